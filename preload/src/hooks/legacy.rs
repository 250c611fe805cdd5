//! Entry points this library refuses rather than let through unlimited:
//! the CUDA 2.x allocation and memory-info calls (32-bit sizes and
//! pointers, not worth wrapping) and the pre-`cuLaunchKernel` launch calls
//! (their grid shape lives in state set by other deprecated calls). They
//! answer `CUDA_ERROR_NOT_SUPPORTED` when limits apply and pass through
//! under a fail-open policy.

use std::ffi::{c_int, c_uint, c_void};

use super::{hook, refused_when_limited};
use crate::ffi::*;
use crate::real::real_cuda;

hook! {
    fn cuMemAlloc(dptr: *mut c_uint, bytes: c_uint) {
        refused_when_limited(|| real_cuda!(cuMemAlloc(dptr, bytes)))
    }

    fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, w: c_uint, h: c_uint, e: c_uint) {
        refused_when_limited(|| real_cuda!(cuMemAllocPitch(dptr, pitch, w, h, e)))
    }

    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) {
        refused_when_limited(|| real_cuda!(cuMemGetInfo(free, total)))
    }

    fn cuArrayCreate(arr: *mut Handle, desc: *const c_void) {
        refused_when_limited(|| real_cuda!(cuArrayCreate(arr, desc)))
    }

    fn cuArray3DCreate(arr: *mut Handle, desc: *const c_void) {
        refused_when_limited(|| real_cuda!(cuArray3DCreate(arr, desc)))
    }

    fn cuLaunch(f: Handle) {
        refused_when_limited(|| real_cuda!(cuLaunch(f)))
    }

    fn cuLaunchGrid(f: Handle, w: c_int, h: c_int) {
        refused_when_limited(|| real_cuda!(cuLaunchGrid(f, w, h)))
    }

    fn cuLaunchGridAsync(f: Handle, w: c_int, h: c_int, stream: Handle) {
        refused_when_limited(|| real_cuda!(cuLaunchGridAsync(f, w, h, stream)))
    }
}
