//! One compute controller tick per GPU of the node.

use super::*;

impl Agent {
    /// One controller tick per GPU of the node: the launch limits of every
    /// (container, GPU), by container and UUID. Without NVML nothing is
    /// decided (rates stay as they are).
    pub(super) fn decide(
        &mut self,
        ready: &[Container],
        observed: &[Observed],
        sm: &HashMap<[u8; 16], SmSamples>,
    ) -> HashMap<(ContainerId, [u8; 16]), RateDecision> {
        let mut out = HashMap::new();
        let Some(g) = &self.gpus else {
            return out;
        };
        let now = Instant::now();
        // Parsed once per period, not once per (container, GPU).
        let uuids: Vec<Vec<[u8; 16]>> = ready.iter().map(|c| c.meta.uuids()).collect();
        for gpu in &g.gpus {
            let ctl = self
                .controllers
                .entry(gpu.uuid)
                .or_insert_with(|| GpuController::new(ControllerConfig::default()));
            let mut sample = GpuSample {
                busy_percent: sm.get(&gpu.uuid).map(SmSamples::total),
                containers: Vec::new(),
            };
            let mut present = std::collections::HashSet::new();
            for ((c, o), uuids) in ready.iter().zip(observed).zip(&uuids) {
                let Some(i) = uuids.iter().position(|u| u == &gpu.uuid) else {
                    continue;
                };
                let id = c.id.as_str();
                present.insert(id);
                let control = c.meta.control(&self.policy.effective(&c.meta));
                let known = ctl.contains(id);
                let applied = if known {
                    ctl.upsert(id, control)
                } else {
                    // Resume from the rate in its control region (I4: a
                    // restarted agent continues without a jump).
                    let rate = self
                        .managed
                        .get(&c.id)
                        .map_or(UNLIMITED, |m| m.control.gpu(i).0.launch_rate);
                    ctl.resume(id, control, rate)
                };
                if let Err(e) = applied {
                    tracing::warn!(id, error = %with_causes(&e), "controller refused the container");
                    continue;
                }
                if let Some(u) = &o.usage {
                    let pct = sm
                        .get(&gpu.uuid)
                        .map(|s| s.sum_over(o.host_pids.iter().copied()));
                    sample
                        .containers
                        .push(ContainerSample::from_usage(id, pct, u, i));
                }
            }
            let gone: Vec<String> = ctl
                .containers()
                .map(|(k, _)| k)
                .filter(|k| !present.contains(k))
                .map(str::to_owned)
                .collect();
            for k in gone {
                ctl.remove(&k);
            }
            for d in ctl.tick(now, &sample) {
                if let Ok(id) = ContainerId::new(&d.id) {
                    out.insert((id, gpu.uuid), d);
                }
            }
        }
        self.controllers
            .retain(|u, _| g.gpus.iter().any(|gpu| &gpu.uuid == u));
        out
    }
}
