//! Context management.

use std::ffi::{c_int, c_uint, c_void};

use super::ptr::{out, out_opt};
use super::{Code, cu_alias, cu_export, h, hp};
use crate::abi::*;
use crate::context;
use crate::process;
use crate::status::*;

cu_export! {
    fn cuCtxCreate_v2(pctx: *mut Handle, flags: c_uint, dev: CUdevice) {
        let p = process::get()?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(context::create(p, dev, flags)?);
        // SAFETY: the caller's contract: `pctx` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(pctx, v) }
    }

    /// With execution-affinity parameters (ignored: no SM partitioning).
    fn cuCtxCreate_v3(pctx: *mut Handle, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice) {
        let _ = (params, n);
        // SAFETY: the caller's contract for `pctx` is that of
        // cuCtxCreate_v2, which takes the same pointer.
        unsafe { cuCtxCreate_v2(pctx, flags, dev) }.ok()
    }

    /// With `CUctxCreateParams` (ignored).
    fn cuCtxCreate_v4(pctx: *mut Handle, params: *mut c_void, flags: c_uint, dev: CUdevice) {
        let _ = params;
        // SAFETY: the caller's contract for `pctx` is that of
        // cuCtxCreate_v2, which takes the same pointer.
        unsafe { cuCtxCreate_v2(pctx, flags, dev) }.ok()
    }

    fn cuCtxDestroy_v2(ctx: Handle) {
        let p = process::get()?;
        context::destroy(p, h(ctx))
    }

    fn cuCtxPushCurrent_v2(ctx: Handle) {
        let p = process::get()?;
        context::check_current(p, h(ctx))?;
        process::with_stack(|s| s.push(h(ctx)));
        Ok(())
    }

    fn cuCtxPopCurrent_v2(pctx: *mut Handle) {
        process::get()?;
        let top = process::with_stack(|s| s.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        // SAFETY: the caller's contract: `pctx` is NULL or points to a writable
        // `Handle`; `out_opt` skips NULL.
        unsafe { out_opt(pctx, hp(top)) };
        Ok(())
    }

    fn cuCtxSetCurrent(ctx: Handle) {
        let p = process::get()?;
        if h(ctx) != 0 {
            context::check_current(p, h(ctx))?;
        }
        process::with_stack(|s| {
            s.pop();
            if h(ctx) != 0 {
                s.push(h(ctx));
            }
        });
        Ok(())
    }

    fn cuCtxGetCurrent(pctx: *mut Handle) {
        process::get()?;
        // SAFETY: the caller's contract: `pctx` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(pctx, hp(process::current_context().unwrap_or(0))) }
    }

    fn cuCtxGetDevice(dev: *mut CUdevice) {
        let p = process::get()?;
        let v = context::current_device(p)? as CUdevice;
        // SAFETY: the caller's contract: `dev` is NULL or points to a writable
        // `CUdevice`; `out` rejects NULL.
        unsafe { out(dev, v) }
    }

    fn cuCtxGetFlags(flags: *mut c_uint) {
        let p = process::get()?;
        let f = p.lock().current()?.1.flags;
        // SAFETY: the caller's contract: `flags` is NULL or points to a
        // writable `c_uint`; `out` rejects NULL.
        unsafe { out(flags, f) }
    }

    fn cuCtxSetFlags(flags: c_uint) {
        let p = process::get()?;
        let mut inner = p.lock();
        let (c, _) = inner.current()?;
        inner.contexts.get_mut(c)?.flags = flags;
        Ok(())
    }

    fn cuCtxGetId(ctx: Handle, id: *mut u64) {
        let p = process::get()?;
        let c = if h(ctx) == 0 { process::current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)? } else { h(ctx) };
        context::check(p, c)?;
        // SAFETY: the caller's contract: `id` is NULL or points to a writable
        // `u64`; `out` rejects NULL.
        unsafe { out(id, c & 0xffff_ffff_ffff) }
    }

    fn cuCtxSynchronize() {
        let p = process::get()?;
        context::synchronize(p)
    }

    fn cuCtxGetApiVersion(ctx: Handle, version: *mut c_uint) {
        let p = process::get()?;
        if h(ctx) != 0 {
            context::check(p, h(ctx))?;
        }
        // SAFETY: the caller's contract: `version` is NULL or points to a
        // writable `c_uint`; `out` rejects NULL.
        unsafe { out(version, 3020) }
    }

    fn cuCtxGetLimit(value: *mut usize, limit: c_int) {
        let p = process::get()?;
        p.lock().current()?;
        // SAFETY: the caller's contract: `value` is NULL or points to a
        // writable `usize`; `out` rejects NULL.
        unsafe { out(value, match limit {
            0 => 1024,             // STACK_SIZE
            1 => 1 << 20,          // PRINTF_FIFO_SIZE
            2 => 8 << 20,          // MALLOC_HEAP_SIZE
            3 => 2,                // DEV_RUNTIME_SYNC_DEPTH
            4 => 2048,             // DEV_RUNTIME_PENDING_LAUNCH_COUNT
            5 => 32,               // MAX_L2_FETCH_GRANULARITY
            6 => 0,                // PERSISTING_L2_CACHE_SIZE
            _ => return Err(CUDA_ERROR_UNSUPPORTED_LIMIT),
        }) }
    }

    fn cuCtxSetLimit(limit: c_int, value: usize) {
        let p = process::get()?;
        p.lock().current()?;
        let _ = value;
        if (0..=6).contains(&limit) { Ok(()) } else { Err(CUDA_ERROR_UNSUPPORTED_LIMIT) }
    }

    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        let p = process::get()?;
        p.lock().current()?;
        // SAFETY: the caller's contract: `least` is NULL or points to a
        // writable `c_int`; `out_opt` skips NULL.
        unsafe { out_opt(least, 0) };
        // SAFETY: the caller's contract: `greatest` is NULL or points to a
        // writable `c_int`; `out_opt` skips NULL.
        unsafe { out_opt(greatest, -5) };
        Ok(())
    }

    fn cuCtxGetCacheConfig(config: *mut c_int) {
        let p = process::get()?;
        p.lock().current()?;
        // SAFETY: the caller's contract: `config` is NULL or points to a
        // writable `c_int`; `out` rejects NULL.
        unsafe { out(config, 0) }
    }

    fn cuCtxSetCacheConfig(config: c_int) {
        let p = process::get()?;
        p.lock().current()?;
        if (0..=3).contains(&config) { Ok(()) } else { Err(CUDA_ERROR_INVALID_VALUE) }
    }

    fn cuCtxEnablePeerAccess(peer: Handle, flags: c_uint) {
        let p = process::get()?;
        context::check(p, h(peer))?;
        if flags != 0 { Err(CUDA_ERROR_INVALID_VALUE) } else { Ok(()) }
    }

    fn cuCtxDisablePeerAccess(peer: Handle) {
        let p = process::get()?;
        context::check(p, h(peer))
    }

    fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) {
        let p = process::get()?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(context::primary_retain(p, dev)?);
        // SAFETY: the caller's contract: `pctx` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(pctx, v) }
    }

    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        let p = process::get()?;
        context::primary_release(p, dev)
    }

    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        let p = process::get()?;
        context::primary_reset(p, dev)
    }

    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) {
        let p = process::get()?;
        context::primary_set_flags(p, dev, flags)
    }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let p = process::get()?;
        let (f, a) = context::primary_state(p, dev)?;
        // SAFETY: the caller's contract: `flags` is NULL or points to a
        // writable `c_uint`; `out` rejects NULL.
        unsafe { out(flags, f) }?;
        // SAFETY: the caller's contract: `active` is NULL or points to a
        // writable `c_int`; `out` rejects NULL.
        unsafe { out(active, c_int::from(a)) }
    }
}

cu_alias! {
    cuCtxCreate => cuCtxCreate_v2(pctx: *mut Handle, flags: c_uint, dev: CUdevice);
    cuCtxDestroy => cuCtxDestroy_v2(ctx: Handle);
    cuCtxPushCurrent => cuCtxPushCurrent_v2(ctx: Handle);
    cuCtxPopCurrent => cuCtxPopCurrent_v2(pctx: *mut Handle);
    cuDevicePrimaryCtxRelease => cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
    cuDevicePrimaryCtxReset => cuDevicePrimaryCtxReset_v2(dev: CUdevice);
    cuDevicePrimaryCtxSetFlags => cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint);
}
