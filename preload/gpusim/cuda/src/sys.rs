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
