//! `cuGetProcAddress`: entry points by base name, driver API version and
//! stream flavour, as the real driver resolves them.
//!
//! Each base name has entries `(version, symbol)`: the version of the
//! driver API that introduced that variant (from the `PFN_<name>_v<version>`
//! typedefs of `cudaTypedefs.h`). A request for `cudaVersion` gets the
//! newest entry not newer than it, so `cuMemAlloc` asked with 3020 or
//! later is `cuMemAlloc_v2`. With `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`
//! the per-thread-stream variant (`_ptds` / `_ptsz`) is preferred where
//! one exists at that version; `CU_GET_PROC_ADDRESS_DEFAULT` means legacy
//! stream semantics. Variants this simulator does not implement (some
//! 32-bit CUDA 2.x entry points, the newest `cuStreamGetCtx_v2`) resolve
//! to `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::OnceLock;

use crate::abi::{
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
};
use crate::exports::*;

/// One variant of an entry point.
#[derive(Clone, Copy, Debug)]
struct Variant {
    version: i32,
    per_thread: bool,
    symbol: Option<usize>,
}

#[allow(non_snake_case)]
fn D(version: i32, symbol: Option<usize>) -> Variant {
    Variant {
        version,
        per_thread: false,
        symbol,
    }
}

#[allow(non_snake_case)]
fn P(version: i32, symbol: Option<usize>) -> Variant {
    Variant {
        version,
        per_thread: true,
        symbol,
    }
}

macro_rules! f {
    ($name:ident) => {
        $name as *const () as usize
    };
}

fn table() -> &'static HashMap<&'static str, Vec<Variant>> {
    static TABLE: OnceLock<HashMap<&'static str, Vec<Variant>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        [
            (
                "cuArray3DCreate",
                vec![
                    D(2000, Some(f!(cuArray3DCreate))),
                    D(3020, Some(f!(cuArray3DCreate_v2))),
                ],
            ),
            (
                "cuArray3DGetDescriptor",
                vec![D(2000, None), D(3020, Some(f!(cuArray3DGetDescriptor_v2)))],
            ),
            (
                "cuArrayCreate",
                vec![
                    D(2000, Some(f!(cuArrayCreate))),
                    D(3020, Some(f!(cuArrayCreate_v2))),
                ],
            ),
            ("cuArrayDestroy", vec![D(2000, Some(f!(cuArrayDestroy)))]),
            (
                "cuArrayGetDescriptor",
                vec![D(2000, None), D(3020, Some(f!(cuArrayGetDescriptor_v2)))],
            ),
            (
                "cuCtxCreate",
                vec![
                    D(2000, Some(f!(cuCtxCreate))),
                    D(3020, Some(f!(cuCtxCreate_v2))),
                    D(11040, Some(f!(cuCtxCreate_v3))),
                    D(12050, Some(f!(cuCtxCreate_v4))),
                ],
            ),
            (
                "cuCtxDestroy",
                vec![
                    D(2000, Some(f!(cuCtxDestroy))),
                    D(4000, Some(f!(cuCtxDestroy_v2))),
                ],
            ),
            (
                "cuCtxDisablePeerAccess",
                vec![D(4000, Some(f!(cuCtxDisablePeerAccess)))],
            ),
            (
                "cuCtxEnablePeerAccess",
                vec![D(4000, Some(f!(cuCtxEnablePeerAccess)))],
            ),
            (
                "cuCtxGetApiVersion",
                vec![D(3020, Some(f!(cuCtxGetApiVersion)))],
            ),
            (
                "cuCtxGetCacheConfig",
                vec![D(3020, Some(f!(cuCtxGetCacheConfig)))],
            ),
            ("cuCtxGetCurrent", vec![D(4000, Some(f!(cuCtxGetCurrent)))]),
            ("cuCtxGetDevice", vec![D(2000, Some(f!(cuCtxGetDevice)))]),
            ("cuCtxGetFlags", vec![D(7000, Some(f!(cuCtxGetFlags)))]),
            ("cuCtxGetId", vec![D(12000, Some(f!(cuCtxGetId)))]),
            ("cuCtxGetLimit", vec![D(3010, Some(f!(cuCtxGetLimit)))]),
            (
                "cuCtxGetStreamPriorityRange",
                vec![D(5050, Some(f!(cuCtxGetStreamPriorityRange)))],
            ),
            (
                "cuCtxPopCurrent",
                vec![
                    D(2000, Some(f!(cuCtxPopCurrent))),
                    D(4000, Some(f!(cuCtxPopCurrent_v2))),
                ],
            ),
            (
                "cuCtxPushCurrent",
                vec![
                    D(2000, Some(f!(cuCtxPushCurrent))),
                    D(4000, Some(f!(cuCtxPushCurrent_v2))),
                ],
            ),
            (
                "cuCtxSetCacheConfig",
                vec![D(3020, Some(f!(cuCtxSetCacheConfig)))],
            ),
            ("cuCtxSetCurrent", vec![D(4000, Some(f!(cuCtxSetCurrent)))]),
            ("cuCtxSetFlags", vec![D(12010, Some(f!(cuCtxSetFlags)))]),
            ("cuCtxSetLimit", vec![D(3010, Some(f!(cuCtxSetLimit)))]),
            (
                "cuCtxSynchronize",
                vec![D(2000, Some(f!(cuCtxSynchronize)))],
            ),
            (
                "cuDeviceCanAccessPeer",
                vec![D(4000, Some(f!(cuDeviceCanAccessPeer)))],
            ),
            (
                "cuDeviceComputeCapability",
                vec![D(2000, Some(f!(cuDeviceComputeCapability)))],
            ),
            ("cuDeviceGet", vec![D(2000, Some(f!(cuDeviceGet)))]),
            (
                "cuDeviceGetAttribute",
                vec![D(2000, Some(f!(cuDeviceGetAttribute)))],
            ),
            (
                "cuDeviceGetByPCIBusId",
                vec![D(4010, Some(f!(cuDeviceGetByPCIBusId)))],
            ),
            (
                "cuDeviceGetCount",
                vec![D(2000, Some(f!(cuDeviceGetCount)))],
            ),
            (
                "cuDeviceGetDefaultMemPool",
                vec![D(11020, Some(f!(cuDeviceGetDefaultMemPool)))],
            ),
            (
                "cuDeviceGetMemPool",
                vec![D(11020, Some(f!(cuDeviceGetMemPool)))],
            ),
            ("cuDeviceGetName", vec![D(2000, Some(f!(cuDeviceGetName)))]),
            (
                "cuDeviceGetP2PAttribute",
                vec![D(8000, Some(f!(cuDeviceGetP2PAttribute)))],
            ),
            (
                "cuDeviceGetPCIBusId",
                vec![D(4010, Some(f!(cuDeviceGetPCIBusId)))],
            ),
            (
                "cuDeviceGetUuid",
                vec![
                    D(9020, Some(f!(cuDeviceGetUuid))),
                    D(11040, Some(f!(cuDeviceGetUuid_v2))),
                ],
            ),
            (
                "cuDevicePrimaryCtxGetState",
                vec![D(7000, Some(f!(cuDevicePrimaryCtxGetState)))],
            ),
            (
                "cuDevicePrimaryCtxRelease",
                vec![
                    D(7000, Some(f!(cuDevicePrimaryCtxRelease))),
                    D(11000, Some(f!(cuDevicePrimaryCtxRelease_v2))),
                ],
            ),
            (
                "cuDevicePrimaryCtxReset",
                vec![
                    D(7000, Some(f!(cuDevicePrimaryCtxReset))),
                    D(11000, Some(f!(cuDevicePrimaryCtxReset_v2))),
                ],
            ),
            (
                "cuDevicePrimaryCtxRetain",
                vec![D(7000, Some(f!(cuDevicePrimaryCtxRetain)))],
            ),
            (
                "cuDevicePrimaryCtxSetFlags",
                vec![
                    D(7000, Some(f!(cuDevicePrimaryCtxSetFlags))),
                    D(11000, Some(f!(cuDevicePrimaryCtxSetFlags_v2))),
                ],
            ),
            (
                "cuDeviceSetMemPool",
                vec![D(11020, Some(f!(cuDeviceSetMemPool)))],
            ),
            (
                "cuDeviceTotalMem",
                vec![D(2000, None), D(3020, Some(f!(cuDeviceTotalMem_v2)))],
            ),
            (
                "cuDriverGetVersion",
                vec![D(2020, Some(f!(cuDriverGetVersion)))],
            ),
            ("cuEventCreate", vec![D(2000, Some(f!(cuEventCreate)))]),
            (
                "cuEventDestroy",
                vec![
                    D(2000, Some(f!(cuEventDestroy))),
                    D(4000, Some(f!(cuEventDestroy_v2))),
                ],
            ),
            (
                "cuEventElapsedTime",
                vec![D(2000, Some(f!(cuEventElapsedTime)))],
            ),
            ("cuEventQuery", vec![D(2000, Some(f!(cuEventQuery)))]),
            (
                "cuEventRecord",
                vec![
                    D(2000, Some(f!(cuEventRecord))),
                    P(7000, Some(f!(cuEventRecord_ptsz))),
                ],
            ),
            (
                "cuEventRecordWithFlags",
                vec![
                    D(11010, Some(f!(cuEventRecordWithFlags))),
                    P(11010, Some(f!(cuEventRecordWithFlags_ptsz))),
                ],
            ),
            (
                "cuEventSynchronize",
                vec![D(2000, Some(f!(cuEventSynchronize)))],
            ),
            (
                "cuFuncGetAttribute",
                vec![D(2020, Some(f!(cuFuncGetAttribute)))],
            ),
            ("cuFuncGetName", vec![D(12030, Some(f!(cuFuncGetName)))]),
            (
                "cuFuncSetAttribute",
                vec![D(9000, Some(f!(cuFuncSetAttribute)))],
            ),
            (
                "cuFuncSetCacheConfig",
                vec![D(3000, Some(f!(cuFuncSetCacheConfig)))],
            ),
            ("cuGetErrorName", vec![D(6000, Some(f!(cuGetErrorName)))]),
            (
                "cuGetErrorString",
                vec![D(6000, Some(f!(cuGetErrorString)))],
            ),
            (
                "cuGetExportTable",
                vec![D(3000, Some(f!(cuGetExportTable)))],
            ),
            (
                "cuGetProcAddress",
                vec![
                    D(11030, Some(f!(cuGetProcAddress))),
                    D(12000, Some(f!(cuGetProcAddress_v2))),
                ],
            ),
            (
                "cuGraphAddChildGraphNode",
                vec![D(10000, Some(f!(cuGraphAddChildGraphNode)))],
            ),
            (
                "cuGraphAddEmptyNode",
                vec![D(10000, Some(f!(cuGraphAddEmptyNode)))],
            ),
            (
                "cuGraphAddKernelNode",
                vec![
                    D(10000, Some(f!(cuGraphAddKernelNode))),
                    D(12000, Some(f!(cuGraphAddKernelNode_v2))),
                ],
            ),
            (
                "cuGraphAddMemAllocNode",
                vec![D(11040, Some(f!(cuGraphAddMemAllocNode)))],
            ),
            (
                "cuGraphAddMemFreeNode",
                vec![D(11040, Some(f!(cuGraphAddMemFreeNode)))],
            ),
            (
                "cuGraphAddNode",
                vec![
                    D(12020, Some(f!(cuGraphAddNode))),
                    D(12030, Some(f!(cuGraphAddNode_v2))),
                ],
            ),
            (
                "cuGraphChildGraphNodeGetGraph",
                vec![D(10000, Some(f!(cuGraphChildGraphNodeGetGraph)))],
            ),
            ("cuGraphCreate", vec![D(10000, Some(f!(cuGraphCreate)))]),
            (
                "cuGraphDebugDotPrint",
                vec![D(11030, Some(f!(cuGraphDebugDotPrint)))],
            ),
            ("cuGraphDestroy", vec![D(10000, Some(f!(cuGraphDestroy)))]),
            (
                "cuGraphExecDestroy",
                vec![D(10000, Some(f!(cuGraphExecDestroy)))],
            ),
            (
                "cuGraphExecChildGraphNodeSetParams",
                vec![D(11010, Some(f!(cuGraphExecChildGraphNodeSetParams)))],
            ),
            (
                "cuGraphExecKernelNodeSetParams",
                vec![
                    D(10010, Some(f!(cuGraphExecKernelNodeSetParams))),
                    D(12000, Some(f!(cuGraphExecKernelNodeSetParams_v2))),
                ],
            ),
            (
                "cuGraphExecNodeSetParams",
                vec![D(12020, Some(f!(cuGraphExecNodeSetParams)))],
            ),
            (
                "cuGraphExecUpdate",
                vec![
                    D(10020, Some(f!(cuGraphExecUpdate))),
                    D(12000, Some(f!(cuGraphExecUpdate_v2))),
                ],
            ),
            ("cuGraphGetNodes", vec![D(10000, Some(f!(cuGraphGetNodes)))]),
            (
                "cuGraphInstantiate",
                vec![
                    D(10000, Some(f!(cuGraphInstantiate))),
                    D(11000, Some(f!(cuGraphInstantiate_v2))),
                    D(12000, Some(f!(cuGraphInstantiateWithFlags))),
                ],
            ),
            (
                "cuGraphInstantiateWithFlags",
                vec![D(11040, Some(f!(cuGraphInstantiateWithFlags)))],
            ),
            (
                "cuGraphInstantiateWithParams",
                vec![
                    D(12000, Some(f!(cuGraphInstantiateWithParams))),
                    P(12000, Some(f!(cuGraphInstantiateWithParams_ptsz))),
                ],
            ),
            (
                "cuGraphKernelNodeGetParams",
                vec![
                    D(10000, Some(f!(cuGraphKernelNodeGetParams))),
                    D(12000, Some(f!(cuGraphKernelNodeGetParams_v2))),
                ],
            ),
            (
                "cuGraphLaunch",
                vec![
                    D(10000, Some(f!(cuGraphLaunch))),
                    P(10000, Some(f!(cuGraphLaunch_ptsz))),
                ],
            ),
            (
                "cuGraphNodeGetType",
                vec![D(10000, Some(f!(cuGraphNodeGetType)))],
            ),
            (
                "cuGraphUpload",
                vec![
                    D(11010, Some(f!(cuGraphUpload))),
                    P(11010, Some(f!(cuGraphUpload_ptsz))),
                ],
            ),
            (
                "cuFuncSetBlockShape",
                vec![D(2000, Some(f!(cuFuncSetBlockShape)))],
            ),
            ("cuInit", vec![D(2000, Some(f!(cuInit)))]),
            ("cuLaunch", vec![D(2000, Some(f!(cuLaunch)))]),
            ("cuLaunchGrid", vec![D(2000, Some(f!(cuLaunchGrid)))]),
            (
                "cuLaunchGridAsync",
                vec![D(2000, Some(f!(cuLaunchGridAsync)))],
            ),
            (
                "cuKernelGetAttribute",
                vec![D(12000, Some(f!(cuKernelGetAttribute)))],
            ),
            ("cuKernelGetName", vec![D(12030, Some(f!(cuKernelGetName)))]),
            (
                "cuKernelSetAttribute",
                vec![D(12000, Some(f!(cuKernelSetAttribute)))],
            ),
            (
                "cuKernelSetCacheConfig",
                vec![D(12000, Some(f!(cuKernelSetCacheConfig)))],
            ),
            (
                "cuKernelGetFunction",
                vec![D(12000, Some(f!(cuKernelGetFunction)))],
            ),
            (
                "cuLaunchCooperativeKernel",
                vec![
                    D(9000, Some(f!(cuLaunchCooperativeKernel))),
                    P(9000, Some(f!(cuLaunchCooperativeKernel_ptsz))),
                ],
            ),
            (
                "cuLaunchHostFunc",
                vec![
                    D(10000, Some(f!(cuLaunchHostFunc))),
                    P(10000, Some(f!(cuLaunchHostFunc_ptsz))),
                ],
            ),
            (
                "cuLaunchKernel",
                vec![
                    D(4000, Some(f!(cuLaunchKernel))),
                    P(7000, Some(f!(cuLaunchKernel_ptsz))),
                ],
            ),
            (
                "cuLaunchKernelEx",
                vec![
                    D(11060, Some(f!(cuLaunchKernelEx))),
                    P(11060, Some(f!(cuLaunchKernelEx_ptsz))),
                ],
            ),
            (
                "cuLibraryGetKernel",
                vec![D(12000, Some(f!(cuLibraryGetKernel)))],
            ),
            (
                "cuLibraryGetModule",
                vec![D(12000, Some(f!(cuLibraryGetModule)))],
            ),
            (
                "cuLibraryLoadData",
                vec![D(12000, Some(f!(cuLibraryLoadData)))],
            ),
            ("cuLibraryUnload", vec![D(12000, Some(f!(cuLibraryUnload)))]),
            (
                "cuLogsRegisterCallback",
                vec![D(12090, Some(f!(cuLogsRegisterCallback)))],
            ),
            (
                "cuLogsUnregisterCallback",
                vec![D(12090, Some(f!(cuLogsUnregisterCallback)))],
            ),
            (
                "cuMemAddressFree",
                vec![D(10020, Some(f!(cuMemAddressFree)))],
            ),
            (
                "cuMemAddressReserve",
                vec![D(10020, Some(f!(cuMemAddressReserve)))],
            ),
            (
                "cuMemAdvise",
                vec![
                    D(8000, Some(f!(cuMemAdvise))),
                    D(12020, Some(f!(cuMemAdvise_v2))),
                ],
            ),
            (
                "cuMemAlloc",
                vec![
                    D(2000, Some(f!(cuMemAlloc))),
                    D(3020, Some(f!(cuMemAlloc_v2))),
                ],
            ),
            (
                "cuMemAllocAsync",
                vec![
                    D(11020, Some(f!(cuMemAllocAsync))),
                    P(11020, Some(f!(cuMemAllocAsync_ptsz))),
                ],
            ),
            (
                "cuMemAllocFromPoolAsync",
                vec![
                    D(11020, Some(f!(cuMemAllocFromPoolAsync))),
                    P(11020, Some(f!(cuMemAllocFromPoolAsync_ptsz))),
                ],
            ),
            (
                "cuMemAllocHost",
                vec![D(2000, None), D(3020, Some(f!(cuMemAllocHost_v2)))],
            ),
            (
                "cuMemAllocManaged",
                vec![D(6000, Some(f!(cuMemAllocManaged)))],
            ),
            (
                "cuMemAllocPitch",
                vec![
                    D(2000, Some(f!(cuMemAllocPitch))),
                    D(3020, Some(f!(cuMemAllocPitch_v2))),
                ],
            ),
            ("cuMemCreate", vec![D(10020, Some(f!(cuMemCreate)))]),
            (
                "cuMemFree",
                vec![D(2000, None), D(3020, Some(f!(cuMemFree_v2)))],
            ),
            (
                "cuMemFreeAsync",
                vec![
                    D(11020, Some(f!(cuMemFreeAsync))),
                    P(11020, Some(f!(cuMemFreeAsync_ptsz))),
                ],
            ),
            ("cuMemFreeHost", vec![D(2000, Some(f!(cuMemFreeHost)))]),
            (
                "cuMemGetAddressRange",
                vec![D(2000, None), D(3020, Some(f!(cuMemGetAddressRange_v2)))],
            ),
            (
                "cuMemGetAllocationGranularity",
                vec![D(10020, Some(f!(cuMemGetAllocationGranularity)))],
            ),
            (
                "cuMemGetAllocationPropertiesFromHandle",
                vec![D(10020, Some(f!(cuMemGetAllocationPropertiesFromHandle)))],
            ),
            (
                "cuMemGetInfo",
                vec![
                    D(2000, Some(f!(cuMemGetInfo))),
                    D(3020, Some(f!(cuMemGetInfo_v2))),
                ],
            ),
            ("cuMemHostAlloc", vec![D(2020, Some(f!(cuMemHostAlloc)))]),
            (
                "cuMemHostGetDevicePointer",
                vec![
                    D(2020, None),
                    D(3020, Some(f!(cuMemHostGetDevicePointer_v2))),
                ],
            ),
            (
                "cuMemHostGetFlags",
                vec![D(2030, Some(f!(cuMemHostGetFlags)))],
            ),
            (
                "cuMemHostRegister",
                vec![
                    D(4000, Some(f!(cuMemHostRegister))),
                    D(6050, Some(f!(cuMemHostRegister_v2))),
                ],
            ),
            (
                "cuMemHostUnregister",
                vec![D(4000, Some(f!(cuMemHostUnregister)))],
            ),
            ("cuMemMap", vec![D(10020, Some(f!(cuMemMap)))]),
            ("cuMemPoolCreate", vec![D(11020, Some(f!(cuMemPoolCreate)))]),
            (
                "cuMemPoolDestroy",
                vec![D(11020, Some(f!(cuMemPoolDestroy)))],
            ),
            (
                "cuMemPoolGetAttribute",
                vec![D(11020, Some(f!(cuMemPoolGetAttribute)))],
            ),
            (
                "cuMemPoolSetAttribute",
                vec![D(11020, Some(f!(cuMemPoolSetAttribute)))],
            ),
            ("cuMemPoolTrimTo", vec![D(11020, Some(f!(cuMemPoolTrimTo)))]),
            (
                "cuMemPrefetchAsync",
                vec![
                    D(8000, Some(f!(cuMemPrefetchAsync))),
                    D(12020, Some(f!(cuMemPrefetchAsync_v2))),
                    P(8000, Some(f!(cuMemPrefetchAsync_ptsz))),
                    P(12020, Some(f!(cuMemPrefetchAsync_v2_ptsz))),
                ],
            ),
            ("cuMemRelease", vec![D(10020, Some(f!(cuMemRelease)))]),
            (
                "cuMemRetainAllocationHandle",
                vec![D(11000, Some(f!(cuMemRetainAllocationHandle)))],
            ),
            ("cuMemSetAccess", vec![D(10020, Some(f!(cuMemSetAccess)))]),
            ("cuMemUnmap", vec![D(10020, Some(f!(cuMemUnmap)))]),
            (
                "cuMemcpy",
                vec![
                    D(4000, Some(f!(cuMemcpy))),
                    P(7000, Some(f!(cuMemcpy_ptds))),
                ],
            ),
            (
                "cuMemcpyAsync",
                vec![
                    D(4000, Some(f!(cuMemcpyAsync))),
                    P(7000, Some(f!(cuMemcpyAsync_ptsz))),
                ],
            ),
            (
                "cuMemcpyDtoD",
                vec![
                    D(2000, None),
                    D(3020, Some(f!(cuMemcpyDtoD_v2))),
                    P(7000, Some(f!(cuMemcpyDtoD_v2_ptds))),
                ],
            ),
            (
                "cuMemcpyDtoDAsync",
                vec![
                    D(3000, None),
                    D(3020, Some(f!(cuMemcpyDtoDAsync_v2))),
                    P(7000, Some(f!(cuMemcpyDtoDAsync_v2_ptsz))),
                ],
            ),
            (
                "cuMemcpyDtoH",
                vec![
                    D(2000, None),
                    D(3020, Some(f!(cuMemcpyDtoH_v2))),
                    P(7000, Some(f!(cuMemcpyDtoH_v2_ptds))),
                ],
            ),
            (
                "cuMemcpyDtoHAsync",
                vec![
                    D(2000, None),
                    D(3020, Some(f!(cuMemcpyDtoHAsync_v2))),
                    P(7000, Some(f!(cuMemcpyDtoHAsync_v2_ptsz))),
                ],
            ),
            (
                "cuMemcpyHtoD",
                vec![
                    D(2000, None),
                    D(3020, Some(f!(cuMemcpyHtoD_v2))),
                    P(7000, Some(f!(cuMemcpyHtoD_v2_ptds))),
                ],
            ),
            (
                "cuMemcpyHtoDAsync",
                vec![
                    D(2000, None),
                    D(3020, Some(f!(cuMemcpyHtoDAsync_v2))),
                    P(7000, Some(f!(cuMemcpyHtoDAsync_v2_ptsz))),
                ],
            ),
            (
                "cuMemcpyPeer",
                vec![
                    D(4000, Some(f!(cuMemcpyPeer))),
                    P(7000, Some(f!(cuMemcpyPeer_ptds))),
                ],
            ),
            (
                "cuMemcpyPeerAsync",
                vec![
                    D(4000, Some(f!(cuMemcpyPeerAsync))),
                    P(7000, Some(f!(cuMemcpyPeerAsync_ptsz))),
                ],
            ),
            (
                "cuMemsetD16",
                vec![
                    D(2000, None),
                    D(3020, Some(f!(cuMemsetD16_v2))),
                    P(7000, Some(f!(cuMemsetD16_v2_ptds))),
                ],
            ),
            (
                "cuMemsetD16Async",
                vec![
                    D(3020, Some(f!(cuMemsetD16Async))),
                    P(7000, Some(f!(cuMemsetD16Async_ptsz))),
                ],
            ),
            (
                "cuMemsetD32",
                vec![
                    D(2000, None),
                    D(3020, Some(f!(cuMemsetD32_v2))),
                    P(7000, Some(f!(cuMemsetD32_v2_ptds))),
                ],
            ),
            (
                "cuMemsetD32Async",
                vec![
                    D(3020, Some(f!(cuMemsetD32Async))),
                    P(7000, Some(f!(cuMemsetD32Async_ptsz))),
                ],
            ),
            (
                "cuMemsetD8",
                vec![
                    D(2000, None),
                    D(3020, Some(f!(cuMemsetD8_v2))),
                    P(7000, Some(f!(cuMemsetD8_v2_ptds))),
                ],
            ),
            (
                "cuMemsetD8Async",
                vec![
                    D(3020, Some(f!(cuMemsetD8Async))),
                    P(7000, Some(f!(cuMemsetD8Async_ptsz))),
                ],
            ),
            (
                "cuMipmappedArrayCreate",
                vec![D(5000, Some(f!(cuMipmappedArrayCreate)))],
            ),
            (
                "cuMipmappedArrayDestroy",
                vec![D(5000, Some(f!(cuMipmappedArrayDestroy)))],
            ),
            (
                "cuMipmappedArrayGetLevel",
                vec![D(5000, Some(f!(cuMipmappedArrayGetLevel)))],
            ),
            (
                "cuModuleGetFunction",
                vec![D(2000, Some(f!(cuModuleGetFunction)))],
            ),
            (
                "cuModuleGetGlobal",
                vec![D(2000, None), D(3020, Some(f!(cuModuleGetGlobal_v2)))],
            ),
            ("cuModuleLoad", vec![D(2000, Some(f!(cuModuleLoad)))]),
            (
                "cuModuleLoadData",
                vec![D(2000, Some(f!(cuModuleLoadData)))],
            ),
            (
                "cuModuleLoadDataEx",
                vec![D(2010, Some(f!(cuModuleLoadDataEx)))],
            ),
            (
                "cuModuleLoadFatBinary",
                vec![D(2000, Some(f!(cuModuleLoadFatBinary)))],
            ),
            (
                "cuModuleGetLoadingMode",
                vec![D(11070, Some(f!(cuModuleGetLoadingMode)))],
            ),
            ("cuModuleUnload", vec![D(2000, Some(f!(cuModuleUnload)))]),
            (
                "cuPointerGetAttribute",
                vec![D(4000, Some(f!(cuPointerGetAttribute)))],
            ),
            (
                "cuPointerGetAttributes",
                vec![D(7000, Some(f!(cuPointerGetAttributes)))],
            ),
            (
                "cuStreamAddCallback",
                vec![
                    D(5000, Some(f!(cuStreamAddCallback))),
                    P(7000, Some(f!(cuStreamAddCallback_ptsz))),
                ],
            ),
            (
                "cuStreamBeginCapture",
                vec![
                    D(10000, Some(f!(cuStreamBeginCapture))),
                    D(10010, Some(f!(cuStreamBeginCapture_v2))),
                    P(10000, Some(f!(cuStreamBeginCapture_ptsz))),
                    P(10010, Some(f!(cuStreamBeginCapture_v2_ptsz))),
                ],
            ),
            ("cuStreamCreate", vec![D(2000, Some(f!(cuStreamCreate)))]),
            (
                "cuStreamCreateWithPriority",
                vec![D(5050, Some(f!(cuStreamCreateWithPriority)))],
            ),
            (
                "cuStreamDestroy",
                vec![
                    D(2000, Some(f!(cuStreamDestroy))),
                    D(4000, Some(f!(cuStreamDestroy_v2))),
                ],
            ),
            (
                "cuStreamEndCapture",
                vec![
                    D(10000, Some(f!(cuStreamEndCapture))),
                    P(10000, Some(f!(cuStreamEndCapture_ptsz))),
                ],
            ),
            (
                "cuStreamGetCtx",
                vec![
                    D(9020, Some(f!(cuStreamGetCtx))),
                    D(12050, None),
                    P(9020, Some(f!(cuStreamGetCtx_ptsz))),
                    P(12050, None),
                ],
            ),
            (
                "cuStreamGetFlags",
                vec![
                    D(5050, Some(f!(cuStreamGetFlags))),
                    P(7000, Some(f!(cuStreamGetFlags_ptsz))),
                ],
            ),
            (
                "cuStreamGetPriority",
                vec![
                    D(5050, Some(f!(cuStreamGetPriority))),
                    P(7000, Some(f!(cuStreamGetPriority_ptsz))),
                ],
            ),
            (
                "cuStreamIsCapturing",
                vec![
                    D(10000, Some(f!(cuStreamIsCapturing))),
                    P(10000, Some(f!(cuStreamIsCapturing_ptsz))),
                ],
            ),
            (
                "cuStreamQuery",
                vec![
                    D(2000, Some(f!(cuStreamQuery))),
                    P(7000, Some(f!(cuStreamQuery_ptsz))),
                ],
            ),
            (
                "cuStreamSynchronize",
                vec![
                    D(2000, Some(f!(cuStreamSynchronize))),
                    P(7000, Some(f!(cuStreamSynchronize_ptsz))),
                ],
            ),
            (
                "cuStreamWaitEvent",
                vec![
                    D(3020, Some(f!(cuStreamWaitEvent))),
                    P(7000, Some(f!(cuStreamWaitEvent_ptsz))),
                ],
            ),
        ]
        .into_iter()
        .collect()
    })
}

/// Resolves `name` for `version` and `flags`; on failure, the
/// `CUdriverProcAddressQueryResult` to report. A driver API name the
/// simulator does not implement resolves (from the version that
/// introduced it) to a function that names itself once on stderr when
/// called and returns `CUDA_ERROR_NOT_SUPPORTED`: NVIDIA's runtime
/// resolves every entry point of its driver API version at start and
/// refuses a driver that lacks one, and the next gap a program hits then
/// names itself.
pub fn lookup(name: &str, version: i32, flags: u64) -> Result<*mut c_void, i32> {
    let r = match table().get(name) {
        Some(variants) => resolve(variants, version, flags),
        None => unsimulated(name, version),
    };
    if crate::exports::trace_enabled() && r.is_err() {
        eprintln!("gpusim-trace: cuGetProcAddress({name}, {version}, {flags}): {r:?}");
    }
    r
}

fn resolve(variants: &[Variant], version: i32, flags: u64) -> Result<*mut c_void, i32> {
    let newest = |per_thread: bool| {
        variants
            .iter()
            .filter(|v| v.per_thread == per_thread && v.version <= version)
            .max_by_key(|v| v.version)
    };
    let chosen = if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 {
        newest(true).or_else(|| newest(false))
    } else {
        newest(false)
    };
    let v = chosen.ok_or(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)?;
    v.symbol
        .map(|s| s as *mut c_void)
        .ok_or(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
}

/// Every driver API name with the version that introduced it
/// (`driver_api_names.txt`), in the file's order.
fn api_names() -> &'static [(&'static str, i32)] {
    static NAMES: OnceLock<Vec<(&'static str, i32)>> = OnceLock::new();
    NAMES.get_or_init(|| {
        include_str!("driver_api_names.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (name, version) = l.split_once(' ')?;
                Some((name, version.trim().parse().ok()?))
            })
            .collect()
    })
}

/// The stand-in for a driver API name without an implementation.
fn unsimulated(name: &str, version: i32) -> Result<*mut c_void, i32> {
    let index = api_names()
        .iter()
        .position(|&(n, _)| n == name)
        .ok_or(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)?;
    if version < api_names()[index].1 {
        return Err(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    }
    UNSIMULATED
        .get(index)
        .map(|&f| f as *mut c_void)
        .ok_or(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
}

type StandIn = unsafe extern "C" fn() -> crate::status::CUresult;

/// Called through the stand-in for the `I`th name of
/// `driver_api_names.txt`.
unsafe extern "C" fn unsimulated_call<const I: usize>() -> crate::status::CUresult {
    crate::exports::guard(|| {
        let name = api_names().get(I).map_or("?", |n| n.0);
        crate::export_table::log_once(format!(
            "unsimulated driver call: {name}; returning CUDA_ERROR_NOT_SUPPORTED"
        ));
        Err(crate::status::CUDA_ERROR_NOT_SUPPORTED)
    })
}

macro_rules! stand_ins {
    ($($hi:literal)*) => {
        [$(
            stand_ins!(@row $hi 0), stand_ins!(@row $hi 1), stand_ins!(@row $hi 2), stand_ins!(@row $hi 3),
            stand_ins!(@row $hi 4), stand_ins!(@row $hi 5), stand_ins!(@row $hi 6), stand_ins!(@row $hi 7),
            stand_ins!(@row $hi 8), stand_ins!(@row $hi 9), stand_ins!(@row $hi 10), stand_ins!(@row $hi 11),
            stand_ins!(@row $hi 12), stand_ins!(@row $hi 13), stand_ins!(@row $hi 14), stand_ins!(@row $hi 15),
        )*]
    };
    (@row $hi:literal $lo:literal) => {
        unsimulated_call::<{ $hi * 16 + $lo }> as StandIn
    };
}

/// One stand-in per line of `driver_api_names.txt` (room for 768).
static UNSIMULATED: [StandIn; 768] = stand_ins!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23
    24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47
);

/// Every base name known to `cuGetProcAddress`.
pub fn names() -> impl Iterator<Item = &'static str> {
    table().keys().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str, version: i32, flags: u64) -> usize {
        lookup(name, version, flags).unwrap() as usize
    }

    #[test]
    fn versions_pick_the_right_variant() {
        assert_eq!(sym("cuMemAlloc", 12080, 0), f!(cuMemAlloc_v2));
        assert_eq!(sym("cuMemAlloc", 3020, 0), f!(cuMemAlloc_v2));
        assert_eq!(sym("cuMemAlloc", 2000, 0), f!(cuMemAlloc));
        assert_eq!(
            lookup("cuMemFree", 2000, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        );
        assert_eq!(
            lookup("cuMemAllocAsync", 11000, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        );
        assert_eq!(sym("cuCtxCreate", 11040, 0), f!(cuCtxCreate_v3));
        assert_eq!(sym("cuCtxCreate", 12080, 0), f!(cuCtxCreate_v4));
        assert_eq!(sym("cuGetProcAddress", 12000, 0), f!(cuGetProcAddress_v2));
        assert_eq!(sym("cuGetProcAddress", 11030, 0), f!(cuGetProcAddress));
        assert_eq!(
            sym("cuGraphInstantiate", 12000, 0),
            f!(cuGraphInstantiateWithFlags)
        );
        assert_eq!(
            lookup("cuNoSuchThing", 12000, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        );
    }

    #[test]
    fn unimplemented_api_names_resolve_to_stand_ins() {
        let a = sym("cuGLInit", 12000, 0);
        let b = sym("cuLinkCreate", 12000, 0);
        assert_ne!(a, b);
        assert_eq!(a, sym("cuGLInit", 2000, 0));
        assert_eq!(
            lookup("cuLibraryEnumerateKernels", 12030, 0).unwrap_err(),
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        );
        assert!(api_names().len() <= UNSIMULATED.len());
    }

    #[test]
    fn per_thread_flag_picks_ptds_and_ptsz() {
        let pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        assert_eq!(sym("cuLaunchKernel", 12000, pt), f!(cuLaunchKernel_ptsz));
        assert_eq!(sym("cuLaunchKernel", 12000, 0), f!(cuLaunchKernel));
        assert_eq!(sym("cuMemcpyHtoD", 12000, pt), f!(cuMemcpyHtoD_v2_ptds));
        // Before per-thread variants existed, the default one is returned.
        assert_eq!(sym("cuMemcpyHtoD", 6000, pt), f!(cuMemcpyHtoD_v2));
        // Names without a per-thread variant ignore the flag.
        assert_eq!(sym("cuMemAlloc", 12000, pt), f!(cuMemAlloc_v2));
    }
}
