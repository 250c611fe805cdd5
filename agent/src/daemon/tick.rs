//! One control period: discover containers, refresh their processes,
//! sample usage (usage regions, NVML memory and SM samples), run one
//! [`GpuController`] tick per GPU of the node, write each control region
//! (memory limits from the metadata, launch rate and burst from the
//! controller; a write that changes nothing is skipped by the region).
//!
//! Everything the agent needs to resume is on the host (invariant I4):
//! the region directories and their metadata. The in-memory state here is
//! a cache — writable control mappings, the last usage seen — rebuilt from
//! the directories by a new agent in its first period. Nothing a
//! container writes (its usage region, its processes) can stop a period
//! or touch another container (I3): every per-container failure is
//! reported in the view and the period goes on.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tessera_region::control::ControlSpec;
use tessera_region::file::{Mapped, USAGE_FILE, open_control_rw, read_usage_bytes};
use tessera_region::layout::{ControlRegion, UNLIMITED, usage_offsets};
use tessera_region::reader::{UsageSnapshot, read_usage};
use tessera_region::spec::format_uuid;

use crate::config::Config;
use crate::containers::pids::{self, ProcessView};
use crate::containers::store::{Container, MetaCache, Skipped, Store, WriterLock};
use crate::containers::{ContainerId, Metadata};
use crate::control::sampling::{self, SmSamples};
use crate::control::{
    ContainerSample, ControlError, ControllerConfig, GpuController, GpuSample, RateDecision,
};
use crate::error_chain::with_causes;
use crate::gpu::{GpuBackend, GpuUsage, NvmlBackend};

use crate::policy::{Policy, Reloader};
use crate::watchdog::{Facts, GpuMemory, Watchdog};

use super::ebpf::{DaemonEbpf, Member, Seen};

use super::status::Status;
use super::view::{
    ContainerView, DeviceView, EnforcementView, GpuView, PolicyView, SkippedView, View,
};

/// One GPU of the node as NVML lists it.
#[derive(Debug, Clone)]
struct NodeGpu {
    index: u32,
    uuid: [u8; 16],
}

/// NVML and the node's GPUs.
struct Gpus {
    backend: NvmlBackend,
    gpus: Vec<NodeGpu>,
}

/// What one period read of a container before deciding.
struct Observed {
    usage: Option<UsageSnapshot>,
    /// The usage region's header and buckets as read (the watchdog checks
    /// raw fields).
    usage_raw: Option<Vec<u8>>,
    processes: Vec<ProcessView>,
    host_pids: Vec<u32>,
    problems: Vec<String>,
}

/// What the loop keeps per managed container (a cache of the host state).
struct Managed {
    control: Mapped<ControlRegion>,
    /// The period in which this agent took the container over.
    since: u64,
}

/// The loop's state.
pub struct Agent {
    store: Store,
    nvml_lib: PathBuf,
    nvml_retry: Duration,
    cgroup_root: Option<PathBuf>,
    proc_root: PathBuf,
    gpus: Option<Gpus>,
    nvml_error: String,
    nvml_next_try: Instant,
    managed: HashMap<ContainerId, Managed>,
    /// Skipped entries already logged (name → reason), to log changes only.
    reported: BTreeMap<String, String>,
    periods: u64,
    last_sample_us: u64,
    /// One compute controller per GPU (by UUID).
    controllers: HashMap<[u8; 16], GpuController>,
    /// Start of each GPU's next SM sample window (µs).
    sm_since: HashMap<[u8; 16], u64>,
    /// Parsed `meta.json` files, re-read only when they change.
    meta_cache: MetaCache,
    /// The policy in force.
    policy: Policy,
    /// The policy file, looked at once per period.
    policy_file: Reloader,
    /// Ground truth against limits, and the policy's actions.
    watchdog: Watchdog,
    /// The eBPF observer, or why there is none.
    ebpf: DaemonEbpf,
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Agent {
    /// A loop over `config`'s root; the cgroup v2 root is detected when
    /// not configured.
    pub fn new(config: &Config) -> Self {
        let cgroup_root = config
            .cgroup_root
            .clone()
            .or_else(|| crate::cgroup::cgroup2_root().ok());
        match &cgroup_root {
            Some(r) => tracing::info!(cgroup_root = %r.display(), "cgroup v2 hierarchy"),
            None => tracing::warn!(
                "no cgroup v2 hierarchy found; processes are known only from usage regions"
            ),
        }
        Self {
            store: Store::new(&config.root),
            nvml_lib: config.nvml_lib.clone(),
            nvml_retry: config.nvml_retry,
            proc_root: config.proc_root.clone(),
            gpus: None,
            nvml_error: "not initialised yet".to_owned(),
            nvml_next_try: Instant::now(),
            managed: HashMap::new(),
            reported: BTreeMap::new(),
            periods: 0,
            last_sample_us: unix_us(),
            controllers: HashMap::new(),
            sm_since: HashMap::new(),
            meta_cache: MetaCache::default(),
            policy: Policy::default(),
            policy_file: Reloader::new(&config.policy, config.policy_explicit),
            ebpf: DaemonEbpf::start(&config.watchdog, cgroup_root.as_deref()),
            watchdog: Watchdog::new(config.watchdog.clone()),
            cgroup_root,
        }
    }

    /// Replaces the policy in force (for the policy file's loader; the
    /// watchdog tests set one directly).
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn ensure_nvml(&mut self, status: &Status) {
        if self.gpus.is_some() || Instant::now() < self.nvml_next_try {
            return;
        }
        self.nvml_next_try = Instant::now() + self.nvml_retry;
        let loaded = NvmlBackend::load(self.nvml_lib.as_os_str()).and_then(|backend| {
            let n = backend.device_count()?;
            let mut gpus = Vec::new();
            for index in 0..n {
                let d = backend.device(index)?;
                if let Some(uuid) = tessera_region::spec::parse_uuid(&d.uuid) {
                    gpus.push(NodeGpu { index, uuid });
                }
            }
            Ok(Gpus { backend, gpus })
        });
        match loaded {
            Ok(g) => {
                tracing::info!(gpus = g.gpus.len(), lib = %self.nvml_lib.display(), "NVML initialised");
                self.gpus = Some(g);
                self.nvml_error.clear();
                status.set_nvml(Ok(()));
            }
            Err(e) => {
                let msg = with_causes(&e);
                if msg != self.nvml_error {
                    tracing::warn!(error = %msg, retry_ms = self.nvml_retry.as_millis() as u64, "NVML unavailable");
                }
                self.nvml_error.clone_from(&msg);
                status.set_nvml(Err(msg));
            }
        }
    }

    /// NVML's live state of every GPU, by UUID (empty without NVML).
    fn sample_gpus(&mut self) -> HashMap<[u8; 16], GpuUsage> {
        let mut out = HashMap::new();
        let since = self.last_sample_us;
        self.last_sample_us = unix_us();
        let Some(g) = &self.gpus else {
            return out;
        };
        for gpu in &g.gpus {
            match g.backend.usage(gpu.index, since) {
                Ok(u) => {
                    out.insert(gpu.uuid, u);
                }
                Err(e) => tracing::debug!(gpu = gpu.index, error = %with_causes(&e), "no usage"),
            }
        }
        out
    }

    fn report_skipped(&mut self, skipped: &[Skipped]) {
        let now: BTreeMap<String, String> = skipped
            .iter()
            .map(|s| (s.name.clone(), s.reason.clone()))
            .collect();
        for (name, reason) in &now {
            if self.reported.get(name) != Some(reason) {
                tracing::warn!(entry = %name, %reason, "skipping an entry of the container root");
            }
        }
        self.reported = now;
    }

    /// Host processes of `meta`'s cgroup joined with `usage`'s slots.
    fn processes(
        &self,
        meta: &Metadata,
        usage: Option<&UsageSnapshot>,
        problems: &mut Vec<String>,
    ) -> Vec<ProcessView> {
        let slots = usage.map(|u| u.slots.as_slice()).unwrap_or_default();
        match (&meta.cgroup, &self.cgroup_root) {
            (Some(rel), Some(root)) => {
                let dir = root.join(rel.trim_start_matches('/'));
                match pids::cgroup_pids(&dir) {
                    Ok(host) => {
                        let procs: Vec<_> = host
                            .iter()
                            .filter_map(|&p| pids::proc_info(&self.proc_root, p))
                            .collect();
                        pids::join(&procs, slots)
                    }
                    Err(e) => {
                        problems.push(format!(
                            "cannot read the processes of cgroup {}: {e}",
                            dir.display()
                        ));
                        pids::join(&[], slots)
                    }
                }
            }
            (Some(rel), None) => {
                problems.push(format!(
                    "cgroup {rel} is set but no cgroup v2 hierarchy is mounted"
                ));
                pids::join(&[], slots)
            }
            (None, _) => pids::join_same_namespace(&self.proc_root, slots),
        }
    }

    /// Each GPU's SM samples since the previous period (empty without NVML).
    fn sample_sm(&mut self) -> HashMap<[u8; 16], SmSamples> {
        let mut out = HashMap::new();
        let Some(g) = &self.gpus else {
            return out;
        };
        for gpu in &g.gpus {
            let since = *self
                .sm_since
                .entry(gpu.uuid)
                .or_insert_with(sampling::now_us);
            let read = g
                .backend
                .nvml()
                .device_by_index(gpu.index)
                .map_err(|source| ControlError::Nvml { source })
                .and_then(|d| sampling::read_sm_samples(&d, since));
            match read {
                Ok(s) => {
                    self.sm_since.insert(gpu.uuid, s.newest_us);
                    out.insert(gpu.uuid, s);
                }
                Err(e) => {
                    tracing::debug!(gpu = gpu.index, error = %with_causes(&e), "no SM samples");
                }
            }
        }
        out
    }

    /// Runs one period and returns its view.
    pub fn tick(&mut self, status: &Status) -> View {
        let start = Instant::now();
        self.policy_file.poll(&mut self.policy);
        let policy: PolicyView = self.policy_file.view(&self.policy);
        self.ensure_nvml(status);
        let (containers, mut skipped) = match self.store.list_cached(&mut self.meta_cache) {
            Ok(l) => (l.containers, l.skipped),
            Err(e) => {
                tracing::warn!(error = %with_causes(&e), "cannot list the container root");
                (Vec::new(), Vec::new())
            }
        };
        // Forget what is gone; open what is new (a restarted agent
        // resumes every existing container here).
        self.managed
            .retain(|id, _| containers.iter().any(|c| &c.id == id));
        let mut ready = Vec::new();
        for c in containers {
            if !self.managed.contains_key(&c.id) {
                match open_control_rw(&c.dir) {
                    Ok(control) => {
                        tracing::info!(id = %c.id, dir = %c.dir.display(), "managing container");
                        let since = self.periods;
                        self.managed
                            .insert(c.id.clone(), Managed { control, since });
                    }
                    Err(e) => {
                        skipped.push(Skipped {
                            name: c.id.to_string(),
                            reason: with_causes(&e),
                        });
                        continue;
                    }
                }
            }
            ready.push(c);
        }
        self.report_skipped(&skipped);
        let memory = self.sample_gpus();
        let sm = self.sample_sm();
        // Observe every container, then decide per GPU, then write.
        let observed: Vec<Observed> = ready.iter().map(|c| self.observe(c)).collect();
        let seen = self.observe_ebpf(&ready, &observed);
        let nvml: HashMap<[u8; 16], GpuMemory> = memory
            .iter()
            .map(|(u, m)| {
                let mut by_pid = GpuMemory::new();
                for p in &m.processes {
                    *by_pid.entry(p.pid).or_default() += p.used_memory_bytes.unwrap_or(0);
                }
                (*u, by_pid)
            })
            .collect();
        let ids: Vec<ContainerId> = ready.iter().map(|c| c.id.clone()).collect();
        self.watchdog.retain(&ids);
        let decisions = self.decide(&ready, &observed, &sm);
        // One writer of control regions at a time; a CLI call holding the
        // lock delays this period's writes to the next one.
        let lock = self.store.try_lock().ok().flatten();
        let views = ready
            .iter()
            .zip(observed.into_iter().map(|mut o| {
                let kept = (o.usage_raw.take(), o.usage.clone());
                (o, kept)
            }))
            .map(|(c, o)| {
                let mut v = self.publish(c, o.0, &memory, &sm, &decisions, lock.as_ref());
                self.enforce(c, &mut v, o.1, &nvml, seen.get(&c.id));
                v
            })
            .collect();
        drop(lock);
        let view = View {
            period: self.periods,
            root: self.store.root().to_path_buf(),
            containers: views,
            skipped: skipped
                .into_iter()
                .map(|s| SkippedView {
                    name: s.name,
                    reason: s.reason,
                })
                .collect(),
            nvml: if self.gpus.is_some() {
                "ready".to_owned()
            } else {
                self.nvml_error.clone()
            },
            devices: self.devices(&memory, &sm),
            duration_us: start.elapsed().as_micros() as u64,
            ebpf: self.ebpf.status(),
            policy,
        };
        self.periods += 1;
        view
    }

    /// Every GPU of the node in this period's view.
    fn devices(
        &self,
        memory: &HashMap<[u8; 16], GpuUsage>,
        sm: &HashMap<[u8; 16], SmSamples>,
    ) -> Vec<DeviceView> {
        let Some(g) = &self.gpus else {
            return Vec::new();
        };
        g.gpus
            .iter()
            .map(|gpu| {
                let m = memory.get(&gpu.uuid);
                DeviceView {
                    index: gpu.index,
                    uuid: format_uuid(&gpu.uuid),
                    memory_used_bytes: m.map(|m| m.memory_used_bytes),
                    memory_total_bytes: m.map(|m| m.memory_used_bytes + m.memory_free_bytes),
                    sm_percent: sm.get(&gpu.uuid).map(SmSamples::total),
                    healthy: m.is_some(),
                }
            })
            .collect()
    }

    /// A container's usage region and processes.
    fn observe(&self, c: &Container) -> Observed {
        let mut problems = Vec::new();
        let raw = read_usage_bytes(&c.dir.join(USAGE_FILE));
        let usage = raw
            .as_ref()
            .map_err(|e| problems.push(format!("usage region: {}", with_causes(e))))
            .ok()
            .and_then(|b| {
                read_usage(b)
                    .map_err(|e| problems.push(format!("usage region: {}", with_causes(&e))))
                    .ok()
            });
        let processes = self.processes(&c.meta, usage.as_ref(), &mut problems);
        let host_pids = processes.iter().filter_map(|p| p.host_pid).collect();
        Observed {
            usage,
            // The watchdog reads the header and buckets only.
            usage_raw: raw.ok().map(|mut b| {
                b.truncate(usage_offsets::OWNERS);
                b
            }),
            processes,
            host_pids,
            problems,
        }
    }

    /// The container's cgroup directory (absolute), if its metadata names
    /// one and a cgroup v2 hierarchy is mounted.
    fn cgroup_dir(&self, meta: &Metadata) -> Option<PathBuf> {
        let rel = meta.cgroup.as_deref()?;
        Some(crate::watchdog::cgroup_dir(
            self.cgroup_root.as_deref()?,
            rel,
        ))
    }

    /// One period of the eBPF observer over the ready containers.
    fn observe_ebpf(
        &mut self,
        ready: &[Container],
        observed: &[Observed],
    ) -> HashMap<ContainerId, Seen> {
        let dirs: Vec<Option<PathBuf>> = ready.iter().map(|c| self.cgroup_dir(&c.meta)).collect();
        let members: Vec<Member<'_>> = ready
            .iter()
            .zip(observed)
            .zip(&dirs)
            .map(|((c, o), dir)| Member {
                id: &c.id,
                cgroup: dir.as_deref(),
                registered: o
                    .processes
                    .iter()
                    .filter(|p| {
                        p.source == pids::Source::Registered
                            || p.source == pids::Source::SameNamespace
                    })
                    .filter_map(|p| p.host_pid)
                    .collect(),
                pids: o.host_pids.clone(),
            })
            .collect();
        self.ebpf.period(&members)
    }

    /// The watchdog's period of one container: fills the view's
    /// enforcement and eBPF fields.
    fn enforce(
        &mut self,
        c: &Container,
        v: &mut ContainerView,
        (raw, usage): (Option<Vec<u8>>, Option<UsageSnapshot>),
        nvml: &HashMap<[u8; 16], GpuMemory>,
        seen: Option<&Seen>,
    ) {
        let dir = self.cgroup_dir(&c.meta);
        let limits = self.managed.get(&c.id).map(|m| m.control.snapshot());
        let (rates, bursts): (Vec<u64>, Vec<u64>) = limits
            .map(|l| {
                l.gpus
                    .iter()
                    .map(|g| (g.launch_rate, g.launch_burst))
                    .unzip()
            })
            .unwrap_or_default();
        let facts = Facts {
            meta: &c.meta,
            processes: &v.processes,
            usage: usage.as_ref(),
            usage_raw: raw.as_deref(),
            control_epoch: v.epoch,
            launch_rates: &rates,
            launch_bursts: &bursts,
            now: Instant::now(),
            nvml,
            ebpf_bypass: seen.map(|s| s.bypass.as_slice()).unwrap_or_default(),
            context_allowance: self.watchdog.settings().context_allowance,
        };
        v.enforcement = self
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

    /// One controller tick per GPU of the node: the launch limits of every
    /// (container, GPU), by container and UUID. Without NVML nothing is
    /// decided (rates stay as they are).
    fn decide(
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

    /// Writes a container's control region (memory limits from its
    /// metadata, launch limits from the controller) and builds its view.
    fn publish(
        &mut self,
        c: &Container,
        o: Observed,
        memory: &HashMap<[u8; 16], GpuUsage>,
        sm: &HashMap<[u8; 16], SmSamples>,
        decisions: &HashMap<(ContainerId, [u8; 16]), RateDecision>,
        lock: Option<&WriterLock>,
    ) -> ContainerView {
        let Observed {
            usage,
            usage_raw: _,
            processes,
            host_pids,
            mut problems,
        } = o;
        let node_gpus: Vec<[u8; 16]> = self
            .gpus
            .as_ref()
            .map(|g| g.gpus.iter().map(|g| g.uuid).collect())
            .unwrap_or_default();
        let Some(m) = self.managed.get_mut(&c.id) else {
            problems.push("control region not open".to_owned());
            return ContainerView {
                id: c.id.to_string(),
                dir: c.dir.clone(),
                meta: c.meta.clone(),
                epoch: 0,
                since_period: None,
                gpus: Vec::new(),
                processes,
                problems,
                policy: self.policy.effective(&c.meta),
                ebpf: None,
                enforcement: EnforcementView::default(),
            };
        };
        let current = m.control.snapshot();
        let spec: ControlSpec = c.meta.control_spec(|uuid| {
            if let Some(d) = decisions.get(&(c.id.clone(), *uuid)) {
                return (d.launch_rate, d.launch_burst);
            }
            current
                .gpus
                .iter()
                .find(|g| &g.uuid == uuid)
                // A GPU new to the region starts paced, as `container add`
                // creates it.
                .map_or(ControllerConfig::default().initial_limits(), |g| {
                    (g.launch_rate, g.launch_burst)
                })
        });
        for u in c.meta.uuids() {
            if !node_gpus.is_empty() && !node_gpus.contains(&u) {
                problems.push(format!("GPU {} is not on this node", format_uuid(&u)));
            }
        }
        if spec.gpus != current.gpus || spec.flags != current.flags {
            match lock {
                Some(_) => {
                    let memory_changed = spec
                        .gpus
                        .iter()
                        .zip(&current.gpus)
                        .any(|(a, b)| a.memory_limit != b.memory_limit || a.uuid != b.uuid)
                        || spec.gpus.len() != current.gpus.len();
                    match m.control.write(&spec) {
                        Ok(()) if memory_changed => {
                            tracing::info!(id = %c.id, "memory limits updated from metadata");
                        }
                        Ok(()) => {}
                        Err(e) => {
                            problems.push(format!("cannot write control: {}", with_causes(&e)));
                        }
                    }
                }
                None => problems
                    .push("control region not written: another writer holds the lock".into()),
            }
        }
        let after = m.control.snapshot();
        let gpus = after
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
                let bucket = usage.as_ref().map(|u| u.buckets[i]).unwrap_or_default();
                let d = decisions.get(&(c.id.clone(), g.uuid));
                GpuView {
                    uuid: format_uuid(&g.uuid),
                    memory_limit_bytes: (g.memory_limit != UNLIMITED).then_some(g.memory_limit),
                    launch_rate: (g.launch_rate != UNLIMITED).then_some(g.launch_rate),
                    preload_used_bytes: usage.as_ref().map_or(0, |u| u.used[i]),
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
            .collect();
        ContainerView {
            id: c.id.to_string(),
            dir: c.dir.clone(),
            meta: c.meta.clone(),
            epoch: after.epoch,
            since_period: Some(m.since),
            gpus,
            processes,
            problems,
            policy: self.policy.effective(&c.meta),
            ebpf: None,
            enforcement: EnforcementView {
                state: "running".to_owned(),
                ..EnforcementView::default()
            },
        }
    }
}
