//! Graph launches cost the sum of their kernels' warps: counted when the
//! graph is instantiated (descending into child graphs), and kept up to
//! date when kernel nodes of the executable graph are changed or the
//! executable is updated from another graph. Conditional nodes' bodies are
//! not counted (their iteration count is only known on the GPU).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_ulonglong, c_void};

use super::launch::{cost, launch};
use super::{dispatch, hook};
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::Enforcer;

/// `CU_GRAPH_NODE_TYPE_GRAPH` (a child graph).
const NODE_CHILD_GRAPH: c_int = 1;
/// How deep child graphs are followed.
const MAX_DEPTH: u32 = 8;

/// An executable graph's launch cost.
#[derive(Clone, Debug, Default)]
pub struct GraphCost {
    /// Warps per launch: the kernel nodes as instantiated, with later
    /// changes applied.
    warps: u64,
    /// Kernel nodes changed since instantiation → their cost now.
    changed: HashMap<usize, u64>,
}

impl GraphCost {
    /// Warps per launch (at least 1).
    pub fn warps(&self) -> u64 {
        self.warps.max(1)
    }

    /// Kernel node `node`, which cost `was` warps (as instantiated, if not
    /// changed before), now costs `now`.
    fn change(&mut self, node: usize, was: Option<u64>, now: u64) {
        let before = self.changed.get(&node).copied().or(was).unwrap_or(0);
        self.warps = self.warps.saturating_sub(before).saturating_add(now);
        self.changed.insert(node, now);
    }
}

/// Warps of kernel node `node` (0 if it is not one).
fn node_cost(node: Handle) -> u64 {
    // SAFETY: KernelNodeParams is plain data; zero is a valid value.
    let mut p: KernelNodeParams = unsafe { std::mem::zeroed() };
    let mut rc = real_cuda!(cuGraphKernelNodeGetParams_v2(node, &mut p));
    if rc == CUDA_ERROR_NOT_FOUND {
        rc = real_cuda!(cuGraphKernelNodeGetParams(node, &mut p));
    }
    if rc == CUDA_SUCCESS {
        cost(p.grid, p.block)
    } else {
        0
    }
}

/// The launch cost of graph `g`: the sum over its kernel nodes, child
/// graphs included.
fn graph_cost(g: Handle, depth: u32) -> u64 {
    let mut n: usize = 0;
    if depth > MAX_DEPTH
        || real_cuda!(cuGraphGetNodes(g, std::ptr::null_mut(), &mut n)) != CUDA_SUCCESS
        || n == 0
    {
        return 0;
    }
    let mut nodes: Vec<Handle> = vec![std::ptr::null_mut(); n];
    if real_cuda!(cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n)) != CUDA_SUCCESS {
        return 0;
    }
    let mut total = 0u64;
    for &node in nodes.iter().take(n) {
        let mut kind: c_int = -1;
        if real_cuda!(cuGraphNodeGetType(node, &mut kind)) != CUDA_SUCCESS {
            continue;
        }
        let c = match kind {
            CU_GRAPH_NODE_TYPE_KERNEL => node_cost(node),
            NODE_CHILD_GRAPH => {
                let mut child: Handle = std::ptr::null_mut();
                if real_cuda!(cuGraphChildGraphNodeGetGraph(node, &mut child)) == CUDA_SUCCESS {
                    graph_cost(child, depth + 1)
                } else {
                    0
                }
            }
            _ => 0,
        };
        total = total.saturating_add(c);
    }
    total
}

/// Records the cost of a freshly instantiated graph.
///
/// # Safety
/// When `rc` is success, `exec` was written by the real call.
unsafe fn note_graph(e: &Enforcer, rc: CUresult, exec: *mut Handle, graph: Handle) -> CUresult {
    if rc == CUDA_SUCCESS && !exec.is_null() {
        // SAFETY: per the contract.
        exec_updated(e, rc, unsafe { *exec }, graph);
    }
    rc
}

/// `exec` now runs the kernels of `graph`.
fn exec_updated(e: &Enforcer, rc: CUresult, exec: Handle, graph: Handle) {
    if rc == CUDA_SUCCESS {
        let cost = GraphCost {
            warps: graph_cost(graph, 0),
            changed: HashMap::new(),
        };
        e.books().graphs.insert(exec as usize, cost);
    }
}

fn graph_launch(e: &Enforcer, exec: Handle, real: impl FnOnce() -> CUresult) -> CUresult {
    let warps = e
        .books()
        .graphs
        .get(&(exec as usize))
        .map_or(1, GraphCost::warps);
    launch(e, warps, real)
}

/// A kernel node of `exec` was given new parameters.
///
/// # Safety
/// `params` is NULL or points to kernel node parameters, either version:
/// only the grid and block, common to both layouts, are read.
unsafe fn node_changed(
    e: &Enforcer,
    rc: CUresult,
    exec: Handle,
    node: Handle,
    params: *const KernelNodeParams,
) {
    if rc != CUDA_SUCCESS || params.is_null() {
        return;
    }
    // SAFETY: per the contract; the fields lie within the v1 layout too.
    let (grid, block) = unsafe { ((*params).grid, (*params).block) };
    let now = cost(grid, block);
    let seen = e
        .books()
        .graphs
        .get(&(exec as usize))
        .map(|g| g.changed.contains_key(&(node as usize)));
    // The cost as instantiated, asked of the driver (outside the books'
    // lock) the first time the node changes.
    let was = match seen {
        None => return,
        Some(true) => None,
        Some(false) => Some(node_cost(node)),
    };
    if let Some(g) = e.books().graphs.get_mut(&(exec as usize)) {
        g.change(node as usize, was, now);
    }
}

hook! {
    fn cuGraphInstantiateWithFlags(exec: *mut Handle, graph: Handle, flags: c_ulonglong) {
        dispatch(
            || real_cuda!(cuGraphInstantiateWithFlags(exec, graph, flags)),
            |e| {
                let rc = real_cuda!(cuGraphInstantiateWithFlags(exec, graph, flags));
                // SAFETY: exec is the call's output argument (valid per the
                // caller's contract); the real call wrote it if rc is success.
                unsafe { note_graph(e, rc, exec, graph) }
            },
        )
    }

    fn cuGraphInstantiate_v2(exec: *mut Handle, graph: Handle, err: *mut Handle, log: *mut c_char, size: usize) {
        dispatch(
            || real_cuda!(cuGraphInstantiate_v2(exec, graph, err, log, size)),
            |e| {
                let rc = real_cuda!(cuGraphInstantiate_v2(exec, graph, err, log, size));
                // SAFETY: exec is the call's output argument (valid per the
                // caller's contract); the real call wrote it if rc is success.
                unsafe { note_graph(e, rc, exec, graph) }
            },
        )
    }

    fn cuGraphInstantiateWithParams(exec: *mut Handle, graph: Handle, params: *mut c_void) {
        dispatch(
            || real_cuda!(cuGraphInstantiateWithParams(exec, graph, params)),
            |e| {
                let rc = real_cuda!(cuGraphInstantiateWithParams(exec, graph, params));
                // SAFETY: exec is the call's output argument (valid per the
                // caller's contract); the real call wrote it if rc is success.
                unsafe { note_graph(e, rc, exec, graph) }
            },
        )
    }

    fn cuGraphInstantiateWithParams_ptsz(exec: *mut Handle, graph: Handle, params: *mut c_void) {
        dispatch(
            || real_cuda!(cuGraphInstantiateWithParams_ptsz(exec, graph, params)),
            |e| {
                let rc = real_cuda!(cuGraphInstantiateWithParams_ptsz(exec, graph, params));
                // SAFETY: exec is the call's output argument (valid per the
                // caller's contract); the real call wrote it if rc is success.
                unsafe { note_graph(e, rc, exec, graph) }
            },
        )
    }

    fn cuGraphExecKernelNodeSetParams(exec: Handle, node: Handle, params: *const KernelNodeParams) {
        dispatch(
            || real_cuda!(cuGraphExecKernelNodeSetParams(exec, node, params)),
            |e| {
                let rc = real_cuda!(cuGraphExecKernelNodeSetParams(exec, node, params));
                // SAFETY: the caller's contract: params is NULL or points
                // to kernel node parameters.
                unsafe { node_changed(e, rc, exec, node, params) };
                rc
            },
        )
    }

    fn cuGraphExecKernelNodeSetParams_v2(exec: Handle, node: Handle, params: *const KernelNodeParams) {
        dispatch(
            || real_cuda!(cuGraphExecKernelNodeSetParams_v2(exec, node, params)),
            |e| {
                let rc = real_cuda!(cuGraphExecKernelNodeSetParams_v2(exec, node, params));
                // SAFETY: the caller's contract: params is NULL or points
                // to kernel node parameters.
                unsafe { node_changed(e, rc, exec, node, params) };
                rc
            },
        )
    }

    fn cuGraphExecUpdate_v2(exec: Handle, graph: Handle, info: *mut c_void) {
        dispatch(
            || real_cuda!(cuGraphExecUpdate_v2(exec, graph, info)),
            |e| {
                let rc = real_cuda!(cuGraphExecUpdate_v2(exec, graph, info));
                exec_updated(e, rc, exec, graph);
                rc
            },
        )
    }

    fn cuGraphExecUpdate(exec: Handle, graph: Handle, error_node: *mut Handle, result: *mut c_int) {
        dispatch(
            || real_cuda!(cuGraphExecUpdate(exec, graph, error_node, result)),
            |e| {
                let rc = real_cuda!(cuGraphExecUpdate(exec, graph, error_node, result));
                exec_updated(e, rc, exec, graph);
                rc
            },
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
