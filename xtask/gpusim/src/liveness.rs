//! Whether the processes holding channels still run, without reading
//! `/proc` on every query.
//!
//! A reap asks about every active channel's process, and queries reap every
//! time (`sim.rs`), so a process polling NVML would otherwise open, read and
//! parse `/proc/<pid>/stat` for each channel of each GPU it asks about. A
//! [`Liveness`] (one per [`Sim`](crate::Sim), so per calling process) keeps
//! a pidfd per process it has been asked about instead:
//!
//! - the first question about `(pid, start time)` opens a pidfd for `pid`
//!   and only then confirms through `/proc` ([`procfs::alive`]) that `pid`
//!   is the process started at that time and still running; the fd then
//!   refers to that very process, whatever later happens to the pid;
//! - later questions are a zero-timeout `poll` of the fd, which turns
//!   readable once the process's thread group has exited (zombies
//!   included), plus an `fstat` proving the fd number still names the file
//!   it was opened as;
//! - a channel whose pid was reused is recorded with the old start time, so
//!   its key still names the old process's fd (readable: dead); the new
//!   process, if it attaches, has a key of its own.
//!
//! The answer is the one [`procfs::alive`] gives: a pidfd that turned
//! readable is confirmed through `/proc` (once per death), and a pidfd that
//! has not cannot belong to an exited process. `/proc` is also what the
//! cache falls back to whenever it cannot help: `pidfd_open` fails (old kernel,
//! seccomp, `EMFILE`), the cache is full, or its lock is busy (another
//! thread of this process is reaping, or this is a forked child that
//! inherited it locked). A forked child otherwise keeps using the inherited
//! fds: they refer to the same processes.
//!
//! Bounds: at most [`MAX_CACHED`] fds, and at most an eighth of the
//! process's open-file limit, so the simulator never takes the descriptors
//! its host program needs. An entry is dropped (its fd closed) as soon as
//! its process is found dead, and otherwise once no GPU's latest reap found
//! its process holding a channel.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, TryLockError};

use crate::{procfs, sys};

/// Most pidfds one [`Liveness`] keeps open.
pub const MAX_CACHED: usize = 256;

/// GPUs whose reaps an entry can remember (the state holds at most
/// [`MAX_GPUS`](crate::layout::MAX_GPUS)); reaps of others go to `/proc`.
const GPU_BITS: usize = u64::BITS as usize;

/// One process known to be alive when its fd was opened.
struct Entry {
    fd: OwnedFd,
    /// `(st_dev, st_ino)` of the pidfd when it was opened.
    identity: (u64, u64),
    /// Bit `g`: the latest reap of GPU `g` found the process on a channel.
    gpus: u64,
    /// The last pass that asked about it.
    pass: u64,
}

#[derive(Default)]
struct Cache {
    /// Keyed by (pid, start time), as channels record their owner.
    entries: HashMap<(i32, u64), Entry>,
    /// Passes started so far.
    passes: u64,
}

/// A per-process cache of pidfds answering "is this channel's owner alive".
pub struct Liveness {
    cache: Mutex<Cache>,
    capacity: usize,
}

impl Default for Liveness {
    fn default() -> Self {
        Self::new()
    }
}

impl Liveness {
    /// A cache sized for this process: [`MAX_CACHED`] fds, or an eighth of
    /// its open-file limit if that is less.
    pub fn new() -> Self {
        let capacity =
            sys::open_files_limit().map_or(MAX_CACHED, |n| (n / 8).min(MAX_CACHED as u64) as usize);
        Self::with_capacity(capacity)
    }

    /// A cache of at most `capacity` fds (0: always ask `/proc`).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            cache: Mutex::new(Cache::default()),
            capacity,
        }
    }

    /// Starts the checks of one reap of `gpu`; the processes it is not
    /// asked about are taken to have left `gpu` when it ends.
    pub fn pass(&self, gpu: usize) -> Pass<'_> {
        let cache = if gpu < GPU_BITS {
            match self.cache.try_lock() {
                Ok(c) => Some(c),
                // Only fds and plain numbers inside: usable as they are.
                Err(TryLockError::Poisoned(p)) => {
                    self.cache.clear_poison();
                    Some(p.into_inner())
                }
                Err(TryLockError::WouldBlock) => None,
            }
        } else {
            None
        };
        let mut pass = Pass {
            cache,
            bit: 1u64 << (gpu % GPU_BITS),
            capacity: self.capacity,
            number: 0,
        };
        if let Some(c) = pass.cache.as_mut() {
            c.passes += 1;
            pass.number = c.passes;
        }
        pass
    }

    /// Pidfds held now.
    pub fn cached(&self) -> usize {
        match self.cache.lock() {
            Ok(c) => c.entries.len(),
            Err(p) => p.into_inner().entries.len(),
        }
    }
}

/// The liveness checks of one reap of one GPU.
pub struct Pass<'a> {
    /// `None`: the cache is busy or unusable; every answer comes from `/proc`.
    cache: Option<MutexGuard<'a, Cache>>,
    bit: u64,
    capacity: usize,
    number: u64,
}

impl Pass<'_> {
    /// Whether `pid`, started at `start_time`, still runs: exactly
    /// [`procfs::alive`]'s answer.
    pub fn alive(&mut self, pid: i32, start_time: u64) -> bool {
        let Some(cache) = self.cache.as_mut() else {
            return procfs::alive(pid, start_time);
        };
        if pid <= 0 {
            return false;
        }
        let key = (pid, start_time);
        if let Some(e) = cache.entries.get_mut(&key) {
            let fd = e.fd.as_fd();
            if sys::file_identity(fd).ok() == Some(e.identity) {
                match sys::pidfd_exited(fd) {
                    Ok(false) => {
                        e.pass = self.number;
                        return true;
                    }
                    // Dead for good: that process cannot come back. A
                    // death is rare, so `/proc` has the last word on it:
                    // a verdict of dead is always exactly `/proc`'s.
                    Ok(true) => {
                        cache.entries.remove(&key);
                        return procfs::alive(pid, start_time);
                    }
                    // Not a pidfd after all: ask again below.
                    Err(_) => {}
                }
            }
            // Someone closed the fd and its number now names another file:
            // forget it without closing that file.
            if let Some(e) = cache.entries.remove(&key) {
                sys::abandon_fd(e.fd);
            }
        }
        if cache.entries.len() >= self.capacity {
            return procfs::alive(pid, start_time);
        }
        let Ok(fd) = sys::pidfd_open(pid) else {
            return procfs::alive(pid, start_time);
        };
        // Confirmed after the open: if `pid` is the recorded process now, it
        // was when the fd was opened (it started before and has not been
        // reaped), so the fd refers to it.
        if !procfs::alive(pid, start_time) {
            return false;
        }
        let Ok(identity) = sys::file_identity(fd.as_fd()) else {
            return true;
        };
        cache.entries.insert(
            key,
            Entry {
                fd,
                identity,
                gpus: 0,
                pass: self.number,
            },
        );
        true
    }
}

impl Drop for Pass<'_> {
    /// Records which processes this GPU's reap found and drops (closing
    /// their fds) those that no GPU's latest reap found.
    fn drop(&mut self) {
        let (bit, number) = (self.bit, self.number);
        if let Some(cache) = self.cache.as_mut() {
            cache.entries.retain(|_, e| {
                if e.pass == number {
                    e.gpus |= bit;
                } else {
                    e.gpus &= !bit;
                }
                e.gpus != 0
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> (i32, u64) {
        (sys::getpid(), procfs::self_start_time())
    }

    #[test]
    fn a_live_process_is_cached_once_and_dropped_when_no_gpu_has_it() {
        let live = Liveness::with_capacity(8);
        let (pid, start) = me();
        for gpu in [0, 1] {
            let mut p = live.pass(gpu);
            assert!(p.alive(pid, start));
            assert!(p.alive(pid, start), "asked twice in one pass");
        }
        assert_eq!(live.cached(), 1, "one fd per process, not per GPU");
        // GPU 0 no longer has it; GPU 1 still does.
        drop(live.pass(0));
        assert_eq!(live.cached(), 1);
        drop(live.pass(1));
        assert_eq!(live.cached(), 0);
    }

    #[test]
    fn a_wrong_start_time_is_dead_and_not_cached() {
        let live = Liveness::with_capacity(8);
        let (pid, start) = me();
        let mut p = live.pass(0);
        assert!(!p.alive(pid, start + 1));
        assert!(!p.alive(-1, 0));
        drop(p);
        assert_eq!(live.cached(), 0);
    }

    #[test]
    fn without_room_or_lock_the_answer_comes_from_proc() {
        let (pid, start) = me();
        let none = Liveness::with_capacity(0);
        assert!(none.pass(0).alive(pid, start));
        assert!(!none.pass(0).alive(pid, start + 1));
        assert_eq!(none.cached(), 0);
        let live = Liveness::with_capacity(8);
        let held = live.pass(0);
        let mut busy = live.pass(1);
        assert!(busy.alive(pid, start));
        assert!(!busy.alive(pid, start + 1));
        drop(busy);
        drop(held);
        assert_eq!(live.cached(), 0);
    }

    #[test]
    fn an_fd_closed_behind_the_cache_is_not_trusted_nor_closed_again() {
        use std::os::fd::AsRawFd;
        let live = Liveness::with_capacity(8);
        let (pid, start) = me();
        assert!(live.pass(0).alive(pid, start));
        let raw = {
            let c = live.cache.lock().unwrap();
            c.entries[&(pid, start)].fd.as_raw_fd()
        };
        // The host program closes the fd and its number comes to name a
        // regular file, which always polls readable (dup2 does both at
        // once, so no other test thread takes the number in between).
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        sys::replace_fd(file.as_raw_fd(), raw);
        assert!(
            live.pass(0).alive(pid, start),
            "the regular file was read as an exit"
        );
        // The number still names the file: the cache did not close it.
        assert_eq!(
            sys::raw_fd_identity(raw).unwrap(),
            sys::file_identity(file.as_fd()).unwrap()
        );
        sys::close_raw_fd(raw);
        assert_eq!(live.cached(), 1, "a fresh pidfd replaced the stale entry");
    }

    #[test]
    fn a_process_whose_leader_exited_lives_until_its_last_thread_does() {
        /// Kills and waits for the child, also when an assertion fails.
        struct Child(Option<i32>);
        impl Drop for Child {
            fn drop(&mut self) {
                if let Some(pid) = self.0.take() {
                    sys::kill_and_wait(pid);
                }
            }
        }
        let mut child = Child(Some(sys::fork_with_leader_gone()));
        let pid = child.0.unwrap();
        // Until the leader has gone: Z, with the other thread still listed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let start = loop {
            let s = procfs::stat(pid).expect("the child is there");
            let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
            if s.state == 'Z' && threads == 2 {
                break s.start_time;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the leader did not exit"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        let live = Liveness::with_capacity(8);
        assert!(procfs::alive(pid, start), "/proc: a thread still runs");
        assert!(
            live.pass(0).alive(pid, start),
            "first question (pidfd opened)"
        );
        assert_eq!(live.cached(), 1);
        assert!(live.pass(0).alive(pid, start), "cached pidfd");
        if let Some(pid) = child.0.take() {
            sys::kill_and_wait(pid);
        }
        assert!(
            !live.pass(0).alive(pid, start),
            "cached pidfd, all threads gone"
        );
        assert!(!procfs::alive(pid, start));
        assert_eq!(live.cached(), 0);
    }
}
