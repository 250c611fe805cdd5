//! The real driver libraries' entry points, resolved once.
//!
//! `libcuda.so.1` and `libnvidia-ml.so.1` are opened by name (the loader
//! returns the copy the program already loaded) and every function the
//! hooks forward to is looked up with the C library's `dlsym`. A missing
//! function (an older driver) is `None`; its hook then answers
//! `CUDA_ERROR_NOT_FOUND` / `NVML_ERROR_FUNCTION_NOT_FOUND`.

use std::ffi::{CStr, c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ffi::*;
use crate::sys;

macro_rules! real_fns {
    ($table:ident { $( $name:ident : fn($($arg:ty),* $(,)?) -> $ret:ty ; )* }) => {
        /// Real entry points (see the module docs).
        #[allow(non_snake_case, missing_docs)]
        pub struct $table {
            $( pub $name: Option<unsafe extern "C" fn($($arg),*) -> $ret>, )*
        }

        impl $table {
            fn load(handle: *mut c_void) -> Self {
                Self {
                    $( $name: {
                        let name = concat!(stringify!($name), "\0");
                        let p = CStr::from_bytes_with_nul(name.as_bytes())
                            .map(|n| sys::real_dlsym(handle, n))
                            .unwrap_or(std::ptr::null_mut());
                        if p.is_null() {
                            None
                        } else {
                            // SAFETY: the library exports this name with the
                            // driver API signature declared here.
                            Some(unsafe {
                                std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p)
                            })
                        }
                    }, )*
                }
            }
        }
    };
}

/// Calls a real CUDA entry point, or answers `CUDA_ERROR_NOT_FOUND` if the
/// driver lacks it. The arguments are the hook's own (plain values and
/// pointers), evaluated inside the call's `unsafe` block: they are never
/// dereferences (the hooks read caller memory in blocks of their own).
#[allow(clippy::macro_metavars_in_unsafe)]
macro_rules! real_cuda {
    ($name:ident($($arg:expr),* $(,)?)) => {
        match $crate::real::cuda().and_then(|c| c.$name) {
            // SAFETY: the real driver function, called with the arguments
            // our caller passed us (same contract) or values we built.
            Some(f) => unsafe { f($($arg),*) },
            None => $crate::ffi::CUDA_ERROR_NOT_FOUND,
        }
    };
}
pub(crate) use real_cuda;

type H = Handle;

real_fns!(Cuda {
    cuInit: fn(c_uint) -> CUresult;
    cuGetProcAddress: fn(CStr_, *mut *mut c_void, c_int, c_ulonglong) -> CUresult;
    cuGetProcAddress_v2: fn(CStr_, *mut *mut c_void, c_int, c_ulonglong, *mut c_int) -> CUresult;
    cuDeviceGetUuid: fn(*mut CUuuid, CUdevice) -> CUresult;
    cuDeviceGetUuid_v2: fn(*mut CUuuid, CUdevice) -> CUresult;
    cuDeviceTotalMem_v2: fn(*mut usize, CUdevice) -> CUresult;
    cuCtxGetDevice: fn(*mut CUdevice) -> CUresult;
    cuCtxGetCurrent: fn(*mut H) -> CUresult;
    cuCtxCreate_v2: fn(*mut H, c_uint, CUdevice) -> CUresult;
    cuCtxCreate_v3: fn(*mut H, *mut c_void, c_int, c_uint, CUdevice) -> CUresult;
    cuCtxCreate_v4: fn(*mut H, *mut c_void, c_uint, CUdevice) -> CUresult;
    cuCtxDestroy_v2: fn(H) -> CUresult;
    cuDevicePrimaryCtxRetain: fn(*mut H, CUdevice) -> CUresult;
    cuDevicePrimaryCtxRelease_v2: fn(CUdevice) -> CUresult;
    cuDevicePrimaryCtxReset_v2: fn(CUdevice) -> CUresult;
    cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> CUresult;
    cuMemGetAllocationGranularity: fn(*mut usize, *const CUmemAllocationProp, c_int) -> CUresult;
    cuMemAlloc_v2: fn(*mut CUdeviceptr, usize) -> CUresult;
    cuMemAllocPitch_v2: fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
    cuMemAllocManaged: fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
    cuMemFree_v2: fn(CUdeviceptr) -> CUresult;
    cuMemAllocAsync: fn(*mut CUdeviceptr, usize, H) -> CUresult;
    cuMemAllocAsync_ptsz: fn(*mut CUdeviceptr, usize, H) -> CUresult;
    cuMemAllocFromPoolAsync: fn(*mut CUdeviceptr, usize, H, H) -> CUresult;
    cuMemAllocFromPoolAsync_ptsz: fn(*mut CUdeviceptr, usize, H, H) -> CUresult;
    cuMemFreeAsync: fn(CUdeviceptr, H) -> CUresult;
    cuMemFreeAsync_ptsz: fn(CUdeviceptr, H) -> CUresult;
    cuMemPoolCreate: fn(*mut H, *const CUmemPoolProps) -> CUresult;
    cuMemPoolGetAttribute: fn(H, c_int, *mut c_void) -> CUresult;
    cuMemPoolTrimTo: fn(H, usize) -> CUresult;
    cuStreamIsCapturing: fn(H, *mut c_int) -> CUresult;
    cuStreamSynchronize: fn(H) -> CUresult;
    cuDeviceGetDefaultMemPool: fn(*mut H, CUdevice) -> CUresult;
    cuDeviceGetMemPool: fn(*mut H, CUdevice) -> CUresult;
    cuMemCreate: fn(*mut c_ulonglong, usize, *const CUmemAllocationProp, c_ulonglong) -> CUresult;
    cuMemRelease: fn(c_ulonglong) -> CUresult;
    cuMemRetainAllocationHandle: fn(*mut c_ulonglong, *mut c_void) -> CUresult;
    cuMemMap: fn(CUdeviceptr, usize, usize, c_ulonglong, c_ulonglong) -> CUresult;
    cuMemUnmap: fn(CUdeviceptr, usize) -> CUresult;
    cuArrayCreate_v2: fn(*mut H, *const ArrayDescriptor) -> CUresult;
    cuArray3DCreate_v2: fn(*mut H, *const Array3dDescriptor) -> CUresult;
    cuArrayDestroy: fn(H) -> CUresult;
    cuMipmappedArrayCreate: fn(*mut H, *const Array3dDescriptor, c_uint) -> CUresult;
    cuMipmappedArrayDestroy: fn(H) -> CUresult;
    cuLaunchKernel: fn(H, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, H, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    cuLaunchKernel_ptsz: fn(H, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, H, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    cuLaunchKernelEx: fn(*const LaunchConfig, H, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    cuLaunchKernelEx_ptsz: fn(*const LaunchConfig, H, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    cuLaunchCooperativeKernel: fn(H, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, H, *mut *mut c_void) -> CUresult;
    cuLaunchCooperativeKernel_ptsz: fn(H, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, H, *mut *mut c_void) -> CUresult;
    cuGraphInstantiateWithFlags: fn(*mut H, H, c_ulonglong) -> CUresult;
    cuGraphInstantiate_v2: fn(*mut H, H, *mut H, *mut std::ffi::c_char, usize) -> CUresult;
    cuGraphExecDestroy: fn(H) -> CUresult;
    cuGraphInstantiateWithParams: fn(*mut H, H, *mut c_void) -> CUresult;
    cuGraphExecKernelNodeSetParams_v2: fn(H, H, *const KernelNodeParams) -> CUresult;
    cuGraphExecUpdate_v2: fn(H, H, *mut c_void) -> CUresult;
    cuGraphInstantiateWithParams_ptsz: fn(*mut H, H, *mut c_void) -> CUresult;
    cuGraphExecKernelNodeSetParams: fn(H, H, *const KernelNodeParamsV1) -> CUresult;
    cuGraphExecUpdate: fn(H, H, *mut H, *mut c_int) -> CUresult;
    cuGraphAddMemAllocNode: fn(*mut H, H, *const H, usize, *mut c_void) -> CUresult;
    cuGraphAddNode: fn(*mut H, H, *const H, usize, *mut GraphNodeParams) -> CUresult;
    cuGraphAddNode_v2: fn(*mut H, H, *const H, *const c_void, usize, *mut GraphNodeParams) -> CUresult;
    cuGraphExecNodeSetParams: fn(H, H, *mut GraphNodeParams) -> CUresult;
    cuGraphExecChildGraphNodeSetParams: fn(H, H, H) -> CUresult;
    cuMemPoolDestroy: fn(H) -> CUresult;
    cuMemAlloc: fn(*mut c_uint, c_uint) -> CUresult;
    cuMemAllocPitch: fn(*mut c_uint, *mut c_uint, c_uint, c_uint, c_uint) -> CUresult;
    cuMemGetInfo: fn(*mut c_uint, *mut c_uint) -> CUresult;
    cuArrayCreate: fn(*mut H, *const c_void) -> CUresult;
    cuArray3DCreate: fn(*mut H, *const c_void) -> CUresult;
    cuLaunch: fn(H) -> CUresult;
    cuLaunchGrid: fn(H, c_int, c_int) -> CUresult;
    cuLaunchGridAsync: fn(H, c_int, c_int, H) -> CUresult;
    cuGraphChildGraphNodeGetGraph: fn(H, *mut H) -> CUresult;
    cuGraphLaunch: fn(H, H) -> CUresult;
    cuGraphLaunch_ptsz: fn(H, H) -> CUresult;
    cuGraphGetNodes: fn(H, *mut H, *mut usize) -> CUresult;
    cuGraphNodeGetType: fn(H, *mut c_int) -> CUresult;
    cuGraphKernelNodeGetParams_v2: fn(H, *mut KernelNodeParams) -> CUresult;
    cuGraphKernelNodeGetParams: fn(H, *mut KernelNodeParams) -> CUresult;
});

real_fns!(Nvml {
    nvmlInit: fn() -> NvmlReturn;
    nvmlInit_v2: fn() -> NvmlReturn;
    nvmlInitWithFlags: fn(c_uint) -> NvmlReturn;
    nvmlDeviceGetUUID: fn(H, *mut std::ffi::c_char, c_uint) -> NvmlReturn;
    nvmlDeviceGetMemoryInfo: fn(H, *mut NvmlMemory) -> NvmlReturn;
    nvmlDeviceGetMemoryInfo_v2: fn(H, *mut NvmlMemoryV2) -> NvmlReturn;
});

/// `const char *`.
type CStr_ = *const std::ffi::c_char;

/// One real driver library: the SONAME it is opened by and the loaded
/// object that is.
///
/// Invariant: once [`Driver::object`] is non-zero it stays the identity of
/// the object this library forwards to. The object is found by opening the
/// SONAME, as [`cuda`] and [`nvml`] do (the loader answers with the copy
/// already loaded), and the reference that opening takes is never given
/// back, so the object cannot be unloaded and another one loaded at its
/// address.
pub struct Driver {
    soname: &'static CStr,
    object: AtomicUsize,
}

/// `libcuda.so.1`.
pub static CUDA_DRIVER: Driver = Driver::new(c"libcuda.so.1");
/// `libnvidia-ml.so.1`.
pub static NVML_DRIVER: Driver = Driver::new(c"libnvidia-ml.so.1");

impl Driver {
    const fn new(soname: &'static CStr) -> Self {
        Self {
            soname,
            object: AtomicUsize::new(0),
        }
    }

    /// Opens the library (loading it if needed) and records its object;
    /// NULL if it cannot be loaded.
    fn open(&self) -> *mut c_void {
        let h = sys::dlopen(self.soname);
        if !h.is_null() {
            self.object
                .store(sys::object_of_handle(h), Ordering::Release);
        }
        h
    }

    /// The loaded object (as [`sys::object_at`] names it), without
    /// loading it: 0 if the library is not loaded. Safe to call from
    /// anywhere, including a library constructor running inside `dlopen`
    /// (no lock of ours).
    pub fn object(&self) -> usize {
        let known = self.object.load(Ordering::Acquire);
        if known != 0 {
            return known;
        }
        let h = sys::dlopen_loaded(self.soname);
        if h.is_null() {
            return 0;
        }
        let id = sys::object_of_handle(h);
        self.object.store(id, Ordering::Release);
        id
    }
}

/// Whether `object` (as [`sys::object_at`] names it) is one of the real
/// driver libraries this library forwards to.
pub fn is_driver(object: usize) -> bool {
    object != 0
        && [&CUDA_DRIVER, &NVML_DRIVER]
            .iter()
            .any(|d| d.object() == object)
}

/// The real libcuda, loading it if the program has not.
pub fn cuda() -> Option<&'static Cuda> {
    static CUDA: crate::fork::Once<Option<Cuda>> = crate::fork::Once::new();
    CUDA.get_or_init(|| {
        let h = CUDA_DRIVER.open();
        (!h.is_null()).then(|| Cuda::load(h))
    })
    .as_ref()
}

/// The real libnvidia-ml, loading it if the program has not.
pub fn nvml() -> Option<&'static Nvml> {
    static NVML: crate::fork::Once<Option<Nvml>> = crate::fork::Once::new();
    NVML.get_or_init(|| {
        let h = NVML_DRIVER.open();
        (!h.is_null()).then(|| Nvml::load(h))
    })
    .as_ref()
}
