//! Launches: every path draws from the container's launch bucket of the
//! GPU before the real launch. A kernel costs its warps (grid blocks ×
//! ceil(threads per block / 32)); a graph costs the sum of its kernels,
//! counted when it is instantiated.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use tessera_region::rate::launch_cost;

use super::{dispatch, hook};
use crate::accounting::real_cuda;
use crate::accounting::{current_device, gpu_index};
use crate::ffi::*;
use crate::state::Enforcer;
use crate::throttle;

fn cost(grid: [c_uint; 3], block: [c_uint; 3]) -> u64 {
    let n = |d: [c_uint; 3]| d.iter().map(|&x| u64::from(x.max(1))).product::<u64>();
    launch_cost(n(grid), n(block))
}

/// Admits a launch of `warps` on the current device, then runs `real`.
fn launch(e: &Enforcer, warps: u64, real: impl FnOnce() -> CUresult) -> CUresult {
    let gpu = if e.single_gpu {
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

/// The launch cost of graph `g`: the sum over its kernel nodes.
fn graph_cost(g: Handle) -> u64 {
    let mut n: usize = 0;
    if real_cuda!(cuGraphGetNodes(g, std::ptr::null_mut(), &mut n)) != CUDA_SUCCESS || n == 0 {
        return 1;
    }
    let mut nodes: Vec<Handle> = vec![std::ptr::null_mut(); n];
    if real_cuda!(cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n)) != CUDA_SUCCESS {
        return 1;
    }
    let mut total = 0u64;
    for &node in nodes.iter().take(n) {
        let mut kind: c_int = -1;
        if real_cuda!(cuGraphNodeGetType(node, &mut kind)) != CUDA_SUCCESS
            || kind != CU_GRAPH_NODE_TYPE_KERNEL
        {
            continue;
        }
        // SAFETY: KernelNodeParams is plain data; zero is a valid value.
        let mut p: KernelNodeParams = unsafe { std::mem::zeroed() };
        let mut rc = real_cuda!(cuGraphKernelNodeGetParams_v2(node, &mut p));
        if rc == CUDA_ERROR_NOT_FOUND {
            rc = real_cuda!(cuGraphKernelNodeGetParams(node, &mut p));
        }
        if rc == CUDA_SUCCESS {
            total = total.saturating_add(cost(p.grid, p.block));
        }
    }
    total.max(1)
}

/// Records the cost of a freshly instantiated graph.
///
/// # Safety
/// When `rc` is success, `exec` was written by the real call.
unsafe fn note_graph(e: &Enforcer, rc: CUresult, exec: *mut Handle, graph: Handle) -> CUresult {
    if rc == CUDA_SUCCESS && !exec.is_null() {
        let c = graph_cost(graph);
        // SAFETY: per the contract.
        let x = unsafe { *exec } as usize;
        e.books().graphs.insert(x, c);
    }
    rc
}

fn graph_launch(e: &Enforcer, exec: Handle, real: impl FnOnce() -> CUresult) -> CUresult {
    let warps = e.books().graphs.get(&(exec as usize)).copied().unwrap_or(1);
    launch(e, warps, real)
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
                let Some(c) = config.as_ref() else {
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
                let Some(c) = config.as_ref() else {
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

    fn cuGraphInstantiateWithFlags(exec: *mut Handle, graph: Handle, flags: c_ulonglong) {
        dispatch(
            || real_cuda!(cuGraphInstantiateWithFlags(exec, graph, flags)),
            |e| note_graph(e, real_cuda!(cuGraphInstantiateWithFlags(exec, graph, flags)), exec, graph),
        )
    }

    fn cuGraphInstantiate_v2(exec: *mut Handle, graph: Handle, err: *mut Handle, log: *mut c_char, size: usize) {
        dispatch(
            || real_cuda!(cuGraphInstantiate_v2(exec, graph, err, log, size)),
            |e| note_graph(e, real_cuda!(cuGraphInstantiate_v2(exec, graph, err, log, size)), exec, graph),
        )
    }

    fn cuGraphExecDestroy(exec: Handle) {
        dispatch(
            || real_cuda!(cuGraphExecDestroy(exec)),
            |e| {
                let rc = real_cuda!(cuGraphExecDestroy(exec));
                if rc == CUDA_SUCCESS {
                    e.books().graphs.remove(&(exec as usize));
                }
                rc
            },
        )
    }

    fn cuGraphLaunch(exec: Handle, stream: Handle) {
        dispatch(
            || real_cuda!(cuGraphLaunch(exec, stream)),
            |e| graph_launch(e, exec, || real_cuda!(cuGraphLaunch(exec, stream))),
        )
    }

    fn cuGraphLaunch_ptsz(exec: Handle, stream: Handle) {
        dispatch(
            || real_cuda!(cuGraphLaunch_ptsz(exec, stream)),
            |e| graph_launch(e, exec, || real_cuda!(cuGraphLaunch_ptsz(exec, stream))),
        )
    }
}
