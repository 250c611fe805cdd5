//! Pids across pid namespaces, as a driver reports them: in the caller's
//! own namespace.
//!
//! A process records itself (an [`Owner`]) under the pid it has in its own
//! pid namespace and that namespace's inode; in a container that pid is
//! often 1 and means nothing on the host. A reader ([`PidView`], one per
//! [`Sim`](crate::Sim)) turns an owner into what it can see:
//!
//! - same namespace: the recorded pid;
//! - another namespace: the process in the reader's `/proc` whose own
//!   namespace is the owner's (`/proc/<p>/ns/pid`, when the reader may
//!   read it), whose innermost pid (the last `NSpid:` field of
//!   `/proc/<p>/status`) is the recorded one and whose start time matches;
//!   found by one scan of `/proc`, then remembered (and checked against
//!   the start time at each use), so a query does not rescan;
//! - a reader in the initial namespace uses the owner's `init_pid` once
//!   someone there has found it (see `Sim`'s reap), so the host can name a
//!   container's process after it exits.
//!
//! Who may judge a process dead: a reader in its namespace (through its
//! pid), and a reader in the initial namespace, which sees every process:
//! for it an owner no scan finds is gone. A reader elsewhere (a sibling
//! container) cannot see the process and must leave it alone
//! ([`Seen::Hidden`]); like NVIDIA's driver, which lists only processes
//! it can translate into the caller's namespace, it omits it from process
//! lists.
//!
//! Start times are clock ticks after boot in every pid namespace (a time
//! namespace's boot-time offset would shift them; containers do not use
//! one).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use crate::layout::Owner;
use crate::{procfs, sys};

/// `PROC_PID_INIT_INO`: the inode of the initial pid namespace.
pub const PROC_PID_INIT_INO: u32 = 0xEFFF_FFFC;

/// Cached translations kept before the cache starts afresh.
const MAX_CACHED: usize = 4096;

/// The inode of `pid`'s pid namespace (`self` for this process), if this
/// process may read it.
pub fn namespace_of(pid: &str) -> Option<u32> {
    let meta = fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    u32::try_from(meta.ino()).ok()
}

/// This process's pid namespace inode (0 when unreadable).
pub fn own_namespace() -> u32 {
    namespace_of("self").unwrap_or(0)
}

/// The pids of a process in each pid namespace from the one of the
/// `/proc` it was read from down to its own (`NSpid:` of a `status` file).
pub fn parse_nspid(status: &str) -> Option<Vec<i32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Option<Vec<i32>> = line
        .split_ascii_whitespace()
        .map(|f| f.parse().ok())
        .collect();
    pids.filter(|p| !p.is_empty())
}

/// This process as it records itself.
pub fn me() -> Owner {
    let pid = sys::getpid();
    let pid_ns = own_namespace();
    Owner {
        pid,
        pid_ns,
        start_time: procfs::self_start_time(),
        init_pid: if pid_ns == PROC_PID_INIT_INO { pid } else { 0 },
        _reserved: 0,
    }
}

/// What a reader can tell of a recorded process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Its pid in the reader's namespace (whether it still runs is the
    /// liveness check's to say).
    Pid(i32),
    /// It has exited: the reader would see it if it ran.
    Gone,
    /// It runs in a namespace the reader cannot see into.
    Hidden,
}

/// One process's view of recorded pids.
pub struct PidView {
    own: u32,
    /// `(namespace, pid there, start time)` → the pid in this process's
    /// `/proc`, or `None`: no process of it there.
    cache: Mutex<HashMap<(u32, i32, u64), Option<i32>>>,
}

impl Default for PidView {
    fn default() -> Self {
        Self::new()
    }
}

impl PidView {
    /// The view of this process's pid namespace.
    pub fn new() -> Self {
        Self::with_namespace(own_namespace())
    }

    /// The view of a reader in namespace `own` (tests).
    pub fn with_namespace(own: u32) -> Self {
        Self {
            own,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The reader's namespace inode.
    pub fn namespace(&self) -> u32 {
        self.own
    }

    /// Whether the reader is in the initial pid namespace.
    pub fn is_initial(&self) -> bool {
        self.own == PROC_PID_INIT_INO
    }

    /// What this reader can tell of `o`.
    pub fn see(&self, o: &Owner) -> Seen {
        if o.pid <= 0 {
            return Seen::Gone;
        }
        // An owner or reader that could not read its namespace counts as
        // sharing it (one namespace for all, as without containers).
        if o.pid_ns == self.own || o.pid_ns == 0 || self.own == 0 {
            return Seen::Pid(o.pid);
        }
        if self.is_initial() && o.init_pid > 0 {
            return Seen::Pid(o.init_pid);
        }
        let key = (o.pid_ns, o.pid, o.start_time);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let found = match cache.get(&key) {
            // The pid a process has in a namespace is fixed for its life:
            // if the one found is no longer it, it has exited.
            Some(&Some(p)) => procfs::stat(p)
                .filter(|s| s.start_time == o.start_time)
                .map(|_| p),
            Some(&None) => None,
            None => {
                if cache.len() >= MAX_CACHED {
                    cache.clear();
                }
                let found = scan(o);
                cache.insert(key, found);
                found
            }
        };
        match found {
            Some(p) => Seen::Pid(p),
            // Found once and now gone; or never found by a reader that
            // sees every process.
            None if cache.get(&key).is_some_and(Option::is_some) || self.is_initial() => Seen::Gone,
            None => Seen::Hidden,
        }
    }
}

/// The process of `/proc` that `o` records, if this `/proc` shows it.
fn scan(o: &Owner) -> Option<i32> {
    let dir = fs::read_dir("/proc").ok()?;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Ok(p) = name.parse::<i32>() else { continue };
        let Ok(status) = fs::read_to_string(format!("/proc/{p}/status")) else {
            continue;
        };
        if parse_nspid(&status).and_then(|v| v.last().copied()) != Some(o.pid) {
            continue;
        }
        if procfs::stat(p).is_none_or(|s| s.start_time != o.start_time) {
            continue;
        }
        // Where the reader may look (same user, or privileged), the
        // namespace must be the recorded one; elsewhere pid and start time
        // tell it apart well enough.
        if namespace_of(name).is_some_and(|ns| ns != o.pid_ns) {
            continue;
        }
        return Some(p);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lists_outermost_first() {
        let status = "Name:\tsleep\nPid:\t4242\nNSpid:\t4242\t17\t1\nPPid:\t1\n";
        assert_eq!(parse_nspid(status), Some(vec![4242, 17, 1]));
        assert_eq!(parse_nspid("Name:\tx\n"), None);
        assert_eq!(parse_nspid("NSpid:\t\n"), None);
    }

    #[test]
    fn this_process_reads_its_own_status() {
        let status = fs::read_to_string("/proc/self/status").unwrap();
        let pids = parse_nspid(&status).unwrap();
        assert_eq!(pids[0], sys::getpid());
        assert_ne!(own_namespace(), 0);
    }

    #[test]
    fn same_namespace_is_taken_as_is() {
        let me = me();
        let view = PidView::new();
        assert_eq!(view.see(&me), Seen::Pid(me.pid));
        let other = Owner { pid: 77, ..me };
        assert_eq!(view.see(&other), Seen::Pid(77), "liveness judges it");
    }

    /// A reader that believes itself in another namespace finds this
    /// process by scanning `/proc`, and never rescans for it.
    #[test]
    fn another_namespace_is_found_by_nspid_and_start_time() {
        let me = me();
        let view = PidView::with_namespace(me.pid_ns ^ 1);
        let recorded = Owner { init_pid: 0, ..me };
        assert_eq!(view.see(&recorded), Seen::Pid(me.pid));
        assert_eq!(view.see(&recorded), Seen::Pid(me.pid), "cached");
        // A start time no process has: not visible from a sibling
        // namespace, gone for the initial one.
        let never = Owner {
            start_time: me.start_time + 1,
            ..recorded
        };
        assert_eq!(view.see(&never), Seen::Hidden);
        let init = PidView::with_namespace(PROC_PID_INIT_INO);
        let foreign = Owner {
            pid_ns: me.pid_ns ^ 1,
            ..never
        };
        assert_eq!(init.see(&foreign), Seen::Gone);
        assert_eq!(
            init.see(&Owner {
                init_pid: 5,
                ..foreign
            }),
            Seen::Pid(5)
        );
    }
}
