//! Launches: every path draws from the container's launch bucket of the
//! GPU before the real launch. A kernel costs its warps (grid blocks ×
//! ceil(threads per block / 32)), or the GPU's launch floor if that is
//! more (applied where the GPU is known, in `throttle`); graphs are in
//! `graph.rs`.

use std::ffi::{c_uint, c_void};
use std::sync::atomic::Ordering;

use tessera_region::rate::launch_cost;

use super::{dispatch, hook};
use crate::accounting::{current_context_device, gpu_index};
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::Enforcer;
use crate::throttle::{self, Route};

/// Warps of a launch of `grid` blocks of `block` threads. A dimension of
/// 0 (a launch the driver refuses) makes the count 0, which costs one warp
/// like the smallest launch; products too large saturate, so no shape is
/// cheaper than its warps.
#[inline]
pub fn cost(grid: [c_uint; 3], block: [c_uint; 3]) -> u64 {
    // Two 32-bit factors never overflow 64 bits; the third may.
    let n = |[x, y, z]: [c_uint; 3]| (u64::from(x) * u64::from(y)).saturating_mul(u64::from(z));
    launch_cost(n(grid), n(block))
}

/// Admits a launch of `warps` on the current device, then runs `real`.
pub fn launch(e: &'static Enforcer, warps: u64, real: impl FnOnce() -> CUresult) -> CUresult {
    match admit(e, warps) {
        Ok(()) => real(),
        Err(rc) => rc,
    }
}

/// The launch floor of the current device's GPU in the container (0 when
/// there is none, or no current device the container has).
pub fn launch_floor(e: &Enforcer) -> u64 {
    let gpu = if e.single_gpu_epoch().is_some() {
        Ok(0)
    } else {
        current_context_device().and_then(|c| gpu_index(e, c.device))
    };
    gpu.map_or(0, |gpu| e.control.launch_limits(gpu).floor)
}

/// Admits a launch of `warps` on the current device (waiting for its
/// turn), or says what to answer instead.
fn admit(e: &'static Enforcer, warps: u64) -> Result<(), CUresult> {
    if let Some(epoch) = e.single_gpu_epoch() {
        throttle::admit(e, 0, warps, Route::Single, epoch);
        return Ok(());
    }
    // The epoch before the lookup: the route is kept only if the batch's
    // limits are read under this same epoch, i.e. no write of the control
    // region began or ended between the lookup and them.
    let epoch = e.control.header.epoch.load(Ordering::Acquire);
    let current = current_context_device()?;
    let gpu = gpu_index(e, current.device)?;
    let route = match current.ctx {
        0 => Route::Lookup,
        ctx => Route::Context {
            ctx,
            generation: current.generation,
        },
    };
    throttle::admit(e, gpu, warps, route, epoch);
    Ok(())
}

/// The gate of a kernel launch of `warps`: `CUDA_SUCCESS` when the real
/// launch may go ahead (admitted, or passing through unlimited), else
/// what to answer instead (see [`dispatch`]). The hooks then call the real
/// function themselves, so its arguments are not moved through closures
/// on the launch path.
///
/// A thread whose previous launch found one GPU and left a batch spends
/// from it first ([`throttle::try_admit_fast`]); everything else takes
/// the full path.
#[inline(always)]
fn gate(warps: u64) -> CUresult {
    if throttle::try_admit_fast(warps) {
        return CUDA_SUCCESS;
    }
    gate_slow(warps)
}

/// [`gate`] past the one-GPU fast path: the same batch if the thread's
/// current context is the previous launch's, else the mode, the device,
/// the bucket.
#[inline(never)]
fn gate_slow(warps: u64) -> CUresult {
    if throttle::try_admit_in_context(warps) {
        return CUDA_SUCCESS;
    }
    dispatch(
        || CUDA_SUCCESS,
        |e| match admit(e, warps) {
            Ok(()) => CUDA_SUCCESS,
            Err(rc) => rc,
        },
    )
}

hook! {
    fn cuLaunchKernel(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) {
        match gate(cost([gx, gy, gz], [bx, by, bz])) {
            CUDA_SUCCESS => real_cuda!(cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)),
            rc => rc,
        }
    }

    fn cuLaunchKernel_ptsz(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) {
        match gate(cost([gx, gy, gz], [bx, by, bz])) {
            CUDA_SUCCESS => real_cuda!(cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)),
            rc => rc,
        }
    }

    fn cuLaunchKernelEx(config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) {
        // SAFETY: the caller's contract: config is NULL or points to a
        // launch configuration.
        let Some(c) = (unsafe { config.as_ref() }) else {
            // Nothing to admit: the driver refuses the call itself.
            return dispatch(
                || real_cuda!(cuLaunchKernelEx(config, f, params, extra)),
                |_| real_cuda!(cuLaunchKernelEx(config, f, params, extra)),
            );
        };
        match gate(cost(
            [c.grid_dim_x, c.grid_dim_y, c.grid_dim_z],
            [c.block_dim_x, c.block_dim_y, c.block_dim_z],
        )) {
            CUDA_SUCCESS => real_cuda!(cuLaunchKernelEx(config, f, params, extra)),
            rc => rc,
        }
    }

    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) {
        // SAFETY: the caller's contract: config is NULL or points to a
        // launch configuration.
        let Some(c) = (unsafe { config.as_ref() }) else {
            // Nothing to admit: the driver refuses the call itself.
            return dispatch(
                || real_cuda!(cuLaunchKernelEx_ptsz(config, f, params, extra)),
                |_| real_cuda!(cuLaunchKernelEx_ptsz(config, f, params, extra)),
            );
        };
        match gate(cost(
            [c.grid_dim_x, c.grid_dim_y, c.grid_dim_z],
            [c.block_dim_x, c.block_dim_y, c.block_dim_z],
        )) {
            CUDA_SUCCESS => real_cuda!(cuLaunchKernelEx_ptsz(config, f, params, extra)),
            rc => rc,
        }
    }

    fn cuLaunchCooperativeKernel(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void,
    ) {
        match gate(cost([gx, gy, gz], [bx, by, bz])) {
            CUDA_SUCCESS => real_cuda!(cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params)),
            rc => rc,
        }
    }

    fn cuLaunchCooperativeKernel_ptsz(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void,
    ) {
        match gate(cost([gx, gy, gz], [bx, by, bz])) {
            CUDA_SUCCESS => real_cuda!(cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params)),
            rc => rc,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_costs_its_warps_whatever_its_shape() {
        assert_eq!(cost([1, 1, 1], [32, 1, 1]), 1);
        assert_eq!(cost([132, 1, 1], [256, 1, 1]), 132 * 8);
        assert_eq!(cost([4, 3, 2], [8, 4, 3]), 24 * 3);
        assert_eq!(cost([2, 1, 1], [33, 1, 1]), 4);
        // Refused shapes cost the minimum, never nothing.
        assert_eq!(cost([0, 7, 7], [32, 1, 1]), 1);
        assert_eq!(cost([7, 7, 7], [0, 0, 0]), 343);
        // Shapes whose warps do not fit 64 bits saturate, never wrap.
        let max = c_uint::MAX;
        assert_eq!(cost([max, max, max], [32, 1, 1]), u64::MAX);
        assert_eq!(cost([max, max, 2], [1024, 1, 1]), u64::MAX);
    }
}
