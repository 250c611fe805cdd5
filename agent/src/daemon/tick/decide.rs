//! One compute controller tick per GPU of the node.

use super::*;

impl Agent {
    /// One controller tick per GPU of the node: the launch limits of every
    /// (container, GPU), as `out[container][gpu]` in the order of `ready`
    /// and of each container's GPUs (`uuids`). Without NVML nothing is
    /// decided (rates stay as they are). A container not observed this
    /// period (skipped while quiet) stays on its GPUs' controllers and
    /// learns nothing; the first sample after such a gap only records its
    /// counters (they cover more than the window).
    pub(super) fn decide(
        &mut self,
        ready: &[Container],
        per: &[PerContainer],
        observed: &[Option<Observed>],
        sm: &HashMap<[u8; 16], SmSamples>,
    ) -> Vec<Vec<Option<RateDecision>>> {
        let mut out: Vec<Vec<Option<RateDecision>>> =
            per.iter().map(|p| vec![None; p.uuids.len()]).collect();
        let Some(g) = &self.nvml.gpus else {
            return out;
        };
        let inputs = Inputs {
            ready,
            per,
            observed,
            sm,
            managed: &self.containers.managed,
            periods: self.clock.periods,
        };
        let now = Instant::now();
        for gpu in &g.gpus {
            // A GPU none of whose containers was observed this period is
            // left as it is (its tick would learn nothing and decide for
            // no one; containers that left it are dropped at its next
            // tick; the next tick's window, longer than the periods it
            // spans, is learnt from only by containers observed throughout
            // — one returning from a gap only records its counters).
            let any_observed = ready
                .iter()
                .zip(observed)
                .zip(per)
                .any(|((_, o), p)| o.is_some() && p.uuids.contains(&gpu.uuid));
            if !any_observed && self.controllers.contains_key(&gpu.uuid) {
                continue;
            }
            // A controller made this period knows no one yet; an older
            // one knows every container skipped this period (each was
            // added at a visit since, or in the period it was made).
            let fresh = !self.controllers.contains_key(&gpu.uuid);
            let ctl = self.controllers.entry(gpu.uuid).or_insert_with(|| {
                GpuController::new(ControllerConfig::default().with_launch_floor(gpu.launch_floor))
            });
            let (sample, present, refused) = inputs.enrol(ctl, gpu, fresh);
            // (Unless one was refused, every present container is on the
            // controller by now, so only a controller of another size
            // holds containers that left.)
            if refused || ctl.len() != present.len() {
                drop_departed(ctl, &present);
            }
            // Decisions are written for observed containers only (in id
            // order, as `present`).
            let wanted: Vec<&str> = present
                .iter()
                .filter(|(_, ci, _)| observed[*ci].is_some())
                .map(|(id, _, _)| *id)
                .collect();
            for d in ctl.tick_for(now, &sample, &wanted) {
                if let Some((ci, i)) = find(&present, d.id.as_str()) {
                    out[ci][i] = Some(d);
                }
            }
        }
        self.controllers
            .retain(|u, _| g.gpus.iter().any(|gpu| &gpu.uuid == u));
        out
    }
}

/// What the controllers are told of one period.
struct Inputs<'a> {
    ready: &'a [Container],
    per: &'a [PerContainer],
    observed: &'a [Option<Observed>],
    sm: &'a HashMap<[u8; 16], SmSamples>,
    managed: &'a HashMap<ContainerId, Managed>,
    periods: u64,
}

/// The containers present on a GPU: (id, index in `ready`, index of the
/// GPU in its grant), sorted by id as `ready` is.
type Present<'a> = Vec<(&'a str, usize, usize)>;

/// Where container `id` is in `present`: (index in `ready`, GPU index).
fn find(present: &[(&str, usize, usize)], id: &str) -> Option<(usize, usize)> {
    present
        .binary_search_by(|(k, _, _)| (*k).cmp(id))
        .ok()
        .map(|at| (present[at].1, present[at].2))
}

/// Removes from `ctl` the containers not `present` on its GPU.
fn drop_departed(ctl: &mut GpuController, present: &[(&str, usize, usize)]) {
    let gone: Vec<String> = ctl
        .containers()
        .map(|(k, _)| k)
        .filter(|k| find(present, k).is_none())
        .map(str::to_owned)
        .collect();
    for k in gone {
        ctl.remove(&k);
    }
}

impl<'a> Inputs<'a> {
    /// Puts the containers present on `gpu` on its controller `ctl`
    /// (`fresh`: made this period) with their policy's control, and
    /// samples those observed: the sample, who is present, and whether
    /// the controller refused a container it did not know.
    fn enrol(
        &self,
        ctl: &mut GpuController,
        gpu: &NodeGpu,
        fresh: bool,
    ) -> (GpuSample, Present<'a>, bool) {
        let mut sample = GpuSample {
            busy_percent: self.sm.get(&gpu.uuid).map(SmSamples::total),
            containers: Vec::new(),
        };
        let mut present: Present<'a> = Vec::with_capacity(self.ready.len());
        // Whether a present container is not on the controller.
        let mut refused = false;
        let ready: &'a [Container] = self.ready;
        for (ci, ((c, o), p)) in ready.iter().zip(self.observed).zip(self.per).enumerate() {
            let Some(i) = p.uuids.iter().position(|u| u == &gpu.uuid) else {
                continue;
            };
            let id = c.id.as_str();
            present.push((id, ci, i));
            if o.is_none() && !fresh {
                continue;
            }
            let known = ctl.contains(id);
            if o.is_none() && known {
                continue;
            }
            let control = p.policy.control(&c.meta);
            let applied = if known {
                ctl.upsert(id, control)
            } else {
                // Resume from the pacing in its control region (I4: a
                // restarted agent continues without a jump); a
                // controller new since the container's last visit
                // takes it on without a sample.
                let current = self
                    .managed
                    .get(&c.id)
                    .map_or(Pacing::UNLIMITED, |m| Pacing::from(&m.control.gpu(i).0));
                ctl.resume(id, control, current)
            };
            if let Err(e) = applied {
                tracing::warn!(id, error = %with_causes(&e), "controller refused the container");
                refused |= !known;
                continue;
            }
            let Some(o) = o else {
                continue;
            };
            let after_gap = self
                .managed
                .get(&c.id)
                .and_then(|m| m.last.as_ref())
                .is_some_and(|l| l.schedule.missed(self.periods));
            if known && after_gap {
                ctl.rebase(id);
            }
            if let Some(u) = &o.usage {
                // No process of the container is known on the host yet (a
                // pod whose cgroup is not learnt, its processes in a pid
                // namespace of their own): its use is unmeasured, not
                // zero, so its rate is held rather than probed upwards.
                let pct = if o.host_pids.is_empty() {
                    None
                } else {
                    self.sm
                        .get(&gpu.uuid)
                        .map(|s| s.sum_over(o.host_pids.iter().copied()))
                };
                sample
                    .containers
                    .push(ContainerSample::from_usage(id, pct, u, i));
            }
        }
        (sample, present, refused)
    }
}
