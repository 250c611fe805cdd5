//! Graph construction and instantiation.

use std::ffi::{c_char, c_ulonglong};

use gpusim::cost::LaunchShape;

use super::ptr::{out, out_opt, read, slice};
use super::{cu_export, h, hp};
use crate::abi::*;
use crate::graph;
use crate::process::{self, KernelLaunch};
use crate::status::*;

fn launch_of(p: &KernelNodeParamsV1, kern: Handle) -> KernelLaunch {
    let f = if p.func.is_null() { kern } else { p.func };
    KernelLaunch {
        function: h(f),
        shape: LaunchShape {
            grid: [p.grid_dim_x, p.grid_dim_y, p.grid_dim_z],
            block: [p.block_dim_x, p.block_dim_y, p.block_dim_z],
        },
        shared_mem: p.shared_mem_bytes,
    }
}

fn params_of(k: KernelLaunch) -> KernelNodeParamsV1 {
    KernelNodeParamsV1 {
        func: hp(k.function),
        grid_dim_x: k.shape.grid[0],
        grid_dim_y: k.shape.grid[1],
        grid_dim_z: k.shape.grid[2],
        block_dim_x: k.shape.block[0],
        block_dim_y: k.shape.block[1],
        block_dim_z: k.shape.block[2],
        shared_mem_bytes: k.shared_mem,
        kernel_params: std::ptr::null_mut(),
        extra: std::ptr::null_mut(),
    }
}

fn handles(v: &[Handle]) -> Vec<u64> {
    v.iter().map(|&x| h(x)).collect()
}

cu_export! {
    fn cuGraphCreate(g: *mut Handle, flags: u32) {
        let p = process::get()?;
        if g.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(g, hp(graph::create(p, flags)?))
    }

    fn cuGraphDestroy(g: Handle) {
        let p = process::get()?;
        graph::destroy(p, h(g))
    }

    fn cuGraphAddKernelNode(node: *mut Handle, g: Handle, deps: *const Handle, n: usize, params: *const KernelNodeParamsV1) {
        let p = process::get()?;
        let params = read(params)?;
        let deps = handles(&slice(deps, n)?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(node, hp(graph::add_kernel_node(p, h(g), &deps, launch_of(&params, std::ptr::null_mut()))?))
    }

    fn cuGraphAddKernelNode_v2(node: *mut Handle, g: Handle, deps: *const Handle, n: usize, params: *const KernelNodeParamsV2) {
        let p = process::get()?;
        let params = read(params)?;
        let deps = handles(&slice(deps, n)?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(node, hp(graph::add_kernel_node(p, h(g), &deps, launch_of(&params.v1, params.kern))?))
    }

    fn cuGraphAddEmptyNode(node: *mut Handle, g: Handle, deps: *const Handle, n: usize) {
        let p = process::get()?;
        let deps = handles(&slice(deps, n)?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(node, hp(graph::add_empty_node(p, h(g), &deps)?))
    }

    fn cuGraphGetNodes(g: Handle, nodes: *mut Handle, count: *mut usize) {
        let p = process::get()?;
        let all = graph::nodes(p, h(g))?;
        if nodes.is_null() {
            return out(count, all.len());
        }
        let cap = read(count)?;
        for (i, &n) in all.iter().take(cap).enumerate() {
            out(nodes.add(i), hp(n))?;
        }
        out(count, all.len().min(cap))
    }

    fn cuGraphNodeGetType(node: Handle, kind: *mut i32) {
        let p = process::get()?;
        out(kind, graph::node_type(p, h(node))?)
    }

    fn cuGraphKernelNodeGetParams(node: Handle, params: *mut KernelNodeParamsV1) {
        let p = process::get()?;
        out(params, params_of(graph::kernel_params(p, h(node))?))
    }

    fn cuGraphKernelNodeGetParams_v2(node: Handle, params: *mut KernelNodeParamsV2) {
        let p = process::get()?;
        out(params, KernelNodeParamsV2 {
            v1: params_of(graph::kernel_params(p, h(node))?),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        })
    }

    fn cuGraphInstantiateWithFlags(exec: *mut Handle, g: Handle, flags: c_ulonglong) {
        let p = process::get()?;
        let _ = flags;
        if exec.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(exec, hp(graph::instantiate(p, h(g))?))
    }

    /// The CUDA 11 form, with an error node and log buffer.
    fn cuGraphInstantiate_v2(exec: *mut Handle, g: Handle, error_node: *mut Handle, log: *mut c_char, log_size: usize) {
        let p = process::get()?;
        out_opt(error_node, std::ptr::null_mut());
        if !log.is_null() && log_size > 0 {
            *log = 0;
        }
        if exec.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(exec, hp(graph::instantiate(p, h(g))?))
    }

    fn cuGraphExecDestroy(exec: Handle) {
        let p = process::get()?;
        graph::exec_destroy(p, h(exec))
    }
}

super::cu_alias! {
    cuGraphInstantiate => cuGraphInstantiate_v2(exec: *mut Handle, g: Handle, error_node: *mut Handle, log: *mut c_char, log_size: usize);
}
