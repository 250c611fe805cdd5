//! The simulator's only contact with the OS beyond `std`: shared mappings,
//! process-shared robust mutexes, clocks, ioctls and liveness probes
//! (pidfds).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

/// A shared, read-write mapping of a whole file.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; all access to it goes through
// atomics or the robust mutexes it contains.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` shared and read-write.
    pub fn map(file: &File, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping at an address of the kernel's choosing;
        // the fd is valid for the call.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
        })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping made by `map` and not yet
        // unmapped; no references into it outlive `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Initialises a process-shared, robust, error-checking mutex in place.
///
/// # Safety
/// `m` must point to writable memory for a `pthread_mutex_t` that no other
/// thread or process uses yet.
pub unsafe fn mutex_init(m: *mut libc::pthread_mutex_t) -> io::Result<()> {
    let mut attr = std::mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
    // SAFETY: attr is initialised by pthread_mutexattr_init before use and
    // destroyed after; `m` is valid per the caller's contract.
    unsafe {
        check(libc::pthread_mutexattr_init(attr.as_mut_ptr()))?;
        let a = attr.as_mut_ptr();
        let r = check(libc::pthread_mutexattr_setpshared(
            a,
            libc::PTHREAD_PROCESS_SHARED,
        ))
        .and_then(|_| {
            check(libc::pthread_mutexattr_setrobust(
                a,
                libc::PTHREAD_MUTEX_ROBUST,
            ))
        })
        // Normal, not error-checking: glibc's check compares the holder's
        // thread id with the caller's, and processes in different pid
        // namespaces (two containers' main threads, both tid 1) share
        // numbers. A thread locking a GPU it already holds is told by
        // `mutex_lock` itself (see `HELD`).
        .and_then(|_| {
            check(libc::pthread_mutexattr_settype(
                a,
                libc::PTHREAD_MUTEX_NORMAL,
            ))
        })
        .and_then(|_| check(libc::pthread_mutex_init(m, a)));
        libc::pthread_mutexattr_destroy(a);
        r
    }
}

/// Outcome of locking a robust mutex.
#[derive(Debug, PartialEq, Eq)]
pub enum Locked {
    /// Acquired normally.
    Clean,
    /// The previous owner died holding it; it is now consistent again.
    OwnerDied,
}

/// Longest a waiter sleeps on a robust mutex before it looks at it again.
///
/// glibc's robust mutexes can lose a wake-up when processes die: the waiter
/// an unlock (or the kernel's owner-died handling) wakes inherits the duty
/// of re-arming `FUTEX_WAITERS` for the sleepers behind it. If it is
/// SIGKILLed after being woken and before it takes the lock, while a
/// newcomer holds the lock (glibc's fast path takes a free mutex without
/// that bit), the kernel's exit handling sees a live owner and wakes
/// nobody; the newcomer's unlock sees no waiters bit and wakes nobody
/// either. The mutex is then free and its sleepers sleep forever. Bounding
/// each sleep turns such a lost wake-up into a delay of at most this long.
pub const LOCK_WAIT_SLICE_NS: u64 = 10_000_000;

/// How long a waiter waits on a robust mutex before it looks at whether
/// its holder is stopped or frozen; far above any critical section of the
/// simulator's.
pub const SUSPENDED_HOLDER_NS: u64 = 250_000_000;

/// How long a driver call waits while a lock's holder stays stopped or
/// frozen ([`Patience::Driver`]).
pub const DRIVER_PATIENCE_NS: u64 = 30_000_000_000;

/// How a caller treats a lock whose holder is stopped or frozen.
///
/// The real driver's locks live in the kernel, where a task is never
/// stopped or frozen while it holds one, so neither a driver call nor an
/// NVML query ever waits for a frozen process; the simulator's locks live
/// in the processes' shared memory. A node agent freezes a container's
/// cgroup (the throttle: for a second or so at a time, again and again)
/// and may catch one of its processes inside a critical section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patience {
    /// A driver call (`libcuda`): waits while the holder stays suspended,
    /// up to [`DRIVER_PATIENCE_NS`], since a throttled holder is thawed
    /// again; failing would end the caller's work, which a frozen
    /// neighbour must not cause.
    Driver,
    /// A monitoring query (NVML, the agent's): gives up once the holder
    /// has been suspended [`SUSPENDED_HOLDER_NS`] into the wait, and at
    /// once while the same holder still is (this process gave up on it
    /// before), so a node agent's period is not held by a process it
    /// froze.
    Monitor,
}

thread_local! {
    static PATIENCE: std::cell::Cell<Patience> = const { std::cell::Cell::new(Patience::Driver) };
}

/// Runs `f` with this thread's locks taken with `p`.
pub fn with_patience<T>(p: Patience, f: impl FnOnce() -> T) -> T {
    let before = PATIENCE.with(|c| c.replace(p));
    let out = f();
    PATIENCE.with(|c| c.set(before));
    out
}

/// The (mutex address, holder) pairs this process gave up on.
static GAVE_UP: std::sync::Mutex<Vec<(usize, i32)>> = std::sync::Mutex::new(Vec::new());

fn gave_up(m: usize) -> Option<i32> {
    let list = GAVE_UP.lock().unwrap_or_else(|e| e.into_inner());
    list.iter().find(|(a, _)| *a == m).map(|(_, t)| *t)
}

fn set_gave_up(m: usize, tid: Option<i32>) {
    let mut list = GAVE_UP.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|(a, _)| *a != m);
    if let Some(t) = tid {
        list.push((m, t));
    }
}

/// glibc keeps a robust mutex's holder in its futex word (the mutex's
/// first 32 bits): the thread id in the low 30 bits, beside the waiters
/// and owner-died flags.
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// The thread id holding `m` (0: none).
///
/// # Safety
/// `m` must point to a mapped, initialised robust mutex.
pub(crate) unsafe fn holder(m: *mut libc::pthread_mutex_t) -> i32 {
    // SAFETY: the futex word is the first, 4-aligned u32 of a glibc mutex
    // and is only ever changed atomically (by glibc and the kernel), so an
    // atomic load of it is sound while the mutex stays mapped.
    let word = unsafe { std::sync::atomic::AtomicU32::from_ptr(m.cast::<u32>()) }
        .load(std::sync::atomic::Ordering::Relaxed);
    i32::try_from(word & FUTEX_TID_MASK).unwrap_or(0)
}

/// Why a robust mutex could not be locked.
#[derive(Debug)]
pub enum LockError {
    /// An owner died and the next one released it without making it
    /// consistent: it can never be locked again (`ENOTRECOVERABLE`).
    NotRecoverable,
    /// The holder is stopped or frozen, and was for longer than this
    /// caller's [`Patience`]: it may not let go for as long as someone
    /// keeps it so, and the caller gives up instead of waiting with it.
    HolderSuspended {
        /// The holder's thread id, as the mutex records it.
        tid: i32,
    },
    /// Any other failure.
    Os(io::Error),
}

/// Mutexes this thread holds through [`mutex_lock`] (0: a free slot): a
/// thread locking one again (say, from a signal handler) gets `EDEADLK`
/// instead of waiting for itself forever. Plain cells, so that a signal
/// handler interrupting an update finds them usable.
const HELD_SLOTS: usize = 8;

thread_local! {
    static HELD: [std::cell::Cell<usize>; HELD_SLOTS] =
        const { [const { std::cell::Cell::new(0) }; HELD_SLOTS] };
}

fn holds(m: usize) -> bool {
    HELD.try_with(|h| h.iter().any(|c| c.get() == m))
        .unwrap_or(false)
}

fn set_held(m: usize, held: bool) {
    let _ = HELD.try_with(|h| {
        let (from, to) = if held { (0, m) } else { (m, 0) };
        if let Some(c) = h.iter().find(|c| c.get() == from) {
            c.set(to);
        }
    });
}

/// Locks a robust mutex, recovering it if its owner died.
///
/// Never sleeps longer than [`LOCK_WAIT_SLICE_NS`] at a time (see there),
/// so a waiter cannot be stranded by a wake-up that died with its target.
/// A holder that is stopped or frozen is waited for as this thread's
/// [`Patience`] says ([`with_patience`]).
///
/// # Safety
/// `m` must point to a mutex initialised by [`mutex_init`] that stays mapped
/// while locked.
pub unsafe fn mutex_lock(m: *mut libc::pthread_mutex_t) -> Result<Locked, LockError> {
    let addr = m as usize;
    if holds(addr) {
        return Err(LockError::Os(io::Error::from_raw_os_error(libc::EDEADLK)));
    }
    // SAFETY: per the caller's contract.
    let locked = unsafe { mutex_lock_inner(m) };
    if locked.is_ok() {
        set_held(addr, true);
    }
    locked
}

/// [`mutex_lock`] once this thread is known not to hold `m`.
///
/// # Safety
/// As for [`mutex_lock`].
unsafe fn mutex_lock_inner(m: *mut libc::pthread_mutex_t) -> Result<Locked, LockError> {
    // Uncontended: no clock read, no syscall.
    // SAFETY: per the caller's contract.
    let mut rc = unsafe { libc::pthread_mutex_trylock(m) };
    let patience = PATIENCE.with(std::cell::Cell::get);
    let addr = m as usize;
    let (mut waited_ns, mut suspended_ns) = (0, 0);
    while rc == libc::EBUSY || rc == libc::ETIMEDOUT {
        if patience == Patience::Monitor
            && let Some(tid) = gave_up(addr)
            // SAFETY: per the caller's contract.
            && unsafe { holder(m) } == tid
            && crate::procfs::suspended(tid)
        {
            return Err(LockError::HolderSuspended { tid });
        }
        if waited_ns >= SUSPENDED_HOLDER_NS {
            // SAFETY: per the caller's contract.
            let tid = unsafe { holder(m) };
            if tid > 0 && crate::procfs::suspended(tid) {
                let limit = match patience {
                    Patience::Monitor => 0,
                    Patience::Driver => DRIVER_PATIENCE_NS,
                };
                if suspended_ns >= limit {
                    if patience == Patience::Monitor {
                        set_gave_up(addr, Some(tid));
                    }
                    return Err(LockError::HolderSuspended { tid });
                }
                suspended_ns += LOCK_WAIT_SLICE_NS;
            } else {
                // Running again (thawed): it lets go soon.
                suspended_ns = 0;
            }
        }
        // CLOCK_REALTIME is what pthread_mutex_timedlock takes: a clock
        // stepped back lengthens one wait, and only a wait whose wake-up
        // was lost.
        let deadline = timespec_after(libc::CLOCK_REALTIME, LOCK_WAIT_SLICE_NS);
        // SAFETY: per the caller's contract; deadline is a valid timespec.
        rc = unsafe { libc::pthread_mutex_timedlock(m, &deadline) };
        waited_ns += LOCK_WAIT_SLICE_NS;
    }
    if patience == Patience::Monitor
        && (rc == 0 || rc == libc::EOWNERDEAD)
        && gave_up(addr).is_some()
    {
        set_gave_up(addr, None);
    }
    match rc {
        0 => Ok(Locked::Clean),
        libc::EOWNERDEAD => {
            // SAFETY: EOWNERDEAD still acquires the mutex for us.
            let rc = unsafe { libc::pthread_mutex_consistent(m) };
            if rc != 0 {
                // Holding it forever would wedge every process; released
                // unmarked it becomes unrecoverable, which is reported.
                // SAFETY: this thread holds the mutex (see above).
                unsafe { libc::pthread_mutex_unlock(m) };
                return Err(LockError::Os(io::Error::from_raw_os_error(rc)));
            }
            Ok(Locked::OwnerDied)
        }
        libc::ENOTRECOVERABLE => Err(LockError::NotRecoverable),
        e => Err(LockError::Os(io::Error::from_raw_os_error(e))),
    }
}

/// `clock` now plus `ns`.
fn timespec_after(clock: libc::clockid_t, ns: u64) -> libc::timespec {
    let t = self::clock(clock).saturating_add(ns);
    libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    }
}

/// Unlocks a mutex locked by [`mutex_lock`] on this thread.
///
/// # Safety
/// The calling thread must hold `m`.
pub unsafe fn mutex_unlock(m: *mut libc::pthread_mutex_t) {
    set_held(m as usize, false);
    // SAFETY: per the caller's contract.
    unsafe {
        libc::pthread_mutex_unlock(m);
    }
}

/// Writes `tid` as the holder in `m`'s futex word, keeping its flags: what
/// a holder in another pid namespace whose thread has the same number as
/// one here looks like.
///
/// # Safety
/// `m` must point to a mapped robust mutex that the calling thread holds;
/// it must write its own tid back before unlocking.
#[cfg(test)]
pub unsafe fn set_holder(m: *mut libc::pthread_mutex_t, tid: i32) {
    // SAFETY: per the caller's contract (see `holder`).
    let word = unsafe { std::sync::atomic::AtomicU32::from_ptr(m.cast::<u32>()) };
    let flags = word.load(std::sync::atomic::Ordering::Relaxed) & !FUTEX_TID_MASK;
    word.store(
        flags | (tid as u32 & FUTEX_TID_MASK),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// This thread's id.
#[cfg(test)]
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// `CLOCK_MONOTONIC` in ns (shared by all processes on the host).
pub fn monotonic_ns() -> u64 {
    clock(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` in ns.
pub fn realtime_ns() -> u64 {
    clock(libc::CLOCK_REALTIME)
}

fn clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; these clocks always exist.
    unsafe {
        libc::clock_gettime(id, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Opens a device node read-write (close-on-exec).
pub fn open_device(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: c is a valid NUL-terminated string.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Issues `ioctl(fd, cmd, arg)`; the result is ignored by design (stand-in
/// devices answer ENOTTY), only the syscall matters.
///
/// # Safety
/// `arg` must point to at least as many readable and writable bytes as the
/// command encodes (or the command is served by a device that does not
/// touch them).
pub unsafe fn ioctl(fd: RawFd, cmd: u64, arg: *mut libc::c_void) -> i32 {
    // SAFETY: per the caller's contract.
    unsafe { libc::ioctl(fd, cmd as _, arg) }
}

/// Opens a pidfd for process `pid` (`pidfd_open(2)`; pidfds are always
/// close-on-exec). It keeps referring to that process after it exits, even
/// once its pid is reused.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: pidfd_open takes a pid and flags, touches no memory of ours
    // and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process behind pidfd `fd` has exited: a zero-timeout
/// `poll(POLLIN)`. A pidfd turns readable once the whole thread group has
/// exited, zombies (exited, not yet waited for) included.
pub fn pidfd_exited(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `p` is one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r >= 0 {
            if p.revents & libc::POLLNVAL != 0 {
                return Err(io::Error::from_raw_os_error(libc::EBADF));
            }
            return Ok(p.revents & (libc::POLLIN | libc::POLLHUP) != 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `(st_dev, st_ino)` of the file behind `fd` (`fstat(2)`, no path walk).
pub fn file_identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is a valid out-pointer for a struct stat; the fd is
    // borrowed, so open for the call.
    let r = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Ok((st.st_dev, st.st_ino))
}

/// Gives up ownership of `fd` without closing it: for a descriptor whose
/// number no longer names the file it was opened as (someone else closed
/// it and the number was reused), closing it would close that other file.
pub fn abandon_fd(fd: OwnedFd) {
    let _ = fd.into_raw_fd();
}

/// This process's soft limit on open files (`RLIMIT_NOFILE`), if known.
pub fn open_files_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-pointer for a struct rlimit.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// This process's effective user id (the owner of the files it creates).
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// This process's id.
pub fn getpid() -> i32 {
    std::process::id() as i32
}

/// Runs `f` in a forked child that then leaves with `_exit` (no unwinding,
/// no destructors, so whatever `f` holds stays held as at a crash); returns
/// the child's exit status (1 if `f` panicked).
#[cfg(test)]
pub fn in_child(f: impl FnOnce()) -> i32 {
    // SAFETY: the child only runs `f` (test code touching the shared
    // mapping it inherited) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        let code = i32::from(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err());
        // SAFETY: _exit ends this forked child at once.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child; status is a valid out-pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid: {}", io::Error::last_os_error());
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

/// Runs `f` in a forked child that then stops itself (`SIGSTOP`) with
/// whatever `f` holds still held; returns the child's pid once it is
/// stopped. The caller kills and reaps it.
#[cfg(test)]
pub fn stopped_child(f: impl FnOnce()) -> libc::pid_t {
    // SAFETY: the child only runs `f` (test code touching the shared
    // mapping it inherited), stops, and leaves with _exit if continued.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        f();
        // SAFETY: raise and _exit take no pointers; the child stops here
        // until killed, and ends at once if ever continued.
        unsafe {
            libc::raise(libc::SIGSTOP);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child to stop; status is a valid
    // out-pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
    assert_eq!(r, pid, "waitpid: {}", io::Error::last_os_error());
    assert!(
        libc::WIFSTOPPED(status),
        "the child did not stop: {status:#x}"
    );
    pid
}

/// Locks `m` and, if its owner had died, unlocks it without making it
/// consistent, as a careless recoverer would; returns what the lock said.
///
/// # Safety
/// As for [`mutex_lock`].
#[cfg(test)]
pub unsafe fn lock_and_abandon(m: *mut libc::pthread_mutex_t) -> i32 {
    // SAFETY: per the caller's contract.
    let rc = unsafe { libc::pthread_mutex_lock(m) };
    if rc == 0 || rc == libc::EOWNERDEAD {
        // SAFETY: this thread holds the mutex.
        unsafe { libc::pthread_mutex_unlock(m) };
    }
    rc
}

/// Makes fd number `to` a duplicate of `from` (`dup2`), closing what `to`
/// was, as a host program replacing a descriptor it does not own would.
#[cfg(test)]
pub fn replace_fd(from: RawFd, to: RawFd) {
    // SAFETY: dup2 only changes the fd table; both numbers are the test's.
    let r = unsafe { libc::dup2(from, to) };
    assert_eq!(r, to, "dup2: {}", io::Error::last_os_error());
}

/// `(st_dev, st_ino)` of whatever fd number `fd` names.
#[cfg(test)]
pub fn raw_fd_identity(fd: RawFd) -> io::Result<(u64, u64)> {
    // SAFETY: the borrow lasts for this call only; fstat of a closed
    // number fails with EBADF, it does not misbehave.
    file_identity(unsafe { BorrowedFd::borrow_raw(fd) })
}

/// Closes fd number `fd`, owned by the test.
#[cfg(test)]
pub fn close_raw_fd(fd: RawFd) {
    // SAFETY: the caller owns `fd` and uses it no more.
    unsafe { libc::close(fd) };
}

/// Forks a child whose main thread exits at once while a second thread
/// sleeps on: a process whose thread-group leader is a zombie although the
/// process runs. Returns its pid; the caller kills it and waits for it
/// ([`kill_and_wait`]).
#[cfg(test)]
pub fn fork_with_leader_gone() -> i32 {
    extern "C" fn sleeper(_: *mut libc::c_void) -> *mut libc::c_void {
        loop {
            // SAFETY: pause only waits for a signal.
            unsafe { libc::pause() };
        }
    }
    // SAFETY: the child only creates a thread and ends its own (no
    // allocation, no unwinding through Rust frames).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        let mut t = std::mem::MaybeUninit::<libc::pthread_t>::uninit();
        // SAFETY: `t` is a valid out-pointer; `sleeper` never returns.
        let rc = unsafe {
            libc::pthread_create(
                t.as_mut_ptr(),
                std::ptr::null(),
                sleeper,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            // SAFETY: _exit ends this forked child at once.
            unsafe { libc::_exit(1) };
        }
        // SAFETY: exit(2), not exit_group: only this thread ends.
        unsafe { libc::syscall(libc::SYS_exit, 0) };
    }
    pid
}

/// SIGKILLs our child `pid` and waits for it.
#[cfg(test)]
pub fn kill_and_wait(pid: i32) {
    // SAFETY: signals and waits for our own child; status is a valid
    // out-pointer.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
    }
}
