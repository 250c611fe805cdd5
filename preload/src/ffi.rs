//! The CUDA driver API and NVML types, codes and structures the hooks use,
//! from the one declaration set the simulator's stand-ins share
//! (`tessera-cuda-abi`, checked against NVIDIA's `cuda.h` and `nvml.h`),
//! under the names the hooks read best with.

pub use tessera_cuda_abi::cuda::result::*;
pub use tessera_cuda_abi::cuda::{
    CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEM_ALLOC,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
    CUdevice, CUdeviceptr, CUlaunchConfig as LaunchConfig, CUmemAllocationProp, CUmemLocation,
    CUmemPoolProps, CUuuid, CudaArray3dDescriptor as Array3dDescriptor,
    CudaArrayDescriptor as ArrayDescriptor, GraphNodeBody, GraphNodeParams, Handle,
    KernelNodeParamsV1, KernelNodeParamsV2 as KernelNodeParams,
};
pub use tessera_cuda_abi::nvml::{
    ERROR_FUNCTION_NOT_FOUND as NVML_ERROR_FUNCTION_NOT_FOUND,
    ERROR_NO_PERMISSION as NVML_ERROR_NO_PERMISSION, ERROR_UNKNOWN as NVML_ERROR_UNKNOWN,
    Memory as NvmlMemory, MemoryV2 as NvmlMemoryV2, Return as NvmlReturn, SUCCESS as NVML_SUCCESS,
};
