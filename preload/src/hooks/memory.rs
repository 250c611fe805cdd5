//! Device allocations: linear, pitched and managed (stream-ordered and
//! pool allocations are in `pool.rs`). Each is reserved against the
//! container's limit before the real call (`CUDA_ERROR_OUT_OF_MEMORY`,
//! nothing allocated, when it does not fit) and returned when freed.

use std::ffi::c_uint;

use super::{dispatch, hook};
use crate::accounting::{self, Charge, reserve, reserve_current, rounded};
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::Enforcer;

/// Records a successful allocation at `*dptr`, or returns the reservation.
///
/// # Safety
/// `dptr` is not NULL, and when `rc` is success it was written by the
/// real call.
unsafe fn book(e: &Enforcer, rc: CUresult, dptr: *mut CUdeviceptr, c: Charge) -> CUresult {
    accounting::settle(e, rc, c, |b, c| {
        // SAFETY: per the contract (`record` runs only on success).
        let p = unsafe { *dptr };
        b.allocs.insert(p, c);
    })
}

/// Frees through `real` and returns the charge of `dptr` on success (to
/// its pool's account for pool memory, see `pool.rs`).
pub fn unbook(e: &Enforcer, dptr: CUdeviceptr, real: impl FnOnce() -> CUresult) -> CUresult {
    let charge = e.books().allocs.remove(&dptr);
    let rc = real();
    match (rc, charge) {
        (CUDA_SUCCESS, Some(c)) if c.pool != 0 => super::pool::freed(e, c),
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
                // SAFETY: pitch is non-NULL (checked above), valid per the
                // caller's contract, and the successful real call wrote it.
                let chosen = unsafe { *pitch } as u64;
                let actual = rounded(e, ordinal, chosen.saturating_mul(height as u64));
                if actual < c.bytes {
                    accounting::unreserve(e, c.gpu, c.bytes - actual);
                } else if actual > c.bytes && reserve(e, c.gpu, actual - c.bytes).is_err() {
                    // SAFETY: dptr is non-NULL (checked above), valid per
                    // the caller's contract, and the real call wrote it.
                    let ptr = unsafe { *dptr };
                    let _ = real_cuda!(cuMemFree_v2(ptr));
                    accounting::release(e, c);
                    return CUDA_ERROR_OUT_OF_MEMORY;
                }
                c.bytes = actual;
                // SAFETY: dptr is non-NULL and the successful real call
                // wrote it.
                unsafe { book(e, rc, dptr, c) }
            },
        )
    }

    fn cuMemFree_v2(dptr: CUdeviceptr) {
        dispatch(
            || real_cuda!(cuMemFree_v2(dptr)),
            |e| unbook(e, dptr, || real_cuda!(cuMemFree_v2(dptr))),
        )
    }

}
