//! Garbage collection of region directories whose container kubelet no
//! longer runs (the device plugin creates them; nothing else would
//! remove them).
//!
//! [`Collector::round`] weighs one PodResources answer against the
//! directories under the root. A directory is removed only when all of
//! these hold (each decision is logged with the directory and the reason):
//!
//! 1. its metadata is readable and valid and has a `pod_uid` (only the
//!    device plugin sets one: directories made by the CLI are never
//!    collected), a namespace, a pod and a container name; a malformed
//!    directory is reported, never removed;
//! 2. its last change (the change time of the directory and of its
//!    metadata) is older than [`GcSettings::grace`]: `Allocate` creates
//!    the directory before kubelet lists the container;
//! 3. the answering kubelet's socket was created more than
//!    [`GcSettings::settle`] ago: a kubelet that has just (re)started may
//!    answer before it knows its pods, typically with nothing;
//! 4. the same kubelet instance left the container out of every `List`
//!    for at least [`GcSettings::confirm`], in at least two answers in a
//!    row. A failed `List`, a new kubelet instance (its socket recreated)
//!    or a `List` naming the container starts the count again;
//! 5. no process uses it and kubelet has cleaned its pod up
//!    ([`crate::containers::live`]: the pod's cgroup, the container's cgroup, its usage
//!    slots, any process mapping its usage file);
//! 6. under the store's writer lock (the one `Store::add` holds; tried for
//!    at most about half a second, else the removal waits a round) the
//!    directory is still the one judged (same inode, same metadata file):
//!    it is renamed to a tombstone `.gc.<id>.<pid>.<n>` and then deleted, so a concurrent `Allocate` that recreates the same
//!    id gets a fresh directory that is never touched. A tombstone left by
//!    a crash is deleted at the next round (only the collector makes them,
//!    and only from directories judged dead).
//!
//! Matching is by (namespace, pod, container), the names `List` reports
//! (it carries no pod UID). A pod recreated under the same name keeps the
//! old directory until kubelet stops listing the name.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::containers::StoreError;
use crate::containers::id::ContainerId;
use crate::containers::live::{Probe, Verdict};
use crate::containers::meta::{META_FILE, Metadata};
use crate::containers::store::{Container, FileKey, Store, WriterLock, meta_key};

use super::podresources::{ContainerKey, Snapshot};
use super::socket::FileId;

/// Name prefix of a directory being deleted by the collector.
pub const TOMBSTONE_PREFIX: &str = ".gc.";

/// How much evidence a removal needs; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcSettings {
    /// A directory changed more recently than this is kept (rule 2).
    pub grace: Duration,
    /// A kubelet whose socket is younger than this is not believed about
    /// absences (rule 3).
    pub settle: Duration,
    /// How long a container must stay absent from `List` (rule 4).
    pub confirm: Duration,
}

impl Default for GcSettings {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(120),
            settle: Duration::from_secs(60),
            confirm: Duration::from_secs(60),
        }
    }
}

/// What kubelet said this round.
#[derive(Clone, Copy, Debug)]
pub enum Observation<'a> {
    /// `List` answered.
    Listed(&'a Snapshot),
    /// `List` failed (the reason, for the log): no evidence at all.
    Failed(&'a str),
}

/// Why a round counts no absence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoEvidence {
    /// kubelet's `List` failed.
    #[error("kubelet's List failed ({0}): no evidence this round")]
    ListFailed(String),
    /// kubelet's socket is younger than the settle time.
    #[error(
        "kubelet's socket is {up:.1?} old (settle {settle:?}): its absences are not believed yet"
    )]
    Unsettled {
        /// Its age.
        up: Duration,
        /// The settle time.
        settle: Duration,
    },
}

/// What was done with one entry of the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Left alone (a guard held).
    Kept,
    /// Removed.
    Removed,
    /// Left alone and reported: malformed or not understood.
    Reported,
}

/// One decision of a round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The entry's name under the root.
    pub name: String,
    /// Its path.
    pub dir: PathBuf,
    /// What was done.
    pub action: Action,
    /// Why.
    pub reason: String,
}

/// Identity of a directory as judged: its inode and its metadata file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DirIdent {
    dev: u64,
    ino: u64,
    meta: FileKey,
}

/// A container's run of absences from one kubelet's `List`.
#[derive(Clone, Copy, Debug)]
struct Streak {
    since: Instant,
    lists: u32,
    ident: DirIdent,
}

/// The garbage collector's state between rounds; see the module
/// documentation.
#[derive(Debug)]
pub struct Collector {
    store: Store,
    settings: GcSettings,
    probe: Probe,
    kubelet: Option<FileId>,
    streaks: HashMap<ContainerId, Streak>,
    /// (name, reason) of reports already logged at warning level.
    reported: HashSet<(String, String)>,
}

static TOMBSTONES: AtomicU64 = AtomicU64::new(0);

fn ident(dir: &Path) -> Option<DirIdent> {
    let m = std::fs::symlink_metadata(dir).ok()?;
    if !m.is_dir() {
        return None;
    }
    Some(DirIdent {
        dev: m.dev(),
        ino: m.ino(),
        meta: meta_key(dir)?,
    })
}

fn ctime(m: &std::fs::Metadata) -> SystemTime {
    let secs = u64::try_from(m.ctime()).unwrap_or(0);
    let nanos = u32::try_from(m.ctime_nsec()).unwrap_or(0).min(999_999_999);
    UNIX_EPOCH + Duration::new(secs, nanos)
}

/// The last change of `dir`: the later change time of the directory and
/// of its metadata file (`None` if neither can be read).
fn last_change(dir: &Path) -> Option<SystemTime> {
    [dir.to_path_buf(), dir.join(META_FILE)]
        .iter()
        .filter_map(|p| std::fs::symlink_metadata(p).ok())
        .map(|m| ctime(&m))
        .max()
}

fn key_of(meta: &Metadata) -> Option<ContainerKey> {
    Some(ContainerKey {
        namespace: meta.namespace.clone()?,
        pod: meta.pod.clone()?,
        container: meta.container.clone()?,
    })
}

fn age(now: SystemTime, then: SystemTime) -> Duration {
    // A time in the future (clock step) is age zero: the guard holds.
    now.duration_since(then).unwrap_or(Duration::ZERO)
}

/// How often, and how far apart, the store lock is tried before a
/// removal is deferred to the next round (the daemon holds it for a few
/// milliseconds each period).
const LOCK_TRIES: u32 = 25;
const LOCK_PAUSE: Duration = Duration::from_millis(20);

/// The store's writer lock if it comes free within about half a second;
/// never waits longer (a writer holding it for good must not wedge the
/// collector).
fn lock_briefly(store: &Store) -> Result<Option<WriterLock>, StoreError> {
    for _ in 1..LOCK_TRIES {
        if let Some(l) = store.try_lock()? {
            return Ok(Some(l));
        }
        std::thread::sleep(LOCK_PAUSE);
    }
    store.try_lock()
}

impl Collector {
    /// A collector of the directories of `store`.
    pub fn new(store: Store, settings: GcSettings, probe: Probe) -> Self {
        Self {
            store,
            settings,
            probe,
            kubelet: None,
            streaks: HashMap::new(),
            reported: HashSet::new(),
        }
    }

    /// The store collected.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// One round: weighs `observation` against the directories under the
    /// root now and removes those it proves dead; every decision is logged
    /// and returned.
    pub fn round(&mut self, observation: Observation<'_>) -> Vec<Decision> {
        let mut out = Vec::new();
        self.clear_tombstones(&mut out);
        let listing = match self.store.list() {
            Ok(l) => l,
            Err(e) => {
                out.push(Decision {
                    name: String::new(),
                    dir: self.store.root().to_path_buf(),
                    action: Action::Reported,
                    reason: format!(
                        "cannot list the region directories: {}",
                        crate::error_chain::with_causes(&e)
                    ),
                });
                self.log(&out);
                return out;
            }
        };
        for s in &listing.skipped {
            out.push(Decision {
                name: s.name.clone(),
                dir: self.store.root().join(&s.name),
                action: Action::Reported,
                reason: format!("not a usable region directory, left alone: {}", s.reason),
            });
        }
        let (now, now_sys) = (Instant::now(), SystemTime::now());
        let snapshot = self.evidence(observation, now_sys);
        let candidates = self.judge(&listing.containers, &snapshot, (now, now_sys), &mut out);
        self.remove_unused(candidates, &mut out);
        self.log(&out);
        out
    }

    /// The evidence `observation` gives this round (an error: no absence
    /// counts, and why); a failed `List`, a new kubelet instance or one
    /// not settled yet starts every count again (rules 3 and 4).
    fn evidence<'a>(
        &mut self,
        observation: Observation<'a>,
        now_sys: SystemTime,
    ) -> Result<&'a Snapshot, NoEvidence> {
        match observation {
            Observation::Failed(why) => {
                self.streaks.clear();
                self.kubelet = None;
                Err(NoEvidence::ListFailed(why.to_owned()))
            }
            Observation::Listed(s) => {
                if self.kubelet != Some(s.kubelet.socket) {
                    if self.kubelet.is_some() {
                        tracing::info!(
                            "a new kubelet answers PodResources: absences are counted anew"
                        );
                    }
                    self.streaks.clear();
                    self.kubelet = Some(s.kubelet.socket);
                }
                let up = age(now_sys, s.kubelet.since);
                if up < self.settings.settle {
                    self.streaks.clear();
                    Err(NoEvidence::Unsettled {
                        up,
                        settle: self.settings.settle,
                    })
                } else {
                    Ok(s)
                }
            }
        }
    }

    /// Weighs each listed container against `snapshot` (rules 1 to 4):
    /// those kept get their decision in `out`; those absent long enough
    /// are returned, with their key and streak, for the last check. The
    /// streaks of containers no longer listed are forgotten.
    fn judge<'c>(
        &mut self,
        containers: &'c [Container],
        snapshot: &Result<&Snapshot, NoEvidence>,
        now: (Instant, SystemTime),
        out: &mut Vec<Decision>,
    ) -> Vec<(&'c Container, ContainerKey, Streak)> {
        let mut seen = HashSet::new();
        let mut candidates = Vec::new();
        for c in containers {
            seen.insert(c.id.clone());
            match self.judge_one(c, snapshot, now) {
                Ok((key, streak)) => candidates.push((c, key, streak)),
                Err(d) => out.push(d),
            }
        }
        self.streaks.retain(|id, _| seen.contains(id));
        candidates
    }

    /// Rules 1 to 4 for container `c`: the decision to keep (or report)
    /// it, or its key and streak of absences when it passes them all.
    fn judge_one(
        &mut self,
        c: &Container,
        snapshot: &Result<&Snapshot, NoEvidence>,
        (now, now_sys): (Instant, SystemTime),
    ) -> Result<(ContainerKey, Streak), Decision> {
        let keep = |reason: String| Decision {
            name: c.id.as_str().to_owned(),
            dir: c.dir.clone(),
            action: Action::Kept,
            reason,
        };
        if c.meta.pod_uid.is_none() {
            return Err(keep(
                "no pod_uid (not made by the device plugin): never collected".into(),
            ));
        }
        let Some(key) = key_of(&c.meta) else {
            return Err(Decision {
                action: Action::Reported,
                ..keep("has a pod_uid but no namespace, pod or container name: cannot be matched with kubelet's list, left alone".into())
            });
        };
        let snap = snapshot
            .as_ref()
            .map_err(|why| keep(format!("{key}: {why}")))?;
        if snap.lists(&key) {
            self.streaks.remove(&c.id);
            return Err(keep(format!("kubelet lists {key}")));
        }
        let Some(id_now) = ident(&c.dir) else {
            return Err(keep(format!("{key}: changed while being looked at")));
        };
        let fresh = Streak {
            since: now,
            lists: 1,
            ident: id_now,
        };
        let streak = *self
            .streaks
            .entry(c.id.clone())
            .and_modify(|s| {
                if s.ident == id_now {
                    s.lists += 1;
                } else {
                    *s = fresh;
                }
            })
            .or_insert(fresh);
        let changed = last_change(&c.dir).unwrap_or(now_sys);
        let dir_age = age(now_sys, changed);
        if dir_age < self.settings.grace {
            return Err(keep(format!(
                "{key} not listed, but the directory is {dir_age:.1?} old (grace {:?})",
                self.settings.grace
            )));
        }
        let absent = now.duration_since(streak.since);
        if streak.lists < 2 || absent < self.settings.confirm {
            return Err(keep(format!(
                "{key} not listed in {} answer(s) over {absent:.1?} (needed: 2 and {:?})",
                streak.lists, self.settings.confirm
            )));
        }
        Ok((key, streak))
    }

    /// Rule 5 for the `candidates`, then rule 6 for those no process uses:
    /// their decisions go to `out`.
    fn remove_unused(
        &mut self,
        candidates: Vec<(&Container, ContainerKey, Streak)>,
        out: &mut Vec<Decision>,
    ) {
        if candidates.is_empty() {
            return;
        }
        let evidence = self.probe.gather();
        for (c, key, streak) in candidates {
            let d = match self.probe.verdict(&c.dir, &c.meta, &evidence) {
                Verdict::Alive(why) => Decision {
                    name: c.id.as_str().to_owned(),
                    dir: c.dir.clone(),
                    action: Action::Kept,
                    reason: format!("{key} not listed, but {why}"),
                },
                Verdict::Unused(remarks) => self.remove(&c.id, &c.dir, &key, streak, &remarks),
            };
            out.push(d);
        }
    }

    /// Removes `dir` if it is still the one judged (rule 6).
    fn remove(
        &mut self,
        id: &ContainerId,
        dir: &Path,
        key: &ContainerKey,
        streak: Streak,
        remarks: &[String],
    ) -> Decision {
        let decision = |action, reason| Decision {
            name: id.as_str().to_owned(),
            dir: dir.to_path_buf(),
            action,
            reason,
        };
        let lock = match lock_briefly(&self.store) {
            Ok(Some(l)) => l,
            Ok(None) => {
                return decision(
                    Action::Kept,
                    format!("{key} gone, but the store is busy: retried next round"),
                );
            }
            Err(e) => {
                return decision(
                    Action::Reported,
                    format!(
                        "{key} gone, but the store lock failed: {}",
                        crate::error_chain::with_causes(&e)
                    ),
                );
            }
        };
        if ident(dir) != Some(streak.ident) {
            drop(lock);
            self.streaks.remove(id);
            return decision(
                Action::Kept,
                format!("{key}: the directory was replaced meanwhile; judged anew"),
            );
        }
        let n = TOMBSTONES.fetch_add(1, Ordering::Relaxed);
        let tomb = self
            .store
            .root()
            .join(format!("{TOMBSTONE_PREFIX}{id}.{}.{n}", std::process::id()));
        let renamed = std::fs::rename(dir, &tomb);
        drop(lock);
        self.streaks.remove(id);
        if let Err(e) = renamed {
            return decision(
                Action::Reported,
                format!("{key} gone, but {} cannot be renamed: {e}", dir.display()),
            );
        }
        let mut reason = format!(
            "{key} not listed by kubelet for {:.1?} ({} answers) and no process uses it",
            streak.since.elapsed(),
            streak.lists
        );
        for r in remarks {
            reason.push_str("; ");
            reason.push_str(r);
        }
        if let Err(e) = std::fs::remove_dir_all(&tomb) {
            reason.push_str(&format!(
                "; its tombstone {} is deleted next round ({e})",
                tomb.display()
            ));
        }
        decision(Action::Removed, reason)
    }

    /// Deletes tombstones a previous round left.
    fn clear_tombstones(&self, out: &mut Vec<Decision>) {
        let Ok(entries) = std::fs::read_dir(self.store.root()) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(TOMBSTONE_PREFIX) {
                continue;
            }
            let path = e.path();
            let (action, reason) = match std::fs::remove_dir_all(&path) {
                Ok(()) => (
                    Action::Removed,
                    "a tombstone left by an earlier round".to_owned(),
                ),
                Err(e) => (Action::Reported, format!("cannot delete tombstone: {e}")),
            };
            out.push(Decision {
                name,
                dir: path,
                action,
                reason,
            });
        }
    }

    fn log(&mut self, decisions: &[Decision]) {
        for d in decisions {
            match d.action {
                Action::Removed => {
                    tracing::info!(dir = %d.dir.display(), reason = %d.reason, "region directory removed")
                }
                Action::Kept => {
                    tracing::debug!(dir = %d.dir.display(), reason = %d.reason, "region directory kept")
                }
                Action::Reported => {
                    if self.reported.insert((d.name.clone(), d.reason.clone())) {
                        tracing::warn!(dir = %d.dir.display(), reason = %d.reason, "region directory left alone");
                    } else {
                        tracing::debug!(dir = %d.dir.display(), reason = %d.reason, "region directory left alone");
                    }
                }
            }
        }
        if self.reported.len() > 4096 {
            self.reported.clear();
        }
    }
}
