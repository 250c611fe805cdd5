//! Memory allocation: linear, pitched, managed, stream-ordered and pools,
//! pinned host memory, memory info and pointer queries.

use std::ffi::{c_int, c_uint, c_void};

use super::ptr::{out, out_opt, read};
use super::{cu_alias, cu_export, h, hp};
use crate::abi::*;
use crate::memory;
use crate::process;
use crate::status::*;

cu_export! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) {
        let p = process::get()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = memory::alloc(p, bytes as u64)?;
        // SAFETY: the caller's contract: `dptr` is NULL or points to a writable
        // `CUdeviceptr`; `out` rejects NULL.
        unsafe { out(dptr, v) }
    }

    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element: c_uint) {
        let p = process::get()?;
        if dptr.is_null() || pitch.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (d, pt) = memory::alloc_pitch(p, width as u64, height as u64, element)?;
        // SAFETY: the caller's contract: `pitch` is NULL or points to a
        // writable `usize`; `out` rejects NULL.
        unsafe { out(pitch, pt as usize) }?;
        // SAFETY: the caller's contract: `dptr` is NULL or points to a writable
        // `CUdeviceptr`; `out` rejects NULL.
        unsafe { out(dptr, d) }
    }

    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) {
        let p = process::get()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = memory::alloc_managed(p, bytes as u64, flags)?;
        // SAFETY: the caller's contract: `dptr` is NULL or points to a writable
        // `CUdeviceptr`; `out` rejects NULL.
        unsafe { out(dptr, v) }
    }

    fn cuMemFree_v2(dptr: CUdeviceptr) {
        let p = process::get()?;
        memory::free(p, dptr)
    }

    /// CUDA 2.x: a 32-bit size and pointer (the low half of the address;
    /// the simulator keeps no 32-bit address space).
    fn cuMemAlloc(dptr: *mut c_uint, bytes: c_uint) {
        let p = process::get()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = memory::alloc(p, u64::from(bytes))? as c_uint;
        // SAFETY: the caller's contract: `dptr` is NULL or points to a writable
        // `c_uint`; `out` rejects NULL.
        unsafe { out(dptr, v) }
    }

    /// CUDA 2.x `cuMemAllocPitch` (32-bit sizes and pointer).
    fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, element: c_uint) {
        let p = process::get()?;
        if dptr.is_null() || pitch.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (d, pt) = memory::alloc_pitch(p, u64::from(width), u64::from(height), element)?;
        // SAFETY: the caller's contract: `pitch` is NULL or points to a
        // writable `c_uint`; `out` rejects NULL.
        unsafe { out(pitch, pt as c_uint) }?;
        // SAFETY: the caller's contract: `dptr` is NULL or points to a writable
        // `c_uint`; `out` rejects NULL.
        unsafe { out(dptr, d as c_uint) }
    }

    /// CUDA 2.x `cuMemGetInfo`: 32-bit sizes, clamped.
    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) {
        let p = process::get()?;
        let (f, t) = memory::info(p)?;
        let clamp = |v: u64| c_uint::try_from(v).unwrap_or(c_uint::MAX);
        // SAFETY: the caller's contract: `free` is NULL or points to a writable
        // `c_uint`; `out` rejects NULL.
        unsafe { out(free, clamp(f)) }?;
        // SAFETY: the caller's contract: `total` is NULL or points to a
        // writable `c_uint`; `out` rejects NULL.
        unsafe { out(total, clamp(t)) }
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let p = process::get()?;
        let (f, t) = memory::info(p)?;
        // SAFETY: the caller's contract: `free` is NULL or points to a writable
        // `usize`; `out` rejects NULL.
        unsafe { out(free, f as usize) }?;
        // SAFETY: the caller's contract: `total` is NULL or points to a
        // writable `usize`; `out` rejects NULL.
        unsafe { out(total, t as usize) }
    }

    fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, dptr: CUdeviceptr) {
        let p = process::get()?;
        let (b, s) = memory::address_range(p, dptr)?;
        // SAFETY: the caller's contract: `base` is NULL or points to a writable
        // `CUdeviceptr`; `out_opt` skips NULL.
        unsafe { out_opt(base, b) };
        // SAFETY: the caller's contract: `size` is NULL or points to a writable
        // `usize`; `out_opt` skips NULL.
        unsafe { out_opt(size, s as usize) };
        Ok(())
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) {
        let p = process::get()?;
        if pp.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = memory::host_alloc(p, bytes as u64, 0)?.cast();
        // SAFETY: the caller's contract: `pp` is NULL or points to a writable
        // `*mut c_void`; `out` rejects NULL.
        unsafe { out(pp, v) }
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) {
        let p = process::get()?;
        if pp.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = memory::host_alloc(p, bytes as u64, flags)?.cast();
        // SAFETY: the caller's contract: `pp` is NULL or points to a writable
        // `*mut c_void`; `out` rejects NULL.
        unsafe { out(pp, v) }
    }

    fn cuMemFreeHost(ptr: *mut c_void) {
        let p = process::get()?;
        memory::host_free(p, ptr as usize)
    }

    fn cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, host: *mut c_void, flags: c_uint) {
        let p = process::get()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        memory::host_flags(p, host as usize)?;
        // SAFETY: the caller's contract: `dptr` is NULL or points to a writable
        // `CUdeviceptr`; `out` rejects NULL.
        unsafe { out(dptr, host as u64) }
    }

    fn cuMemHostGetFlags(flags: *mut c_uint, host: *mut c_void) {
        let p = process::get()?;
        let v = memory::host_flags(p, host as usize)?;
        // SAFETY: the caller's contract: `flags` is NULL or points to a
        // writable `c_uint`; `out` rejects NULL.
        unsafe { out(flags, v) }
    }

    fn cuMemHostRegister_v2(host: *mut c_void, bytes: usize, flags: c_uint) {
        let p = process::get()?;
        memory::host_register(p, host as usize, bytes as u64, flags)
    }

    fn cuMemHostUnregister(host: *mut c_void) {
        let p = process::get()?;
        memory::host_unregister(p, host as usize)
    }

    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: Handle) {
        let p = process::get()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = memory::alloc_async(p, bytes as u64, h(stream))?;
        // SAFETY: the caller's contract: `dptr` is NULL or points to a writable
        // `CUdeviceptr`; `out` rejects NULL.
        unsafe { out(dptr, v) }
    }

    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: Handle, stream: Handle) {
        let p = process::get()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = memory::alloc_from_pool(p, bytes as u64, h(pool), h(stream))?;
        // SAFETY: the caller's contract: `dptr` is NULL or points to a writable
        // `CUdeviceptr`; `out` rejects NULL.
        unsafe { out(dptr, v) }
    }

    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle) {
        let p = process::get()?;
        memory::free_async(p, dptr, h(stream))
    }

    fn cuMemPoolCreate(pool: *mut Handle, props: *const CUmemPoolProps) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `props` is NULL or points to a
        // readable `CUmemPoolProps`; `read` rejects NULL.
        let props = unsafe { read(props) }?;
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = memory::pool_create(p, props.location.id, props.alloc_type, props.location.kind)?;
        // SAFETY: the caller's contract: `pool` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(pool, hp(h)) }
    }

    fn cuMemPoolDestroy(pool: Handle) {
        let p = process::get()?;
        memory::pool_destroy(p, h(pool))
    }

    fn cuMemPoolTrimTo(pool: Handle, keep: usize) {
        let p = process::get()?;
        memory::pool_trim(p, h(pool), keep as u64)
    }

    fn cuMemPoolGetAttribute(pool: Handle, attr: c_int, value: *mut c_void) {
        let p = process::get()?;
        let v = memory::pool_attribute(p, h(pool), attr)?;
        if (1..=3).contains(&attr) {
            // SAFETY: the caller's contract: `value` is NULL or points to a
            // writable `c_int`, the type of this attribute; `out` rejects NULL.
            unsafe { out(value.cast::<c_int>(), v as c_int) }
        } else {
            // SAFETY: the caller's contract: `value` is NULL or points to a
            // writable `u64`, the type of this attribute; `out` rejects NULL.
            unsafe { out(value.cast::<u64>(), v) }
        }
    }

    fn cuMemPoolSetAttribute(pool: Handle, attr: c_int, value: *mut c_void) {
        let p = process::get()?;
        let v = if (1..=3).contains(&attr) {
            // SAFETY: the caller's contract: `value` is NULL or points to a
            // readable `c_int`, the type of this attribute; `read` rejects
            // NULL.
            unsafe { read(value.cast::<c_int>()) }? as u64
        } else {
            // SAFETY: the caller's contract: `value` is NULL or points to a
            // readable `u64`, the type of this attribute; `read` rejects NULL.
            unsafe { read(value.cast::<u64>()) }?
        };
        memory::set_pool_attribute(p, h(pool), attr, v)
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) {
        let p = process::get()?;
        let v = hp(memory::default_pool(p, dev)?);
        // SAFETY: the caller's contract: `pool` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(pool, v) }
    }

    fn cuDeviceGetMemPool(pool: *mut Handle, dev: CUdevice) {
        let p = process::get()?;
        let v = hp(memory::device_pool(p, dev)?);
        // SAFETY: the caller's contract: `pool` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(pool, v) }
    }

    fn cuDeviceSetMemPool(dev: CUdevice, pool: Handle) {
        let p = process::get()?;
        memory::set_device_pool(p, dev, h(pool))
    }

    /// `cuPointerGetAttributes`: each attribute as `cuPointerGetAttribute`
    /// answers it; one it cannot answer for `dptr` (a pointer the driver
    /// does not know, an attribute that does not apply) is written as
    /// zeros of the attribute's size and the call still succeeds, as the
    /// driver API documents.
    fn cuPointerGetAttributes(
        count: c_uint,
        attributes: *const c_int,
        data: *mut *mut c_void,
        dptr: CUdeviceptr,
    ) {
        if count == 0 || attributes.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        process::get()?;
        for i in 0..count as usize {
            // SAFETY: the caller's contract: `attributes` and `data` hold
            // `count` entries (checked non-NULL above).
            let (attribute, slot) = unsafe { (read(attributes.add(i))?, read(data.add(i).cast_const())?) };
            if slot.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: the caller's contract: `slot` points to storage of
            // the attribute's type.
            if unsafe { cuPointerGetAttribute(slot, attribute, dptr) } != CUDA_SUCCESS {
                let size = pointer_attribute_size(attribute);
                // SAFETY: as above: `slot` holds `size` bytes for this
                // attribute's type.
                unsafe { std::ptr::write_bytes(slot.cast::<u8>(), 0, size) };
            }
        }
        Ok(())
    }

    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, dptr: CUdeviceptr) {
        let p = process::get()?;
        let Some((base, size, device, ctx, managed)) = memory::lookup(p, dptr) else {
            // Pinned host memory answers a few attributes too.
            memory::host_flags(p, dptr as usize).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
            return match attribute {
                // SAFETY: the caller's contract: `data` is NULL or points to a
                // writable `c_uint`, the type of this attribute; `out` rejects
                // NULL.
                CU_POINTER_ATTRIBUTE_MEMORY_TYPE => unsafe { out(data.cast::<c_uint>(), CU_MEMORYTYPE_HOST) },
                // SAFETY: the caller's contract: `data` is NULL or points to a
                // writable `u64`, the type of this attribute; `out` rejects
                // NULL.
                CU_POINTER_ATTRIBUTE_HOST_POINTER | CU_POINTER_ATTRIBUTE_DEVICE_POINTER => unsafe { out(data.cast::<u64>(), dptr) },
                // SAFETY: the caller's contract: `data` is NULL or points to a
                // writable `c_uint`, the type of this attribute; `out` rejects
                // NULL.
                CU_POINTER_ATTRIBUTE_IS_MANAGED => unsafe { out(data.cast::<c_uint>(), 0) },
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            };
        };
        match attribute {
            // SAFETY: the caller's contract: `data` is NULL or points to a
            // writable `Handle`, the type of this attribute; `out` rejects
            // NULL.
            CU_POINTER_ATTRIBUTE_CONTEXT => unsafe { out(data.cast::<Handle>(), hp(ctx)) },
            // SAFETY: the caller's contract: `data` is NULL or points to a
            // writable `c_uint`, the type of this attribute; `out` rejects
            // NULL.
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE => unsafe { out(data.cast::<c_uint>(), CU_MEMORYTYPE_DEVICE) },
            // SAFETY: the caller's contract: `data` is NULL or points to a
            // writable `u64`, the type of this attribute; `out` rejects NULL.
            CU_POINTER_ATTRIBUTE_DEVICE_POINTER => unsafe { out(data.cast::<u64>(), dptr) },
            CU_POINTER_ATTRIBUTE_HOST_POINTER => {
                // SAFETY: the caller's contract: `data` is NULL or points to a
                // writable `u64`, the type of this attribute; `out` rejects
                // NULL.
                if managed { unsafe { out(data.cast::<u64>(), dptr) } } else { Err(CUDA_ERROR_INVALID_VALUE) }
            }
            // SAFETY: the caller's contract: `data` is NULL or points to a
            // writable `c_uint`, the type of this attribute; `out` rejects
            // NULL.
            CU_POINTER_ATTRIBUTE_IS_MANAGED => unsafe { out(data.cast::<c_uint>(), c_uint::from(managed)) },
            // SAFETY: the caller's contract: `data` is NULL or points to a
            // writable `c_int`, the type of this attribute; `out` rejects NULL.
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => unsafe { out(data.cast::<c_int>(), device as c_int) },
            // SAFETY: the caller's contract: `data` is NULL or points to a
            // writable `u64`, the type of this attribute; `out` rejects NULL.
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => unsafe { out(data.cast::<u64>(), base) },
            // SAFETY: the caller's contract: `data` is NULL or points to a
            // writable `usize`, the type of this attribute; `out` rejects NULL.
            CU_POINTER_ATTRIBUTE_RANGE_SIZE => unsafe { out(data.cast::<usize>(), size as usize) },
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemPrefetchAsync(dptr: CUdeviceptr, bytes: usize, dev: CUdevice, stream: Handle) {
        let p = process::get()?;
        let _ = (bytes, h(stream));
        memory::lookup(p, dptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if dev >= 0 { p.device(dev).map(|_| ()) } else { Ok(()) }
    }

    fn cuMemPrefetchAsync_v2(dptr: CUdeviceptr, bytes: usize, location: CUmemLocation, flags: c_uint, stream: Handle) {
        let p = process::get()?;
        let _ = (bytes, flags, location, h(stream));
        memory::lookup(p, dptr).ok_or(CUDA_ERROR_INVALID_VALUE).map(|_| ())
    }

    fn cuMemAdvise(dptr: CUdeviceptr, bytes: usize, advice: c_int, dev: CUdevice) {
        let p = process::get()?;
        let _ = (bytes, advice, dev);
        // CU_MEM_ADVISE_SET_READ_MOSTLY (1) to CU_MEM_ADVISE_UNSET_ACCESSED_BY (6).
        if !(1..=6).contains(&advice) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        memory::lookup(p, dptr).ok_or(CUDA_ERROR_INVALID_VALUE).map(|_| ())
    }

    fn cuMemAdvise_v2(dptr: CUdeviceptr, bytes: usize, advice: c_int, location: CUmemLocation) {
        let p = process::get()?;
        let _ = (bytes, advice, location);
        // CU_MEM_ADVISE_SET_READ_MOSTLY (1) to CU_MEM_ADVISE_UNSET_ACCESSED_BY (6).
        if !(1..=6).contains(&advice) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        memory::lookup(p, dptr).ok_or(CUDA_ERROR_INVALID_VALUE).map(|_| ())
    }
}

cu_alias! {
    cuMemAllocAsync_ptsz => cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: Handle);
    cuMemAllocFromPoolAsync_ptsz => cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: Handle, stream: Handle);
    cuMemFreeAsync_ptsz => cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle);
    cuMemPrefetchAsync_ptsz => cuMemPrefetchAsync(dptr: CUdeviceptr, bytes: usize, dev: CUdevice, stream: Handle);
    cuMemPrefetchAsync_v2_ptsz => cuMemPrefetchAsync_v2(dptr: CUdeviceptr, bytes: usize, location: CUmemLocation, flags: c_uint, stream: Handle);
    cuMemHostRegister => cuMemHostRegister_v2(host: *mut c_void, bytes: usize, flags: c_uint);
}

/// The size of attribute `attribute`'s value (`CUpointer_attribute`):
/// pointers, handles, sizes and 64-bit ids take 8 bytes, the P2P tokens 16,
/// the rest (enums, flags, ordinals) 4.
fn pointer_attribute_size(attribute: c_int) -> usize {
    match attribute {
        // CONTEXT, DEVICE_POINTER, HOST_POINTER, BUFFER_ID, RANGE_START_ADDR,
        // RANGE_SIZE, ALLOWED_HANDLE_TYPES, MEMPOOL_HANDLE, MAPPING_SIZE,
        // MAPPING_BASE_ADDR, MEMORY_BLOCK_ID.
        1 | 3 | 4 | 7 | 11 | 12 | 14 | 17 | 18 | 19 | 20 => 8,
        // P2P_TOKENS.
        5 => 16,
        _ => 4,
    }
}
