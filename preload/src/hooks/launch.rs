//! Launches: every path draws from the container's launch bucket of the
//! GPU before the real launch. A kernel costs its warps (grid blocks ×
//! ceil(threads per block / 32)); graphs are in `graph.rs`.

use std::ffi::{c_uint, c_void};

use tessera_region::rate::launch_cost;

use super::{dispatch, hook};
use crate::accounting::{current_device, gpu_index};
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::Enforcer;
use crate::throttle;

/// Warps of a launch of `grid` blocks of `block` threads.
pub fn cost(grid: [c_uint; 3], block: [c_uint; 3]) -> u64 {
    let n = |d: [c_uint; 3]| d.iter().map(|&x| u64::from(x.max(1))).product::<u64>();
    launch_cost(n(grid), n(block))
}

/// Admits a launch of `warps` on the current device, then runs `real`.
pub fn launch(e: &Enforcer, warps: u64, real: impl FnOnce() -> CUresult) -> CUresult {
    let gpu = if e.single_gpu() {
        0
    } else {
        match current_device().and_then(|d| gpu_index(e, d)) {
            Ok(g) => g,
            Err(rc) => return rc,
        }
    };
    throttle::admit(e, gpu, warps);
    real()
}

hook! {
    fn cuLaunchKernel(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) {
        dispatch(
            || real_cuda!(cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)),
            |e| launch(e, cost([gx, gy, gz], [bx, by, bz]), || {
                real_cuda!(cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra))
            }),
        )
    }

    fn cuLaunchKernel_ptsz(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) {
        dispatch(
            || real_cuda!(cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)),
            |e| launch(e, cost([gx, gy, gz], [bx, by, bz]), || {
                real_cuda!(cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra))
            }),
        )
    }

    fn cuLaunchKernelEx(config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) {
        dispatch(
            || real_cuda!(cuLaunchKernelEx(config, f, params, extra)),
            |e| {
                // SAFETY: the caller's contract: config is NULL or points
                // to a launch configuration.
                let Some(c) = (unsafe { config.as_ref() }) else {
                    return real_cuda!(cuLaunchKernelEx(config, f, params, extra));
                };
                launch(e, cost(c.grid, c.block), || real_cuda!(cuLaunchKernelEx(config, f, params, extra)))
            },
        )
    }

    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) {
        dispatch(
            || real_cuda!(cuLaunchKernelEx_ptsz(config, f, params, extra)),
            |e| {
                // SAFETY: the caller's contract: config is NULL or points
                // to a launch configuration.
                let Some(c) = (unsafe { config.as_ref() }) else {
                    return real_cuda!(cuLaunchKernelEx_ptsz(config, f, params, extra));
                };
                launch(e, cost(c.grid, c.block), || real_cuda!(cuLaunchKernelEx_ptsz(config, f, params, extra)))
            },
        )
    }

    fn cuLaunchCooperativeKernel(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void,
    ) {
        dispatch(
            || real_cuda!(cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params)),
            |e| launch(e, cost([gx, gy, gz], [bx, by, bz]), || {
                real_cuda!(cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params))
            }),
        )
    }

    fn cuLaunchCooperativeKernel_ptsz(
        f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: Handle, params: *mut *mut c_void,
    ) {
        dispatch(
            || real_cuda!(cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params)),
            |e| launch(e, cost([gx, gy, gz], [bx, by, bz]), || {
                real_cuda!(cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params))
            }),
        )
    }
}
