//! Graph construction and instantiation.

use std::ffi::{c_char, c_ulonglong, c_void};

use gpusim::cost::LaunchShape;

use super::ptr::{cstr, out, out_opt, read, slice};
use super::{Code, cu_export, h, hp};
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
        let v = hp(graph::create(p, flags)?);
        // SAFETY: the caller's contract: `g` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(g, v) }
    }

    fn cuGraphDestroy(g: Handle) {
        let p = process::get()?;
        graph::destroy(p, h(g))
    }

    /// `cuGraphDebugDotPrint`: the graph in DOT (see `graph::debug_dot`)
    /// written to `path`; flag bit 0 (`CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE`)
    /// adds launch shapes and addresses.
    fn cuGraphDebugDotPrint(g: Handle, path: *const c_char, flags: u32) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `path` is NULL or a NUL-terminated
        // string; `cstr` rejects NULL.
        let path = unsafe { cstr(path) }?;
        let dot = graph::debug_dot(p, h(g), flags & 1 != 0)?;
        std::fs::write(path, dot).map_err(|_| CUDA_ERROR_OPERATING_SYSTEM)
    }

    fn cuGraphAddKernelNode(node: *mut Handle, g: Handle, deps: *const Handle, n: usize, params: *const KernelNodeParamsV1) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // readable `KernelNodeParamsV1`; `read` rejects NULL.
        let params = unsafe { read(params) }?;
        // SAFETY: the caller's contract: `deps` is NULL or points to `n`
        // readable `Handle`s; `slice` rejects NULL unless `n` is 0.
        let deps = handles(&unsafe { slice(deps, n) }?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(graph::add_kernel_node(p, h(g), &deps, launch_of(&params, std::ptr::null_mut()))?);
        // SAFETY: the caller's contract: `node` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(node, v) }
    }

    fn cuGraphAddKernelNode_v2(node: *mut Handle, g: Handle, deps: *const Handle, n: usize, params: *const KernelNodeParamsV2) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // readable `KernelNodeParamsV2`; `read` rejects NULL.
        let params = unsafe { read(params) }?;
        // SAFETY: the caller's contract: `deps` is NULL or points to `n`
        // readable `Handle`s; `slice` rejects NULL unless `n` is 0.
        let deps = handles(&unsafe { slice(deps, n) }?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(graph::add_kernel_node(p, h(g), &deps, launch_of(&params.v1, params.kern))?);
        // SAFETY: the caller's contract: `node` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(node, v) }
    }

    fn cuGraphAddEmptyNode(node: *mut Handle, g: Handle, deps: *const Handle, n: usize) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `deps` is NULL or points to `n`
        // readable `Handle`s; `slice` rejects NULL unless `n` is 0.
        let deps = handles(&unsafe { slice(deps, n) }?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(graph::add_empty_node(p, h(g), &deps)?);
        // SAFETY: the caller's contract: `node` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(node, v) }
    }

    fn cuGraphGetNodes(g: Handle, nodes: *mut Handle, count: *mut usize) {
        let p = process::get()?;
        let all = graph::nodes(p, h(g))?;
        if nodes.is_null() {
            // SAFETY: the caller's contract: `count` is NULL or points to a
            // writable `usize`; `out` rejects NULL.
            return unsafe { out(count, all.len()) };
        }
        // SAFETY: the caller's contract: `count` is NULL or points to a
        // readable `usize`; `read` rejects NULL.
        let cap = unsafe { read(count) }?;
        for (i, &n) in all.iter().take(cap).enumerate() {
            let slot = nodes.wrapping_add(i);
            // SAFETY: the caller's contract: `nodes` points to room for
            // `*count` (read into `cap`) handles and `i < cap`, so `slot` is
            // a writable `Handle` inside it; `out` rejects NULL.
            unsafe { out(slot, hp(n)) }?;
        }
        // SAFETY: the caller's contract: `count` is NULL or points to a
        // writable `usize`; `out` rejects NULL.
        unsafe { out(count, all.len().min(cap)) }
    }

    fn cuGraphNodeGetType(node: Handle, kind: *mut i32) {
        let p = process::get()?;
        let v = graph::node_type(p, h(node))?;
        // SAFETY: the caller's contract: `kind` is NULL or points to a writable
        // `i32`; `out` rejects NULL.
        unsafe { out(kind, v) }
    }

    fn cuGraphKernelNodeGetParams(node: Handle, params: *mut KernelNodeParamsV1) {
        let p = process::get()?;
        let v = params_of(graph::kernel_params(p, h(node))?);
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // writable `KernelNodeParamsV1`; `out` rejects NULL.
        unsafe { out(params, v) }
    }

    fn cuGraphKernelNodeGetParams_v2(node: Handle, params: *mut KernelNodeParamsV2) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // writable `KernelNodeParamsV2`; `out` rejects NULL.
        unsafe { out(params, KernelNodeParamsV2 {
            v1: params_of(graph::kernel_params(p, h(node))?),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }) }
    }

    fn cuGraphInstantiateWithFlags(exec: *mut Handle, g: Handle, flags: c_ulonglong) {
        let p = process::get()?;
        let _ = flags;
        if exec.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(graph::instantiate(p, h(g))?);
        // SAFETY: the caller's contract: `exec` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(exec, v) }
    }

    /// The CUDA 11 form, with an error node and log buffer.
    fn cuGraphInstantiate_v2(exec: *mut Handle, g: Handle, error_node: *mut Handle, log: *mut c_char, log_size: usize) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `error_node` is NULL or points to a
        // writable `Handle`; `out_opt` skips NULL.
        unsafe { out_opt(error_node, std::ptr::null_mut()) };
        if !log.is_null() && log_size > 0 {
            // SAFETY: the caller's contract: `log` is NULL or valid for
            // writing `log_size` bytes; checked non-NULL with room for one.
            unsafe { *log = 0 };
        }
        if exec.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(graph::instantiate(p, h(g))?);
        // SAFETY: the caller's contract: `exec` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(exec, v) }
    }

    fn cuGraphExecDestroy(exec: Handle) {
        let p = process::get()?;
        graph::exec_destroy(p, h(exec))
    }

    fn cuGraphAddChildGraphNode(node: *mut Handle, g: Handle, deps: *const Handle, n: usize, child: Handle) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `deps` is NULL or points to `n`
        // readable `Handle`s; `slice` rejects NULL unless `n` is 0.
        let deps = handles(&unsafe { slice(deps, n) }?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(graph::add_child_node(p, h(g), &deps, h(child))?);
        // SAFETY: the caller's contract: `node` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(node, v) }
    }

    fn cuGraphChildGraphNodeGetGraph(node: Handle, child: *mut Handle) {
        let p = process::get()?;
        let v = hp(graph::child_graph(p, h(node))?);
        // SAFETY: the caller's contract: `child` is NULL or points to a
        // writable `Handle`; `out` rejects NULL.
        unsafe { out(child, v) }
    }

    fn cuGraphAddMemAllocNode(node: *mut Handle, g: Handle, deps: *const Handle, n: usize, params: *mut MemAllocNodeParams) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // readable `MemAllocNodeParams`; `read` rejects NULL.
        let mut prm = unsafe { read(params) }?;
        // SAFETY: the caller's contract: `deps` is NULL or points to `n`
        // readable `Handle`s; `slice` rejects NULL unless `n` is 0.
        let deps = handles(&unsafe { slice(deps, n) }?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (made, dptr) = add_mem_alloc(p, h(g), &deps, &prm)?;
        prm.dptr = dptr;
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // writable `MemAllocNodeParams`; `out` rejects NULL.
        unsafe { out(params, prm) }?;
        // SAFETY: the caller's contract: `node` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(node, hp(made)) }
    }

    fn cuGraphAddMemFreeNode(node: *mut Handle, g: Handle, deps: *const Handle, n: usize, dptr: CUdeviceptr) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `deps` is NULL or points to `n`
        // readable `Handle`s; `slice` rejects NULL unless `n` is 0.
        let deps = handles(&unsafe { slice(deps, n) }?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(graph::add_mem_free_node(p, h(g), &deps, dptr)?);
        // SAFETY: the caller's contract: `node` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(node, v) }
    }

    /// CUDA 12.2: any node type from one parameter structure.
    fn cuGraphAddNode(node: *mut Handle, g: Handle, deps: *const Handle, n: usize, params: *mut GraphNodeParams) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `deps` is NULL or points to `n`
        // readable `Handle`s; `slice` rejects NULL unless `n` is 0.
        let deps = handles(&unsafe { slice(deps, n) }?);
        if node.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // readable and writable `GraphNodeParams`, as `add_node` requires.
        let v = hp(unsafe { add_node(p, h(g), &deps, params) }?);
        // SAFETY: the caller's contract: `node` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(node, v) }
    }

    /// CUDA 12.3: [`cuGraphAddNode`] with per-edge data (only the default
    /// edges are modelled: the data is ignored).
    fn cuGraphAddNode_v2(node: *mut Handle, g: Handle, deps: *const Handle, edges: *const c_void, n: usize, params: *mut GraphNodeParams) {
        let _ = edges;
        // SAFETY: the caller's contract for `node`, `deps` (`n` handles) and
        // `params` is that of cuGraphAddNode, which takes the same pointers.
        unsafe { cuGraphAddNode(node, g, deps, n, params) }.ok()
    }

    /// The CUDA 12 form, with the options in a structure.
    fn cuGraphInstantiateWithParams(exec: *mut Handle, g: Handle, params: *mut GraphInstantiateParams) {
        let p = process::get()?;
        if exec.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let made = graph::instantiate(p, h(g));
        if !params.is_null() {
            // SAFETY: the caller's contract: `params` is NULL or points to a
            // readable `GraphInstantiateParams`; `read` rejects NULL.
            let mut prm = unsafe { read(params) }?;
            prm.err_node_out = std::ptr::null_mut();
            // CUDA_GRAPH_INSTANTIATE_SUCCESS / _ERROR.
            prm.result_out = i32::from(made.is_err());
            // SAFETY: the caller's contract: `params` is NULL or points to a
            // writable `GraphInstantiateParams`; `out` rejects NULL.
            unsafe { out(params, prm) }?;
        }
        let v = hp(made?);
        // SAFETY: the caller's contract: `exec` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(exec, v) }
    }

    fn cuGraphExecKernelNodeSetParams(exec: Handle, node: Handle, params: *const KernelNodeParamsV1) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // readable `KernelNodeParamsV1`; `read` rejects NULL.
        let prm = unsafe { read(params) }?;
        graph::exec_set_kernel(p, h(exec), h(node), launch_of(&prm, std::ptr::null_mut()))
    }

    fn cuGraphExecKernelNodeSetParams_v2(exec: Handle, node: Handle, params: *const KernelNodeParamsV2) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // readable `KernelNodeParamsV2`; `read` rejects NULL.
        let prm = unsafe { read(params) }?;
        graph::exec_set_kernel(p, h(exec), h(node), launch_of(&prm.v1, prm.kern))
    }

    fn cuGraphExecChildGraphNodeSetParams(exec: Handle, node: Handle, child: Handle) {
        let p = process::get()?;
        graph::exec_set_child(p, h(exec), h(node), h(child))
    }

    /// CUDA 12.2: kernel and child-graph nodes (other types: not
    /// supported by the simulator; memory nodes: not by the driver either).
    fn cuGraphExecNodeSetParams(exec: Handle, node: Handle, params: *mut GraphNodeParams) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `params` is NULL or points to a
        // readable `GraphNodeParams`; `read` rejects NULL.
        let prm = unsafe { read(params) }?;
        match prm.kind {
            CU_GRAPH_NODE_TYPE_KERNEL => {
                // SAFETY: the caller's contract: `body` holds the member
                // that `kind` names, here the kernel parameters.
                let k = unsafe { prm.body.kernel };
                graph::exec_set_kernel(p, h(exec), h(node), launch_of(&k.v1, k.kern))
            }
            CU_GRAPH_NODE_TYPE_GRAPH => {
                // SAFETY: the caller's contract: `body` holds the member
                // that `kind` names, here the child graph.
                let child = unsafe { prm.body.graph };
                graph::exec_set_child(p, h(exec), h(node), h(child))
            }
            _ => Err(CUDA_ERROR_NOT_SUPPORTED),
        }
    }

    /// The CUDA 10.2 form: the failing node and a result code.
    fn cuGraphExecUpdate(exec: Handle, g: Handle, error_node: *mut Handle, result: *mut i32) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `error_node` is NULL or points to a
        // writable `Handle`; `out_opt` skips NULL.
        unsafe { out_opt(error_node, std::ptr::null_mut()) };
        let r = graph::exec_update(p, h(exec), h(g));
        // CU_GRAPH_EXEC_UPDATE_SUCCESS / _ERROR.
        // SAFETY: the caller's contract: `result` is NULL or points to a
        // writable `i32`; `out_opt` skips NULL.
        unsafe { out_opt(result, i32::from(r.is_err())) };
        r
    }

    /// The CUDA 12 form: `CUgraphExecUpdateResultInfo` (result, error node,
    /// error-from node).
    fn cuGraphExecUpdate_v2(exec: Handle, g: Handle, info: *mut UpdateResultInfo) {
        let p = process::get()?;
        let r = graph::exec_update(p, h(exec), h(g));
        // SAFETY: the caller's contract: `info` is NULL or points to a writable
        // `UpdateResultInfo`; `out_opt` skips NULL.
        unsafe { out_opt(info, UpdateResultInfo {
            result: i32::from(r.is_err()),
            error_node: std::ptr::null_mut(),
            error_from_node: std::ptr::null_mut(),
        }) };
        r
    }
}

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UpdateResultInfo {
    /// `CUgraphExecUpdateResult`.
    pub result: i32,
    /// The node that made the update fail.
    pub error_node: Handle,
    /// Its counterpart in the executable.
    pub error_from_node: Handle,
}

/// A memory node of `prm`'s size on its device.
fn add_mem_alloc(
    p: &process::Process,
    g: u64,
    deps: &[u64],
    prm: &MemAllocNodeParams,
) -> Result<(u64, u64), CUresult> {
    if prm.pool_props.location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    graph::add_mem_alloc_node(p, g, deps, prm.bytesize as u64, prm.pool_props.location.id)
}

/// `cuGraphAddNode` by type: kernel, empty, child graph and memory nodes.
///
/// # Safety
/// `params` is NULL or points to a `CUgraphNodeParams` (written back for
/// memory nodes, whose address is an output).
unsafe fn add_node(
    p: &process::Process,
    g: u64,
    deps: &[u64],
    params: *mut GraphNodeParams,
) -> Result<u64, CUresult> {
    // SAFETY: per the contract.
    let mut prm = unsafe { read(params) }?;
    match prm.kind {
        CU_GRAPH_NODE_TYPE_KERNEL => {
            // SAFETY: the type says the kernel member is the one set.
            let k = unsafe { prm.body.kernel };
            graph::add_kernel_node(p, g, deps, launch_of(&k.v1, k.kern))
        }
        CU_GRAPH_NODE_TYPE_EMPTY => graph::add_empty_node(p, g, deps),
        CU_GRAPH_NODE_TYPE_GRAPH => {
            // SAFETY: the type says the graph member is the one set.
            let child = unsafe { prm.body.graph };
            graph::add_child_node(p, g, deps, h(child))
        }
        CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
            // SAFETY: the type says the alloc member is the one set.
            let mut a = unsafe { prm.body.alloc };
            let (node, dptr) = add_mem_alloc(p, g, deps, &a)?;
            a.dptr = dptr;
            prm.body.alloc = a;
            // SAFETY: per the contract (the read succeeded: not NULL).
            unsafe { out(params, prm) }?;
            Ok(node)
        }
        CU_GRAPH_NODE_TYPE_MEM_FREE => {
            // SAFETY: the type says the free member is the one set.
            let dptr = unsafe { prm.body.free };
            graph::add_mem_free_node(p, g, deps, dptr)
        }
        _ => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

super::cu_alias! {
    cuGraphInstantiate => cuGraphInstantiate_v2(exec: *mut Handle, g: Handle, error_node: *mut Handle, log: *mut c_char, log_size: usize);
    cuGraphInstantiateWithParams_ptsz => cuGraphInstantiateWithParams(exec: *mut Handle, g: Handle, params: *mut GraphInstantiateParams);
}
