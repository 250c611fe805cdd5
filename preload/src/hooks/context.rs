//! Contexts: each one's memory overhead is charged when it is created and
//! returned, with everything allocated in it, when the driver destroys it.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{MutexGuard, PoisonError};

use super::{alias, dispatch, hook};
use crate::accounting::{self, Charge, gpu_index, reserve};
use crate::ffi::*;
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

/// Moves the charges of context `ctx` out of `book` into `dropped`.
fn drain_context<K>(book: &mut HashMap<K, Charge>, ctx: usize, dropped: &mut Vec<Charge>) {
    book.retain(|_, c| {
        let keep = c.ctx != ctx;
        if !keep {
            dropped.push(*c);
        }
        keep
    });
}

/// Returns every charge that belongs to context `ctx`: its allocations
/// and arrays die with it. (Stream-ordered, pool and VMM memory is not
/// owned by a context: those charges have `ctx` 0.)
fn drop_context_charges(e: &Enforcer, ctx: usize) {
    accounting::contexts_changed();
    let mut dropped = Vec::new();
    {
        let mut b = e.books();
        drain_context(&mut b.allocs, ctx, &mut dropped);
        drain_context(&mut b.arrays, ctx, &mut dropped);
        dropped.extend(b.contexts.remove(&ctx));
        dropped.extend(
            b.pages
                .drain_context(ctx)
                .into_iter()
                .map(|(gpu, bytes)| Charge {
                    gpu,
                    bytes,
                    ctx,
                    pool: 0,
                }),
        );
    }
    for c in dropped {
        accounting::release(e, c);
    }
}

/// Held across a primary-context retain, release or reset and its
/// bookkeeping, so the driver's reference count and ours change together
/// (two threads' first retains would otherwise both charge the overhead).
/// Lock order: this before the books.
fn lock_primary(e: &Enforcer) -> MutexGuard<'_, ()> {
    e.primary_ops.lock().unwrap_or_else(PoisonError::into_inner)
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
                let rc = real_cuda!(cuCtxDestroy_v2(ctx));
                if rc == CUDA_SUCCESS {
                    drop_context_charges(e, ctx as usize);
                }
                rc
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
                    let ctx = *pctx as usize;
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
                let rc = real_cuda!(cuDevicePrimaryCtxRelease_v2(dev));
                if rc == CUDA_SUCCESS {
                    let gone = {
                        let mut b = e.books();
                        match b.primary.get_mut(&dev) {
                            Some(p) if p.retains > 1 => {
                                p.retains -= 1;
                                None
                            }
                            Some(_) => b.primary.remove(&dev),
                            None => None,
                        }
                    };
                    if let Some(p) = gone {
                        drop_context_charges(e, p.ctx);
                        accounting::release(e, p.charge);
                    }
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
                let rc = real_cuda!(cuDevicePrimaryCtxReset_v2(dev));
                if rc == CUDA_SUCCESS {
                    let gone = e.books().primary.remove(&dev);
                    if let Some(p) = gone {
                        drop_context_charges(e, p.ctx);
                        accounting::release(e, p.charge);
                    }
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
