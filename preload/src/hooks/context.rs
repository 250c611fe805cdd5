//! Contexts: each one's memory overhead is charged when it is created and
//! returned, with everything allocated in it, when the driver destroys it.
//!
//! The driver may give a new context the handle of one just destroyed, so
//! a dying context's charges are taken out of the books *before* the real
//! destroy (and put back if it fails): whatever is booked under that handle
//! once the driver has let go of it belongs to the new context and stays.
//! Charges leave the account only after the driver freed the memory.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{MutexGuard, PoisonError};

use super::{alias, dispatch, hook};
use crate::accounting::{self, Charge, gpu_index, reserve};
use crate::ffi::*;
use crate::pages::Span;
use crate::real::real_cuda;
use crate::state::{Enforcer, Primary};

/// Reserves the overhead of a new context on `dev`.
fn reserve_overhead(e: &Enforcer, dev: CUdevice) -> Result<Charge, CUresult> {
    let gpu = gpu_index(e, dev)?;
    let bytes = e.control.gpu(gpu).0.context_overhead;
    reserve(e, gpu, bytes)?;
    Ok(Charge {
        gpu,
        bytes,
        ctx: 0,
        pool: 0,
    })
}

/// Moves the charges of context `ctx` out of `book` into `taken`.
fn drain_context<K: Copy>(book: &mut HashMap<K, Charge>, ctx: usize, taken: &mut Vec<(K, Charge)>) {
    book.retain(|&k, c| {
        let keep = c.ctx != ctx;
        if !keep {
            taken.push((k, *c));
        }
        keep
    });
}

/// The charges of a context being destroyed, out of the books.
#[derive(Default)]
struct Dying {
    allocs: Vec<(u64, Charge)>,
    arrays: Vec<(usize, Charge)>,
    contexts: Vec<(usize, Charge)>,
    /// Its linear allocations in the page book (pages still held).
    pages: Vec<(u64, Span)>,
}

/// Takes every charge that belongs to context `ctx` out of the books: its
/// allocations and arrays die with it, and its own overhead (explicit
/// contexts). Stream-ordered, pool and VMM memory is not owned by a
/// context: those charges have `ctx` 0.
fn take_context_charges(e: &Enforcer, ctx: usize) -> Dying {
    let mut d = Dying::default();
    let mut b = e.books();
    drain_context(&mut b.allocs, ctx, &mut d.allocs);
    drain_context(&mut b.arrays, ctx, &mut d.arrays);
    drain_context(&mut b.contexts, ctx, &mut d.contexts);
    d.pages = b.pages.take_context(ctx);
    d
}

/// Destroys context `ctx` through `real` (which also returns `extra` on
/// success, the primary context's overhead). Its charges leave the books
/// before the call, come back if it fails, and are returned to the account
/// if it succeeds.
fn retire(
    e: &Enforcer,
    ctx: usize,
    extra: Option<Charge>,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let dying = take_context_charges(e, ctx);
    let rc = real();
    if rc != CUDA_SUCCESS {
        let mut b = e.books();
        b.allocs.extend(dying.allocs);
        b.arrays.extend(dying.arrays);
        b.contexts.extend(dying.contexts);
        for (addr, span) in dying.pages {
            b.pages.restore(addr, span);
        }
        return rc;
    }
    // Cached context → device facts of this handle are stale now.
    accounting::contexts_changed();
    // The device pages its linear allocations held die with it too (held
    // until the destroy succeeded).
    let pages: Vec<Charge> = {
        let mut b = e.books();
        dying
            .pages
            .iter()
            .map(|(addr, span)| Charge {
                gpu: span.gpu,
                bytes: b.pages.release(*addr, span),
                ctx,
                pool: 0,
            })
            .collect()
    };
    let allocs = dying.allocs.into_iter().map(|(_, c)| c);
    let others = dying
        .arrays
        .into_iter()
        .chain(dying.contexts)
        .map(|(_, c)| c);
    for c in allocs.chain(others).chain(pages).chain(extra) {
        accounting::release(e, c);
    }
    rc
}

/// Held across a primary-context retain, release or reset and its
/// bookkeeping, so the driver's reference count and ours change together
/// (two threads' first retains would otherwise both charge the overhead).
/// Lock order: this before the books (see `fork.rs`).
fn lock_primary(e: &Enforcer) -> crate::fork::Holding<MutexGuard<'_, ()>> {
    // The driver table is first loaded outside the lock (fork.rs: no
    // one-time initialisation under this lock).
    let _ = crate::real::cuda();
    crate::fork::Holding::new(e.primary_ops.lock().unwrap_or_else(PoisonError::into_inner))
}

fn create(
    e: &Enforcer,
    pctx: *mut Handle,
    dev: CUdevice,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if pctx.is_null() {
        return real();
    }
    let charge = match reserve_overhead(e, dev) {
        Ok(c) => c,
        Err(rc) => return rc,
    };
    accounting::settle(e, real(), charge, |b, charge| {
        // SAFETY: the real call succeeded and wrote the new context.
        let ctx = unsafe { *pctx } as usize;
        b.contexts.insert(ctx, Charge { ctx, ..charge });
    })
}

hook! {
    fn cuCtxCreate_v2(pctx: *mut Handle, flags: c_uint, dev: CUdevice) {
        dispatch(
            || real_cuda!(cuCtxCreate_v2(pctx, flags, dev)),
            |e| create(e, pctx, dev, || real_cuda!(cuCtxCreate_v2(pctx, flags, dev))),
        )
    }

    fn cuCtxCreate_v3(pctx: *mut Handle, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice) {
        dispatch(
            || real_cuda!(cuCtxCreate_v3(pctx, params, n, flags, dev)),
            |e| create(e, pctx, dev, || real_cuda!(cuCtxCreate_v3(pctx, params, n, flags, dev))),
        )
    }

    fn cuCtxCreate_v4(pctx: *mut Handle, params: *mut c_void, flags: c_uint, dev: CUdevice) {
        dispatch(
            || real_cuda!(cuCtxCreate_v4(pctx, params, flags, dev)),
            |e| create(e, pctx, dev, || real_cuda!(cuCtxCreate_v4(pctx, params, flags, dev))),
        )
    }

    fn cuCtxDestroy_v2(ctx: Handle) {
        dispatch(
            || real_cuda!(cuCtxDestroy_v2(ctx)),
            |e| {
                if ctx.is_null() {
                    // Not a context (charges of context 0 are pool and VMM
                    // memory): nothing of ours dies.
                    return real_cuda!(cuCtxDestroy_v2(ctx));
                }
                retire(e, ctx as usize, None, || real_cuda!(cuCtxDestroy_v2(ctx)))
            },
        )
    }

    fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) {
        dispatch(
            || real_cuda!(cuDevicePrimaryCtxRetain(pctx, dev)),
            |e| {
                if pctx.is_null() {
                    return real_cuda!(cuDevicePrimaryCtxRetain(pctx, dev));
                }
                let _serial = lock_primary(e);
                if e.books().primary.contains_key(&dev) {
                    let rc = real_cuda!(cuDevicePrimaryCtxRetain(pctx, dev));
                    if rc == CUDA_SUCCESS
                        && let Some(p) = e.books().primary.get_mut(&dev)
                    {
                        p.retains += 1;
                    }
                    return rc;
                }
                // The first retain creates the context: charge its overhead.
                let charge = match reserve_overhead(e, dev) {
                    Ok(c) => c,
                    Err(rc) => return rc,
                };
                accounting::settle(e, real_cuda!(cuDevicePrimaryCtxRetain(pctx, dev)), charge, |b, charge| {
                    // SAFETY: the real retain succeeded, so it wrote the
                    // context through pctx (valid per the caller's contract).
                    let ctx = unsafe { *pctx } as usize;
                    b.primary.insert(dev, Primary { ctx, retains: 1, charge: Charge { ctx, ..charge } });
                })
            },
        )
    }

    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        dispatch(
            || real_cuda!(cuDevicePrimaryCtxRelease_v2(dev)),
            |e| {
                let _serial = lock_primary(e);
                let last = match e.books().primary.get(&dev) {
                    Some(p) if p.retains <= 1 => Some(*p),
                    _ => None,
                };
                let Some(p) = last else {
                    let rc = real_cuda!(cuDevicePrimaryCtxRelease_v2(dev));
                    if rc == CUDA_SUCCESS
                        && let Some(p) = e.books().primary.get_mut(&dev)
                    {
                        p.retains -= 1;
                    }
                    return rc;
                };
                // The last release destroys the context.
                let rc = retire(e, p.ctx, Some(p.charge), || real_cuda!(cuDevicePrimaryCtxRelease_v2(dev)));
                if rc == CUDA_SUCCESS {
                    e.books().primary.remove(&dev);
                }
                rc
            },
        )
    }

    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        dispatch(
            || real_cuda!(cuDevicePrimaryCtxReset_v2(dev)),
            |e| {
                let _serial = lock_primary(e);
                let active = e.books().primary.get(&dev).copied();
                let Some(p) = active else {
                    return real_cuda!(cuDevicePrimaryCtxReset_v2(dev));
                };
                let rc = retire(e, p.ctx, Some(p.charge), || real_cuda!(cuDevicePrimaryCtxReset_v2(dev)));
                if rc == CUDA_SUCCESS {
                    e.books().primary.remove(&dev);
                }
                rc
            },
        )
    }
}

alias! {
    cuCtxCreate => cuCtxCreate_v2(pctx: *mut Handle, flags: c_uint, dev: CUdevice);
    cuCtxDestroy => cuCtxDestroy_v2(ctx: Handle);
    cuDevicePrimaryCtxRelease => cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
    cuDevicePrimaryCtxReset => cuDevicePrimaryCtxReset_v2(dev: CUdevice);
}
