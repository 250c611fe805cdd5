//! CUDA array entry points.

use std::ffi::c_uint;

use super::cu_export;
use super::ptr::{out, read};
use super::{h, hp};
use crate::abi::*;
use crate::array;
use crate::process;
use crate::status::*;

cu_export! {
    fn cuArrayCreate_v2(arr: *mut Handle, desc: *const CudaArrayDescriptor) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `desc` is NULL or points to a readable
        // `CudaArrayDescriptor`; `read` rejects NULL.
        let d = unsafe { read(desc) }?;
        if arr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let a = array::create(p, CudaArray3dDescriptor {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            num_channels: d.num_channels,
            flags: 0,
        })?;
        // SAFETY: the caller's contract: `arr` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(arr, hp(a)) }
    }

    fn cuArray3DCreate_v2(arr: *mut Handle, desc: *const CudaArray3dDescriptor) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `desc` is NULL or points to a readable
        // `CudaArray3dDescriptor`; `read` rejects NULL.
        let d = unsafe { read(desc) }?;
        if arr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(array::create(p, d)?);
        // SAFETY: the caller's contract: `arr` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(arr, v) }
    }

    /// CUDA 2.x: 32-bit sizes.
    fn cuArrayCreate(arr: *mut Handle, desc: *const CudaArrayDescriptorV1) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `desc` is NULL or points to a readable
        // `CudaArrayDescriptorV1`; `read` rejects NULL.
        let d = unsafe { read(desc) }?;
        if arr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let a = array::create(p, CudaArray3dDescriptor {
            width: d.width as usize,
            height: d.height as usize,
            depth: 0,
            format: d.format,
            num_channels: d.num_channels,
            flags: 0,
        })?;
        // SAFETY: the caller's contract: `arr` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(arr, hp(a)) }
    }

    /// CUDA 2.x: 32-bit sizes.
    fn cuArray3DCreate(arr: *mut Handle, desc: *const CudaArray3dDescriptorV1) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `desc` is NULL or points to a readable
        // `CudaArray3dDescriptorV1`; `read` rejects NULL.
        let d = unsafe { read(desc) }?;
        if arr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(array::create(p, CudaArray3dDescriptor {
            width: d.width as usize,
            height: d.height as usize,
            depth: d.depth as usize,
            format: d.format,
            num_channels: d.num_channels,
            flags: d.flags,
        })?);
        // SAFETY: the caller's contract: `arr` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(arr, v) }
    }

    fn cuArrayDestroy(arr: Handle) {
        let p = process::get()?;
        let mut inner = p.lock();
        array::destroy(p, &mut inner, h(arr))
    }

    fn cuArrayGetDescriptor_v2(desc: *mut CudaArrayDescriptor, arr: Handle) {
        let p = process::get()?;
        let d = array::descriptor(p, h(arr))?;
        // SAFETY: the caller's contract: `desc` is NULL or points to a writable
        // `CudaArrayDescriptor`; `out` rejects NULL.
        unsafe { out(desc, CudaArrayDescriptor {
            width: d.width,
            height: d.height,
            format: d.format,
            num_channels: d.num_channels,
        }) }
    }

    fn cuArray3DGetDescriptor_v2(desc: *mut CudaArray3dDescriptor, arr: Handle) {
        let p = process::get()?;
        let v = array::descriptor(p, h(arr))?;
        // SAFETY: the caller's contract: `desc` is NULL or points to a writable
        // `CudaArray3dDescriptor`; `out` rejects NULL.
        unsafe { out(desc, v) }
    }

    fn cuMipmappedArrayCreate(arr: *mut Handle, desc: *const CudaArray3dDescriptor, levels: c_uint) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `desc` is NULL or points to a readable
        // `CudaArray3dDescriptor`; `read` rejects NULL.
        let d = unsafe { read(desc) }?;
        if arr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(array::create_mipmapped(p, d, levels)?);
        // SAFETY: the caller's contract: `arr` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(arr, v) }
    }

    fn cuMipmappedArrayDestroy(arr: Handle) {
        let p = process::get()?;
        array::destroy_mipmapped(p, h(arr))
    }

    fn cuMipmappedArrayGetLevel(level_arr: *mut Handle, arr: Handle, level: c_uint) {
        let p = process::get()?;
        let v = hp(array::level(p, h(arr), level)?);
        // SAFETY: the caller's contract: `level_arr` is NULL or points to a
        // writable `Handle`; `out` rejects NULL.
        unsafe { out(level_arr, v) }
    }
}
