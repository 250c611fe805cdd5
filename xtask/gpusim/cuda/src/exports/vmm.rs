//! Virtual memory management entry points.

use std::ffi::{c_int, c_ulonglong};

use super::cu_export;
use super::ptr::{out, read, slice};
use crate::abi::*;
use crate::process;
use crate::status::*;
use crate::vmm;

cu_export! {
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_int) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `prop` is NULL or points to a readable
        // `CUmemAllocationProp`; `read` rejects NULL.
        let prop = unsafe { read(prop) }?;
        if !(0..=1).contains(&option) || prop.location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        p.device(prop.location.id)?;
        // SAFETY: the caller's contract: `granularity` is NULL or points to a
        // writable `usize`; `out` rejects NULL.
        unsafe { out(granularity, vmm::granularity(p) as usize) }
    }

    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `prop` is NULL or points to a readable
        // `CUmemAllocationProp`; `read` rejects NULL.
        let prop = unsafe { read(prop) }?;
        if flags != 0 || handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = vmm::create(p, size as u64, prop.kind, prop.location.kind, prop.location.id)?;
        // SAFETY: the caller's contract: `handle` is NULL or points to a
        // writable `CUmemGenericAllocationHandle`; `out` rejects NULL.
        unsafe { out(handle, h) }
    }

    fn cuMemRelease(handle: CUmemGenericAllocationHandle) {
        let p = process::get()?;
        vmm::release(p, handle)
    }

    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut std::ffi::c_void) {
        let p = process::get()?;
        let v = vmm::retain_handle(p, addr as u64)?;
        // SAFETY: the caller's contract: `handle` is NULL or points to a
        // writable `CUmemGenericAllocationHandle`; `out` rejects NULL.
        unsafe { out(handle, v) }
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) {
        let p = process::get()?;
        let (kind, id) = vmm::properties(p, handle)?;
        // SAFETY: the caller's contract: `prop` is NULL or points to a writable
        // `CUmemAllocationProp`; `out` rejects NULL.
        unsafe { out(prop, CUmemAllocationProp {
            kind: CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location: CUmemLocation { kind, id },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }) }
    }

    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong) {
        let p = process::get()?;
        if flags != 0 || ptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = vmm::reserve(p, size as u64, alignment as u64, addr)?;
        // SAFETY: the caller's contract: `ptr` is NULL or points to a writable
        // `CUdeviceptr`; `out` rejects NULL.
        unsafe { out(ptr, v) }
    }

    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        let p = process::get()?;
        vmm::address_free(p, ptr, size as u64)
    }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) {
        let p = process::get()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        vmm::map(p, ptr, size as u64, offset as u64, handle)
    }

    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        let p = process::get()?;
        vmm::unmap(p, ptr, size as u64)
    }

    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        let p = process::get()?;
        if count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's contract: `desc` is NULL or points to `count`
        // readable `CUmemAccessDesc`s; `slice` rejects NULL unless `count` is
        // 0.
        let descs = unsafe { slice(desc, count) }?;
        let devices: Vec<(i32, i32)> = descs.iter().map(|d| (d.location.kind, d.location.id)).collect();
        vmm::set_access(p, ptr, size as u64, &devices)
    }
}
