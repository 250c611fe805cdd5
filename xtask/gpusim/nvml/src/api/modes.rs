//! Modes and limits `nvidia-smi` shows in its table for each GPU, with
//! the values of a data-centre GPU set up for sharing (see
//! [`sensors`](crate::sensors)): persistence mode on, default compute
//! mode, performance state P0, the power limit of an H100 SXM, no display,
//! ECC on with no errors counted, and no fan to read (passively cooled:
//! `NVML_ERROR_NOT_SUPPORTED`, which `nvidia-smi` prints as `N/A`).
//!
//! Like the other live readings they fail with `NVML_ERROR_GPU_IS_LOST`
//! on a GPU marked lost.

use std::ffi::{c_uint, c_ulonglong};

use crate::abi::{DeviceHandle, FEATURE_DISABLED as DISABLED, FEATURE_ENABLED as ENABLED, Return};
use crate::error::NvmlError;
use crate::guard::entry;
use crate::library::context;
use crate::{ptr, sensors};

/// `NVML_COMPUTEMODE_DEFAULT`.
const COMPUTE_MODE_DEFAULT: c_uint = 0;
/// `NVML_PSTATE_0`.
const PSTATE_0: c_uint = 0;

/// Resolves `device` to a GPU that is not lost.
fn live(device: DeviceHandle) -> Result<(), NvmlError> {
    let ctx = context()?;
    let gpu = ctx.gpu(device)?;
    ctx.live(gpu)
}

/// Writes `value` for a live `device`.
///
/// # Safety
/// `out` is NULL or valid for a `T`.
unsafe fn answer<T>(device: DeviceHandle, out: *mut T, value: T) -> Return {
    entry(|| {
        live(device)?;
        // SAFETY: the caller's contract.
        unsafe { ptr::put(out, value) }
    })
}

/// `nvmlDeviceGetPersistenceMode`: enabled.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: DeviceHandle,
    mode: *mut c_uint,
) -> Return {
    // SAFETY: NVML contract: NULL or valid for an unsigned int.
    unsafe { answer(device, mode, ENABLED) }
}

/// `nvmlDeviceGetComputeMode`: `NVML_COMPUTEMODE_DEFAULT` (shared).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: DeviceHandle,
    mode: *mut c_uint,
) -> Return {
    // SAFETY: NVML contract: NULL or valid for an unsigned int.
    unsafe { answer(device, mode, COMPUTE_MODE_DEFAULT) }
}

/// `nvmlDeviceGetPerformanceState`: P0.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: DeviceHandle,
    state: *mut c_uint,
) -> Return {
    // SAFETY: NVML contract: NULL or valid for an unsigned int.
    unsafe { answer(device, state, PSTATE_0) }
}

/// `nvmlDeviceGetPowerManagementLimit` (mW): the full-load power.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: DeviceHandle,
    limit: *mut c_uint,
) -> Return {
    // SAFETY: NVML contract: NULL or valid for an unsigned int.
    unsafe { answer(device, limit, sensors::FULL_POWER_MW) }
}

/// `nvmlDeviceGetEnforcedPowerLimit` (mW): as the management limit.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: DeviceHandle,
    limit: *mut c_uint,
) -> Return {
    // SAFETY: NVML contract: NULL or valid for an unsigned int.
    unsafe { answer(device, limit, sensors::FULL_POWER_MW) }
}

/// `nvmlDeviceGetDisplayMode`: no display connected.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetDisplayMode(
    device: DeviceHandle,
    display: *mut c_uint,
) -> Return {
    // SAFETY: NVML contract: NULL or valid for an unsigned int.
    unsafe { answer(device, display, DISABLED) }
}

/// `nvmlDeviceGetDisplayActive`: no display active.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetDisplayActive(
    device: DeviceHandle,
    active: *mut c_uint,
) -> Return {
    // SAFETY: NVML contract: NULL or valid for an unsigned int.
    unsafe { answer(device, active, DISABLED) }
}

/// `nvmlDeviceGetEccMode`: enabled, now and after the next reboot.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: DeviceHandle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Return {
    entry(|| {
        live(device)?;
        if current.is_null() || pending.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        // SAFETY: NVML contract: valid for an unsigned int (checked non-NULL).
        unsafe { ptr::put(current, ENABLED) }?;
        // SAFETY: as above.
        unsafe { ptr::put(pending, ENABLED) }
    })
}

/// `nvmlDeviceGetTotalEccErrors`: none counted, of any type and counter.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: DeviceHandle,
    error_type: c_uint,
    counter_type: c_uint,
    count: *mut c_ulonglong,
) -> Return {
    entry(|| {
        // Corrected/uncorrected; volatile/aggregate.
        if error_type > 1 || counter_type > 1 {
            return Err(NvmlError::InvalidArgument);
        }
        live(device)?;
        // SAFETY: NVML contract: NULL or valid for an unsigned long long.
        unsafe { ptr::put(count, 0) }
    })
}

/// `nvmlDeviceGetFanSpeed`: a passively cooled GPU has no fan to read.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(device: DeviceHandle, speed: *mut c_uint) -> Return {
    entry(|| {
        live(device)?;
        if speed.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        Err(NvmlError::NotSupported)
    })
}
