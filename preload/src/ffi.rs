//! The CUDA driver API and NVML types, codes and structures the hooks use
//! (`cuda.h`, `nvml.h`).

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

/// `CUresult`.
pub type CUresult = c_uint;
/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUdeviceptr`.
pub type CUdeviceptr = c_ulonglong;
/// Opaque driver handles.
pub type Handle = *mut c_void;
/// `nvmlReturn_t`.
pub type NvmlReturn = c_uint;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
/// `CUDA_ERROR_NOT_FOUND`.
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// `CUDA_ERROR_NOT_PERMITTED`.
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
/// `CUDA_ERROR_UNKNOWN`.
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `NVML_SUCCESS`.
pub const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_ERROR_NO_PERMISSION`.
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
/// `NVML_ERROR_UNKNOWN`.
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `CU_GRAPH_NODE_TYPE_KERNEL`.
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_int = 0;
/// `CU_GRAPH_NODE_TYPE_GRAPH` (a child graph).
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_int = 4;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUuuid {
    /// The bytes.
    pub bytes: [u8; 16],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemLocation {
    /// `CUmemLocationType`.
    pub kind: c_int,
    /// Device ordinal.
    pub id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType`.
    pub kind: c_int,
    /// Requested handle types.
    pub requested_handle_types: c_int,
    /// Location.
    pub location: CUmemLocation,
    /// Windows only.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags`.
    pub alloc_flags: [u8; 8],
}

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    /// Allocation type.
    pub alloc_type: c_int,
    /// Handle types.
    pub handle_types: c_int,
    /// Location.
    pub location: CUmemLocation,
    /// Windows only.
    pub win32_security_attributes: *mut c_void,
    /// Maximum size.
    pub max_size: usize,
    /// Usage.
    pub usage: u16,
    /// Reserved.
    pub reserved: [u8; 54],
}

/// `CUDA_ARRAY_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ArrayDescriptor {
    /// Width.
    pub width: usize,
    /// Height.
    pub height: usize,
    /// Format.
    pub format: c_uint,
    /// Channels.
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Array3dDescriptor {
    /// Width.
    pub width: usize,
    /// Height.
    pub height: usize,
    /// Depth.
    pub depth: usize,
    /// Format.
    pub format: c_uint,
    /// Channels.
    pub num_channels: c_uint,
    /// Flags.
    pub flags: c_uint,
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    /// Grid X, Y, Z.
    pub grid: [c_uint; 3],
    /// Block X, Y, Z.
    pub block: [c_uint; 3],
    /// Shared memory.
    pub shared_mem_bytes: c_uint,
    /// Stream.
    pub stream: Handle,
    /// Attributes.
    pub attrs: *mut c_void,
    /// Number of attributes.
    pub num_attrs: c_uint,
}

/// `CUDA_KERNEL_NODE_PARAMS` (v1).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelNodeParamsV1 {
    /// Function.
    pub func: Handle,
    /// Grid X, Y, Z.
    pub grid: [c_uint; 3],
    /// Block X, Y, Z.
    pub block: [c_uint; 3],
    /// Shared memory.
    pub shared_mem_bytes: c_uint,
    /// Parameters.
    pub kernel_params: *mut *mut c_void,
    /// Extra.
    pub extra: *mut *mut c_void,
}

/// `CUgraphNodeParams` (CUDA 12.2): the node type, then its parameters in
/// a 232-byte union at offset 16, then 8 reserved bytes (256 in all).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GraphNodeParams {
    /// `CUgraphNodeType`.
    pub kind: c_int,
    /// Reserved.
    pub reserved0: [c_int; 3],
    /// The type's parameters.
    pub body: GraphNodeBody,
    /// Reserved.
    pub reserved2: i64,
}

/// The union of `CUgraphNodeParams` (the members the hooks read).
#[repr(C)]
#[derive(Clone, Copy)]
pub union GraphNodeBody {
    /// Padding: the union's size.
    pub reserved1: [i64; 29],
    /// `CUDA_KERNEL_NODE_PARAMS_v3` (the v2 layout).
    pub kernel: KernelNodeParams,
    /// `CUDA_CHILD_GRAPH_NODE_PARAMS`: the child graph.
    pub graph: Handle,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (its v1 prefix is the v1 structure).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelNodeParams {
    /// Function.
    pub func: Handle,
    /// Grid X, Y, Z.
    pub grid: [c_uint; 3],
    /// Block X, Y, Z.
    pub block: [c_uint; 3],
    /// Shared memory.
    pub shared_mem_bytes: c_uint,
    /// Parameters.
    pub kernel_params: *mut *mut c_void,
    /// Extra.
    pub extra: *mut *mut c_void,
    /// Kernel (v2).
    pub kern: Handle,
    /// Context (v2).
    pub ctx: Handle,
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlMemory {
    /// Total.
    pub total: c_ulonglong,
    /// Free.
    pub free: c_ulonglong,
    /// Used.
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlMemoryV2 {
    /// Structure version.
    pub version: c_uint,
    /// Total.
    pub total: c_ulonglong,
    /// Reserved.
    pub reserved: c_ulonglong,
    /// Free.
    pub free: c_ulonglong,
    /// Used.
    pub used: c_ulonglong,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets as `cuda.h` (CUDA 12.9) lays them out.
    #[test]
    fn graph_structures_match_cuda_h() {
        assert_eq!(size_of::<GraphNodeParams>(), 256);
        assert_eq!(offset_of!(GraphNodeParams, body), 16);
        assert_eq!(size_of::<KernelNodeParamsV1>(), 56);
        assert_eq!(size_of::<KernelNodeParams>(), 72);
        assert_eq!(offset_of!(KernelNodeParams, grid), 8);
        assert_eq!(offset_of!(KernelNodeParams, block), 20);
        assert_eq!(offset_of!(KernelNodeParams, kern), 56);
    }
}
