//! Host processes described once: a process's pid in its own namespace
//! and its start time never change while it lives, so the daemon reads
//! `/proc/<pid>/status` and `/stat` once per process and afterwards only
//! asks the process's pidfd whether it has exited (one `poll`, no file).
//!
//! Invariant: an entry is answered from the cache only while its pidfd
//! says the process it was opened on has not exited, and the entry was
//! read from procfs after the pidfd was opened and checked again after
//! the read — so the cached description is of the process the pidfd
//! holds, and that process still owns the pid (a pid is not reused
//! before its process is reaped, and an exited process reads as exited).
//! Pidfds name processes of the agent's own pid namespace, so the cache
//! is used only when the configured proc root is this process's
//! `/proc`; with another root (or where `pidfd_open` fails: an old
//! kernel, no fd left) every lookup reads procfs as before.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::process::{Pid, PidfdFlags, pidfd_open};

use super::pids::{ProcInfo, proc_info};

/// Most processes remembered (each holds one file descriptor).
pub const MAX_ENTRIES: usize = 4096;

/// Lookups of host processes, remembered by pid (see the module docs).
#[derive(Debug)]
pub struct ProcCache {
    proc_root: PathBuf,
    /// Whether pidfds name the processes of `proc_root`.
    pidfds: bool,
    /// By host pid: the description, its pidfd, the round last used.
    entries: HashMap<u32, (ProcInfo, OwnedFd, u64)>,
    /// Rounds so far ([`Self::end_round`]).
    round: u64,
}

/// Whether the process `fd` was opened on has exited (zombies included).
fn exited(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    match poll(&mut fds, Some(&Timespec::default())) {
        Ok(0) => false,
        Ok(_) => !fds[0].revents().is_empty(),
        // Cannot tell: take it as gone, so the next lookup reads procfs.
        Err(_) => true,
    }
}

impl ProcCache {
    /// The `/proc` it reads host processes from.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// A cache over `proc_root`.
    pub fn new(proc_root: &Path) -> Self {
        Self {
            pidfds: proc_root == Path::new("/proc"),
            proc_root: proc_root.to_path_buf(),
            entries: HashMap::new(),
            round: 0,
        }
    }

    /// Host process `pid`, or `None` if it is gone.
    pub fn info(&mut self, pid: u32) -> Option<ProcInfo> {
        if let Some((info, fd, used)) = self.entries.get_mut(&pid) {
            if !exited(fd) {
                *used = self.round;
                return Some(*info);
            }
            self.entries.remove(&pid);
        }
        let pidfd = self
            .pidfds
            .then(|| Pid::from_raw(i32::try_from(pid).ok()?))
            .flatten()
            .filter(|_| self.entries.len() < MAX_ENTRIES)
            .and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
        let info = proc_info(&self.proc_root, pid)?;
        if let Some(fd) = pidfd
            && !exited(&fd)
        {
            self.entries.insert(pid, (info, fd, self.round));
        }
        Some(info)
    }

    /// Ends a round of lookups (a period): processes not looked up in the
    /// last `keep` rounds are forgotten (their containers left, or are
    /// visited seldom) and their descriptors closed.
    pub fn end_round(&mut self, keep: u64) {
        let round = self.round;
        self.entries
            .retain(|_, (_, _, used)| round.saturating_sub(*used) < keep);
        self.round += 1;
    }

    /// Processes remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn sleeper() -> std::process::Child {
        Command::new("sleep")
            .arg("30")
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_live_process_is_described_as_procfs_says_and_remembered() {
        let mut child = sleeper();
        let pid = child.id();
        let mut cache = ProcCache::new(Path::new("/proc"));
        let first = cache.info(pid).unwrap();
        assert_eq!(Some(first), proc_info(Path::new("/proc"), pid));
        assert_eq!(cache.len(), 1, "pidfd_open works on this kernel");
        assert_eq!(cache.info(pid), Some(first));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn an_exited_process_is_gone_at_once_even_when_remembered() {
        let mut child = sleeper();
        let pid = child.id();
        let mut cache = ProcCache::new(Path::new("/proc"));
        assert!(cache.info(pid).is_some());
        child.kill().unwrap();
        // Not reaped yet: a zombie still has /proc/<pid>, but it exited.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the zombie's /proc entry is there"
        );
        let zombie = cache.info(pid);
        assert_eq!(
            cache.len(),
            0,
            "the exited process is not answered from the cache"
        );
        // procfs still describes the zombie (as the old code did); once
        // reaped, nothing.
        assert_eq!(zombie, proc_info(Path::new("/proc"), pid));
        child.wait().unwrap();
        assert_eq!(cache.info(pid), None);
    }

    #[test]
    fn entries_not_looked_up_are_forgotten_after_keep_rounds() {
        let mut child = sleeper();
        let pid = child.id();
        let mut cache = ProcCache::new(Path::new("/proc"));
        cache.info(pid).unwrap();
        cache.end_round(3);
        cache.end_round(3);
        assert_eq!(cache.len(), 1);
        cache.end_round(3);
        cache.end_round(3);
        assert!(cache.is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A process exits and a new one gets its pid: the remembered
    /// description must not be answered for the newcomer.
    #[test]
    fn a_reused_pid_is_described_afresh() {
        const NS_LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";
        if !rustix::process::geteuid().is_root() {
            println!("skipped: writing {NS_LAST_PID} needs root");
            return;
        }
        let mut first = sleeper();
        let pid = first.id();
        let mut cache = ProcCache::new(Path::new("/proc"));
        let old = cache.info(pid).unwrap();
        first.kill().unwrap();
        first.wait().unwrap();
        // Other processes fork too: try until a new child gets the pid,
        // at least one clock tick later (start times count ticks).
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut second = None;
        for _ in 0..200 {
            std::fs::write(NS_LAST_PID, (pid - 1).to_string()).unwrap();
            let mut c = sleeper();
            if c.id() == pid {
                second = Some(c);
                break;
            }
            c.kill().unwrap();
            c.wait().unwrap();
        }
        let Some(mut second) = second else {
            panic!("no child got pid {pid} in 200 tries");
        };
        let new = cache.info(pid).unwrap();
        assert_eq!(Some(new), proc_info(Path::new("/proc"), pid));
        assert_ne!(
            new.start_time, old.start_time,
            "{old:?} answered for the new process"
        );
        second.kill().unwrap();
        second.wait().unwrap();
    }

    #[test]
    fn another_proc_root_is_read_every_time() {
        let cache = ProcCache::new(Path::new("/host/proc"));
        assert!(!cache.pidfds);
    }
}
