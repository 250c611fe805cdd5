//! Device allocations: linear, pitched and managed (stream-ordered and
//! pool allocations are in `pool.rs`). Each is reserved against the
//! container's limit before the real call (`CUDA_ERROR_OUT_OF_MEMORY`,
//! nothing allocated, when it does not fit) and returned when freed.
//! Linear and pitched memory is charged by the device pages it touches
//! (small allocations share pages, see `crate::pages`): the reservation
//! covers a fresh page (or whole pages) and is settled on the pages the
//! returned address really touches.

use std::ffi::c_uint;

use super::{dispatch, hook};
use crate::accounting::{self, Charge, reserve_current};
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
/// its pool's account for pool memory, see `pool.rs`; the pages no live
/// allocation touches any more for linear memory).
pub fn unbook(e: &Enforcer, dptr: CUdeviceptr, real: impl FnOnce() -> CUresult) -> CUresult {
    let (span, charge) = {
        let mut b = e.books();
        match b.pages.take(dptr) {
            Some(s) => (Some(s), None),
            None => (None, b.allocs.remove(&dptr)),
        }
    };
    if let Some(span) = span {
        // The pages stay charged until the driver's free succeeded.
        let rc = real();
        let mut b = e.books();
        if rc == CUDA_SUCCESS {
            let bytes = b.pages.release(dptr, &span);
            drop(b);
            accounting::unreserve(e, span.gpu, bytes);
        } else {
            b.pages.restore(dptr, span);
        }
        return rc;
    }
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

/// A linear allocation through `real`, reserved for `reserve_len` bytes
/// and charged by the pages of the `len()` bytes it took.
fn linear(
    e: &Enforcer,
    dptr: *mut CUdeviceptr,
    reserve_len: u64,
    real: impl FnOnce() -> CUresult,
    len: impl FnOnce() -> u64,
) -> CUresult {
    let r = match accounting::reserve_pages(e, reserve_len) {
        Ok(r) => r,
        Err(rc) => return rc,
    };
    let rc = real();
    if rc != CUDA_SUCCESS {
        accounting::unreserve(e, r.gpu, r.reserved);
        return rc;
    }
    // SAFETY: the caller checked `dptr` is not NULL, and the real call
    // succeeded, so it wrote the new allocation's address there.
    let addr = unsafe { *dptr };
    match accounting::book_pages(e, r, addr, len()) {
        Ok(()) => CUDA_SUCCESS,
        Err(rc) => {
            let _ = real_cuda!(cuMemFree_v2(addr));
            rc
        }
    }
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
            |e| {
                if bytes == 0 || dptr.is_null() {
                    return real_cuda!(cuMemAlloc_v2(dptr, bytes));
                }
                let len = bytes as u64;
                linear(e, dptr, len, || real_cuda!(cuMemAlloc_v2(dptr, bytes)), || len)
            },
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
                linear(
                    e,
                    dptr,
                    row.saturating_mul(height as u64),
                    || real_cuda!(cuMemAllocPitch_v2(dptr, pitch, width, height, elem)),
                    // SAFETY: checked not NULL above; read only after the
                    // real call succeeded and wrote it.
                    || (unsafe { *pitch } as u64).saturating_mul(height as u64),
                )
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
