//! NVML: initialisation (refused when GPU use is refused) and memory
//! information showing the container's limit.

use std::ffi::{c_char, c_uint};

use super::{dispatch_as, guard};
use crate::accounting::parse_uuid;
use crate::ffi::*;
use crate::hooks::info::virtual_memory;
use crate::real::{self, Nvml};
use crate::state::Enforcer;

/// Calls a real NVML function or answers `NVML_ERROR_FUNCTION_NOT_FOUND`.
#[allow(clippy::macro_metavars_in_unsafe)]
macro_rules! real_nvml {
    ($name:ident($($arg:expr),* $(,)?)) => {
        match real::nvml().and_then(|n: &Nvml| n.$name) {
            // SAFETY: the real NVML function, with our caller's arguments.
            Some(f) => unsafe { f($($arg),*) },
            None => NVML_ERROR_FUNCTION_NOT_FOUND,
        }
    };
}

/// Declares exported NVML hooks returning `nvmlReturn_t` (as `hook!`
/// does for CUDA: the NVML contract for the arguments, one `unsafe` block
/// per dereference in the body, exported only from the built library).
macro_rules! nvml_hook {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            #[cfg_attr(not(test), unsafe(no_mangle))]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> NvmlReturn {
                guard(NVML_ERROR_UNKNOWN, move || $body)
            }
        )*
    };
}

fn nvml_dispatch(
    pass: impl FnOnce() -> NvmlReturn,
    enforce: impl FnOnce(&Enforcer) -> NvmlReturn,
) -> NvmlReturn {
    dispatch_as(NVML_ERROR_NO_PERMISSION, pass, enforce)
}

/// The control index of NVML device `dev`, if assigned.
fn gpu_of(e: &Enforcer, dev: Handle) -> Option<usize> {
    let mut buf = [0 as c_char; 96];
    if real_nvml!(nvmlDeviceGetUUID(
        dev,
        buf.as_mut_ptr(),
        buf.len() as c_uint
    )) != NVML_SUCCESS
    {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into buf.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .ok()?;
    e.control.find(&parse_uuid(s)?)
}

/// Rewrites device `dev`'s memory figures as the container sees them
/// (total = limit, free = limit − use); false, leaving them, if the GPU
/// is not the container's.
fn show_limit(e: &Enforcer, dev: Handle, total: &mut u64, free: &mut u64, used: &mut u64) -> bool {
    let Some(g) = gpu_of(e, dev) else {
        return false;
    };
    (*total, *free) = virtual_memory(e, g, *total, *free);
    *used = *total - *free;
    true
}

nvml_hook! {
    fn nvmlInit() {
        nvml_dispatch(|| real_nvml!(nvmlInit()), |_| real_nvml!(nvmlInit()))
    }

    fn nvmlInit_v2() {
        nvml_dispatch(|| real_nvml!(nvmlInit_v2()), |_| real_nvml!(nvmlInit_v2()))
    }

    fn nvmlInitWithFlags(flags: c_uint) {
        nvml_dispatch(|| real_nvml!(nvmlInitWithFlags(flags)), |_| real_nvml!(nvmlInitWithFlags(flags)))
    }

    fn nvmlDeviceGetMemoryInfo(dev: Handle, mem: *mut NvmlMemory) {
        nvml_dispatch(
            || real_nvml!(nvmlDeviceGetMemoryInfo(dev, mem)),
            |e| {
                let rc = real_nvml!(nvmlDeviceGetMemoryInfo(dev, mem));
                if rc == NVML_SUCCESS && !mem.is_null() {
                    // SAFETY: mem is non-NULL (checked), points to the
                    // caller's memory structure per the NVML contract, and
                    // the successful real call filled it.
                    let m = unsafe { &mut *mem };
                    show_limit(e, dev, &mut m.total, &mut m.free, &mut m.used);
                }
                rc
            },
        )
    }

    fn nvmlDeviceGetMemoryInfo_v2(dev: Handle, mem: *mut NvmlMemoryV2) {
        nvml_dispatch(
            || real_nvml!(nvmlDeviceGetMemoryInfo_v2(dev, mem)),
            |e| {
                let rc = real_nvml!(nvmlDeviceGetMemoryInfo_v2(dev, mem));
                if rc == NVML_SUCCESS && !mem.is_null() {
                    // SAFETY: mem is non-NULL (checked), points to the
                    // caller's memory structure per the NVML contract, and
                    // the successful real call filled it.
                    let m = unsafe { &mut *mem };
                    if show_limit(e, dev, &mut m.total, &mut m.free, &mut m.used) {
                        m.reserved = 0;
                    }
                }
                rc
            },
        )
    }
}
