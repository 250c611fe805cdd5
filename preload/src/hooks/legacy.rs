//! Entry points this library refuses rather than let through unlimited:
//! the CUDA 2.x allocation and memory-info calls (32-bit sizes and
//! pointers, not worth wrapping) and the pre-`cuLaunchKernel` launch calls
//! (their grid shape lives in state set by other deprecated calls). They
//! answer `CUDA_ERROR_NOT_SUPPORTED` when limits apply.

use std::ffi::{c_int, c_uint, c_void};

use super::{dispatch, hook};
use crate::ffi::*;

fn refused() -> CUresult {
    dispatch(|| CUDA_ERROR_NOT_SUPPORTED, |_| CUDA_ERROR_NOT_SUPPORTED)
}

hook! {
    fn cuMemAlloc(dptr: *mut c_uint, bytes: c_uint) {
        let _ = (dptr, bytes);
        refused()
    }

    fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, w: c_uint, h: c_uint, e: c_uint) {
        let _ = (dptr, pitch, w, h, e);
        refused()
    }

    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) {
        let _ = (free, total);
        refused()
    }

    fn cuArrayCreate(arr: *mut Handle, desc: *const c_void) {
        let _ = (arr, desc);
        refused()
    }

    fn cuArray3DCreate(arr: *mut Handle, desc: *const c_void) {
        let _ = (arr, desc);
        refused()
    }

    fn cuLaunch(f: Handle) {
        let _ = f;
        refused()
    }

    fn cuLaunchGrid(f: Handle, w: c_int, h: c_int) {
        let _ = (f, w, h);
        refused()
    }

    fn cuLaunchGridAsync(f: Handle, w: c_int, h: c_int, stream: Handle) {
        let _ = (f, w, h, stream);
        refused()
    }
}
