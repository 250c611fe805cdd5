//! NUMA, PCIe topology and NVLink.
//!
//! - `nvmlDeviceGetNumaNodeId` reports the node description's `numa_node`
//!   (`NVML_ERROR_NOT_SUPPORTED` when it is -1, unknown).
//! - `nvmlDeviceGetTopologyCommonAncestor` models PCIe only: the same GPU
//!   is `NVML_TOPOLOGY_INTERNAL`, GPUs on the same NUMA node (both unknown
//!   counts as the same, a single-socket host) `NVML_TOPOLOGY_NODE`, others
//!   `NVML_TOPOLOGY_SYSTEM`. NVLink does not change the PCIe path, as on
//!   real hosts; it is reported by the NVLink calls.
//! - A GPU has one active NVLink per entry of `nvlink_peers`: link *i*
//!   reaches peer *i*. Links past those (up to `NVML_NVLINK_MAX_LINKS`)
//!   are inactive, with no remote end (`NVML_ERROR_NOT_SUPPORTED`); a GPU
//!   without peers has no NVLink at all (`NVML_ERROR_NOT_SUPPORTED` for
//!   every link); a link number past the maximum is
//!   `NVML_ERROR_INVALID_ARGUMENT`.

use std::ffi::c_uint;

use crate::abi::{
    DeviceHandle, FEATURE_DISABLED, FEATURE_ENABLED, NVLINK_MAX_LINKS, PCI_INFO_LEGACY_SIZE,
    PciInfo, Return, TOPOLOGY_INTERNAL, TOPOLOGY_NODE, TOPOLOGY_SYSTEM,
};
use crate::error::NvmlError;
use crate::guard::entry;
use crate::library::context;
use crate::{pci, ptr};

/// `nvmlDeviceGetNumaNodeId`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: DeviceHandle,
    node: *mut c_uint,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let gpu = ctx.gpu(device)?;
        let numa = ctx.sim.node().gpu[gpu].numa_node;
        let numa = c_uint::try_from(numa).map_err(|_| NvmlError::NotSupported)?;
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(node, numa) }
    })
}

/// `nvmlDeviceGetTopologyCommonAncestor`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: DeviceHandle,
    device2: DeviceHandle,
    path_info: *mut c_uint,
) -> Return {
    entry(|| {
        let ctx = context()?;
        let (a, b) = (ctx.gpu(device1)?, ctx.gpu(device2)?);
        let gpus = &ctx.sim.node().gpu;
        let level = if a == b {
            TOPOLOGY_INTERNAL
        } else if gpus[a].numa_node == gpus[b].numa_node {
            TOPOLOGY_NODE
        } else {
            TOPOLOGY_SYSTEM
        };
        // SAFETY: NVML contract: NULL or valid for an nvmlGpuTopologyLevel_t.
        unsafe { ptr::put(path_info, level) }
    })
}

/// The peer at the far end of `link`: `Ok(None)` for an inactive link.
fn link_peer(
    device: DeviceHandle,
    link: c_uint,
) -> Result<(std::sync::Arc<crate::library::Context>, Option<usize>), NvmlError> {
    let ctx = context()?;
    let gpu = ctx.gpu(device)?;
    if link >= NVLINK_MAX_LINKS {
        return Err(NvmlError::InvalidArgument);
    }
    ctx.live(gpu)?;
    let peers = &ctx.sim.node().gpu[gpu].nvlink_peers;
    if peers.is_empty() {
        return Err(NvmlError::NotSupported);
    }
    let peer = peers.get(link as usize).map(|&p| p as usize);
    Ok((ctx, peer))
}

/// `nvmlDeviceGetNvLinkState`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: DeviceHandle,
    link: c_uint,
    is_active: *mut c_uint,
) -> Return {
    entry(|| {
        let (_, peer) = link_peer(device, link)?;
        let state = if peer.is_some() {
            FEATURE_ENABLED
        } else {
            FEATURE_DISABLED
        };
        // SAFETY: NVML contract: NULL or valid for an nvmlEnableState_t.
        unsafe { ptr::put(is_active, state) }
    })
}

fn remote_pci(device: DeviceHandle, link: c_uint) -> Result<PciInfo, NvmlError> {
    let (ctx, peer) = link_peer(device, link)?;
    let peer = peer.ok_or(NvmlError::NotSupported)?;
    Ok(pci::info(ctx.sim.node(), peer))
}

/// `nvmlDeviceGetNvLinkRemotePciInfo` (v1): the 52-byte struct of its era.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo(
    device: DeviceHandle,
    link: c_uint,
    pci: *mut PciInfo,
) -> Return {
    entry(|| {
        let info = remote_pci(device, link)?;
        // SAFETY: NVML contract: NULL or valid for the legacy struct size.
        unsafe { ptr::put_prefix(pci, &info, PCI_INFO_LEGACY_SIZE) }
    })
}

/// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: the whole `nvmlPciInfo_t`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: DeviceHandle,
    link: c_uint,
    pci: *mut PciInfo,
) -> Return {
    entry(|| {
        let info = remote_pci(device, link)?;
        // SAFETY: NVML contract: NULL or valid for an nvmlPciInfo_t.
        unsafe { ptr::put(pci, info) }
    })
}

/// `NVML_NVLINK_DEVICE_TYPE_GPU`: what every simulated link reaches.
const NVLINK_DEVICE_TYPE_GPU: c_uint = 0;

/// `nvmlDeviceGetNvLinkRemoteDeviceType`: a GPU at the end of each
/// active link (no NVSwitch is simulated); `NVML_ERROR_NOT_SUPPORTED` for
/// an inactive one, as for its remote PCI information.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: DeviceHandle,
    link: c_uint,
    device_type: *mut c_uint,
) -> Return {
    entry(|| {
        let (_, peer) = link_peer(device, link)?;
        peer.ok_or(NvmlError::NotSupported)?;
        // SAFETY: NVML contract: NULL or valid for an nvmlIntNvLinkDeviceType_t.
        unsafe { ptr::put(device_type, NVLINK_DEVICE_TYPE_GPU) }
    })
}

/// `nvmlDeviceGetGpuFabricInfoV`: no NVLink fabric (NVSwitch and fabric
/// manager) is simulated, so `NVML_ERROR_NOT_SUPPORTED`, as on a GPU
/// outside one.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: DeviceHandle,
    info: *mut std::ffi::c_void,
) -> Return {
    entry(|| {
        context()?.gpu(device)?;
        if info.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        Err(NvmlError::NotSupported)
    })
}
