//! Initialisation, error strings and system queries.

use std::ffi::{c_char, c_int, c_uint};

use crate::abi::{API_VERSION, Return};
use crate::error::{self, NvmlError};
use crate::guard::entry;
use crate::library::{self, context};
use crate::ptr;

/// `nvmlInit` (v1): same as `nvmlInit_v2`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlInit() -> Return {
    entry(library::init)
}

/// `nvmlInit_v2`: opens the simulated node (reference counted).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlInit_v2() -> Return {
    entry(library::init)
}

/// `nvmlInitWithFlags`: flags (`NO_GPUS`, `NO_ATTACH`) change nothing here.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Return {
    entry(library::init)
}

/// `nvmlShutdown`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlShutdown() -> Return {
    entry(library::shutdown)
}

/// `nvmlErrorString`: a static string for any code.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlErrorString(result: Return) -> *const c_char {
    std::panic::catch_unwind(|| error::message(result))
        .unwrap_or(error::message(NvmlError::Unknown.code()))
        .as_ptr()
}

/// `nvmlSystemGetDriverVersion`: the node description's `driver_version`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> Return {
    entry(|| {
        let ctx = context()?;
        // SAFETY: NVML contract: `version` is NULL or holds `length` bytes.
        unsafe { ptr::put_str(version, length, &ctx.sim.node().driver_version) }
    })
}

/// `nvmlSystemGetNVMLVersion`: `12.<driver version>`, as NVML reports it.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Return {
    entry(|| {
        let ctx = context()?;
        let v = format!("{API_VERSION}.{}", ctx.sim.node().driver_version);
        // SAFETY: NVML contract: `version` is NULL or holds `length` bytes.
        unsafe { ptr::put_str(version, length, &v) }
    })
}

/// `nvmlSystemGetCudaDriverVersion`: the node description's `cuda_version`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(cuda_driver_version: *mut c_int) -> Return {
    entry(|| {
        let ctx = context()?;
        // SAFETY: NVML contract: NULL or valid for an int.
        unsafe { ptr::put(cuda_driver_version, ctx.sim.node().cuda_version) }
    })
}

/// `nvmlSystemGetCudaDriverVersion_v2`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    cuda_driver_version: *mut c_int,
) -> Return {
    // SAFETY: same contract.
    unsafe { nvmlSystemGetCudaDriverVersion(cuda_driver_version) }
}

/// `nvmlSystemGetProcessName`: the process's `/proc/<pid>/comm`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> Return {
    entry(|| {
        context()?;
        let comm = gpusim::procfs::comm(pid).ok_or(NvmlError::NotFound)?;
        // SAFETY: NVML contract: `name` is NULL or holds `length` bytes.
        unsafe { ptr::put_str(name, length, &comm) }
    })
}
