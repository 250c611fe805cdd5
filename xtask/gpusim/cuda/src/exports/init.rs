//! Initialisation, versions, error strings and entry-point lookup.

use std::ffi::{c_char, c_int, c_void};

use super::cu_export;
use super::ptr::{cstr, out, out_opt};
use crate::abi::*;
use crate::proc_address;
use crate::process;
use crate::status::{self, *};

/// Log callbacks registered so far (their handles are 1 to this).
static LOG_CALLBACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

cu_export! {
    fn cuInit(flags: u32) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        process::init().map(|_| ())
    }

    fn cuDriverGetVersion(version: *mut c_int) {
        let v = match process::get() {
            Ok(p) => p.sim.node().cuda_version,
            // Readable before cuInit: from the node cuInit would open (no
            // state file is created); the default node's if that is unusable.
            Err(_) => gpusim::state::Config::from_env()
                .effective_node()
                .unwrap_or_else(|_| gpusim::NodeDescription::default_node())
                .cuda_version,
        };
        // SAFETY: the caller's contract: `version` is NULL or points to a
        // writable `c_int`; `out` rejects NULL.
        unsafe { out(version, v) }
    }

    fn cuGetErrorString(code: CUresult, text: *mut *const c_char) {
        match status::description(code) {
            // SAFETY: the caller's contract: `text` is NULL or points to a
            // writable `*const c_char`; `out` rejects NULL.
            Some(s) => unsafe { out(text, s.as_ptr().cast()) },
            None => {
                // SAFETY: the caller's contract: `text` is NULL or points to a
                // writable `*const c_char`; `out_opt` skips NULL.
                unsafe { out_opt(text, std::ptr::null()) };
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    fn cuGetErrorName(code: CUresult, text: *mut *const c_char) {
        match status::name(code) {
            // SAFETY: the caller's contract: `text` is NULL or points to a
            // writable `*const c_char`; `out` rejects NULL.
            Some(s) => unsafe { out(text, s.as_ptr().cast()) },
            None => {
                // SAFETY: the caller's contract: `text` is NULL or points to a
                // writable `*const c_char`; `out_opt` skips NULL.
                unsafe { out_opt(text, std::ptr::null()) };
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
        // SAFETY: the caller's contract: `symbol` is NULL or a NUL-terminated
        // string that outlives the call; `cstr` rejects NULL.
        let name = unsafe { cstr(symbol) }?;
        match proc_address::lookup(name, version, flags) {
            // SAFETY: the caller's contract: `pfn` is NULL or points to a
            // writable `*mut c_void`; `out` rejects NULL.
            Ok(f) => unsafe { out(pfn, f) },
            Err(_) => {
                // SAFETY: the caller's contract: `pfn` is NULL or points to a
                // writable `*mut c_void`; `out_opt` skips NULL.
                unsafe { out_opt(pfn, std::ptr::null_mut()) };
                Err(CUDA_ERROR_NOT_FOUND)
            }
        }
    }

    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: u64,
        status: *mut c_int,
    ) {
        // SAFETY: the caller's contract: `symbol` is NULL or a NUL-terminated
        // string that outlives the call; `cstr` rejects NULL.
        let name = unsafe { cstr(symbol) }?;
        match proc_address::lookup(name, version, flags) {
            Ok(f) => {
                // SAFETY: the caller's contract: `status` is NULL or points to
                // a writable `c_int`; `out_opt` skips NULL.
                unsafe { out_opt(status, CU_GET_PROC_ADDRESS_SUCCESS) };
                // SAFETY: the caller's contract: `pfn` is NULL or points to a
                // writable `*mut c_void`; `out` rejects NULL.
                unsafe { out(pfn, f) }
            }
            Err(found) => {
                // SAFETY: the caller's contract: `status` is NULL or points to
                // a writable `c_int`; `out_opt` skips NULL.
                unsafe { out_opt(status, found) };
                // SAFETY: the caller's contract: `pfn` is NULL or points to a
                // writable `*mut c_void`; `out_opt` skips NULL.
                unsafe { out_opt(pfn, std::ptr::null_mut()) };
                Err(CUDA_ERROR_NOT_FOUND)
            }
        }
    }

    /// Not in the driver API: a probe for interposers. Writes to `own`
    /// whether `dlsym` called from inside this library on its own handle
    /// answers `name` with this library's function (as a driver looking up
    /// its own entry points needs); `CUDA_ERROR_NOT_FOUND` if the lookup
    /// fails.
    fn gpusimLooksUpItself(name: *const c_char, own: *mut c_int) {
        // SAFETY: the caller's contract: `name` is NULL or a NUL-terminated
        // string that outlives the call; `cstr` rejects NULL.
        let name = std::ffi::CString::new(unsafe { cstr(name) }?).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        match crate::sys::looks_up_itself(&name) {
            // SAFETY: the caller's contract: `own` is NULL or points to a
            // writable `c_int`; `out` rejects NULL.
            Some(yes) => unsafe { out(own, c_int::from(yes)) },
            None => Err(CUDA_ERROR_NOT_FOUND),
        }
    }

    /// `cuLogsRegisterCallback`: accepted; the simulated driver writes no
    /// log entries, so the callback is never called. The handle is a
    /// number of this process's, checked by `cuLogsUnregisterCallback`.
    fn cuLogsRegisterCallback(
        callback: *mut c_void,
        user_data: *mut c_void,
        handle: *mut *mut c_void,
    ) {
        let _ = user_data;
        if callback.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let id = LOG_CALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        // SAFETY: the caller's contract: `handle` is NULL or points to a
        // writable `CUlogsCallbackHandle`; `out` rejects NULL.
        unsafe { out(handle, id as *mut c_void) }
    }

    /// `cuLogsUnregisterCallback`: a handle `cuLogsRegisterCallback` gave.
    fn cuLogsUnregisterCallback(handle: *mut c_void) {
        let id = handle as usize;
        if id == 0 || id > LOG_CALLBACKS.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }
}
