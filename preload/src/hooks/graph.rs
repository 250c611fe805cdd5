//! Graph launches cost the sum of their kernels' warps: counted when the
//! graph is instantiated (descending into child graphs), and kept up to
//! date when kernel or child-graph nodes of the executable graph are
//! changed or the executable is updated from another graph. Conditional
//! nodes' bodies are not counted (their iteration count is only known on
//! the GPU). Each kernel costs at least the GPU's launch floor as it was
//! when the executable was instantiated or last updated from a graph
//! (the floor is a property of the GPU the agent sets once; a graph
//! instantiated before the agent first set it keeps the lower cost until
//! it is updated or instantiated again).
//!
//! Graph memory nodes (`cuGraphAddMemAllocNode`, or `cuGraphAddNode` of a
//! memory-allocation node) allocate when the graph runs, outside any hook:
//! they are refused with `CUDA_ERROR_NOT_SUPPORTED` under limits.
//!
//! Parameters the cost is taken from are copied first and the copy is
//! what the driver gets, so another thread rewriting the caller's
//! structure cannot make the driver run something other than what was
//! charged (or slip a memory node past the check).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_ulonglong, c_void};

use super::launch::{cost, launch, launch_floor};
use super::{alias, dispatch, hook, refused_when_limited};
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::Enforcer;

/// How deep child graphs are followed.
const MAX_DEPTH: u32 = 8;

/// An executable graph's launch cost.
#[derive(Clone, Debug, Default)]
pub struct GraphCost {
    /// Warps per launch: the sum of `nodes`, plus what changed nodes not
    /// known at instantiation were charged (see [`GraphCost::change`]).
    warps: u64,
    /// Cost now of each kernel and child-graph node of the graph it was
    /// instantiated from, and of nodes changed since.
    nodes: HashMap<usize, u64>,
    /// The launch floor its kernels were charged at.
    floor: u64,
}

impl GraphCost {
    /// Warps per launch (at least 1).
    pub fn warps(&self) -> u64 {
        self.warps.max(1)
    }

    /// Node `node` now costs `now` warps. A node not known (one inside a
    /// child graph, say) is taken to have cost nothing before: the graph
    /// may be overcharged, never undercharged.
    fn change(&mut self, node: usize, now: u64) {
        let before = self.nodes.insert(node, now).unwrap_or(0);
        self.warps = self.warps.saturating_sub(before).saturating_add(now);
    }
}

/// Warps charged for a kernel node with these parameters under launch
/// floor `floor`.
fn params_cost(p: &KernelNodeParamsV1, floor: u64) -> u64 {
    cost(
        [p.grid_dim_x, p.grid_dim_y, p.grid_dim_z],
        [p.block_dim_x, p.block_dim_y, p.block_dim_z],
    )
    .max(floor)
}

/// Warps charged for kernel node `node` (0 if it is not one).
fn kernel_cost(node: Handle, floor: u64) -> u64 {
    // SAFETY: KernelNodeParams is plain data; zero is a valid value.
    let mut p: KernelNodeParams = unsafe { std::mem::zeroed() };
    let mut rc = real_cuda!(cuGraphKernelNodeGetParams_v2(node, &mut p));
    if rc == CUDA_ERROR_NOT_FOUND {
        rc = real_cuda!(cuGraphKernelNodeGetParams(node, &mut p));
    }
    if rc == CUDA_SUCCESS {
        params_cost(&p.v1, floor)
    } else {
        0
    }
}

/// Warps charged for node `node`: a kernel's, or a child graph's
/// kernels'.
fn node_cost(node: Handle, depth: u32, floor: u64) -> u64 {
    let mut kind: c_int = -1;
    if real_cuda!(cuGraphNodeGetType(node, &mut kind)) != CUDA_SUCCESS {
        return 0;
    }
    match kind {
        CU_GRAPH_NODE_TYPE_KERNEL => kernel_cost(node, floor),
        CU_GRAPH_NODE_TYPE_GRAPH => {
            let mut child: Handle = std::ptr::null_mut();
            if real_cuda!(cuGraphChildGraphNodeGetGraph(node, &mut child)) == CUDA_SUCCESS {
                graph_cost(child, depth + 1, None, floor)
            } else {
                0
            }
        }
        _ => 0,
    }
}

/// The launch cost of graph `g` under launch floor `floor`: the sum over
/// its kernel nodes, child graphs included. `record` receives each node's
/// cost.
fn graph_cost(
    g: Handle,
    depth: u32,
    mut record: Option<&mut HashMap<usize, u64>>,
    floor: u64,
) -> u64 {
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
        let c = node_cost(node, depth, floor);
        if c > 0
            && let Some(r) = record.as_deref_mut()
        {
            r.insert(node as usize, c);
        }
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
        let floor = launch_floor(e);
        let mut nodes = HashMap::new();
        let warps = graph_cost(graph, 0, Some(&mut nodes), floor);
        e.books().graphs.insert(
            exec as usize,
            GraphCost {
                warps,
                nodes,
                floor,
            },
        );
    }
}

fn graph_launch(e: &'static Enforcer, exec: Handle, real: impl FnOnce() -> CUresult) -> CUresult {
    let warps = e
        .books()
        .graphs
        .get(&(exec as usize))
        .map_or(1, GraphCost::warps);
    launch(e, warps, real)
}

/// Node `node` of `exec` now costs `now(floor)` warps, `floor` being the
/// launch floor `exec` is charged at (if the change succeeded).
fn node_changed(
    e: &Enforcer,
    rc: CUresult,
    exec: Handle,
    node: Handle,
    now: impl FnOnce(u64) -> u64,
) {
    if rc != CUDA_SUCCESS {
        return;
    }
    // (Not under the books' lock: `now` may call the driver.)
    let Some(floor) = e.books().graphs.get(&(exec as usize)).map(|g| g.floor) else {
        return;
    };
    let now = now(floor);
    if let Some(g) = e.books().graphs.get_mut(&(exec as usize)) {
        g.change(node as usize, now);
    }
}

/// Copies `*p` (NULL: `None`).
///
/// # Safety
/// `p` is NULL or points to a readable `T`.
unsafe fn copied<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { p.read_unaligned() })
}

/// `cuGraphAddNode[_v2]`: refuses memory-allocation nodes, otherwise
/// adds the node from a private copy of the parameters (written back on
/// success, for the outputs some node types have). Kernel and child-graph
/// nodes are counted when the graph is instantiated.
///
/// # Safety
/// `params` is NULL or points to a `CUgraphNodeParams` valid for reading
/// and writing.
unsafe fn add_node(
    params: *mut GraphNodeParams,
    real: impl FnOnce(*mut GraphNodeParams) -> CUresult,
) -> CUresult {
    // SAFETY: per the contract.
    let Some(mut own) = (unsafe { copied(params) }) else {
        return real(params);
    };
    if own.kind == CU_GRAPH_NODE_TYPE_MEM_ALLOC {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    let rc = real(&mut own);
    if rc == CUDA_SUCCESS {
        // SAFETY: per the contract.
        unsafe { params.write_unaligned(own) };
    }
    rc
}

/// `cuGraphExecNodeSetParams`: the new cost of a kernel or child-graph
/// node, from a private copy of the parameters the driver gets.
///
/// # Safety
/// `params` is NULL or points to a readable `CUgraphNodeParams`.
unsafe fn exec_set_node(
    e: &Enforcer,
    exec: Handle,
    node: Handle,
    params: *mut GraphNodeParams,
) -> CUresult {
    // SAFETY: per the contract.
    let Some(mut own) = (unsafe { copied(params) }) else {
        return real_cuda!(cuGraphExecNodeSetParams(exec, node, params));
    };
    if own.kind == CU_GRAPH_NODE_TYPE_MEM_ALLOC {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    let rc = real_cuda!(cuGraphExecNodeSetParams(exec, node, &mut own));
    match own.kind {
        CU_GRAPH_NODE_TYPE_KERNEL => {
            // SAFETY: the type says the kernel member is the one set.
            let k = unsafe { own.body.kernel };
            node_changed(e, rc, exec, node, |floor| params_cost(&k.v1, floor));
        }
        CU_GRAPH_NODE_TYPE_GRAPH => {
            // SAFETY: the type says the graph member is the one set.
            let child = unsafe { own.body.graph };
            node_changed(e, rc, exec, node, |floor| graph_cost(child, 1, None, floor));
        }
        _ => {}
    }
    rc
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

    fn cuGraphExecKernelNodeSetParams(exec: Handle, node: Handle, params: *const KernelNodeParamsV1) {
        dispatch(
            || real_cuda!(cuGraphExecKernelNodeSetParams(exec, node, params)),
            |e| {
                // SAFETY: the caller's contract: params is NULL or points to
                // kernel node parameters.
                let Some(own) = (unsafe { copied(params) }) else {
                    return real_cuda!(cuGraphExecKernelNodeSetParams(exec, node, params));
                };
                let rc = real_cuda!(cuGraphExecKernelNodeSetParams(exec, node, &own));
                node_changed(e, rc, exec, node, |floor| params_cost(&own, floor));
                rc
            },
        )
    }

    fn cuGraphExecKernelNodeSetParams_v2(exec: Handle, node: Handle, params: *const KernelNodeParams) {
        dispatch(
            || real_cuda!(cuGraphExecKernelNodeSetParams_v2(exec, node, params)),
            |e| {
                // SAFETY: the caller's contract: params is NULL or points to
                // kernel node parameters.
                let Some(own) = (unsafe { copied(params) }) else {
                    return real_cuda!(cuGraphExecKernelNodeSetParams_v2(exec, node, params));
                };
                let rc = real_cuda!(cuGraphExecKernelNodeSetParams_v2(exec, node, &own));
                node_changed(e, rc, exec, node, |floor| params_cost(&own.v1, floor));
                rc
            },
        )
    }

    fn cuGraphExecChildGraphNodeSetParams(exec: Handle, node: Handle, child: Handle) {
        dispatch(
            || real_cuda!(cuGraphExecChildGraphNodeSetParams(exec, node, child)),
            |e| {
                let rc = real_cuda!(cuGraphExecChildGraphNodeSetParams(exec, node, child));
                node_changed(e, rc, exec, node, |floor| graph_cost(child, 1, None, floor));
                rc
            },
        )
    }

    fn cuGraphExecNodeSetParams(exec: Handle, node: Handle, params: *mut GraphNodeParams) {
        dispatch(
            || real_cuda!(cuGraphExecNodeSetParams(exec, node, params)),
            // SAFETY: the caller's contract: params is NULL or points to a
            // CUgraphNodeParams.
            |e| unsafe { exec_set_node(e, exec, node, params) },
        )
    }

    fn cuGraphAddNode(node: *mut Handle, graph: Handle, deps: *const Handle, n: usize, params: *mut GraphNodeParams) {
        dispatch(
            || real_cuda!(cuGraphAddNode(node, graph, deps, n, params)),
            |_| {
                let call = |p| real_cuda!(cuGraphAddNode(node, graph, deps, n, p));
                // SAFETY: the caller's contract: params is NULL or points to
                // a CUgraphNodeParams the driver may write outputs into.
                unsafe { add_node(params, call) }
            },
        )
    }

    fn cuGraphAddNode_v2(node: *mut Handle, graph: Handle, deps: *const Handle, edges: *const c_void, n: usize, params: *mut GraphNodeParams) {
        dispatch(
            || real_cuda!(cuGraphAddNode_v2(node, graph, deps, edges, n, params)),
            |_| {
                let call = |p| real_cuda!(cuGraphAddNode_v2(node, graph, deps, edges, n, p));
                // SAFETY: the caller's contract: params is NULL or points to
                // a CUgraphNodeParams the driver may write outputs into.
                unsafe { add_node(params, call) }
            },
        )
    }

    /// Graph memory nodes allocate when the graph runs, outside any hook:
    /// refused.
    fn cuGraphAddMemAllocNode(node: *mut Handle, graph: Handle, deps: *const Handle, n: usize, params: *mut c_void) {
        refused_when_limited(|| real_cuda!(cuGraphAddMemAllocNode(node, graph, deps, n, params)))
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

// The CUDA 10 symbol (programs built against CUDA 10 headers link it).
alias! {
    cuGraphInstantiate => cuGraphInstantiate_v2(exec: *mut Handle, graph: Handle, err: *mut Handle, log: *mut c_char, size: usize);
}
