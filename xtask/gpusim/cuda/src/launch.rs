//! Kernel launches, copies and memsets: work items on the timeline.

use gpusim::cost::{LaunchShape, copy_ns};
use gpusim::layout::ItemKind;

use crate::process::{KernelLaunch, Process, Step};
use crate::status::*;
use crate::stream;

/// Largest block (threads).
pub const MAX_THREADS_PER_BLOCK: u64 = 1024;

/// Kernels this process submitted to the GPUs and their warps (blocks ×
/// ⌈threads per block / 32⌉), whatever API launched them, from the node's
/// launch log (`gpusim::launch_log`, the one record of what the GPUs were
/// given): the channels this process holds, summed over the GPUs.
pub fn executed(p: &Process) -> Result<(u64, u64), CUresult> {
    let pid = std::process::id() as i32;
    let (mut kernels, mut warps) = (0u64, 0u64);
    for gpu in 0..p.sim.gpu_count() {
        for l in p.sim.launches(gpu).map_err(crate::process::sim_err)? {
            if l.pid == pid && l.active {
                kernels += l.kernels;
                warps += l.warps;
            }
        }
    }
    Ok((kernels, warps))
}

/// Warps of a launch of `shape`.
pub fn warps(shape: &LaunchShape) -> u64 {
    shape
        .blocks()
        .saturating_mul(shape.threads_per_block().div_ceil(32))
}

/// Checks a launch's dimensions against the device limits.
pub fn check_shape(shape: &LaunchShape) -> Result<(), CUresult> {
    let [gx, gy, gz] = shape.grid;
    let [bx, by, bz] = shape.block;
    if gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if gy > 65535 || gz > 65535 || bx > 1024 || by > 1024 || bz > 64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if shape.threads_per_block() > MAX_THREADS_PER_BLOCK {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// `cuLaunchKernel` and friends: queues the kernel, or records it into the
/// graph `stream` is capturing.
pub fn launch(
    p: &Process,
    f: u64,
    shape: LaunchShape,
    shared: u32,
    stream: u64,
) -> Result<(), CUresult> {
    check_shape(&shape)?;
    // Everything is resolved under one lock, which is released before the
    // submission (it may wait for room in the queue).
    let (att, ns) = {
        let mut inner = p.lock();
        let f = crate::module::resolve(&inner, f)?;
        let (ctx, st) = inner.stream_mut(stream)?;
        if let Some(graph) = st.capture {
            let node = crate::graph::add_kernel(
                &mut inner,
                graph,
                KernelLaunch {
                    function: f,
                    shape,
                    shared_mem: shared,
                },
            )?;
            let (_, st) = inner.stream_mut(stream)?;
            st.capture_tail = Some(node);
            return Ok(());
        }
        let att = inner.contexts.get(ctx)?.att;
        let ns = crate::module::duration(p, &mut inner, f, att.gpu, &shape)?;
        (att, ns)
    };
    let warps = shape.warps();
    stream::submit_kernel_on(p, stream, att, ns, warps)
}

/// A copy or memset of `bytes` on `stream`; `sync` waits for it (and for
/// everything before it on the stream).
pub fn copy(p: &Process, bytes: u64, stream: u64, sync: bool) -> Result<(), CUresult> {
    let ns = copy_ns(p.sim.node(), bytes);
    let (att, seq) = stream::submit(p, stream, ItemKind::Copy, ns)?;
    if sync {
        p.sim.wait(&att, seq).map_err(crate::process::sim_err)?;
    }
    Ok(())
}

/// `cuGraphLaunch`: runs the graph's steps in order (kernels queued,
/// graph memory allocated and freed, host functions queued).
pub fn graph(p: &'static Process, exec: u64, stream: u64) -> Result<(), CUresult> {
    for step in crate::graph::exec_steps(p, exec)? {
        match step {
            Step::Kernel(k) => launch(p, k.function, k.shape, k.shared_mem, stream)?,
            Step::Alloc { bytes, dptr } => crate::memory::graph_alloc(p, stream, bytes, dptr)?,
            Step::Free(dptr) => crate::memory::free(p, dptr)?,
            Step::Host { func, data } => {
                stream::host_func(p, stream, crate::exports::host_call(func, data))?
            }
        }
    }
    Ok(())
}

/// `cuFuncSetBlockShape`.
pub fn set_block_shape(p: &Process, f: u64, dims: [u32; 3]) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let f = crate::module::resolve(&inner, f)?;
    check_shape(&LaunchShape {
        grid: [1, 1, 1],
        block: dims,
    })?;
    inner.functions.get_mut(f)?.block_shape = dims;
    Ok(())
}

/// `cuLaunch` / `cuLaunchGrid[Async]`: a `w`×`h` grid of the block shape
/// set for `f`.
pub fn legacy(p: &Process, f: u64, w: i32, h: i32, stream: u64) -> Result<(), CUresult> {
    let (w, h) = match (u32::try_from(w), u32::try_from(h)) {
        (Ok(w), Ok(h)) => (w, h),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let block = {
        let inner = p.lock();
        let f = crate::module::resolve(&inner, f)?;
        inner.functions.get(f)?.block_shape
    };
    launch(
        p,
        f,
        LaunchShape {
            grid: [w, h, 1],
            block,
        },
        0,
        stream,
    )
}
