//! CUDA graphs: kernel and empty nodes, instantiation and launch.
//!
//! Nodes run in insertion order (which respects dependencies, since a node
//! can only depend on nodes that already exist).

use crate::abi::{CU_GRAPH_NODE_TYPE_EMPTY, CU_GRAPH_NODE_TYPE_KERNEL};
use crate::process::{Graph, GraphExec, GraphNode, Inner, KernelLaunch, Process};
use crate::status::*;

/// `cuGraphCreate`.
pub fn create(p: &Process, flags: u32) -> Result<u64, CUresult> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(p.lock().graphs.insert(Graph::default()))
}

/// `cuGraphDestroy`.
pub fn destroy(p: &Process, g: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let graph = inner.graphs.remove(g)?;
    for n in graph.nodes {
        let _ = inner.nodes.remove(n);
    }
    Ok(())
}

fn check_deps(inner: &Inner, g: u64, deps: &[u64]) -> Result<(), CUresult> {
    for &d in deps {
        if inner.nodes.get(d)?.graph != g {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    Ok(())
}

/// Adds a kernel node to graph `g`.
pub fn add_kernel(inner: &mut Inner, g: u64, k: KernelLaunch) -> Result<u64, CUresult> {
    crate::launch::check_shape(&k.shape)?;
    crate::module::resolve(inner, k.function)?;
    inner.graphs.get(g)?;
    let n = inner.nodes.insert(GraphNode {
        graph: g,
        kernel: Some(k),
    });
    inner.graphs.get_mut(g)?.nodes.push(n);
    Ok(n)
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
    let function = crate::module::resolve(&inner, k.function)?;
    add_kernel(&mut inner, g, KernelLaunch { function, ..k })
}

/// `cuGraphAddEmptyNode`.
pub fn add_empty_node(p: &Process, g: u64, deps: &[u64]) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    check_deps(&inner, g, deps)?;
    inner.graphs.get(g)?;
    let n = inner.nodes.insert(GraphNode {
        graph: g,
        kernel: None,
    });
    inner.graphs.get_mut(g)?.nodes.push(n);
    Ok(n)
}

/// `cuGraphGetNodes`.
pub fn nodes(p: &Process, g: u64) -> Result<Vec<u64>, CUresult> {
    Ok(p.lock().graphs.get(g)?.nodes.clone())
}

/// `cuGraphNodeGetType`.
pub fn node_type(p: &Process, n: u64) -> Result<i32, CUresult> {
    Ok(match p.lock().nodes.get(n)?.kernel {
        Some(_) => CU_GRAPH_NODE_TYPE_KERNEL,
        None => CU_GRAPH_NODE_TYPE_EMPTY,
    })
}

/// `cuGraphKernelNodeGetParams`.
pub fn kernel_params(p: &Process, n: u64) -> Result<KernelLaunch, CUresult> {
    p.lock()
        .nodes
        .get(n)?
        .kernel
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// `cuGraphInstantiate*`.
pub fn instantiate(p: &Process, g: u64) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    let nodes = inner.graphs.get(g)?.nodes.clone();
    let kernels = nodes
        .iter()
        .filter_map(|&n| inner.nodes.get(n).ok().and_then(|x| x.kernel))
        .collect();
    Ok(inner.execs.insert(GraphExec { kernels }))
}

/// `cuGraphExecDestroy`.
pub fn exec_destroy(p: &Process, e: u64) -> Result<(), CUresult> {
    p.lock().execs.remove(e).map(|_| ())
}

/// Checks an executable graph handle (`cuGraphUpload`).
pub fn exec_check(p: &Process, e: u64) -> Result<(), CUresult> {
    p.lock().execs.get(e).map(|_| ())
}
