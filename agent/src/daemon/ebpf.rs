//! The eBPF observer in the daemon: started when configured and possible
//! (root, the object loads), never fatal; each period it watches every
//! managed container's cgroup (and forgets removed ones), copies the
//! processes registered in the usage regions into the kernel's
//! registration map, and reads the counts, the memory estimate and the
//! processes reported as bypassing.
//!
//! A bypass report is a candidate, not a verdict: the agent copies a
//! registration at most one period after the preload made it, so a
//! process's first ioctl may be reported before its registration arrived.
//! The watchdog acts only on reported processes that still have no usage
//! slot ([`crate::watchdog::detect`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::containers::ContainerId;
use crate::ebpf::devices::DeviceError;
use crate::ebpf::{BypassEvents, Observer, ObserverConfig, ObserverError, Snapshot};
use crate::error_chain::with_causes;
use crate::watchdog::{EbpfSetting, WatchdogSettings};

use crate::view::EbpfView;

/// Most cgroup directories below a container's cgroup whose ids count as
/// its own.
const MAX_SUBTREE: usize = 256;

/// One container as the observer needs it.
pub struct Member<'a> {
    /// Its id.
    pub id: &'a ContainerId,
    /// Its cgroup directory (absolute), if any.
    pub cgroup: Option<&'a Path>,
    /// Host pids of its processes that have a usage slot.
    pub registered: Vec<u32>,
    /// Host pids of all its processes.
    pub pids: Vec<u32>,
}

/// What the observer saw of one container this period.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Counts for the view.
    pub view: EbpfView,
    /// Estimated live video memory of its processes (requested bytes).
    pub estimate_bytes: u64,
    /// Its processes reported as bypassing and still alive.
    pub bypass: Vec<u32>,
}

struct Running {
    observer: Observer,
    events: BypassEvents,
    /// Watched cgroup id per container.
    watched: HashMap<ContainerId, (PathBuf, u64)>,
    registered: HashSet<u32>,
    /// Bypass events per watched cgroup id (cumulative).
    events_by_cgroup: HashMap<u64, u64>,
    mode: String,
}

/// The daemon's observer, or why there is none.
pub struct DaemonEbpf {
    state: Result<Running, NoObserver>,
}

/// Why the daemon runs without an eBPF observer.
#[derive(Debug, thiserror::Error)]
pub enum NoObserver {
    /// The settings turn it off.
    #[error("off (watchdog.ebpf = \"off\")")]
    Off,
    /// Loading programs needs root.
    #[error("not root")]
    NotRoot,
    /// The object file is not there.
    #[error("no ebpf object at {} (cargo xtask build builds it)", .0.display())]
    NoObject(PathBuf),
    /// The NVIDIA devices to watch could not be found.
    #[error("no devices to watch")]
    Devices(#[source] DeviceError),
    /// Loading, attaching or reading the observer failed.
    #[error(transparent)]
    Observer(#[from] ObserverError),
}

fn cgroup_ids(dir: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if out.len() >= MAX_SUBTREE {
            break;
        }
        if let Ok(id) = crate::cgroup::cgroup_id(&d) {
            out.push(id);
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    out
}

impl DaemonEbpf {
    /// Starts the observer as `settings` say, on cgroup v2 root
    /// `cgroup_root` (for the open audit).
    pub fn start(settings: &WatchdogSettings, cgroup_root: Option<&Path>) -> Self {
        let state = match settings.ebpf {
            EbpfSetting::Off => Err(NoObserver::Off),
            _ => Self::try_start(settings, cgroup_root),
        };
        match &state {
            Ok(r) => tracing::info!(mode = %r.mode, "ebpf observer running"),
            Err(why) if settings.ebpf == EbpfSetting::Required => {
                tracing::error!(reason = %with_causes(why), "the required ebpf observer is not running; NVML-based detection goes on");
            }
            Err(why) => {
                tracing::info!(reason = %with_causes(why), "ebpf observer off; NVML-based detection goes on")
            }
        }
        Self { state }
    }

    fn try_start(
        settings: &WatchdogSettings,
        cgroup_root: Option<&Path>,
    ) -> Result<Running, NoObserver> {
        if !rustix::process::geteuid().is_root() {
            return Err(NoObserver::NotRoot);
        }
        if !settings.ebpf_object.exists() {
            return Err(NoObserver::NoObject(settings.ebpf_object.clone()));
        }
        let devices = settings.resolve_devices().map_err(NoObserver::Devices)?;
        let config = ObserverConfig::new(settings.ebpf_object.clone(), devices);
        let mut observer = Observer::start(&config)?;
        let mut mode = observer.mode().to_string();
        if let Some(root) = cgroup_root {
            match observer.audit_opens(root) {
                Ok(audit) => mode.push_str(&format!(", open audit {audit:?}")),
                Err(e) => {
                    tracing::warn!(error = %with_causes(&e), "ebpf open audit off: opens are not counted");
                    mode.push_str(", no open audit");
                }
            }
        }
        let events = observer.bypass_events()?;
        Ok(Running {
            observer,
            events,
            watched: HashMap::new(),
            registered: HashSet::new(),
            events_by_cgroup: HashMap::new(),
            mode,
        })
    }

    /// `running (<mode>)` or why not, for the view.
    pub fn status(&self) -> String {
        match &self.state {
            Ok(r) => format!("running ({})", r.mode),
            Err(why) => with_causes(why),
        }
    }

    /// One period over the managed containers: what it saw of each (none
    /// without an observer).
    pub fn period(&mut self, members: &[Member<'_>]) -> HashMap<ContainerId, Seen> {
        let Ok(r) = &mut self.state else {
            return HashMap::new();
        };
        // Watch new cgroups, unwatch removed ones.
        let wanted: HashMap<&ContainerId, &Path> = members
            .iter()
            .filter_map(|m| m.cgroup.map(|c| (m.id, c)))
            .collect();
        let gone: Vec<ContainerId> = r
            .watched
            .iter()
            .filter(|(id, (dir, _))| wanted.get(id).is_none_or(|d| d != dir))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some((dir, cg)) = r.watched.remove(&id)
                && let Err(e) = r.observer.unwatch_cgroup(cg)
            {
                tracing::warn!(cgroup = %dir.display(), error = %with_causes(&e), "cannot unwatch cgroup");
            }
        }
        for (id, dir) in &wanted {
            if r.watched.contains_key(*id) {
                continue;
            }
            match crate::cgroup::cgroup_id(dir) {
                Ok(cg) => match r.observer.watch_cgroup(cg) {
                    Ok(()) => {
                        tracing::info!(container = %id, cgroup = %dir.display(), "ebpf watching cgroup");
                        r.watched.insert((*id).clone(), (dir.to_path_buf(), cg));
                    }
                    Err(e) => {
                        tracing::warn!(cgroup = %dir.display(), error = %with_causes(&e), "cannot watch cgroup");
                    }
                },
                Err(e) => tracing::debug!(error = %with_causes(&e), "cgroup not there yet"),
            }
        }
        // Registrations: exactly the live processes with a slot.
        let now: HashSet<u32> = members
            .iter()
            .flat_map(|m| m.registered.iter().copied())
            .collect();
        for &t in now.difference(&r.registered) {
            if let Err(e) = r.observer.register_tgid(t) {
                tracing::warn!(tgid = t, error = %with_causes(&e), "cannot register process");
            }
        }
        for &t in r.registered.difference(&now) {
            let _ = r.observer.unregister_tgid(t);
        }
        r.registered = now;
        for e in r.events.drain() {
            *r.events_by_cgroup.entry(e.watched_cgroup_id).or_default() += 1;
            tracing::debug!(tgid = e.tgid, comm = %e.comm, cgroup_id = e.cgroup_id, "ebpf bypass report");
        }
        let reported: HashSet<u32> = r
            .observer
            .reported_tgids()
            .map(|v| v.into_iter().collect())
            .unwrap_or_default();
        let snap = match r.observer.snapshot() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %with_causes(&e), "cannot read the ebpf maps");
                Snapshot::default()
            }
        };
        let mut out = HashMap::new();
        for m in members {
            let Some((dir, top)) = r.watched.get(m.id) else {
                continue;
            };
            let ids = cgroup_ids(dir);
            let ioctls = snap
                .ioctls
                .iter()
                .filter(|(k, _)| ids.contains(&k.cgroup_id))
                .map(|(_, n)| n)
                .sum();
            let opens = snap
                .opens
                .iter()
                .filter(|(k, _)| ids.contains(&k.cgroup_id))
                .map(|(_, n)| n)
                .sum();
            let estimate_bytes = snap
                .rm_procs
                .iter()
                .filter(|(tgid, p)| m.pids.contains(tgid) || ids.contains(&p.cgroup_id))
                .map(|(_, p)| p.live())
                .sum();
            out.insert(
                m.id.clone(),
                Seen {
                    view: EbpfView {
                        ioctls,
                        opens,
                        bypass_events: r.events_by_cgroup.get(top).copied().unwrap_or(0),
                    },
                    estimate_bytes,
                    bypass: m
                        .pids
                        .iter()
                        .copied()
                        .filter(|p| reported.contains(p))
                        .collect(),
                },
            );
        }
        out
    }
}
