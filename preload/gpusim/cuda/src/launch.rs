//! Kernel launches, copies and memsets: work items on the timeline.

use gpusim::cost::{LaunchShape, copy_ns};
use gpusim::layout::ItemKind;

use crate::process::{KernelLaunch, Process};
use crate::status::*;
use crate::stream;

/// Largest block (threads).
pub const MAX_THREADS_PER_BLOCK: u64 = 1024;

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
    stream::submit_kernel_on(p, stream, att, ns, shape.warps())
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

/// `cuGraphLaunch`: queues the graph's kernels in order.
pub fn graph(p: &Process, exec: u64, stream: u64) -> Result<(), CUresult> {
    let kernels = p.lock().execs.get(exec)?.kernels.clone();
    for k in kernels {
        launch(p, k.function, k.shape, k.shared_mem, stream)?;
    }
    Ok(())
}
