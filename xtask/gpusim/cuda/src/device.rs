//! Device enumeration and attributes, from the node description.

use gpusim::clocks::{MAX_MEMORY_CLOCK_MHZ, MAX_SM_CLOCK_MHZ};
use gpusim::pci::PciAddress;

use crate::abi::attr;
use crate::process::Process;
use crate::status::*;

/// `cuDeviceGetAttribute`.
pub fn attribute(p: &Process, dev: i32, a: i32) -> Result<i32, CUresult> {
    let d = p.device(dev)?;
    let node = p.sim.node();
    let g = &node.gpu[d];
    let pci = p.sim.pci_address(d);
    let [major, minor] = g.compute_capability;
    Ok(match a {
        attr::MAX_THREADS_PER_BLOCK => 1024,
        attr::MAX_BLOCK_DIM_X | attr::MAX_BLOCK_DIM_Y => 1024,
        attr::MAX_BLOCK_DIM_Z => 64,
        attr::MAX_GRID_DIM_X => i32::MAX,
        attr::MAX_GRID_DIM_Y | attr::MAX_GRID_DIM_Z => 65535,
        attr::MAX_SHARED_MEMORY_PER_BLOCK => 48 * 1024,
        attr::TOTAL_CONSTANT_MEMORY => 64 * 1024,
        attr::WARP_SIZE => 32,
        attr::MAX_PITCH => i32::MAX,
        attr::MAX_REGISTERS_PER_BLOCK | attr::MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        // kHz
        attr::CLOCK_RATE => (MAX_SM_CLOCK_MHZ * 1000) as i32,
        attr::TEXTURE_ALIGNMENT => 512,
        attr::TEXTURE_PITCH_ALIGNMENT => 32,
        attr::GPU_OVERLAP => 1,
        attr::MULTIPROCESSOR_COUNT => g.sm_count as i32,
        attr::KERNEL_EXEC_TIMEOUT | attr::INTEGRATED | attr::TCC_DRIVER => 0,
        attr::CAN_MAP_HOST_MEMORY => 1,
        attr::COMPUTE_MODE => 0,
        attr::CONCURRENT_KERNELS => 1,
        attr::ECC_ENABLED => 1,
        attr::PCI_BUS_ID => pci.bus as i32,
        attr::PCI_DEVICE_ID => pci.device as i32,
        attr::PCI_DOMAIN_ID => pci.domain as i32,
        attr::MEMORY_CLOCK_RATE => (MAX_MEMORY_CLOCK_MHZ * 1000) as i32,
        attr::GLOBAL_MEMORY_BUS_WIDTH => 5120,
        attr::L2_CACHE_SIZE => 50 * 1024 * 1024,
        attr::MAX_THREADS_PER_MULTIPROCESSOR => g.max_threads_per_sm as i32,
        attr::ASYNC_ENGINE_COUNT => 3,
        attr::UNIFIED_ADDRESSING => 1,
        attr::COMPUTE_CAPABILITY_MAJOR => major as i32,
        attr::COMPUTE_CAPABILITY_MINOR => minor as i32,
        attr::STREAM_PRIORITIES_SUPPORTED => 1,
        attr::GLOBAL_L1_CACHE_SUPPORTED | attr::LOCAL_L1_CACHE_SUPPORTED => 1,
        attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 * 1024,
        attr::MANAGED_MEMORY => 1,
        attr::MULTI_GPU_BOARD => 0,
        attr::MULTI_GPU_BOARD_GROUP_ID => d as i32,
        attr::PAGEABLE_MEMORY_ACCESS => 0,
        attr::CONCURRENT_MANAGED_ACCESS => 1,
        attr::COMPUTE_PREEMPTION_SUPPORTED => 1,
        attr::COOPERATIVE_LAUNCH => 1,
        attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 227 * 1024,
        attr::HOST_REGISTER_SUPPORTED => 1,
        attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => 1,
        attr::MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        attr::MEMORY_POOLS_SUPPORTED => 1,
        x if (1..=200).contains(&x) => 0,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// `cuDeviceCanAccessPeer`: NVLink peers can.
pub fn can_access_peer(p: &Process, dev: i32, peer: i32) -> Result<bool, CUresult> {
    let d = p.device(dev)?;
    let q = p.device(peer)?;
    Ok(d != q && p.sim.node().gpu[d].nvlink_peers.contains(&(q as u32)))
}

/// `cuDeviceGetByPCIBusId`: any documented form (`domain:bus:device.function`,
/// `domain:bus:device`, `bus:device.function`).
pub fn by_pci_bus_id(p: &Process, id: &str) -> Result<i32, CUresult> {
    let want = PciAddress::parse(id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    p.sim
        .gpu_at(want)
        .map(|i| i as i32)
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// `cuDeviceGetPCIBusId` text (`dddd:bb:dd.f`).
pub fn pci_bus_id(p: &Process, dev: i32) -> Result<String, CUresult> {
    let d = p.device(dev)?;
    Ok(p.sim.pci_address(d).to_string())
}
