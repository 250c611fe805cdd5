//! The interposer's contact with the dynamic loader and the OS.
//!
//! Invariant: nothing in this library calls `dlsym` by name. The library
//! exports its own `dlsym`, so a by-name call would come back to the hook;
//! every lookup goes through [`real_dlsym`], the C library's `dlsym` found
//! with `dlvsym`.

use std::ffi::{CStr, c_char, c_int, c_void};
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

/// `dlopen(name, RTLD_NOW | extra)`; NULL when it cannot be loaded.
pub fn dlopen(name: &CStr, extra: c_int) -> *mut c_void {
    // SAFETY: name is NUL-terminated; dlopen reports failure as NULL.
    unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | extra) }
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

/// This process's pid (a syscall; only on slow paths).
pub fn getpid() -> u32 {
    std::process::id()
}

/// `(state, start time)` of `pid` from `/proc/<pid>/stat`.
pub fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some((f.first()?.chars().next()?, f.get(19)?.parse().ok()?))
}

/// Whether `pid`, started at `start_time` (0 = unknown), is running.
pub fn alive(pid: u32, start_time: u64) -> bool {
    match proc_stat(pid) {
        Some((state, start)) => {
            !matches!(state, 'Z' | 'X' | 'x') && (start_time == 0 || start == start_time)
        }
        None => false,
    }
}

/// Registers `child` to run in the child after `fork`.
pub fn at_fork_child(child: unsafe extern "C" fn()) {
    // SAFETY: registers a handler; the handler only touches atomics.
    unsafe {
        libc::pthread_atfork(None, None, Some(child));
    }
}
