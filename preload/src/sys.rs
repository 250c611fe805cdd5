//! The interposer's contact with the dynamic loader and the OS.
//!
//! Invariant: nothing in this library calls `dlsym` by name. The library
//! exports its own `dlsym`, so a by-name call would come back to the hook;
//! every lookup goes through [`real_dlsym`], the C library's `dlsym` found
//! with `dlvsym`.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// Whether code address `addr` lies in a shared object whose file name
/// starts with one of `prefixes` (`libcuda.so`, say). False when the
/// loader does not know the address.
pub fn code_in_object(addr: usize, prefixes: &[&[u8]]) -> bool {
    // SAFETY: Dl_info is plain data; zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr accepts any address and writes `info` only on
    // success; dli_fname then points to a NUL-terminated string owned by
    // the loader that lives as long as the object stays loaded, which the
    // caller (code running in it) guarantees for this call.
    let name = unsafe {
        if libc::dladdr(addr as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return false;
        }
        CStr::from_ptr(info.dli_fname).to_bytes()
    };
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    prefixes.iter().any(|p| base.starts_with(p))
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
/// cheaper to read (no hardware counter).
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

/// Registers `child` to run in the child after `fork`.
pub fn at_fork_child(child: unsafe extern "C" fn()) {
    // SAFETY: registers a handler; the handler only touches atomics.
    unsafe {
        libc::pthread_atfork(None, None, Some(child));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_addresses_are_attributed_to_their_object() {
        let in_libc = libc::getpid as *const () as usize;
        assert!(code_in_object(in_libc, &[b"libc.so"]));
        assert!(!code_in_object(
            in_libc,
            &[b"libcuda.so", b"libnvidia-ml.so"]
        ));
        assert!(!code_in_object(0, &[b"libc.so"]));
    }
}
