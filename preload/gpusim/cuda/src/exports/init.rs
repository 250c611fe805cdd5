//! Initialisation, versions, error strings and entry-point lookup.

use std::ffi::{c_char, c_int, c_void};

use super::cu_export;
use super::ptr::{cstr, out, out_opt};
use crate::abi::*;
use crate::proc_address;
use crate::process;
use crate::status::{self, *};

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
        out(version, v)
    }

    fn cuGetErrorString(code: CUresult, text: *mut *const c_char) {
        match status::description(code) {
            Some(s) => out(text, s.as_ptr().cast()),
            None => {
                out_opt(text, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    fn cuGetErrorName(code: CUresult, text: *mut *const c_char) {
        match status::name(code) {
            Some(s) => out(text, s.as_ptr().cast()),
            None => {
                out_opt(text, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    /// Private export tables of the real driver are not simulated.
    fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) {
        let _ = id;
        out_opt(table, std::ptr::null());
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
        let name = cstr(symbol)?;
        match proc_address::lookup(name, version, flags) {
            Ok(f) => out(pfn, f),
            Err(_) => {
                out_opt(pfn, std::ptr::null_mut());
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
        let name = cstr(symbol)?;
        match proc_address::lookup(name, version, flags) {
            Ok(f) => {
                out_opt(status, CU_GET_PROC_ADDRESS_SUCCESS);
                out(pfn, f)
            }
            Err(found) => {
                out_opt(status, found);
                out_opt(pfn, std::ptr::null_mut());
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
        let name = std::ffi::CString::new(cstr(name)?).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        match crate::sys::looks_up_itself(&name) {
            Some(yes) => out(own, c_int::from(yes)),
            None => Err(CUDA_ERROR_NOT_FOUND),
        }
    }
}
