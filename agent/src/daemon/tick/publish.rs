//! What a period writes and shows: each container's control region (memory
//! limits from the metadata, launch limits from the controller), its view,
//! and the watchdog's verdict on it.

use super::*;
use crate::watchdog::Compute;

impl Agent {
    /// Writes a container's control region (memory limits from its
    /// metadata, launch limits from the controller) and builds its view.
    pub(super) fn publish(
        &mut self,
        c: &Container,
        per: &PerContainer,
        o: Observed,
        memory: &HashMap<[u8; 16], GpuLive>,
        sm: &HashMap<[u8; 16], SmSamples>,
        lock: Option<&WriterLock>,
    ) -> ContainerView {
        let decided = |uuid: &[u8; 16]| {
            per.uuids
                .iter()
                .position(|u| u == uuid)
                .and_then(|i| per.decided.get(i)?.as_ref())
        };
        let Observed {
            usage,
            usage_raw: _,
            processes,
            host_pids,
            mut problems,
        } = o;
        let node_gpus: Vec<[u8; 16]> = self
            .nvml
            .gpus
            .as_ref()
            .map(|g| g.gpus.iter().map(|g| g.uuid).collect())
            .unwrap_or_default();
        let Some(m) = self.containers.managed.get_mut(&c.id) else {
            problems.push("control region not open".to_owned());
            return bare_view(c, per.policy.clone(), processes, problems);
        };
        let current = m.control.snapshot();
        let spec: ControlSpec = c.meta.control_spec(|uuid| {
            if let Some(d) = decided(uuid) {
                return d.pacing;
            }
            current
                .gpus
                .iter()
                .find(|g| &g.uuid == uuid)
                // A GPU new to the region starts paced, as `container add`
                // creates it.
                .map_or(ControllerConfig::default().initial_limits(), Pacing::from)
        });
        for u in &per.uuids {
            if !node_gpus.is_empty() && !node_gpus.contains(u) {
                problems.push(format!("GPU {} is not on this node", format_uuid(u)));
            }
        }
        if spec.gpus != current.gpus || spec.flags != current.flags {
            problems.extend(write_control(c, m, &spec, &current, lock));
        }
        let after = m.control.snapshot();
        let gpus = gpu_views(&after, usage.as_ref(), &host_pids, memory, sm, decided);
        ContainerView {
            id: c.id.to_string(),
            dir: c.dir.clone(),
            meta: c.meta.clone(),
            epoch: after.epoch,
            since_period: Some(m.since),
            gpus,
            processes,
            problems,
            policy: per.policy.clone(),
            ebpf: None,
            enforcement: EnforcementView {
                state: "running".to_owned(),
                ..EnforcementView::default()
            },
        }
    }

    /// The watchdog's period of one container: fills the view's
    /// enforcement and eBPF fields.
    pub(super) fn enforce(
        &mut self,
        c: &Container,
        v: &mut ContainerView,
        (raw, usage): (Option<&[u8]>, Option<&UsageSnapshot>),
        nvml: &HashMap<[u8; 16], GpuMemory>,
        seen: Option<&Seen>,
    ) {
        let dir = self.cgroup_dir(&c.meta);
        let limits = self
            .containers
            .managed
            .get(&c.id)
            .map(|m| m.control.snapshot());
        let (rates, bursts): (Vec<u64>, Vec<u64>) = limits
            .map(|l| {
                l.gpus
                    .iter()
                    .map(|g| (g.launch_rate, g.launch_burst))
                    .unzip()
            })
            .unwrap_or_default();
        let compute: Vec<Compute> = c
            .meta
            .uuids()
            .iter()
            .map(|u| {
                let uuid = format_uuid(u);
                v.gpus
                    .iter()
                    .find(|g| g.uuid == uuid)
                    .map_or_else(Compute::default, |g| Compute {
                        measured: g.sm_percent,
                        cap: g.cap_percent,
                    })
            })
            .collect();
        let facts = Facts {
            meta: &c.meta,
            processes: &v.processes,
            usage,
            usage_raw: raw,
            control_epoch: v.epoch,
            launch_rates: &rates,
            launch_bursts: &bursts,
            now: Instant::now(),
            nvml,
            ebpf_bypass: seen.map(|s| s.bypass.as_slice()).unwrap_or_default(),
            context_allowance: self.enforcement.watchdog.settings().context_allowance,
            compute: &compute,
        };
        v.enforcement = self
            .enforcement
            .watchdog
            .check(&c.id, dir.as_deref(), &v.policy, &facts);
        if let Some(s) = seen {
            v.ebpf = Some(s.view.clone());
            // The estimate is per process, not per GPU: shown on the
            // grant's only GPU, left null when it has several.
            if let [g] = v.gpus.as_mut_slice() {
                g.ebpf_used_bytes = Some(s.estimate_bytes);
            }
        }
    }
}

/// Writes `spec` over `current` in `c`'s control region under the writer
/// `lock`: the problem, if it could not.
fn write_control(
    c: &Container,
    m: &mut Managed,
    spec: &ControlSpec,
    current: &ControlSnapshot,
    lock: Option<&WriterLock>,
) -> Option<String> {
    if lock.is_none() {
        return Some("control region not written: another writer holds the lock".into());
    }
    let memory_changed = spec
        .gpus
        .iter()
        .zip(&current.gpus)
        .any(|(a, b)| a.memory_limit != b.memory_limit || a.uuid != b.uuid)
        || spec.gpus.len() != current.gpus.len();
    match m.control.write(spec) {
        Ok(()) if memory_changed => {
            tracing::info!(id = %c.id, "memory limits updated from metadata");
            None
        }
        Ok(()) => None,
        Err(e) => Some(format!("cannot write control: {}", with_causes(&e))),
    }
}

/// The view of each GPU of a control region (`after` this period's
/// write): its limits, what the usage region, NVML and the controller
/// (`decided`) say of the container's processes (`host_pids`) on it.
fn gpu_views<'d>(
    after: &ControlSnapshot,
    usage: Option<&UsageSnapshot>,
    host_pids: &[u32],
    memory: &HashMap<[u8; 16], GpuLive>,
    sm: &HashMap<[u8; 16], SmSamples>,
    decided: impl Fn(&[u8; 16]) -> Option<&'d RateDecision>,
) -> Vec<GpuView> {
    after
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mem = memory.get(&g.uuid).map(|s| {
                s.processes
                    .iter()
                    .filter(|p| host_pids.contains(&p.pid))
                    .filter_map(|p| p.used_memory_bytes)
                    .sum()
            });
            let bucket = usage.map(|u| u.buckets[i]).unwrap_or_default();
            let d = decided(&g.uuid);
            GpuView {
                uuid: format_uuid(&g.uuid),
                memory_limit_bytes: (g.memory_limit != UNLIMITED).then_some(g.memory_limit),
                launch_rate: (g.launch_rate != UNLIMITED).then_some(g.launch_rate),
                launch_floor: g.launch_floor,
                preload_used_bytes: usage.map_or(0, |u| u.used[i]),
                nvml_used_bytes: mem,
                sm_percent: sm
                    .get(&g.uuid)
                    .map(|s| s.sum_over(host_pids.iter().copied())),
                cap_percent: d.map(|d| d.cap_percent),
                error_pp: d.and_then(RateDecision::error_pp),
                loop_state: d.map(|d| d.state),
                warps: bucket.warps,
                launches: bucket.launches,
                throttled_ns: bucket.throttled_ns,
                ebpf_used_bytes: None,
            }
        })
        .collect()
}
