//! Stream-ordered allocations and memory pools.
//!
//! A freed block goes back to its pool, which may keep it reserved on the
//! device (up to its release threshold; PyTorch sets that to "never"). So
//! a pool is charged as a whole: the larger of its live allocations and
//! what the driver says it keeps reserved
//! (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`). Each allocation is reserved
//! against the limit before the real call, as elsewhere; frees, trims and
//! memory-info calls settle the pool's charge down to that figure.
//!
//! Allocating on a capturing stream creates a graph memory node, whose
//! memory appears only when the graph runs: that is refused
//! (`CUDA_ERROR_NOT_SUPPORTED`), as are explicit memory nodes.

use std::ffi::{c_int, c_void};

use super::memory::unbook;
use super::{dispatch, hook, refused_when_limited};
use crate::accounting::{self, Charge, current_device, gpu_index, reserve, rounded};
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::{Enforcer, PoolBook};

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
const RESERVED_MEM_CURRENT: c_int = 5;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
const CAPTURE_ACTIVE: c_int = 1;

/// Whether `stream` is being captured into a graph.
fn capturing(stream: Handle) -> bool {
    let mut status: c_int = 0;
    real_cuda!(cuStreamIsCapturing(stream, &mut status)) == CUDA_SUCCESS && status == CAPTURE_ACTIVE
}

/// What the driver keeps reserved for `pool`, if it says.
fn reserved(pool: usize) -> Option<u64> {
    let mut v: u64 = 0;
    (real_cuda!(cuMemPoolGetAttribute(
        pool as Handle,
        RESERVED_MEM_CURRENT,
        (&mut v as *mut u64).cast::<c_void>()
    )) == CUDA_SUCCESS)
        .then_some(v)
}

/// Settles `pool`'s charge to max(live, reserved).
pub fn reconcile(e: &Enforcer, pool: usize) {
    let held = reserved(pool);
    let (gpu, delta) = {
        let mut b = e.books();
        let Some(pb) = b.pools.get_mut(&pool) else {
            return;
        };
        let target = pb.live.max(held.unwrap_or(pb.live));
        let delta = target as i128 - pb.charged as i128;
        pb.charged = target;
        (pb.gpu, delta)
    };
    if delta < 0 {
        accounting::unreserve(e, gpu, (-delta) as u64);
    } else if delta > 0 {
        // The driver already holds it: record the truth, limit or not.
        accounting::force_reserve(e, gpu, delta as u64);
    }
}

/// Settles every pool (memory-info calls).
pub fn reconcile_all(e: &Enforcer) {
    let pools: Vec<usize> = e.books().pools.keys().copied().collect();
    for p in pools {
        reconcile(e, p);
    }
}

/// A pool allocation was freed: its bytes leave the pool's live count.
pub fn freed(e: &Enforcer, c: Charge) {
    if let Some(pb) = e.books().pools.get_mut(&c.pool) {
        pb.live = pb.live.saturating_sub(c.bytes);
    }
    reconcile(e, c.pool);
}

/// `pool` and the device it belongs to (known pools; else the current
/// device), for `cuMemAllocFromPoolAsync`.
fn given_pool(e: &Enforcer, pool: usize) -> Result<(usize, CUdevice), CUresult> {
    let known = e.books().pool_devices.get(&pool).copied();
    Ok((pool, known.map_or_else(current_device, Ok)?))
}

/// The current device's current pool and the device (where
/// `cuMemAllocAsync` takes from).
fn current_pool(e: &Enforcer) -> Result<(usize, CUdevice), CUresult> {
    let dev = current_device()?;
    let mut pool: Handle = std::ptr::null_mut();
    match real_cuda!(cuDeviceGetMemPool(&mut pool, dev)) {
        CUDA_SUCCESS => {
            e.books().pool_devices.insert(pool as usize, dev);
            Ok((pool as usize, dev))
        }
        rc => Err(rc),
    }
}

/// A stream-ordered allocation from the pool `target` names.
fn alloc_from(
    e: &Enforcer,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: Handle,
    target: impl FnOnce(&Enforcer) -> Result<(usize, CUdevice), CUresult>,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if bytes == 0 || dptr.is_null() {
        return real();
    }
    if capturing(stream) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    let (pool, ordinal) = match target(e) {
        Ok(x) => x,
        Err(rc) => return rc,
    };
    let gpu = match gpu_index(e, ordinal) {
        Ok(g) => g,
        Err(rc) => return rc,
    };
    let charge = Charge {
        gpu,
        bytes: rounded(e, ordinal, bytes as u64),
        ctx: 0,
        pool,
    };
    if let Err(rc) = reserve(e, gpu, charge.bytes) {
        return rc;
    }
    let rc = accounting::settle(e, real(), charge, |b, charge| {
        let pb = b.pools.entry(pool).or_insert(PoolBook {
            gpu,
            ..PoolBook::default()
        });
        pb.live += charge.bytes;
        pb.charged += charge.bytes;
        // SAFETY: the real call succeeded and wrote *dptr.
        b.allocs.insert(unsafe { *dptr }, charge);
    });
    if rc == CUDA_SUCCESS {
        reconcile(e, pool);
    }
    rc
}

/// Remembers which device a pool belongs to.
///
/// # Safety
/// When `rc` is success, `pool` was written by the real call.
unsafe fn note_pool(e: &Enforcer, rc: CUresult, pool: *mut Handle, dev: CUdevice) -> CUresult {
    if rc == CUDA_SUCCESS && !pool.is_null() {
        // SAFETY: per the contract.
        let p = unsafe { *pool } as usize;
        e.books().pool_devices.insert(p, dev);
    }
    rc
}

hook! {
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemAllocAsync(dptr, bytes, stream)),
            |e| alloc_from(e, dptr, bytes, stream, current_pool, || real_cuda!(cuMemAllocAsync(dptr, bytes, stream))),
        )
    }

    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemAllocAsync_ptsz(dptr, bytes, stream)),
            |e| alloc_from(e, dptr, bytes, stream, current_pool, || real_cuda!(cuMemAllocAsync_ptsz(dptr, bytes, stream))),
        )
    }

    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: Handle, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemAllocFromPoolAsync(dptr, bytes, pool, stream)),
            |e| alloc_from(e, dptr, bytes, stream, |e| given_pool(e, pool as usize), || {
                real_cuda!(cuMemAllocFromPoolAsync(dptr, bytes, pool, stream))
            }),
        )
    }

    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: Handle, stream: Handle) {
        dispatch(
            || real_cuda!(cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, stream)),
            |e| alloc_from(e, dptr, bytes, stream, |e| given_pool(e, pool as usize), || {
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

    fn cuMemPoolTrimTo(pool: Handle, keep: usize) {
        dispatch(
            || real_cuda!(cuMemPoolTrimTo(pool, keep)),
            |e| {
                let rc = real_cuda!(cuMemPoolTrimTo(pool, keep));
                if rc == CUDA_SUCCESS {
                    reconcile(e, pool as usize);
                }
                rc
            },
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
                // SAFETY: props is non-NULL (checked above) and points to
                // pool properties per the caller's contract.
                let dev = unsafe { (*props).location.id };
                // SAFETY: pool is the call's output argument (valid per the
                // caller's contract); the real call wrote it if rc is success.
                unsafe { note_pool(e, rc, pool, dev) }
            },
        )
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) {
        dispatch(
            || real_cuda!(cuDeviceGetDefaultMemPool(pool, dev)),
            |e| {
                let rc = real_cuda!(cuDeviceGetDefaultMemPool(pool, dev));
                // SAFETY: pool is the call's output argument (valid per the
                // caller's contract); the real call wrote it if rc is success.
                unsafe { note_pool(e, rc, pool, dev) }
            },
        )
    }

    fn cuDeviceGetMemPool(pool: *mut Handle, dev: CUdevice) {
        dispatch(
            || real_cuda!(cuDeviceGetMemPool(pool, dev)),
            |e| {
                let rc = real_cuda!(cuDeviceGetMemPool(pool, dev));
                // SAFETY: pool is the call's output argument (valid per the
                // caller's contract); the real call wrote it if rc is success.
                unsafe { note_pool(e, rc, pool, dev) }
            },
        )
    }

    /// Graph memory nodes allocate when the graph runs, outside any hook:
    /// refused.
    fn cuGraphAddMemAllocNode(node: *mut Handle, graph: Handle, deps: *const Handle, n: usize, params: *mut c_void) {
        refused_when_limited(|| real_cuda!(cuGraphAddMemAllocNode(node, graph, deps, n, params)))
    }
}
