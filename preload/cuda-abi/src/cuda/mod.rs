//! The CUDA driver API (`cuda.h`, CUDA 12): the types, result codes,
//! constants and structure layouts Tessera's interposer and the simulated
//! driver use. Each item names its C counterpart; `tests/headers.rs` checks
//! every size, offset and value against NVIDIA's published header.

#![allow(non_camel_case_types)]

use core::ffi::c_void;

pub mod result;

pub use result::CUresult;

/// `CUdevice`.
pub type CUdevice = i32;
/// `CUdeviceptr` (64-bit).
pub type CUdeviceptr = u64;
/// Opaque handles (`CUcontext`, `CUstream`, ...).
pub type Handle = *mut c_void;
/// `CUmemGenericAllocationHandle`.
pub type CUmemGenericAllocationHandle = u64;

/// `CU_STREAM_LEGACY`.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`.
pub const CU_STREAM_PER_THREAD: usize = 0x2;

/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;
/// `CU_GET_PROC_ADDRESS_SUCCESS`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: i32 = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: i32 = 1;

/// `CU_GRAPH_NODE_TYPE_KERNEL`.
pub const CU_GRAPH_NODE_TYPE_KERNEL: i32 = 0;
/// `CU_GRAPH_NODE_TYPE_GRAPH` (a child graph).
pub const CU_GRAPH_NODE_TYPE_GRAPH: i32 = 4;
/// `CU_GRAPH_NODE_TYPE_EMPTY`.
pub const CU_GRAPH_NODE_TYPE_EMPTY: i32 = 5;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: i32 = 10;
/// `CU_GRAPH_NODE_TYPE_MEM_FREE`.
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: i32 = 11;

/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: i32 = 0;

/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CU_STREAM_CAPTURE_STATUS_NONE: i32 = 0;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: i32 = 1;

/// `CU_POINTER_ATTRIBUTE_CONTEXT`.
pub const CU_POINTER_ATTRIBUTE_CONTEXT: i32 = 1;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: i32 = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_POINTER`.
pub const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: i32 = 3;
/// `CU_POINTER_ATTRIBUTE_HOST_POINTER`.
pub const CU_POINTER_ATTRIBUTE_HOST_POINTER: i32 = 4;
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED`.
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: i32 = 8;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: i32 = 9;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`.
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: i32 = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`.
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: i32 = 12;

/// `CU_MEMORYTYPE_HOST`.
pub const CU_MEMORYTYPE_HOST: u32 = 1;
/// `CU_MEMORYTYPE_DEVICE`.
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUuuid {
    /// The 16 bytes.
    pub bytes: [u8; 16],
}

/// `CUDA_ARRAY_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaArrayDescriptor {
    /// Width in elements.
    pub width: usize,
    /// Height (0 for 1D).
    pub height: usize,
    /// `CUarray_format`.
    pub format: u32,
    /// Channels per element (1, 2 or 4).
    pub num_channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaArray3dDescriptor {
    /// Width in elements.
    pub width: usize,
    /// Height (0 for 1D).
    pub height: usize,
    /// Depth (0 for 1D/2D).
    pub depth: usize,
    /// `CUarray_format`.
    pub format: u32,
    /// Channels per element (1, 2 or 4).
    pub num_channels: u32,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: u32,
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemLocation {
    /// `CUmemLocationType`.
    pub kind: i32,
    /// Device ordinal for device locations.
    pub id: i32,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType`.
    pub kind: i32,
    /// `CUmemAllocationHandleType`.
    pub requested_handle_types: i32,
    /// Where.
    pub location: CUmemLocation,
    /// Windows only.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags`: compressionType, gpuDirectRDMACapable, usage, reserved.
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemAccessDesc {
    /// Which device.
    pub location: CUmemLocation,
    /// `CUmemAccess_flags`.
    pub flags: i32,
}

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    /// `CUmemAllocationType`.
    pub alloc_type: i32,
    /// `CUmemAllocationHandleType`.
    pub handle_types: i32,
    /// Where.
    pub location: CUmemLocation,
    /// Windows only.
    pub win32_security_attributes: *mut c_void,
    /// Maximum pool size (0 = no limit).
    pub max_size: usize,
    /// Usage flags.
    pub usage: u16,
    /// Reserved.
    pub reserved: [u8; 54],
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    /// Grid X.
    pub grid_dim_x: u32,
    /// Grid Y.
    pub grid_dim_y: u32,
    /// Grid Z.
    pub grid_dim_z: u32,
    /// Block X.
    pub block_dim_x: u32,
    /// Block Y.
    pub block_dim_y: u32,
    /// Block Z.
    pub block_dim_z: u32,
    /// Dynamic shared memory.
    pub shared_mem_bytes: u32,
    /// Stream.
    pub h_stream: Handle,
    /// Launch attributes.
    pub attrs: *mut c_void,
    /// Number of attributes.
    pub num_attrs: u32,
}

/// `CUDA_KERNEL_NODE_PARAMS` (v1).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelNodeParamsV1 {
    /// Function.
    pub func: Handle,
    /// Grid X.
    pub grid_dim_x: u32,
    /// Grid Y.
    pub grid_dim_y: u32,
    /// Grid Z.
    pub grid_dim_z: u32,
    /// Block X.
    pub block_dim_x: u32,
    /// Block Y.
    pub block_dim_y: u32,
    /// Block Z.
    pub block_dim_z: u32,
    /// Dynamic shared memory.
    pub shared_mem_bytes: u32,
    /// Kernel parameters.
    pub kernel_params: *mut *mut c_void,
    /// Extra options.
    pub extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelNodeParamsV2 {
    /// The v1 fields.
    pub v1: KernelNodeParamsV1,
    /// Kernel (alternative to `func`).
    pub kern: Handle,
    /// Context of the kernel.
    pub ctx: Handle,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 and v2 share this layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemAllocNodeParams {
    /// Where and how: `poolProps`.
    pub pool_props: CUmemPoolProps,
    /// Peer access descriptors.
    pub access_descs: *const CUmemAccessDesc,
    /// Their number.
    pub access_desc_count: usize,
    /// Requested size.
    pub bytesize: usize,
    /// Out: the allocation's address.
    pub dptr: CUdeviceptr,
}

/// `CUgraphNodeParams` (CUDA 12.2): the node type, then its parameters in
/// a union at offset 16 (232 bytes), then 8 reserved bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GraphNodeParams {
    /// `CUgraphNodeType`.
    pub kind: i32,
    /// Reserved (zero).
    pub reserved0: [i32; 3],
    /// The type's parameters.
    pub body: GraphNodeBody,
    /// Reserved (zero).
    pub reserved2: i64,
}

/// The union of `CUgraphNodeParams` (the members the simulator reads).
#[repr(C)]
#[derive(Clone, Copy)]
pub union GraphNodeBody {
    /// Padding: the union's size.
    pub reserved1: [i64; 29],
    /// `CUDA_KERNEL_NODE_PARAMS_v3` (the v2 layout).
    pub kernel: KernelNodeParamsV2,
    /// `CUDA_CHILD_GRAPH_NODE_PARAMS`: the child graph.
    pub graph: Handle,
    /// `CUDA_MEM_ALLOC_NODE_PARAMS_v2`.
    pub alloc: MemAllocNodeParams,
    /// `CUDA_MEM_FREE_NODE_PARAMS`: the address to free.
    pub free: CUdeviceptr,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GraphInstantiateParams {
    /// Instantiation flags.
    pub flags: u64,
    /// Upload stream.
    pub upload_stream: Handle,
    /// Out: the node that made instantiation fail.
    pub err_node_out: Handle,
    /// Out: `CUgraphInstantiateResult` (0 = success).
    pub result_out: i32,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (32-bit sizes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaArrayDescriptorV1 {
    /// Width in elements.
    pub width: u32,
    /// Height (0 for 1D).
    pub height: u32,
    /// `CUarray_format`.
    pub format: u32,
    /// Channels per element.
    pub num_channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (32-bit sizes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaArray3dDescriptorV1 {
    /// Width in elements.
    pub width: u32,
    /// Height.
    pub height: u32,
    /// Depth.
    pub depth: u32,
    /// `CUarray_format`.
    pub format: u32,
    /// Channels per element.
    pub num_channels: u32,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: u32,
}

/// Device attribute numbers (`CUdevice_attribute`).
pub mod attr {
    #![allow(missing_docs)]
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    pub const MAX_BLOCK_DIM_Y: i32 = 3;
    pub const MAX_BLOCK_DIM_Z: i32 = 4;
    pub const MAX_GRID_DIM_X: i32 = 5;
    pub const MAX_GRID_DIM_Y: i32 = 6;
    pub const MAX_GRID_DIM_Z: i32 = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    pub const TOTAL_CONSTANT_MEMORY: i32 = 9;
    pub const WARP_SIZE: i32 = 10;
    pub const MAX_PITCH: i32 = 11;
    pub const MAX_REGISTERS_PER_BLOCK: i32 = 12;
    pub const CLOCK_RATE: i32 = 13;
    pub const TEXTURE_ALIGNMENT: i32 = 14;
    pub const GPU_OVERLAP: i32 = 15;
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const KERNEL_EXEC_TIMEOUT: i32 = 17;
    pub const INTEGRATED: i32 = 18;
    pub const CAN_MAP_HOST_MEMORY: i32 = 19;
    pub const COMPUTE_MODE: i32 = 20;
    pub const CONCURRENT_KERNELS: i32 = 31;
    pub const ECC_ENABLED: i32 = 32;
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const TCC_DRIVER: i32 = 35;
    pub const MEMORY_CLOCK_RATE: i32 = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: i32 = 37;
    pub const L2_CACHE_SIZE: i32 = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
    pub const ASYNC_ENGINE_COUNT: i32 = 40;
    pub const UNIFIED_ADDRESSING: i32 = 41;
    pub const PCI_DOMAIN_ID: i32 = 50;
    pub const TEXTURE_PITCH_ALIGNMENT: i32 = 51;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const STREAM_PRIORITIES_SUPPORTED: i32 = 78;
    pub const GLOBAL_L1_CACHE_SUPPORTED: i32 = 79;
    pub const LOCAL_L1_CACHE_SUPPORTED: i32 = 80;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: i32 = 81;
    pub const MAX_REGISTERS_PER_MULTIPROCESSOR: i32 = 82;
    pub const MANAGED_MEMORY: i32 = 83;
    pub const MULTI_GPU_BOARD: i32 = 84;
    pub const MULTI_GPU_BOARD_GROUP_ID: i32 = 85;
    pub const PAGEABLE_MEMORY_ACCESS: i32 = 88;
    pub const CONCURRENT_MANAGED_ACCESS: i32 = 89;
    pub const COMPUTE_PREEMPTION_SUPPORTED: i32 = 90;
    pub const COOPERATIVE_LAUNCH: i32 = 95;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
    pub const HOST_REGISTER_SUPPORTED: i32 = 99;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: i32 = 102;
    pub const MAX_BLOCKS_PER_MULTIPROCESSOR: i32 = 106;
    pub const MEMORY_POOLS_SUPPORTED: i32 = 115;
}
