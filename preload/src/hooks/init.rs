//! `cuInit` and entry-point lookup.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use super::hook;
use crate::accounting::real_cuda;
use crate::ffi::*;
use crate::real;
use crate::state::{Mode, mode};

/// Replaces a real entry point handed out by the driver with our hook for
/// the same variant, if we hook it.
///
/// # Safety
/// `pfn` is NULL or points to a function pointer the real call wrote.
unsafe fn swap(pfn: *mut *mut c_void) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: per the contract, pfn is valid for reading and writing.
    unsafe {
        let p = *pfn;
        if !p.is_null()
            && let Some(h) = real::hook_for_real(p as usize)
        {
            *pfn = h as *mut c_void;
        }
    }
}

hook! {
    /// Sets up the limits (or refuses, fail closed) before the driver.
    fn cuInit(flags: c_uint) {
        match mode() {
            Mode::Refuse(_) => CUDA_ERROR_NOT_PERMITTED,
            _ => real_cuda!(cuInit(flags)),
        }
    }

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: c_ulonglong) {
        let rc = real_cuda!(cuGetProcAddress(symbol, pfn, version, flags));
        if rc == CUDA_SUCCESS && !matches!(mode(), Mode::PassThrough) {
            swap(pfn);
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
            swap(pfn);
        }
        rc
    }
}
