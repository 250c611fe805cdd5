//! One control period: discover containers, refresh their processes,
//! sample usage (usage regions, NVML memory and SM samples), run one
//! [`GpuController`] tick per GPU of the node, write each control region
//! (memory limits from the metadata, launch rate and burst from the
//! controller; a write that changes nothing is skipped by the region).
//!
//! Parts: [`nvml`] (the node's GPUs and samples), [`schedule`] (which
//! containers a period visits), [`observe`] (usage regions and
//! processes), [`decide`] (the controllers), [`publish`] (control
//! regions, views, the watchdog). [`Agent::tick`] runs them in that order.
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
//! bypass in it. [`schedule`] holds these rules (and [`CALM_PERIODS`]
//! calm visits in a row before a container is quiet) as pure, unit-tested
//! functions; the tick reads what they are given. Whatever uses a GPU
//! shows in NVML, so a container that starts work is visited in the
//! period that sees it.
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
mod schedule;

pub use schedule::CALM_PERIODS;
use schedule::{Revisit, Schedule, busy_pids, process_set_changed, quiet};

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
    /// When it is visited again ([`schedule`]).
    schedule: Schedule,
    /// Its host processes then (NVML activity of any wakes it).
    host_pids: Vec<u32>,
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
    /// The first period in which its usage slots no cgroup member holds
    /// are judged again (a second after a pass that freed none).
    reclaim_from: u64,
}

/// NVML's side of the loop: the node's GPUs and what is kept between
/// their samples.
struct NvmlState {
    /// The daemon's one NVML (shared with the device plugin and the
    /// telemetry writer).
    shared: Arc<SharedNvml>,
    /// The node's GPUs (none until NVML lists them).
    gpus: Option<Gpus>,
    /// Why there are no GPUs (empty once there are).
    error: String,
    /// Start of each GPU's next SM sample window (µs).
    sm_since: HashMap<[u8; 16], u64>,
    /// Each GPU's memory totals (used, free) and the period they were
    /// read in.
    device_memory: HashMap<[u8; 16], ((u64, u64), u64)>,
    /// The SM sample query's buffer, kept between periods.
    sm_buf: Vec<nvml_wrapper_sys::bindings::nvmlProcessUtilizationSample_t>,
    /// The processes NVML listed on the node last period and their memory
    /// over all GPUs (a new or departed one wakes every quiet container).
    gpu_memory: HashMap<u32, u64>,
}

/// The containers under the root and what the loop keeps of each (a
/// cache of the host state).
struct Containers {
    store: Store,
    managed: HashMap<ContainerId, Managed>,
    /// Parsed `meta.json` files, re-read only when they change.
    meta_cache: MetaCache,
    /// Where containers' cgroups are (none: processes are known from
    /// usage regions only).
    cgroup_root: Option<PathBuf>,
    /// Host processes, described once each (`RefCell`: looked up while
    /// the period reads the rest of the loop's state).
    procs: std::cell::RefCell<ProcCache>,
    /// Usage regions are read into this buffer, one after the other.
    usage_buf: Vec<u8>,
    /// Skipped entries already logged (name → reason), to log changes only.
    reported: BTreeMap<String, String>,
}

/// The node policy.
struct PolicyState {
    /// The policy in force.
    in_force: Policy,
    /// The policy file, looked at once per period.
    file: Reloader,
    /// A policy set by [`Agent::set_policy`] since the last period (it
    /// wakes every quiet container, as a reloaded file does).
    set: bool,
}

impl PolicyState {
    /// Whether the policy changed since last period (reloaded from its
    /// file, or set).
    fn poll(&mut self) -> bool {
        self.file.poll(&mut self.in_force) | std::mem::take(&mut self.set)
    }
}

/// Enforcement beyond the control regions.
struct Enforcement {
    /// Ground truth against limits, and the policy's actions.
    watchdog: Watchdog,
    /// The eBPF observer, or why there is none.
    ebpf: DaemonEbpf,
}

/// The periods counted and the quiet containers' revisit interval.
struct Clock {
    /// Periods completed.
    periods: u64,
    /// Periods a quiet container goes unvisited.
    revisit: Revisit,
}

/// What woke quiet containers this period (see [`schedule`]).
struct Wake {
    /// Every one: the policy or the set of NVML's processes changed.
    all: bool,
    /// Those in which something happened ([`Agent::stirred`]).
    stirred: BTreeSet<ContainerId>,
}

impl Wake {
    /// Whether `s`, the schedule of container `id`, is due in `period`.
    fn due(&self, s: &Schedule, id: &ContainerId, period: u64) -> bool {
        s.due(period, self.all, self.stirred.contains(id))
    }

    /// Whether a visit of `id` is no more than the revisit `s` set.
    fn only_revisit(&self, s: &Schedule, id: &ContainerId) -> bool {
        s.only_revisit(self.all, self.stirred.contains(id))
    }
}

/// The loop's state.
pub struct Agent {
    /// NVML: the node's GPUs and their samples.
    nvml: NvmlState,
    /// The containers, and what the loop keeps of each.
    containers: Containers,
    /// The node policy.
    policy: PolicyState,
    /// One compute controller per GPU (by UUID).
    controllers: HashMap<[u8; 16], GpuController>,
    /// The watchdog and the eBPF observer.
    enforcement: Enforcement,
    /// The period count and the revisit interval.
    clock: Clock,
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
            nvml: NvmlState {
                shared: Arc::new(SharedNvml::new(config.nvml_lib.clone(), config.nvml_retry)),
                gpus: None,
                error: "not initialised yet".to_owned(),
                sm_since: HashMap::new(),
                device_memory: HashMap::new(),
                sm_buf: Vec::new(),
                gpu_memory: HashMap::new(),
            },
            enforcement: Enforcement {
                ebpf: DaemonEbpf::start(&config.watchdog, cgroup_root.as_deref()),
                watchdog: Watchdog::new(config.watchdog.clone()),
            },
            containers: Containers {
                store: Store::new(&config.root),
                managed: HashMap::new(),
                meta_cache: MetaCache::default(),
                cgroup_root,
                procs: std::cell::RefCell::new(ProcCache::new(&config.proc_root)),
                usage_buf: Vec::new(),
                reported: BTreeMap::new(),
            },
            policy: PolicyState {
                in_force: Policy::default(),
                file: Reloader::new(&config.policy, config.policy_explicit),
                set: false,
            },
            controllers: HashMap::new(),
            clock: Clock {
                periods: 0,
                revisit: Revisit::new(config.quiet_revisit, config.period),
            },
        }
    }

    /// Replaces the policy in force (for the policy file's loader; the
    /// watchdog tests set one directly).
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy.in_force = policy;
        self.policy.set = true;
    }

    /// The loop's NVML, for the other parts of the daemon to share.
    pub fn nvml(&self) -> Arc<SharedNvml> {
        self.nvml.shared.clone()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.containers.store
    }

    /// Runs one period and returns its view.
    pub fn tick(&mut self, status: &Status) -> View {
        let start = Instant::now();
        let policy_changed = self.policy.poll();
        let policy: PolicyView = self.policy.file.view(&self.policy.in_force);
        self.ensure_nvml(status);
        let sm = self.sample_sm();
        let memory = self.sample_gpus(&sm);
        let (changed, busy) = self.gpu_activity(&sm, &memory);
        let wake = Wake {
            all: changed || policy_changed,
            stirred: self.stirred(&busy),
        };
        let (ready, skipped) = self.list(&wake);
        // Observe every container due a visit, then decide per GPU, then
        // write.
        let (mut observed, seen) = self.observe_due(&ready, &wake);
        self.cut_short_unchanged_revisits(&ready, &mut observed, &seen, &wake);
        let per = self.per_container(&ready, &observed, &sm);
        let views = self.publish_all(&ready, per, observed, &seen, &memory, &sm);
        let view = View {
            period: self.clock.periods,
            root: self.containers.store.root().to_path_buf(),
            containers: views,
            skipped: skipped
                .into_iter()
                .map(|s| SkippedView {
                    name: s.name,
                    reason: s.reason,
                })
                .collect(),
            nvml: if self.nvml.gpus.is_some() {
                "ready".to_owned()
            } else {
                self.nvml.error.clone()
            },
            devices: self.devices(&memory, &sm),
            duration_us: start.elapsed().as_micros() as u64,
            ebpf: self.enforcement.ebpf.status(),
            policy,
        };
        // (A quiet container's processes outlive a few of its revisits.)
        self.containers
            .procs
            .get_mut()
            .end_round(3 * self.clock.revisit.periods() + 1);
        self.clock.periods += 1;
        view
    }

    /// The containers of this period, sorted by id, and the entries of the
    /// root skipped. A quiet container not due is taken as last visited,
    /// without a look at its directory; every revisit interval the root
    /// is read afresh whatever the schedules say.
    fn list(&mut self, wake: &Wake) -> (Vec<Container>, Vec<Skipped>) {
        let period = self.clock.periods;
        let managed = &self.containers.managed;
        let keep = |id: &ContainerId| {
            let l = managed.get(id)?.last.as_ref()?;
            (!wake.due(&l.schedule, id, period)).then(|| Container {
                id: id.clone(),
                dir: l.view.dir.clone(),
                meta: l.meta.clone(),
                meta_key: l.meta_key,
            })
        };
        let force = self.clock.revisit.forces_listing(period);
        let listed =
            self.containers
                .store
                .list_cached(&mut self.containers.meta_cache, force, keep);
        let (containers, mut skipped) = match listed {
            Ok(l) => (l.containers, l.skipped),
            Err(e) => {
                tracing::warn!(error = %with_causes(&e), "cannot list the container root");
                (Vec::new(), Vec::new())
            }
        };
        let ready = self.take_over(containers, &mut skipped);
        // (`ready` keeps the listing's order.)
        self.enforcement
            .watchdog
            .retain(|id| ready.binary_search_by(|c: &Container| c.id.cmp(id)).is_ok());
        self.report_skipped(&skipped);
        (ready, skipped)
    }

    /// Forgets the containers no longer listed and opens those new in
    /// `containers` (a restarted agent resumes every existing container
    /// here): those whose control region opens are ready, in the
    /// listing's order; the others are `skipped`.
    fn take_over(
        &mut self,
        containers: Vec<Container>,
        skipped: &mut Vec<Skipped>,
    ) -> Vec<Container> {
        // (The listing is sorted by id.)
        let listed = |id: &ContainerId| containers.binary_search_by(|c| c.id.cmp(id)).is_ok();
        self.containers.managed.retain(|id, _| listed(id));
        let mut ready = Vec::new();
        for c in containers {
            if !self.containers.managed.contains_key(&c.id) {
                match open_control_rw(&c.dir) {
                    Ok(control) => {
                        tracing::info!(id = %c.id, dir = %c.dir.display(), "managing container");
                        let since = self.clock.periods;
                        self.containers.managed.insert(
                            c.id.clone(),
                            Managed {
                                control,
                                usage: UsageFile::default(),
                                since,
                                last: None,
                                reclaim_from: 0,
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
        ready
    }

    fn report_skipped(&mut self, skipped: &[Skipped]) {
        let now: BTreeMap<String, String> = skipped
            .iter()
            .map(|s| (s.name.clone(), s.reason.clone()))
            .collect();
        for (name, reason) in &now {
            if self.containers.reported.get(name) != Some(reason) {
                tracing::warn!(entry = %name, %reason, "skipping an entry of the container root");
            }
        }
        self.containers.reported = now;
    }

    /// Observes every ready container due a visit (none: skipped), and
    /// runs the eBPF observer's period; a container skipped so far in
    /// which a bypass is reported is observed now.
    fn observe_due(
        &mut self,
        ready: &[Container],
        wake: &Wake,
    ) -> (Vec<Option<Observed>>, HashMap<ContainerId, Seen>) {
        let mut observed: Vec<Option<Observed>> = ready
            .iter()
            .map(|c| self.due(c, wake).then(|| self.observe_managed(c)))
            .collect();
        let seen = self.observe_ebpf(ready, &observed);
        // A bypass reported in a container skipped so far: visit it now.
        for (c, o) in ready.iter().zip(observed.iter_mut()) {
            if o.is_none() && seen.get(&c.id).is_some_and(|s| !s.bypass.is_empty()) {
                *o = Some(self.observe_managed(c));
            }
        }
        (observed, seen)
    }

    /// A quiet container looked at only because its revisit came, in
    /// which everything is as its last visit found it, stays quiet: its
    /// last view stands (see [`Found`]) and it is taken as not observed.
    fn cut_short_unchanged_revisits(
        &mut self,
        ready: &[Container],
        observed: &mut [Option<Observed>],
        seen: &HashMap<ContainerId, Seen>,
        wake: &Wake,
    ) {
        let (period, revisit) = (self.clock.periods, self.clock.revisit);
        for (c, o) in ready.iter().zip(observed.iter_mut()) {
            let (Some(ob), Some(m)) = (o.as_ref(), self.containers.managed.get_mut(&c.id)) else {
                continue;
            };
            let Some(l) = m.last.as_mut() else { continue };
            let s = seen.get(&c.id);
            let only_revisit = wake.only_revisit(&l.schedule, &c.id)
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
                l.schedule.revisited_unchanged(period, revisit);
                *o = None;
            }
        }
    }

    /// What every step reads of each ready container: its GPUs and policy
    /// (as its last visit left them when it is not observed), and the
    /// controllers' launch limits ([`Self::decide`]).
    fn per_container(
        &mut self,
        ready: &[Container],
        observed: &[Option<Observed>],
        sm: &HashMap<[u8; 16], SmSamples>,
    ) -> Vec<PerContainer> {
        let mut per: Vec<PerContainer> = ready
            .iter()
            .zip(observed)
            .map(|(c, o)| {
                let last = self
                    .containers
                    .managed
                    .get(&c.id)
                    .and_then(|m| m.last.as_ref())
                    .filter(|_| o.is_none());
                PerContainer {
                    uuids: last.map_or_else(|| c.meta.uuids(), |l| l.uuids.clone()),
                    policy: match last {
                        Some(l) => l.view.policy.clone(),
                        None => self.policy.in_force.effective(&c.meta),
                    },
                    decided: Vec::new(),
                }
            })
            .collect();
        let decisions = self.decide(ready, &per, observed, sm);
        for (p, d) in per.iter_mut().zip(decisions) {
            p.decided = d;
        }
        per
    }

    /// Every ready container's view: a skipped one's last view, an
    /// observed one's control region written, its view built, the
    /// watchdog's period run over it, and its visit recorded.
    fn publish_all(
        &mut self,
        ready: &[Container],
        per: Vec<PerContainer>,
        observed: Vec<Option<Observed>>,
        seen: &HashMap<ContainerId, Seen>,
        memory: &HashMap<[u8; 16], GpuLive>,
        sm: &HashMap<[u8; 16], SmSamples>,
    ) -> Vec<Arc<ContainerView>> {
        let nvml = by_pid(memory);
        // One writer of control regions at a time; a CLI call holding the
        // lock delays this period's writes to the next one.
        let lock = self.containers.store.try_lock().ok().flatten();
        let views = ready
            .iter()
            .zip(per)
            .zip(observed)
            .enumerate()
            .map(|(k, ((c, per), o))| {
                let Some(mut o) = o else {
                    // Skipped: its last view stands (`due` checked there is one).
                    return self
                        .containers
                        .managed
                        .get(&c.id)
                        .and_then(|m| m.last.as_ref())
                        .map(|l| l.view.clone())
                        .unwrap_or_else(|| Arc::new(self.unvisited(c)));
                };
                let (raw, usage) = (o.usage_raw.take(), o.usage.clone());
                let mut v = self.publish(c, &per, o, memory, sm, lock.as_ref());
                let s = seen.get(&c.id);
                self.enforce(c, &mut v, (raw.as_deref(), usage.as_ref()), &nvml, s);
                let v = Arc::new(v);
                self.record_visit(c, k, per.uuids, &v, (raw.as_deref(), usage.as_ref()), s);
                v
            })
            .collect();
        drop(lock);
        views
    }

    /// Keeps what the visit of `c` (`k`th in the listing) published, and
    /// when it is visited next ([`Schedule::after_visit`]).
    fn record_visit(
        &mut self,
        c: &Container,
        k: usize,
        uuids: Vec<[u8; 16]>,
        v: &Arc<ContainerView>,
        (raw, usage): (Option<&[u8]>, Option<&UsageSnapshot>),
        s: Option<&Seen>,
    ) {
        let settled = self.enforcement.watchdog.settled(&c.id);
        let (period, revisit) = (self.clock.periods, self.clock.revisit);
        let Some(m) = self.containers.managed.get_mut(&c.id) else {
            return;
        };
        let before = m.last.as_ref();
        let calm = quiet(v, before.map(|l| &*l.view), usage, s, settled);
        let schedule = Schedule::after_visit(before.map(|l| &l.schedule), calm, period, k, revisit);
        // (Only a quiet container's revisit compares.)
        let found = schedule
            .quiet()
            .then(|| Found::of(raw, usage, &v.processes, s, m.control.snapshot()));
        m.last = Some(LastVisit {
            view: v.clone(),
            uuids,
            meta: c.meta.clone(),
            meta_key: c.meta_key,
            schedule,
            host_pids: v.processes.iter().filter_map(|p| p.host_pid).collect(),
            found,
        });
    }

    /// This period's NVML activity: whether the set of processes on the
    /// node's GPUs changed since last period ([`process_set_changed`]),
    /// and the processes at work ([`busy_pids`]).
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
        let changed = process_set_changed(&now, &self.nvml.gpu_memory);
        let busy = busy_pids(sm, &now, &self.nvml.gpu_memory);
        self.nvml.gpu_memory = now;
        (changed, busy)
    }

    /// The quiet containers something happened in since their last visit:
    /// NVML shows one of their processes at work (`busy`), or — for those
    /// with processes, which may launch too little for NVML to notice —
    /// the launch counters at the head of their usage region moved (one
    /// read of the header and buckets, no decoding of the slots' bytes).
    fn stirred(&mut self, busy: &BTreeSet<u32>) -> BTreeSet<ContainerId> {
        let mut out = BTreeSet::new();
        let mut buf = std::mem::take(&mut self.containers.usage_buf);
        for (id, m) in &mut self.containers.managed {
            let Some(l) = &m.last else { continue };
            if !l.schedule.quiet() {
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
        self.containers.usage_buf = buf;
        out
    }

    /// Whether container `c` is visited this period: its schedule says so
    /// ([`Schedule::due`]), or its metadata changed, or it was never
    /// visited.
    fn due(&self, c: &Container, wake: &Wake) -> bool {
        match self
            .containers
            .managed
            .get(&c.id)
            .and_then(|m| m.last.as_ref())
        {
            None => true,
            Some(l) => {
                wake.due(&l.schedule, &c.id, self.clock.periods) || !Arc::ptr_eq(&l.meta, &c.meta)
            }
        }
    }

    /// Observes a managed container (its usage file kept open between
    /// periods, read into the shared buffer).
    fn observe_managed(&mut self, c: &Container) -> Observed {
        let mut buf = std::mem::take(&mut self.containers.usage_buf);
        let (mut file, mut reclaim_from) = self
            .containers
            .managed
            .get_mut(&c.id)
            .map(|m| (std::mem::take(&mut m.usage), m.reclaim_from))
            .unwrap_or_default();
        let o = self.observe(c, &mut buf, &mut file, &mut reclaim_from);
        if let Some(m) = self.containers.managed.get_mut(&c.id) {
            m.usage = file;
            m.reclaim_from = reclaim_from;
        }
        self.containers.usage_buf = buf;
        o
    }

    /// The view of a container no visit has described (not reached: a
    /// container is skipped only after a visit).
    fn unvisited(&self, c: &Container) -> ContainerView {
        bare_view(
            c,
            self.policy.in_force.effective(&c.meta),
            Vec::new(),
            vec!["not observed yet".to_owned()],
        )
    }
}

/// NVML's memory of each process, per GPU (what the watchdog holds
/// containers to).
fn by_pid(memory: &HashMap<[u8; 16], GpuLive>) -> HashMap<[u8; 16], GpuMemory> {
    memory
        .iter()
        .map(|(u, m)| {
            let mut by_pid = GpuMemory::new();
            for p in &m.processes {
                *by_pid.entry(p.pid).or_default() += p.used_memory_bytes.unwrap_or(0);
            }
            (*u, by_pid)
        })
        .collect()
}
