//! `cuInit` and entry-point lookup.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use super::hook;
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::{CUDA_INITIALIZED, Mode, mode};
use std::sync::atomic::Ordering;

/// Replaces the entry point the driver handed out for `symbol` with our
/// hook for the same variant, if we hook it (see `proc_table.rs`).
///
/// # Safety
/// `symbol` is a NUL-terminated string; `pfn` is NULL or points to a
/// function pointer the real call wrote.
unsafe fn swap(symbol: *const c_char, version: c_int, flags: c_ulonglong, pfn: *mut *mut c_void) {
    if pfn.is_null() || symbol.is_null() {
        return;
    }
    // SAFETY: per the contract.
    let name = unsafe { std::ffi::CStr::from_ptr(symbol) }.to_bytes();
    if let Some(h) = crate::proc_table::hook_for(name, version, flags) {
        // SAFETY: per the contract, pfn is valid for writing.
        unsafe { *pfn = h as *mut c_void };
    }
}

hook! {
    /// Sets up the limits (or refuses, fail closed) before the driver.
    fn cuInit(flags: c_uint) {
        match mode() {
            Mode::Refuse(_) => CUDA_ERROR_NOT_PERMITTED,
            Mode::PassThrough => real_cuda!(cuInit(flags)),
            Mode::Enforce(_) => {
                let rc = real_cuda!(cuInit(flags));
                if rc == CUDA_SUCCESS {
                    CUDA_INITIALIZED.store(true, Ordering::Relaxed);
                }
                rc
            }
        }
    }

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: c_ulonglong) {
        let rc = real_cuda!(cuGetProcAddress(symbol, pfn, version, flags));
        if rc == CUDA_SUCCESS && !matches!(mode(), Mode::PassThrough) {
            // SAFETY: the caller's contract: symbol is a NUL-terminated
            // name and pfn a valid output argument, which the successful
            // real call wrote.
            unsafe { swap(symbol, version, flags, pfn) };
        }
        rc
    }

    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: c_ulonglong,
        status: *mut c_int,
    ) {
        let rc = real_cuda!(cuGetProcAddress_v2(symbol, pfn, version, flags, status));
        if rc == CUDA_SUCCESS && !matches!(mode(), Mode::PassThrough) {
            // SAFETY: the caller's contract: symbol is a NUL-terminated
            // name and pfn a valid output argument, which the successful
            // real call wrote.
            unsafe { swap(symbol, version, flags, pfn) };
        }
        rc
    }
}
