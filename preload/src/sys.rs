//! The interposer's contact with the dynamic loader and the OS.
//!
//! Invariant: nothing in this library calls `dlsym` by name. The library
//! exports its own `dlsym`, so a by-name call would come back to the hook;
//! every lookup goes through [`real_dlsym`], the C library's `dlsym` found
//! with `dlvsym`.

use std::ffi::{CStr, c_char, c_void};

use std::sync::atomic::{AtomicUsize, Ordering};
use tessera_region::layout::start;

/// The C library's `dlsym` (0 until [`init_real_dlsym`] found it). Read by
/// the `dlsym` hook's assembly.
pub static TESSERA_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Finds the C library's `dlsym` (idempotent) and returns it.
pub fn init_real_dlsym() -> usize {
    let cur = TESSERA_REAL_DLSYM.load(Ordering::Acquire);
    if cur != 0 {
        return cur;
    }
    // glibc ≥ 2.34 keeps dlsym in libc at GLIBC_2.34; older ones in libdl
    // at GLIBC_2.2.5 (x86_64) or GLIBC_2.17 (aarch64).
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17", c"GLIBC_2.0"] {
        // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated names; RTLD_NEXT
        // resolves relative to this library, whose successors include libc.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !p.is_null() {
            TESSERA_REAL_DLSYM.store(p as usize, Ordering::Release);
            return p as usize;
        }
    }
    0
}

/// Looks `name` up in `handle` with the C library's `dlsym`.
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let f = init_real_dlsym();
    if f == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: f is the C library's dlsym (found above); name is
    // NUL-terminated; dlsym accepts any handle value and reports failure
    // by returning NULL.
    unsafe {
        let f: DlsymFn = std::mem::transmute::<usize, DlsymFn>(f);
        f(handle, name.as_ptr())
    }
}

/// `RTLD_DL_LINKMAP` (glibc's `dlfcn.h`): `dladdr1` also returns the
/// object's link map.
const RTLD_DL_LINKMAP: libc::c_int = 2;

/// The loaded object holding address `addr`: its link map's address,
/// the loader's identity of one loaded object (the same file loaded twice
/// is two objects); `None` when the loader does not know the address.
pub fn object_at(addr: usize) -> Option<usize> {
    // SAFETY: Dl_info is plain data; zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 accepts any address and writes `info` and `map` (a
    // `struct link_map *`, with RTLD_DL_LINKMAP) only on success.
    let found =
        unsafe { libc::dladdr1(addr as *const c_void, &mut info, &mut map, RTLD_DL_LINKMAP) };
    (found != 0 && !map.is_null()).then_some(map as usize)
}

/// The identity (as [`object_at`] gives it) of the object behind `dlopen` handle
/// `handle`; 0 if the loader cannot say.
pub fn object_of_handle(handle: *mut c_void) -> usize {
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: handle came from dlopen and was never closed; RTLD_DI_LINKMAP
    // writes one `struct link_map *` into `map`.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *mut c_void).cast(),
        )
    };
    if rc == 0 { map as usize } else { 0 }
}

/// `dlopen(name, RTLD_NOW | RTLD_NOLOAD)`: the handle of `name` if it is
/// already loaded (one more reference), NULL otherwise. Loads nothing;
/// the failure's `dlerror` message is consumed, so a program's own
/// `dlerror` check after a `dlsym` does not see it.
pub fn dlopen_loaded(name: &CStr) -> *mut c_void {
    // SAFETY: name is NUL-terminated; dlopen reports failure as NULL.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        // SAFETY: dlerror takes no arguments; the string it returns is
        // not used.
        unsafe { libc::dlerror() };
    }
    h
}

/// Makes a lookup of `name` fail the way a missing symbol does, leaving
/// its `dlerror` message (a version no object defines, so nothing is
/// found).
pub fn fail_lookup(name: &CStr) {
    // SAFETY: dlvsym with RTLD_DEFAULT and NUL-terminated strings; it
    // reports failure by returning NULL and setting the dlerror message.
    unsafe {
        libc::dlvsym(
            libc::RTLD_DEFAULT,
            name.as_ptr(),
            c"TESSERA_NO_DLSYM".as_ptr(),
        );
    }
}

/// `dlopen(name, RTLD_NOW)`; NULL when it cannot be loaded.
pub fn dlopen(name: &CStr) -> *mut c_void {
    // SAFETY: name is NUL-terminated; dlopen reports failure as NULL.
    unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) }
}

/// `CLOCK_MONOTONIC` in ns (vDSO: no syscall).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_MONOTONIC_COARSE` (ns): the same clock as [`monotonic_ns`],
/// behind it by less than [`coarse_resolution_ns`], and several times
/// cheaper to read (no hardware counter). Not inlined: the call into the
/// C library is the same either way, and a small launch fast path is what
/// lets its thread-local access inline into the hook.
#[inline(never)]
pub fn coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; an unknown clock leaves it zero.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The tick of `CLOCK_MONOTONIC_COARSE` (ns), if the kernel has it.
pub fn coarse_resolution_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// Runs `f` when the process exits normally (`exit`, return from `main`).
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: registers a handler that lives as long as the process (the
    // preloaded library is never unloaded).
    unsafe {
        libc::atexit(f);
    }
}

/// This process's pid (a syscall; only on slow paths).
pub fn getpid() -> u32 {
    std::process::id()
}

/// `(state, start time)` parsed from the bytes of a `/proc/<pid>/stat`
/// (the command name may hold any bytes, so no UTF-8 is assumed).
fn parse_stat(bytes: &[u8]) -> Option<(u8, u64)> {
    let close = bytes.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&bytes[close + 1..]).ok()?;
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some((*f.first()?.as_bytes().first()?, f.get(19)?.parse().ok()?))
}

/// `(state, start time)` of `pid`, or `Err(true)` if the process does not
/// exist and `Err(false)` if `/proc` could not say.
fn proc_stat_checked(pid: u32) -> Result<(u8, u64), bool> {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(bytes) => parse_stat(&bytes).ok_or(false),
        Err(e) => Err(matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH))),
    }
}

/// `(state, start time)` of `pid` from `/proc/<pid>/stat`.
pub fn start_time(pid: u32) -> Option<u64> {
    proc_stat_checked(pid).ok().map(|(_, t)| t)
}

/// The tag of this process's pid namespace (the inode of
/// `/proc/self/ns/pid`), or 0 when `/proc` cannot say. Read each time: a
/// child forked after `unshare(CLONE_NEWPID)` is in another namespace.
pub fn pid_ns_tag() -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| start::tag_of_inode(m.ino()))
}

/// Whether the owner of a usage slot, `pid` with start word `word`, may
/// still be running, judged by a process whose pid namespace has tag
/// `mine`: a slot of another namespace is never judged dead here (its pid
/// names another process, or none, in this one), only by its own
/// namespace's processes or by the agent; the others as [`alive`] says.
pub fn slot_owner_alive(mine: u32) -> impl Fn(u32, u64) -> bool {
    move |pid, word| {
        let theirs = start::tag(word);
        if theirs != 0 && mine != 0 && theirs != mine {
            return true;
        }
        alive(pid, start::ticks(word))
    }
}

/// Whether `pid`, started at `start_time` (0 = unknown), may still be
/// running. Only proof of absence counts as dead: the pid is gone, its
/// start time differs (a recycled pid), or it is a zombie with no thread
/// left (a thread-group leader shows Z while other threads still run and
/// still hold the process's GPU memory). When `/proc` cannot tell, the
/// process is assumed alive: wrongly freeing a live process's bytes would
/// let the container exceed its limit.
pub fn alive(pid: u32, start_time: u64) -> bool {
    match proc_stat_checked(pid) {
        Ok((state, start)) => {
            if start_time != 0 && start != start_time {
                return false;
            }
            match state {
                b'Z' | b'X' | b'x' => std::fs::read_dir(format!("/proc/{pid}/task"))
                    .map(|d| d.count() > 1)
                    .unwrap_or(false),
                _ => true,
            }
        }
        Err(gone) => !gone,
    }
}

/// Registers fork handlers: `prepare` before `fork`, `parent` and `child`
/// after it in each process.
pub fn at_fork(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) {
    // SAFETY: registers handlers; they only take and release this
    // library's own locks and store atomics.
    unsafe {
        libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot of another pid namespace is never judged dead here; one of
    /// this namespace (or untagged) is judged by its pid and start time.
    #[test]
    fn only_slots_of_this_pid_namespace_are_judged() {
        let mine = pid_ns_tag();
        assert_ne!(mine, 0, "/proc/self/ns/pid is readable");
        let other = if mine == start::MAX_TAG { 1 } else { mine + 1 };
        let judge = slot_owner_alive(mine);
        // No process has pid 0x7fff_fff0 (above pid_max).
        let gone = 0x7fff_fff0;
        assert!(judge(gone, start::word(other, 5)), "another namespace's");
        assert!(!judge(gone, start::word(mine, 5)));
        assert!(!judge(gone, 5), "untagged: as before");
        let me = getpid();
        let t = start_time(me).unwrap();
        assert!(judge(me, start::word(mine, t)));
        assert!(!judge(me, start::word(mine, t + 1)), "a reused pid");
    }

    #[test]
    fn code_addresses_are_attributed_to_their_object() {
        let in_libc = libc::getpid as *const () as usize;
        let libc_obj = object_at(in_libc).unwrap();
        assert_eq!(object_at(libc::close as *const () as usize), Some(libc_obj));
        assert_eq!(object_at(0), None);
        // The same object whether found by address or by handle, and
        // another one for code elsewhere.
        let h = dlopen_loaded(c"libc.so.6");
        assert!(!h.is_null());
        assert_eq!(object_of_handle(h), libc_obj);
        let here = code_addresses_are_attributed_to_their_object as *const () as usize;
        assert_ne!(object_at(here).unwrap(), libc_obj);
        assert!(dlopen_loaded(c"libtessera-not-loaded.so.9").is_null());
    }
}
