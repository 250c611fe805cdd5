//! Host memory for managed and pinned allocations.

use std::ptr::NonNull;

/// Maps `len` bytes of zeroed, lazily backed host memory.
pub fn map(len: usize) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        None
    } else {
        NonNull::new(p.cast())
    }
}

/// Unmaps memory obtained from [`map`].
///
/// # Safety
/// `ptr`/`len` must come from one [`map`] call, and nothing may use the
/// memory afterwards.
pub unsafe fn unmap(ptr: *mut u8, len: usize) {
    // SAFETY: per the caller's contract.
    unsafe {
        libc::munmap(ptr.cast(), len.max(1));
    }
}

/// Registers `child` to run in the child after `fork`.
pub fn at_fork_child(child: extern "C" fn()) {
    // SAFETY: registers a handler that only stores to an atomic.
    unsafe {
        libc::pthread_atfork(None, None, Some(child));
    }
}

/// The start address of the loaded object holding `addr` (0: none).
fn object_base(addr: *const libc::c_void) -> usize {
    // SAFETY: Dl_info is plain data; zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr accepts any address and writes `info` only on success.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

/// Whether `dlsym`, called from this library on its own handle (opened by
/// its SONAME, as a driver looking up its own entry points would), answers
/// `name` with a function of this library; `None` if the lookup fails.
pub fn looks_up_itself(name: &std::ffi::CStr) -> Option<bool> {
    // SAFETY: NUL-terminated SONAME; RTLD_NOLOAD only finds this library,
    // which is loaded (this code runs in it); the reference is given back
    // below.
    let own = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if own.is_null() {
        return None;
    }
    // SAFETY: a live handle and a NUL-terminated name.
    let f = unsafe { libc::dlsym(own, name.as_ptr()) };
    // SAFETY: the reference taken above; this library stays loaded (the
    // program's own reference).
    unsafe { libc::dlclose(own) };
    if f.is_null() {
        return None;
    }
    let me = looks_up_itself as *const libc::c_void;
    Some(object_base(f) == object_base(me))
}

/// The calling thread's `pthread_t`, cut to its low 32 bits (as the CUDA
/// runtime's integrity check hashes it).
pub fn thread_id_word() -> u32 {
    // SAFETY: pthread_self has no preconditions.
    (unsafe { libc::pthread_self() }) as u32
}
