//! CUDA graphs: kernel, empty, child-graph, memory and (captured) host nodes,
//! instantiation, executable updates and launch.
//!
//! Nodes run in insertion order (which respects dependencies, since a node
//! can only depend on nodes that already exist). An executable graph keeps,
//! per top-level node, the steps it runs (child graphs flattened), so
//! changing one node of the executable replaces exactly that node's steps.
//! Graph memory nodes reserve an address when made; the memory is charged
//! when a launch reaches the node and stays until a free node, or
//! `cuMemFree[Async]`, gives it back, as the driver does.

use crate::abi::{
    CU_GRAPH_NODE_TYPE_EMPTY, CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_NODE_TYPE_KERNEL,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_GRAPH_NODE_TYPE_MEM_FREE,
};
use crate::process::{
    Graph, GraphExec, GraphNode, Inner, KernelLaunch, NodeKind, NodeSteps, Process, Step,
};
use crate::status::*;

/// `CU_GRAPH_NODE_TYPE_HOST`.
const CU_GRAPH_NODE_TYPE_HOST: i32 = 3;

/// How deep child graphs may nest.
const MAX_DEPTH: u32 = 16;

/// `cuGraphCreate`.
pub fn create(p: &Process, flags: u32) -> Result<u64, CUresult> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(p.lock().graphs.insert(Graph::default()))
}

/// Removes graph `g`, its nodes and the child graphs they own.
fn remove_graph(inner: &mut Inner, g: u64) -> Result<(), CUresult> {
    let graph = inner.graphs.remove(g)?;
    for n in graph.nodes {
        if let Ok(node) = inner.nodes.remove(n)
            && let NodeKind::Child(c) = node.kind
        {
            let _ = remove_graph(inner, c);
        }
    }
    Ok(())
}

/// `cuGraphDestroy`.
pub fn destroy(p: &Process, g: u64) -> Result<(), CUresult> {
    remove_graph(&mut p.lock(), g)
}

/// Destroys graph `g` under the caller's lock.
pub fn destroy_in(inner: &mut Inner, g: u64) -> Result<(), CUresult> {
    remove_graph(inner, g)
}

fn check_deps(inner: &Inner, g: u64, deps: &[u64]) -> Result<(), CUresult> {
    for &d in deps {
        if inner.nodes.get(d)?.graph != g {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    Ok(())
}

fn insert_node(inner: &mut Inner, g: u64, kind: NodeKind) -> Result<u64, CUresult> {
    inner.graphs.get(g)?;
    let n = inner.nodes.insert(GraphNode { graph: g, kind });
    inner.graphs.get_mut(g)?.nodes.push(n);
    Ok(n)
}

/// Checks a kernel launch and resolves its function (a `CUkernel` becomes
/// its function).
fn resolve_kernel(inner: &Inner, k: KernelLaunch) -> Result<KernelLaunch, CUresult> {
    crate::launch::check_shape(&k.shape)?;
    let function = crate::module::resolve(inner, k.function)?;
    Ok(KernelLaunch { function, ..k })
}

/// Adds a kernel node to graph `g` (stream capture).
pub fn add_kernel(inner: &mut Inner, g: u64, k: KernelLaunch) -> Result<u64, CUresult> {
    let k = resolve_kernel(inner, k)?;
    insert_node(inner, g, NodeKind::Kernel(k))
}

/// `cuGraphAddKernelNode`.
pub fn add_kernel_node(
    p: &Process,
    g: u64,
    deps: &[u64],
    k: KernelLaunch,
) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    check_deps(&inner, g, deps)?;
    add_kernel(&mut inner, g, k)
}

/// `cuGraphAddEmptyNode`.
pub fn add_empty_node(p: &Process, g: u64, deps: &[u64]) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    check_deps(&inner, g, deps)?;
    insert_node(&mut inner, g, NodeKind::Empty)
}

/// A copy of graph `g` (child graphs copied too).
fn clone_graph(inner: &mut Inner, g: u64, depth: u32) -> Result<u64, CUresult> {
    if depth > MAX_DEPTH {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let nodes = inner.graphs.get(g)?.nodes.clone();
    let copy = inner.graphs.insert(Graph::default());
    for n in nodes {
        let kind = match inner.nodes.get(n)?.kind {
            NodeKind::Child(c) => NodeKind::Child(clone_graph(inner, c, depth + 1)?),
            NodeKind::MemAlloc { .. } | NodeKind::MemFree(_) => {
                // The driver refuses memory nodes in child graphs too.
                let _ = remove_graph(inner, copy);
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
            k => k,
        };
        insert_node(inner, copy, kind)?;
    }
    Ok(copy)
}

/// `cuGraphAddChildGraphNode`: the node owns a copy of `child`.
pub fn add_child_node(p: &Process, g: u64, deps: &[u64], child: u64) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    check_deps(&inner, g, deps)?;
    inner.graphs.get(g)?;
    let copy = clone_graph(&mut inner, child, 0)?;
    insert_node(&mut inner, g, NodeKind::Child(copy))
}

/// `cuGraphAddMemAllocNode`: reserves the address now; returns (node,
/// address).
pub fn add_mem_alloc_node(
    p: &Process,
    g: u64,
    deps: &[u64],
    bytes: u64,
    device: i32,
) -> Result<(u64, u64), CUresult> {
    p.device(device)?;
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut inner = p.lock();
    check_deps(&inner, g, deps)?;
    inner.graphs.get(g)?;
    let dptr = inner.va.alloc(bytes, 1).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let n = insert_node(&mut inner, g, NodeKind::MemAlloc { bytes, dptr })?;
    Ok((n, dptr))
}

/// `cuGraphAddMemFreeNode`.
pub fn add_mem_free_node(p: &Process, g: u64, deps: &[u64], dptr: u64) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    check_deps(&inner, g, deps)?;
    insert_node(&mut inner, g, NodeKind::MemFree(dptr))
}

/// Stream capture of `cuMemAllocAsync`: a memory node in the capture
/// graph `g`; returns its address.
pub fn capture_alloc(inner: &mut Inner, g: u64, bytes: u64) -> Result<(u64, u64), CUresult> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dptr = inner.va.alloc(bytes, 1).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let n = insert_node(inner, g, NodeKind::MemAlloc { bytes, dptr })?;
    Ok((n, dptr))
}

/// Stream capture of `cuMemFreeAsync`: a free node in graph `g`.
pub fn capture_free(inner: &mut Inner, g: u64, dptr: u64) -> Result<u64, CUresult> {
    insert_node(inner, g, NodeKind::MemFree(dptr))
}

/// Stream capture of `cuLaunchHostFunc`: a host node in graph `g`.
pub fn capture_host(
    inner: &mut Inner,
    g: u64,
    func: crate::process::HostFnPtr,
    data: usize,
) -> Result<u64, CUresult> {
    insert_node(inner, g, NodeKind::Host { func, data })
}

/// `cuGraphDebugDotPrint`: graph `g` in Graphviz's DOT language, one
/// record per node (its type; a kernel's name, and with `verbose` its
/// grid, block and dynamic shared memory), edges in the order the nodes
/// run. Child graphs are clusters inside their node.
pub fn debug_dot(p: &Process, g: u64, verbose: bool) -> Result<String, CUresult> {
    let inner = p.lock();
    let mut out = String::from("digraph dot {\n");
    dot_graph(&inner, g, verbose, 0, &mut out)?;
    out.push_str("}\n");
    Ok(out)
}

fn dot_graph(
    inner: &Inner,
    g: u64,
    verbose: bool,
    depth: u32,
    out: &mut String,
) -> Result<(), CUresult> {
    use std::fmt::Write as _;
    if depth > MAX_DEPTH {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let nodes = &inner.graphs.get(g)?.nodes;
    let _ = writeln!(out, "subgraph cluster_{g:x} {{\nlabel=\"graph_{g:x}\";");
    for &n in nodes {
        let label = match inner.nodes.get(n)?.kind {
            NodeKind::Empty => "EMPTY".to_string(),
            NodeKind::Kernel(k) => {
                let name = inner.functions.get(k.function)?.name.to_string_lossy();
                if verbose {
                    let (g, b) = (k.shape.grid, k.shape.block);
                    format!(
                        "KERNEL\\n{name}\\ngrid {}x{}x{} block {}x{}x{}\\nshared {} B",
                        g[0], g[1], g[2], b[0], b[1], b[2], k.shared_mem
                    )
                } else {
                    format!("KERNEL\\n{name}")
                }
            }
            NodeKind::MemAlloc { bytes, dptr } if verbose => {
                format!("MEM_ALLOC\\n{bytes} B at {dptr:#x}")
            }
            NodeKind::MemAlloc { .. } => "MEM_ALLOC".to_string(),
            NodeKind::MemFree(dptr) if verbose => format!("MEM_FREE\\n{dptr:#x}"),
            NodeKind::MemFree(_) => "MEM_FREE".to_string(),
            NodeKind::Host { .. } => "HOST".to_string(),
            NodeKind::Child(c) => {
                dot_graph(inner, c, verbose, depth + 1, out)?;
                format!("GRAPH\\ngraph_{c:x}")
            }
        };
        let _ = writeln!(out, "\"node_{n:x}\" [shape=record, label=\"{label}\"];");
    }
    for w in nodes.windows(2) {
        let _ = writeln!(out, "\"node_{:x}\" -> \"node_{:x}\";", w[0], w[1]);
    }
    out.push_str("}\n");
    Ok(())
}

/// `cuGraphGetNodes`.
pub fn nodes(p: &Process, g: u64) -> Result<Vec<u64>, CUresult> {
    Ok(p.lock().graphs.get(g)?.nodes.clone())
}

/// `cuGraphNodeGetType`.
pub fn node_type(p: &Process, n: u64) -> Result<i32, CUresult> {
    Ok(match p.lock().nodes.get(n)?.kind {
        NodeKind::Empty => CU_GRAPH_NODE_TYPE_EMPTY,
        NodeKind::Kernel(_) => CU_GRAPH_NODE_TYPE_KERNEL,
        NodeKind::Child(_) => CU_GRAPH_NODE_TYPE_GRAPH,
        NodeKind::MemAlloc { .. } => CU_GRAPH_NODE_TYPE_MEM_ALLOC,
        NodeKind::MemFree(_) => CU_GRAPH_NODE_TYPE_MEM_FREE,
        NodeKind::Host { .. } => CU_GRAPH_NODE_TYPE_HOST,
    })
}

/// `cuGraphKernelNodeGetParams`.
pub fn kernel_params(p: &Process, n: u64) -> Result<KernelLaunch, CUresult> {
    match p.lock().nodes.get(n)?.kind {
        NodeKind::Kernel(k) => Ok(k),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuGraphChildGraphNodeGetGraph`: the graph the node owns.
pub fn child_graph(p: &Process, n: u64) -> Result<u64, CUresult> {
    match p.lock().nodes.get(n)?.kind {
        NodeKind::Child(g) => Ok(g),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// The steps node `n` runs (appended to `out`).
fn node_steps(inner: &Inner, n: u64, depth: u32, out: &mut NodeSteps) -> Result<(), CUresult> {
    match inner.nodes.get(n)?.kind {
        NodeKind::Empty => {}
        NodeKind::Kernel(k) => out.push((n, Step::Kernel(k))),
        NodeKind::MemAlloc { bytes, dptr } => out.push((n, Step::Alloc { bytes, dptr })),
        NodeKind::MemFree(dptr) => out.push((n, Step::Free(dptr))),
        NodeKind::Host { func, data } => out.push((n, Step::Host { func, data })),
        NodeKind::Child(g) => {
            if depth >= MAX_DEPTH {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            for &c in &inner.graphs.get(g)?.nodes {
                node_steps(inner, c, depth + 1, out)?;
            }
        }
    }
    Ok(())
}

/// Graph `g` as an executable's per-node steps.
fn flatten(inner: &Inner, g: u64) -> Result<Vec<(u64, NodeSteps)>, CUresult> {
    let mut nodes = Vec::new();
    for &n in &inner.graphs.get(g)?.nodes {
        let mut steps = Vec::new();
        node_steps(inner, n, 0, &mut steps)?;
        nodes.push((n, steps));
    }
    Ok(nodes)
}

/// `cuGraphInstantiate*`.
pub fn instantiate(p: &Process, g: u64) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    let nodes = flatten(&inner, g)?;
    Ok(inner.execs.insert(GraphExec { nodes }))
}

/// `cuGraphExecDestroy`.
pub fn exec_destroy(p: &Process, e: u64) -> Result<(), CUresult> {
    p.lock().execs.remove(e).map(|_| ())
}

/// Checks an executable graph handle (`cuGraphUpload`).
pub fn exec_check(p: &Process, e: u64) -> Result<(), CUresult> {
    p.lock().execs.get(e).map(|_| ())
}

/// The steps of executable `e`, in launch order.
pub fn exec_steps(p: &Process, e: u64) -> Result<Vec<Step>, CUresult> {
    Ok(p.lock()
        .execs
        .get(e)?
        .nodes
        .iter()
        .flat_map(|(_, steps)| steps.iter().map(|&(_, s)| s))
        .collect())
}

/// `cuGraphExecKernelNodeSetParams`: kernel node `n` of the graph `e` was
/// instantiated from (or of a child graph in it) now launches `k` in `e`.
pub fn exec_set_kernel(p: &Process, e: u64, n: u64, k: KernelLaunch) -> Result<(), CUresult> {
    let mut inner = p.lock();
    if !matches!(inner.nodes.get(n)?.kind, NodeKind::Kernel(_)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let k = resolve_kernel(&inner, k)?;
    let exec = inner.execs.get_mut(e)?;
    let mut found = false;
    for (_, steps) in &mut exec.nodes {
        for (from, step) in steps.iter_mut() {
            if *from == n {
                *step = Step::Kernel(k);
                found = true;
            }
        }
    }
    if found {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// `cuGraphExecChildGraphNodeSetParams`: child-graph node `n` of the graph
/// `e` was instantiated from now runs (a copy of) `child` in `e`.
pub fn exec_set_child(p: &Process, e: u64, n: u64, child: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    if !matches!(inner.nodes.get(n)?.kind, NodeKind::Child(_)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut steps = Vec::new();
    for &c in &inner.graphs.get(child)?.nodes {
        node_steps(&inner, c, 1, &mut steps)?;
    }
    let exec = inner.execs.get_mut(e)?;
    let slot = exec
        .nodes
        .iter_mut()
        .find(|(top, _)| *top == n)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    slot.1 = steps;
    Ok(())
}

/// `cuGraphExecUpdate`: `e` now runs graph `g`, which must have as many
/// top-level nodes of the same types (else
/// `CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`, `e` unchanged).
pub fn exec_update(p: &Process, e: u64, g: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let nodes = flatten(&inner, g)?;
    let old: Vec<u64> = inner.execs.get(e)?.nodes.iter().map(|(n, _)| *n).collect();
    let kind = |inner: &Inner, n: u64| {
        inner
            .nodes
            .get(n)
            .map(|x| std::mem::discriminant(&x.kind))
            .ok()
    };
    let same = old.len() == nodes.len()
        && old
            .iter()
            .zip(&nodes)
            .all(|(&a, (b, _))| kind(&inner, a).is_none() || kind(&inner, a) == kind(&inner, *b));
    if !same {
        return Err(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    }
    inner.execs.get_mut(e)?.nodes = nodes;
    Ok(())
}
