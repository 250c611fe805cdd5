//! Device enumeration and identity.
//!
//! Identity (handles, index, name, UUID, minor number, PCI information,
//! compute capability, core count) stays readable when a GPU is marked
//! lost, as real NVML caches it when it attaches the GPU; that is how a
//! monitoring agent tells which GPU fell off the bus. Live state (see
//! `usage.rs`) fails with `NVML_ERROR_GPU_IS_LOST`.

use std::ffi::{c_char, c_int, c_uint};

use crate::abi::{DeviceHandle, MIG_DISABLE, MIG_ENABLE, PCI_INFO_LEGACY_SIZE, PciInfo, Return};
use crate::error::NvmlError;
use crate::guard::entry;
use crate::library::context;
use crate::{handle, pci, ptr, sensors};

/// `nvmlDeviceGetCount` (v1).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetCount(device_count: *mut c_uint) -> Return {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCount_v2(device_count) }
}

/// `nvmlDeviceGetCount_v2`: the GPUs of the node description this process
/// can open (see `gpusim::Sim::visible_only`).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> Return {
    entry(|| {
        let ctx = context()?;
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(device_count, ctx.gpu_count() as c_uint) }
    })
}

/// `nvmlDeviceGetHandleByIndex` (v1).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut DeviceHandle,
) -> Return {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// `nvmlDeviceGetHandleByIndex_v2`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut DeviceHandle,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let i = index as usize;
        if i >= ctx.gpu_count() {
            return Err(NvmlError::InvalidArgument);
        }
        // SAFETY: NVML contract: NULL or valid for a handle.
        unsafe { ptr::put(device, handle::of(i)) }
    })
}

/// `nvmlDeviceGetHandleByUUID`: exact match on `GPU-…`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut DeviceHandle,
) -> Return {
    entry(|| {
        let ctx = context()?;
        // SAFETY: NVML contract: NULL or a C string.
        let wanted = unsafe { ptr::get_str(uuid) }?;
        let node = ctx.sim.node();
        let i = (0..ctx.gpu_count())
            .find(|&i| node.uuid(i) == wanted)
            .ok_or(NvmlError::NotFound)?;
        // SAFETY: NVML contract: NULL or valid for a handle.
        unsafe { ptr::put(device, handle::of(i)) }
    })
}

/// `nvmlDeviceGetHandleByPciBusId` (v1).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    pci_bus_id: *const c_char,
    device: *mut DeviceHandle,
) -> Return {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id, device) }
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: any case, 4- or 8-digit domain.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut DeviceHandle,
) -> Return {
    entry(|| {
        let ctx = context()?;
        // SAFETY: NVML contract: NULL or a C string.
        let text = unsafe { ptr::get_str(pci_bus_id) }?;
        let i = pci::find(ctx.sim.node(), text).ok_or(NvmlError::NotFound)?;
        // SAFETY: NVML contract: NULL or valid for a handle.
        unsafe { ptr::put(device, handle::of(i)) }
    })
}

/// `nvmlDeviceGetIndex`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: DeviceHandle, index: *mut c_uint) -> Return {
    entry(|| {
        let gpu = context()?.gpu(device)?;
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(index, gpu as c_uint) }
    })
}

/// `nvmlDeviceGetName`: the node description's `model`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: DeviceHandle,
    name: *mut c_char,
    length: c_uint,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let gpu = ctx.gpu(device)?;
        // SAFETY: NVML contract: `name` is NULL or holds `length` bytes.
        unsafe { ptr::put_str(name, length, &ctx.sim.node().gpu[gpu].model) }
    })
}

/// `nvmlDeviceGetUUID`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: DeviceHandle,
    uuid: *mut c_char,
    length: c_uint,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let gpu = ctx.gpu(device)?;
        // SAFETY: NVML contract: `uuid` is NULL or holds `length` bytes.
        unsafe { ptr::put_str(uuid, length, &ctx.sim.node().uuid(gpu)) }
    })
}

/// `nvmlDeviceGetMinorNumber`: the GPU's index on the node
/// (`/dev/nvidia<index>`), which a process seeing only some GPUs numbers
/// differently (`nvmlDeviceGetIndex`).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: DeviceHandle,
    minor_number: *mut c_uint,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let minor = ctx.sim.node_index(ctx.gpu(device)?);
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(minor_number, minor as c_uint) }
    })
}

fn pci_info(device: DeviceHandle) -> Result<PciInfo, NvmlError> {
    let ctx = context()?;
    let gpu = ctx.gpu(device)?;
    Ok(pci::info(ctx.sim.node(), gpu))
}

/// `nvmlDeviceGetPciInfo` (v1): the 52-byte struct of its era.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(device: DeviceHandle, pci: *mut PciInfo) -> Return {
    entry(|| {
        let info = pci_info(device)?;
        // SAFETY: NVML contract: NULL or valid for the legacy struct size.
        unsafe { ptr::put_prefix(pci, &info, PCI_INFO_LEGACY_SIZE) }
    })
}

/// `nvmlDeviceGetPciInfo_v2`: the 52-byte struct of its era.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: DeviceHandle,
    pci: *mut PciInfo,
) -> Return {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetPciInfo(device, pci) }
}

/// `nvmlDeviceGetPciInfo_v3`: the whole `nvmlPciInfo_t`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: DeviceHandle,
    pci: *mut PciInfo,
) -> Return {
    entry(|| {
        let info = pci_info(device)?;
        // SAFETY: NVML contract: NULL or valid for an nvmlPciInfo_t.
        unsafe { ptr::put(pci, info) }
    })
}

/// `nvmlDeviceGetCudaComputeCapability`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: DeviceHandle,
    major: *mut c_int,
    minor: *mut c_int,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let gpu = ctx.gpu(device)?;
        if major.is_null() || minor.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        let [ma, mi] = ctx.sim.node().gpu[gpu].compute_capability;
        // SAFETY: NVML contract: valid for an int each (checked non-NULL).
        unsafe {
            ptr::put(major, ma as c_int)?;
            ptr::put(minor, mi as c_int)
        }
    })
}

/// `nvmlDeviceGetMultiGpuBoard`: always 0 (one GPU per board).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetMultiGpuBoard(
    device: DeviceHandle,
    multi_gpu_bool: *mut c_uint,
) -> Return {
    entry(|| {
        context()?.gpu(device)?;
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(multi_gpu_bool, 0) }
    })
}

/// `nvmlDeviceGetNumGpuCores`: SMs × cores per SM of the architecture.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetNumGpuCores(
    device: DeviceHandle,
    num_cores: *mut c_uint,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let g = &ctx.sim.node().gpu[ctx.gpu(device)?];
        let cores = g.sm_count * sensors::cores_per_sm(g.compute_capability);
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(num_cores, cores) }
    })
}

/// `nvmlDeviceGetAttributes_v2`: `NVML_ERROR_NOT_SUPPORTED`, as the header
/// documents for handles that are not MIG devices (none are simulated).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: DeviceHandle,
    attributes: *mut std::ffi::c_void,
) -> Return {
    entry(|| {
        context()?.gpu(device)?;
        if attributes.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        Err(NvmlError::NotSupported)
    })
}

/// `nvmlDeviceGetAttributes` (v1): as `_v2`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(
    device: DeviceHandle,
    attributes: *mut std::ffi::c_void,
) -> Return {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetAttributes_v2(device, attributes) }
}

/// `nvmlDeviceGetMigMode`: from the node description's `mig_enabled`;
/// `NVML_ERROR_NOT_SUPPORTED` before compute capability 8.0 (pre-Ampere).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: DeviceHandle,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let gpu = ctx.gpu(device)?;
        if current_mode.is_null() || pending_mode.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        ctx.live(gpu)?;
        let g = &ctx.sim.node().gpu[gpu];
        if g.compute_capability[0] < 8 {
            return Err(NvmlError::NotSupported);
        }
        let mode = if g.mig_enabled {
            MIG_ENABLE
        } else {
            MIG_DISABLE
        };
        // SAFETY: NVML contract: valid for an unsigned int each (checked
        // non-NULL).
        unsafe {
            ptr::put(current_mode, mode)?;
            ptr::put(pending_mode, mode)
        }
    })
}
