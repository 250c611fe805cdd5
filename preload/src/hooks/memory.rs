//! Device allocations: linear, pitched, managed, stream-ordered and pool.
//! Each is reserved against the container's limit before the real call
//! (`CUDA_ERROR_OUT_OF_MEMORY`, nothing allocated, when it does not fit)
//! and returned when freed.

use std::ffi::c_uint;

use super::{dispatch, hook};
use crate::accounting::real_cuda;
use crate::accounting::{
    self, Charge, current_context, gpu_index, reserve, reserve_current, rounded,
};
use crate::ffi::*;
use crate::state::Enforcer;

/// Records a successful allocation at `*dptr`, or returns the reservation.
///
/// # Safety
/// When `rc` is success, `dptr` was written by the real call.
unsafe fn book(e: &Enforcer, rc: CUresult, dptr: *mut CUdeviceptr, c: Charge) -> CUresult {
    if rc == CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: per the contract.
        let p = unsafe { *dptr };
        e.books().allocs.insert(p, c);
    } else {
        accounting::release(e, c);
    }
    rc
}

/// Frees through `real` and returns the charge of `dptr` on success.
fn unbook(e: &Enforcer, dptr: CUdeviceptr, real: impl FnOnce() -> CUresult) -> CUresult {
    let charge = e.books().allocs.remove(&dptr);
    let rc = real();
    match (rc, charge) {
        (CUDA_SUCCESS, Some(c)) => accounting::release(e, c),
        (_, Some(c)) => {
            e.books().allocs.insert(dptr, c);
        }
        _ => {}
    }
    rc
}

fn alloc(
    e: &Enforcer,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if bytes == 0 || dptr.is_null() {
        return real();
    }
    match reserve_current(e, bytes as u64) {
        // SAFETY: the real call writes *dptr when it succeeds.
        Ok((_, c)) => unsafe { book(e, real(), dptr, c) },
        Err(rc) => rc,
    }
}

/// Upper bound of a pitched allocation's row (the driver aligns the pitch
/// to at most this).
const MAX_PITCH_ALIGN: u64 = 512;

fn alloc_from_pool(
    e: &Enforcer,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Handle,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if bytes == 0 || dptr.is_null() {
        return real();
    }
    let known = e.books().pools.get(&(pool as usize)).copied();
    let ordinal = match known.map_or_else(accounting::current_device, Ok) {
        Ok(d) => d,
        Err(rc) => return rc,
    };
    let gpu = match gpu_index(e, ordinal) {
        Ok(g) => g,
        Err(rc) => return rc,
    };
    let charge = Charge {
        gpu,
        bytes: rounded(e, ordinal, bytes as u64),
        ctx: current_context(),
    };
    if let Err(rc) = reserve(e, gpu, charge.bytes) {
        return rc;
    }
    // SAFETY: the real call writes *dptr when it succeeds.
    unsafe { book(e, real(), dptr, charge) }
}

/// Remembers which device a pool belongs to.
///
/// # Safety
/// When `rc` is success, `pool` was written by the real call.
unsafe fn note_pool(e: &Enforcer, rc: CUresult, pool: *mut Handle, dev: CUdevice) -> CUresult {
    if rc == CUDA_SUCCESS && !pool.is_null() {
        // SAFETY: per the contract.
        let p = unsafe { *pool } as usize;
        e.books().pools.insert(p, dev);
    }
    rc
}

hook! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) {
        dispatch(
            || real_cuda!(cuMemAlloc_v2(dptr, bytes)),
            |e| alloc(e, dptr, bytes, || real_cuda!(cuMemAlloc_v2(dptr, bytes))),
        )
    }

    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) {
        dispatch(
            || real_cuda!(cuMemAllocManaged(dptr, bytes, flags)),
            |e| alloc(e, dptr, bytes, || real_cuda!(cuMemAllocManaged(dptr, bytes, flags))),
        )
    }

    /// Reserves for the widest pitch the driver may choose, then settles
    /// on the pitch it chose.
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
        dispatch(
            || real_cuda!(cuMemAllocPitch_v2(dptr, pitch, width, height, elem)),
            |e| {
                if width == 0 || height == 0 || dptr.is_null() || pitch.is_null() {
                    return real_cuda!(cuMemAllocPitch_v2(dptr, pitch, width, height, elem));
                }
                let row = (width as u64).div_ceil(MAX_PITCH_ALIGN) * MAX_PITCH_ALIGN;
                let (ordinal, mut c) = match reserve_current(e, row.saturating_mul(height as u64)) {
                    Ok(x) => x,
                    Err(rc) => return rc,
                };
                let rc = real_cuda!(cuMemAllocPitch_v2(dptr, pitch, width, height, elem));
                if rc != CUDA_SUCCESS {
                    accounting::release(e, c);
                    return rc;
                }
                let actual = rounded(e, ordinal, (*pitch as u64).saturating_mul(height as u64));
                if actual < c.bytes {
                    accounting::unreserve(e, c.gpu, c.bytes - actual);
                } else if actual > c.bytes && reserve(e, c.gpu, actual - c.bytes).is_err() {
                    let _ = real_cuda!(cuMemFree_v2(*dptr));
                    accounting::release(e, c);
                    return CUDA_ERROR_OUT_OF_MEMORY;
                }
                c.bytes = actual;
                book(e, rc, dptr, c)
            },
        )
    }

    fn cuMemFree_v2(dptr: CUdeviceptr) {
        dispatch(
            || real_cuda!(cuMemFree_v2(dptr)),
            |e| unbook(e, dptr, || real_cuda!(cuMemFree_v2(dptr))),
        )
    }

    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemAllocAsync(dptr, bytes, stream)),
            |e| alloc(e, dptr, bytes, || real_cuda!(cuMemAllocAsync(dptr, bytes, stream))),
        )
    }

    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemAllocAsync_ptsz(dptr, bytes, stream)),
            |e| alloc(e, dptr, bytes, || real_cuda!(cuMemAllocAsync_ptsz(dptr, bytes, stream))),
        )
    }

    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: Handle, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemAllocFromPoolAsync(dptr, bytes, pool, stream)),
            |e| alloc_from_pool(e, dptr, bytes, pool, || {
                real_cuda!(cuMemAllocFromPoolAsync(dptr, bytes, pool, stream))
            }),
        )
    }

    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: Handle, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, stream)),
            |e| alloc_from_pool(e, dptr, bytes, pool, || {
                real_cuda!(cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, stream))
            }),
        )
    }

    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemFreeAsync(dptr, stream)),
            |e| unbook(e, dptr, || real_cuda!(cuMemFreeAsync(dptr, stream))),
        )
    }

    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemFreeAsync_ptsz(dptr, stream)),
            |e| unbook(e, dptr, || real_cuda!(cuMemFreeAsync_ptsz(dptr, stream))),
        )
    }

    fn cuMemPoolCreate(pool: *mut Handle, props: *const CUmemPoolProps) {
        dispatch(
            || real_cuda!(cuMemPoolCreate(pool, props)),
            |e| {
                let rc = real_cuda!(cuMemPoolCreate(pool, props));
                if props.is_null() {
                    return rc;
                }
                note_pool(e, rc, pool, (*props).location.id)
            },
        )
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) {
        dispatch(
            || real_cuda!(cuDeviceGetDefaultMemPool(pool, dev)),
            |e| note_pool(e, real_cuda!(cuDeviceGetDefaultMemPool(pool, dev)), pool, dev),
        )
    }

    fn cuDeviceGetMemPool(pool: *mut Handle, dev: CUdevice) {
        dispatch(
            || real_cuda!(cuDeviceGetMemPool(pool, dev)),
            |e| note_pool(e, real_cuda!(cuDeviceGetMemPool(pool, dev)), pool, dev),
        )
    }
}
