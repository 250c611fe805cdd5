//! One control period: discover containers, refresh their processes,
//! sample usage (usage regions, NVML memory and SM samples), run one
//! [`GpuController`] tick per GPU of the node, write each control region
//! (memory limits from the metadata, launch rate and burst from the
//! controller; a write that changes nothing is skipped by the region).
//!
//! Parts: [`nvml`] (the node's GPUs and samples), [`observe`] (usage
//! regions and processes), [`decide`] (the controllers), [`publish`]
//! (control regions, views, the watchdog).
//!
//! A container in which nothing happens ([`quiet`]: no kernel ran in its
//! processes, no launch counted, nothing to enforce — an empty container,
//! or an inference server holding its memory between requests) is not
//! visited every period: its last view stands, and it is looked at again
//! after `quiet_revisit` (configured; 1 s by default), or at once when
//! its metadata changes (`container set` touches the root), the policy
//! changes, the set of processes NVML lists on the node changes (a new or
//! departed process on any GPU wakes every container), NVML shows one of
//! its processes running kernels or changing its memory, the launch
//! counters at the head of its usage region move (read each period for a
//! quiet container that has processes), or the eBPF observer reports a
//! bypass in it. Whatever uses a GPU shows in NVML, so
//! a container that starts work is visited in the period that sees it.
//! A revisit reads everything a visit reads (metadata, usage region,
//! processes, control region, eBPF counts); when all of it is as the last
//! visit found it, it stops there ([`Found`]): the container stays quiet
//! and nothing is decided, written or checked again for it.
//!
//! Everything the agent needs to resume is on the host (invariant I4):
//! the region directories and their metadata. The in-memory state here is
//! a cache — writable control mappings, the last usage seen — rebuilt from
//! the directories by a new agent in its first period. Nothing a
//! container writes (its usage region, its processes) can stop a period
//! or touch another container (I3): every per-container failure is
//! reported in the view and the period goes on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tessera_region::control::{ControlSnapshot, ControlSpec};
use tessera_region::file::{Mapped, USAGE_FILE, open_control_rw};
use tessera_region::layout::{ControlRegion, UNLIMITED, usage_offsets};
use tessera_region::reader::{Scope, UsageSnapshot, read_buckets, read_usage_in};
use tessera_region::spec::format_uuid;
use tessera_region::usage_file::UsageFile;

use crate::config::Config;
use crate::containers::pids::{self, ProcessView};
use crate::containers::proc_cache::ProcCache;
use crate::containers::store::{Container, FileKey, MetaCache, Skipped, Store, WriterLock};
use crate::containers::{ContainerId, Metadata};
use crate::control::sampling::{self, SmSamples};
use crate::control::{
    ContainerSample, ControlError, ControllerConfig, GpuController, GpuSample, Pacing, RateDecision,
};
use crate::error_chain::with_causes;
use crate::gpu::{GpuBackend, GpuLive, NvmlBackend};

use crate::policy::{Policy, Reloader};
use crate::watchdog::{Facts, GpuMemory, Watchdog};

use super::ebpf::{DaemonEbpf, Member, Seen};
use super::nvml::SharedNvml;

use crate::view::status::Status;
use crate::view::{
    ContainerView, DeviceView, EnforcementView, GpuView, PolicyView, SkippedView, View,
};

mod decide;
mod nvml;
mod observe;
mod publish;

/// One GPU of the node as NVML lists it.
#[derive(Debug, Clone)]
struct NodeGpu {
    index: u32,
    uuid: [u8; 16],
    /// What its controller writes as `launch_floor`.
    launch_floor: u64,
}

/// NVML and the node's GPUs.
struct Gpus {
    backend: Arc<NvmlBackend>,
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

/// What a container's last visit published, kept while it is quiet.
struct LastVisit {
    /// The view then (shown again in the periods that skip it).
    view: Arc<ContainerView>,
    /// Its GPUs then (in the order of its metadata).
    uuids: Vec<[u8; 16]>,
    /// The metadata it was visited with (a new one is a reason to visit),
    /// and that file's identity.
    meta: Arc<Metadata>,
    meta_key: FileKey,
    /// Nothing happened in it ([`quiet`]) for [`CALM_PERIODS`] visits in a
    /// row (so a container woken up is followed every period for a while,
    /// and its controller learns from whole windows).
    quiet: bool,
    /// Visits in a row in which nothing happened.
    calm: u64,
    /// Its host processes then (NVML activity of any wakes it).
    host_pids: Vec<u32>,
    /// The period of that visit.
    period: u64,
    /// The period by which a quiet container is visited again.
    next: u64,
    /// What that visit found, once the container is quiet.
    found: Option<Found>,
}

/// What a visit found in a container, apart from its metadata and the
/// policy: its usage region (the header and buckets byte for byte, the
/// slots decoded), its processes, the eBPF observer's counts and its
/// control region. These and the metadata and policy are everything a
/// visit publishes from, but for the controller's decisions, which only
/// change what a container that launches gets. So a quiet container's
/// revisit that finds the same as its last full visit (and no problem)
/// would publish the same view and limits: it is cut short, and the
/// container stays quiet.
#[derive(Debug, PartialEq)]
struct Found {
    usage_raw: Option<Vec<u8>>,
    usage: Option<UsageSnapshot>,
    processes: Vec<ProcessView>,
    /// ioctls, opens, bypass events, estimated bytes.
    ebpf: Option<(u64, u64, u64, u64)>,
    control: ControlSnapshot,
}

impl Found {
    fn of(
        usage_raw: Option<&[u8]>,
        usage: Option<&UsageSnapshot>,
        processes: &[ProcessView],
        seen: Option<&Seen>,
        control: ControlSnapshot,
    ) -> Self {
        Self {
            usage_raw: usage_raw.map(<[u8]>::to_vec),
            usage: usage.cloned(),
            processes: processes.to_vec(),
            ebpf: seen.map(|s| {
                (
                    s.view.ioctls,
                    s.view.opens,
                    s.view.bypass_events,
                    s.estimate_bytes,
                )
            }),
            control,
        }
    }
}

/// Visits in a row without activity before a container counts as quiet.
pub const CALM_PERIODS: u64 = 10;

/// Whether nothing happened in a visited container since its previous
/// visit `before`: no kernel of its processes in NVML's samples, its
/// usage region readable, consistent and with the launch counters it had
/// then, no problem, no enforcement under way, the watchdog `settled` (no
/// finding pending, no incident open) and no bypass report. Only such a
/// container may go unvisited.
fn quiet(
    v: &ContainerView,
    before: Option<&ContainerView>,
    usage: Option<&UsageSnapshot>,
    seen: Option<&Seen>,
    settled: bool,
) -> bool {
    let Some(before) = before else {
        return false;
    };
    let counters = |v: &ContainerView| {
        v.gpus
            .iter()
            .map(|g| (g.launches, g.warps, g.throttled_ns))
            .collect::<Vec<_>>()
    };
    settled
        && v.problems.is_empty()
        && v.enforcement.state == "running"
        && seen.is_none_or(|s| s.bypass.is_empty())
        && usage.is_some_and(|u| u.anomalies.is_empty())
        && v.gpus.iter().all(|g| g.sm_percent.is_none_or(|p| p <= 0.0))
        && counters(v) == counters(before)
}

/// The view of a container with no control region to show: who it is,
/// its processes and its problems.
fn bare_view(
    c: &Container,
    policy: crate::policy::Effective,
    processes: Vec<ProcessView>,
    problems: Vec<String>,
) -> ContainerView {
    ContainerView {
        id: c.id.to_string(),
        dir: c.dir.clone(),
        meta: c.meta.clone(),
        epoch: 0,
        since_period: None,
        gpus: Vec::new(),
        processes,
        problems,
        policy,
        ebpf: None,
        enforcement: EnforcementView::default(),
    }
}

/// The host processes NVML shows at work this period: running kernels
/// (SM samples above zero), or holding other memory than last period.
fn busy_pids(
    sm: &HashMap<[u8; 16], SmSamples>,
    memory: &HashMap<u32, u64>,
    before: &HashMap<u32, u64>,
) -> BTreeSet<u32> {
    sm.values()
        .flat_map(|s| s.by_pid.iter())
        .filter(|(_, p)| **p > 0.0)
        .map(|(pid, _)| *pid)
        .chain(
            memory
                .iter()
                .filter(|(pid, b)| before.get(pid) != Some(b))
                .map(|(pid, _)| *pid),
        )
        .collect()
}

/// What a period works out once per container and every step reads.
struct PerContainer {
    /// Its GPUs' UUIDs, in the order of its metadata.
    uuids: Vec<[u8; 16]>,
    /// What the node policy decided for it (its explicit values included).
    policy: crate::policy::Effective,
    /// The controllers' launch limits, by GPU in the order of `uuids`
    /// (none: not decided this period).
    decided: Vec<Option<RateDecision>>,
}

/// What the loop keeps per managed container (a cache of the host state).
struct Managed {
    control: Mapped<ControlRegion>,
    /// Its usage file, kept open between periods (reopened whenever the
    /// path names another file).
    usage: UsageFile,
    /// The period in which this agent took the container over.
    since: u64,
    /// Its last visit (none before the first).
    last: Option<LastVisit>,
}

/// The loop's state.
pub struct Agent {
    store: Store,
    /// The daemon's one NVML (shared with the device plugin and the
    /// telemetry writer).
    nvml: Arc<SharedNvml>,
    cgroup_root: Option<PathBuf>,
    /// Host processes, described once each (`RefCell`: looked up while
    /// the period reads the rest of the loop's state).
    procs: std::cell::RefCell<ProcCache>,
    gpus: Option<Gpus>,
    nvml_error: String,
    managed: HashMap<ContainerId, Managed>,
    /// Skipped entries already logged (name → reason), to log changes only.
    reported: BTreeMap<String, String>,
    periods: u64,
    /// One compute controller per GPU (by UUID).
    controllers: HashMap<[u8; 16], GpuController>,
    /// Start of each GPU's next SM sample window (µs).
    sm_since: HashMap<[u8; 16], u64>,
    /// Each GPU's memory totals (used, free) and the period they were
    /// read in.
    device_memory: HashMap<[u8; 16], ((u64, u64), u64)>,
    /// The SM sample query's buffer, kept between periods.
    sm_buf: Vec<nvml_wrapper_sys::bindings::nvmlProcessUtilizationSample_t>,
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
    /// Usage regions are read into this buffer, one after the other.
    usage_buf: Vec<u8>,
    /// The processes NVML listed on the node last period and their memory
    /// over all GPUs (a new or departed one wakes every quiet container).
    gpu_memory: HashMap<u32, u64>,
    /// Periods a quiet container goes unvisited (at least one).
    revisit: u64,
    /// A policy set by [`Self::set_policy`] since the last period (it
    /// wakes every quiet container, as a reloaded file does).
    policy_set: bool,
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
            nvml: Arc::new(SharedNvml::new(config.nvml_lib.clone(), config.nvml_retry)),
            procs: std::cell::RefCell::new(ProcCache::new(&config.proc_root)),
            gpus: None,
            nvml_error: "not initialised yet".to_owned(),
            managed: HashMap::new(),
            reported: BTreeMap::new(),
            periods: 0,
            controllers: HashMap::new(),
            sm_since: HashMap::new(),
            device_memory: HashMap::new(),
            sm_buf: Vec::new(),
            meta_cache: MetaCache::default(),
            policy: Policy::default(),
            policy_file: Reloader::new(&config.policy, config.policy_explicit),
            ebpf: DaemonEbpf::start(&config.watchdog, cgroup_root.as_deref()),
            watchdog: Watchdog::new(config.watchdog.clone()),
            cgroup_root,
            usage_buf: Vec::new(),
            gpu_memory: HashMap::new(),
            revisit: (config.quiet_revisit.as_millis() / config.period.as_millis().max(1)).max(1)
                as u64,
            policy_set: false,
        }
    }

    /// Replaces the policy in force (for the policy file's loader; the
    /// watchdog tests set one directly).
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
        self.policy_set = true;
    }

    /// The loop's NVML, for the other parts of the daemon to share.
    pub fn nvml(&self) -> Arc<SharedNvml> {
        self.nvml.clone()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
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

    /// Runs one period and returns its view.
    pub fn tick(&mut self, status: &Status) -> View {
        let start = Instant::now();
        let policy_changed =
            self.policy_file.poll(&mut self.policy) | std::mem::take(&mut self.policy_set);
        let policy: PolicyView = self.policy_file.view(&self.policy);
        self.ensure_nvml(status);
        let sm = self.sample_sm();
        let memory = self.sample_gpus(&sm);
        let (wake, busy) = self.gpu_activity(&sm, &memory);
        let wake = wake || policy_changed;
        let stirred = self.stirred(&busy);
        // A quiet container not due is taken as last visited, without a
        // look at its directory; every `revisit` periods the root is read
        // afresh whatever its times say.
        let periods = self.periods;
        let managed = &self.managed;
        let keep = |id: &ContainerId| {
            let l = managed.get(id)?.last.as_ref()?;
            (l.quiet && !wake && !stirred.contains(id) && periods < l.next).then(|| Container {
                id: id.clone(),
                dir: l.view.dir.clone(),
                meta: l.meta.clone(),
                meta_key: l.meta_key,
            })
        };
        let force = periods.is_multiple_of(self.revisit);
        let (containers, mut skipped) =
            match self.store.list_cached(&mut self.meta_cache, force, keep) {
                Ok(l) => (l.containers, l.skipped),
                Err(e) => {
                    tracing::warn!(error = %with_causes(&e), "cannot list the container root");
                    (Vec::new(), Vec::new())
                }
            };
        // Forget what is gone; open what is new (a restarted agent
        // resumes every existing container here).
        // (The listing is sorted by id.)
        let listed = |id: &ContainerId| containers.binary_search_by(|c| c.id.cmp(id)).is_ok();
        self.managed.retain(|id, _| listed(id));
        let mut ready = Vec::new();
        for c in containers {
            if !self.managed.contains_key(&c.id) {
                match open_control_rw(&c.dir) {
                    Ok(control) => {
                        tracing::info!(id = %c.id, dir = %c.dir.display(), "managing container");
                        let since = self.periods;
                        self.managed.insert(
                            c.id.clone(),
                            Managed {
                                control,
                                usage: UsageFile::default(),
                                since,
                                last: None,
                            },
                        );
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
        // (`ready` keeps the listing's order.)
        self.watchdog
            .retain(|id| ready.binary_search_by(|c: &Container| c.id.cmp(id)).is_ok());
        self.report_skipped(&skipped);
        // Observe every container due a visit, then decide per GPU, then
        // write.
        let mut observed: Vec<Option<Observed>> = ready
            .iter()
            .map(|c| self.due(c, wake, &stirred).then(|| self.observe_managed(c)))
            .collect();
        let seen = self.observe_ebpf(&ready, &observed);
        // A bypass reported in a container skipped so far: visit it now.
        for (c, o) in ready.iter().zip(observed.iter_mut()) {
            if o.is_none() && seen.get(&c.id).is_some_and(|s| !s.bypass.is_empty()) {
                *o = Some(self.observe_managed(c));
            }
        }
        // A quiet container looked at only because its revisit came, in
        // which everything is as its last visit found it, stays quiet: its
        // last view stands (see `Found`).
        let (period, revisit) = (self.periods, self.revisit);
        for (c, o) in ready.iter().zip(observed.iter_mut()) {
            let (Some(ob), Some(m)) = (o.as_ref(), self.managed.get_mut(&c.id)) else {
                continue;
            };
            let Some(l) = m.last.as_mut() else { continue };
            let s = seen.get(&c.id);
            let only_revisit = l.quiet
                && !wake
                && !stirred.contains(&c.id)
                && Arc::ptr_eq(&l.meta, &c.meta)
                && ob.problems.is_empty()
                && s.is_none_or(|s| s.bypass.is_empty());
            if only_revisit
                && l.found.as_ref()
                    == Some(&Found::of(
                        ob.usage_raw.as_deref(),
                        ob.usage.as_ref(),
                        &ob.processes,
                        s,
                        m.control.snapshot(),
                    ))
            {
                l.next = period + revisit;
                *o = None;
            }
        }
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
        let mut per: Vec<PerContainer> = ready
            .iter()
            .zip(&observed)
            .map(|(c, o)| {
                let last = self
                    .managed
                    .get(&c.id)
                    .and_then(|m| m.last.as_ref())
                    .filter(|_| o.is_none());
                PerContainer {
                    uuids: last.map_or_else(|| c.meta.uuids(), |l| l.uuids.clone()),
                    policy: match last {
                        Some(l) => l.view.policy.clone(),
                        None => self.policy.effective(&c.meta),
                    },
                    decided: Vec::new(),
                }
            })
            .collect();
        let decisions = self.decide(&ready, &per, &observed, &sm);
        for (p, d) in per.iter_mut().zip(decisions) {
            p.decided = d;
        }
        // One writer of control regions at a time; a CLI call holding the
        // lock delays this period's writes to the next one.
        let lock = self.store.try_lock().ok().flatten();
        let views = ready
            .iter()
            .zip(per)
            .zip(observed)
            .enumerate()
            .map(|(k, ((c, per), o))| {
                let Some(mut o) = o else {
                    // Skipped: its last view stands (`due` checked there is one).
                    return self
                        .managed
                        .get(&c.id)
                        .and_then(|m| m.last.as_ref())
                        .map(|l| l.view.clone())
                        .unwrap_or_else(|| Arc::new(self.unvisited(c)));
                };
                let (raw, usage) = (o.usage_raw.take(), o.usage.clone());
                let mut v = self.publish(c, &per, o, &memory, &sm, lock.as_ref());
                let s = seen.get(&c.id);
                self.enforce(c, &mut v, (raw.as_deref(), usage.as_ref()), &nvml, s);
                let v = Arc::new(v);
                let settled = self.watchdog.settled(&c.id);
                if let Some(m) = self.managed.get_mut(&c.id) {
                    let before = m.last.as_ref().map(|l| &*l.view);
                    let calm = if quiet(&v, before, usage.as_ref(), s, settled) {
                        m.last.as_ref().map_or(0, |l| l.calm) + 1
                    } else {
                        0
                    };
                    // (Only a quiet container's revisit compares.)
                    let found = (calm >= CALM_PERIODS).then(|| {
                        Found::of(
                            raw.as_deref(),
                            usage.as_ref(),
                            &v.processes,
                            s,
                            m.control.snapshot(),
                        )
                    });
                    // (Spread the revisits of containers that calmed down
                    // together over the revisit interval.)
                    let next = if calm == CALM_PERIODS {
                        period + 1 + k as u64 % revisit
                    } else {
                        period + revisit
                    };
                    m.last = Some(LastVisit {
                        view: v.clone(),
                        uuids: per.uuids,
                        meta: c.meta.clone(),
                        meta_key: c.meta_key,
                        quiet: calm >= CALM_PERIODS,
                        calm,
                        host_pids: v.processes.iter().filter_map(|p| p.host_pid).collect(),
                        period,
                        next,
                        found,
                    });
                }
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
        // (A quiet container's processes outlive a few of its revisits.)
        self.procs.get_mut().end_round(3 * self.revisit + 1);
        self.periods += 1;
        view
    }

    /// This period's NVML activity: whether the set of processes on the
    /// node's GPUs changed since last period, and the processes at work
    /// ([`busy_pids`]).
    fn gpu_activity(
        &mut self,
        sm: &HashMap<[u8; 16], SmSamples>,
        memory: &HashMap<[u8; 16], GpuLive>,
    ) -> (bool, BTreeSet<u32>) {
        let mut now: HashMap<u32, u64> = HashMap::new();
        for p in memory.values().flat_map(|m| &m.processes) {
            *now.entry(p.pid).or_default() += p.used_memory_bytes.unwrap_or(0);
        }
        for pid in sm.values().flat_map(|s| s.by_pid.keys()) {
            now.entry(*pid).or_default();
        }
        let changed = now.len() != self.gpu_memory.len()
            || now.keys().any(|p| !self.gpu_memory.contains_key(p));
        let busy = busy_pids(sm, &now, &self.gpu_memory);
        self.gpu_memory = now;
        (changed, busy)
    }

    /// The quiet containers something happened in since their last visit:
    /// NVML shows one of their processes at work (`busy`), or — for those
    /// with processes, which may launch too little for NVML to notice —
    /// the launch counters at the head of their usage region moved (one
    /// read of the header and buckets, no decoding of the slots' bytes).
    fn stirred(&mut self, busy: &BTreeSet<u32>) -> BTreeSet<ContainerId> {
        let mut out = BTreeSet::new();
        let mut buf = std::mem::take(&mut self.usage_buf);
        for (id, m) in &mut self.managed {
            let Some(l) = &m.last else { continue };
            if !l.quiet {
                continue;
            }
            if l.host_pids.iter().any(|p| busy.contains(p)) {
                out.insert(id.clone());
                continue;
            }
            if l.view.processes.is_empty() {
                continue;
            }
            // (The file its processes mapped, as opened at the last visit:
            // no look at the path; the revisit looks.)
            let path = l.view.dir.join(USAGE_FILE);
            let read = match m
                .usage
                .read_kept_prefix(&path, usage_offsets::OWNERS, &mut buf)
            {
                Ok(true) => Ok(()),
                Ok(false) => m.usage.read_prefix(&path, usage_offsets::OWNERS, &mut buf),
                Err(e) => Err(e),
            };
            let moved = match read.ok().and_then(|()| read_buckets(&buf).ok()) {
                Some(buckets) => l.view.gpus.iter().zip(&buckets).any(|(g, b)| {
                    (g.launches, g.warps, g.throttled_ns) != (b.launches, b.warps, b.throttled_ns)
                }),
                None => true,
            };
            if moved {
                out.insert(id.clone());
            }
        }
        self.usage_buf = buf;
        out
    }

    /// Whether container `c` is visited this period (see the module's
    /// documentation).
    fn due(&self, c: &Container, wake: bool, stirred: &BTreeSet<ContainerId>) -> bool {
        match self.managed.get(&c.id).and_then(|m| m.last.as_ref()) {
            None => true,
            Some(l) => {
                wake || !l.quiet
                    || !Arc::ptr_eq(&l.meta, &c.meta)
                    || self.periods >= l.next
                    || stirred.contains(&c.id)
            }
        }
    }

    /// Observes a managed container (its usage file kept open between
    /// periods, read into the shared buffer).
    fn observe_managed(&mut self, c: &Container) -> Observed {
        let mut buf = std::mem::take(&mut self.usage_buf);
        let mut file = self
            .managed
            .get_mut(&c.id)
            .map(|m| std::mem::take(&mut m.usage))
            .unwrap_or_default();
        let o = self.observe(c, &mut buf, &mut file);
        if let Some(m) = self.managed.get_mut(&c.id) {
            m.usage = file;
        }
        self.usage_buf = buf;
        o
    }

    /// The view of a container no visit has described (not reached: a
    /// container is skipped only after a visit).
    fn unvisited(&self, c: &Container) -> ContainerView {
        bare_view(
            c,
            self.policy.effective(&c.meta),
            Vec::new(),
            vec!["not observed yet".to_owned()],
        )
    }
}
