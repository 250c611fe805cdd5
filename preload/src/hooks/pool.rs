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
//! (`CUDA_ERROR_NOT_SUPPORTED`), as are explicit memory nodes (`graph.rs`).
//! A capture can begin (or the stream join one, by waiting on a captured
//! event) between that check and the driver's call; if the stream is
//! capturing once the call returns, the allocation may sit in the graph,
//! so the capture is spoilt (an illegal synchronize invalidates it: it
//! ends without a graph) and the reservation is kept until the pointer is
//! freed.
//!
//! A destroyed pool's account lives on until its last allocation is freed
//! (the driver releases the pool's memory only then), under a key of its
//! own: the driver may hand the same handle to a new pool. Creating and
//! destroying pools are serialised with their bookkeeping ([`POOL_OPS`]),
//! so a new pool with a reused handle is only booked after the old one's
//! account has moved out of its way.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::memory::unbook;
use super::{dispatch, hook};
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

/// Settles `pool`'s charge to max(live, reserved). A destroyed pool keeps
/// its whole charge until nothing is live, then returns it and is
/// forgotten.
pub fn reconcile(e: &Enforcer, pool: usize) {
    let destroyed = e.books().pools.get(&pool).map(|pb| pb.destroyed);
    let held = match destroyed {
        None => return,
        Some(true) => None,
        Some(false) => reserved(pool),
    };
    let (gpu, delta) = {
        let mut b = e.books();
        let Some(pb) = b.pools.get_mut(&pool) else {
            return;
        };
        let target = if pb.destroyed {
            if pb.live == 0 { 0 } else { pb.charged }
        } else {
            pb.live.max(held.unwrap_or(pb.live))
        };
        let delta = target as i128 - pb.charged as i128;
        pb.charged = target;
        let gpu = pb.gpu;
        if pb.destroyed && pb.live == 0 {
            b.pools.remove(&pool);
        }
        (gpu, delta)
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
    let pools: Vec<usize> = e
        .books()
        .pools
        .iter()
        .filter(|(_, pb)| !pb.destroyed)
        .map(|(&k, _)| k)
        .collect();
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
        if capturing(stream) {
            // Synchronizing a capturing stream invalidates its capture.
            let _ = real_cuda!(cuStreamSynchronize(stream));
        }
        reconcile(e, pool);
    }
    rc
}

/// Keys of destroyed pools' accounts: counting down from the top of the
/// address space, where no pool handle (a driver pointer) lies.
static NEXT_TOMBSTONE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Held across a real `cuMemPoolCreate` or `cuMemPoolDestroy` and its
/// bookkeeping. Lock order: this before the books.
static POOL_OPS: Mutex<()> = Mutex::new(());

fn lock_pools() -> MutexGuard<'static, ()> {
    POOL_OPS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `pool` was destroyed: its memory goes back once its allocations are
/// freed (at once if none is live), and its bookkeeping goes with it.
fn destroyed(e: &Enforcer, pool: usize) {
    let key = NEXT_TOMBSTONE.fetch_sub(1, Ordering::Relaxed);
    {
        let mut b = e.books();
        b.pool_devices.remove(&pool);
        let Some(mut pb) = b.pools.remove(&pool) else {
            return;
        };
        pb.destroyed = true;
        for c in b.allocs.values_mut().filter(|c| c.pool == pool) {
            c.pool = key;
        }
        b.pools.insert(key, pb);
    }
    reconcile(e, key);
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

    fn cuMemPoolDestroy(pool: Handle) {
        dispatch(
            || real_cuda!(cuMemPoolDestroy(pool)),
            |e| {
                let _serial = lock_pools();
                let rc = real_cuda!(cuMemPoolDestroy(pool));
                if rc == CUDA_SUCCESS {
                    destroyed(e, pool as usize);
                }
                rc
            },
        )
    }

    fn cuMemPoolCreate(pool: *mut Handle, props: *const CUmemPoolProps) {
        dispatch(
            || real_cuda!(cuMemPoolCreate(pool, props)),
            |e| {
                let _serial = lock_pools();
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
}
