//! Device, managed, pooled and pinned host allocations.
//!
//! Every device allocation is charged to the process's channel on its GPU
//! (what NVML then reports as the process's memory): linear and pitched
//! memory by the pages it holds (small allocations share pages, see
//! [`crate::heap`]), pool and managed memory rounded up to the node's
//! allocation granularity. A charge that does not fit fails with
//! `CUDA_ERROR_OUT_OF_MEMORY` and allocates nothing. Managed memory is host
//! memory (so the host can touch it) charged to the current device.
//! Stream-ordered allocations take effect immediately; on a capturing
//! stream they become graph memory nodes instead (allocated when the graph
//! runs). A pool keeps freed memory reserved, still charged, up to its
//! release threshold (default 0: nothing kept), until it is trimmed or
//! destroyed.

use gpusim::nvrm::NV01_MEMORY_SYSTEM;

use crate::process::{AllocKind, Allocation, HostAlloc, Inner, Pool, Process, sim_err};
use crate::status::*;
use crate::sys;

/// Pitch alignment of `cuMemAllocPitch` (texture alignment).
pub const PITCH_ALIGN: u64 = 512;

/// Charges and records a device allocation for context `ctx`.
fn allocate(
    p: &Process,
    inner: &mut Inner,
    ctx: u64,
    size: u64,
    kind: AllocKind,
    addr: Option<u64>,
) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let att = inner.contexts.get(ctx)?.att;
    if matches!(kind, AllocKind::Linear | AllocKind::Pitch) {
        let (dptr, charge) = inner.heaps.alloc(p, &mut inner.va, ctx, &att, size)?;
        inner.allocations.insert(
            dptr,
            Allocation {
                ctx,
                size,
                charge,
                kind,
            },
        );
        return Ok(dptr);
    }
    let charge = p.charge(&att, size)?;
    let dptr = match addr {
        Some(a) => a,
        None => match inner.va.alloc(size, 1) {
            Some(a) => a,
            None => {
                let _ = p.uncharge(&charge);
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        },
    };
    inner.allocations.insert(
        dptr,
        Allocation {
            ctx,
            size,
            charge,
            kind,
        },
    );
    Ok(dptr)
}

/// Removes allocation `dptr` and returns its charge (to its pool's cache if
/// the pool keeps it). Everything is undone
/// even if the simulator cannot take the charge back (its channel may
/// already be gone); that error is returned afterwards.
pub fn release(p: &Process, inner: &mut Inner, dptr: u64) -> Result<(), CUresult> {
    let a = inner
        .allocations
        .remove(&dptr)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if matches!(a.kind, AllocKind::Linear | AllocKind::Pitch) {
        return inner
            .heaps
            .free(p, &mut inner.va, a.ctx, dptr, a.size, a.charge);
    }
    match a.kind {
        AllocKind::Managed => {
            // SAFETY: managed allocations are host mappings made by
            // sys::map with this size; the caller freed the pointer, so it
            // no longer uses the memory.
            unsafe { sys::unmap(dptr as *mut u8, a.size as usize) };
        }
        AllocKind::Pool(pool) => {
            inner.va.free(dptr, a.size);
            if let Ok(pl) = inner.pools.get_mut(pool) {
                pl.used = pl.used.saturating_sub(a.charge.bytes);
                if pl.reserved() + a.charge.bytes <= pl.release_threshold {
                    // Kept for reuse: still charged.
                    pl.cached.push(a.charge);
                    return Ok(());
                }
            }
        }
        // The address belongs to the graph's memory node.
        AllocKind::Graph => {}
        // Freed by the heap above.
        AllocKind::Linear | AllocKind::Pitch => {}
    }
    p.uncharge(&a.charge)
}

/// `cuMemAlloc_v2`.
pub fn alloc(p: &Process, size: u64) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    let (ctx, _) = inner.current()?;
    allocate(p, &mut inner, ctx, size, AllocKind::Linear, None)
}

/// `cuMemAllocPitch_v2`: returns (pointer, pitch).
pub fn alloc_pitch(
    p: &Process,
    width: u64,
    height: u64,
    element: u32,
) -> Result<(u64, u64), CUresult> {
    if width == 0 || height == 0 || !matches!(element, 4 | 8 | 16) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pitch = width.div_ceil(PITCH_ALIGN) * PITCH_ALIGN;
    let size = pitch.checked_mul(height).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut inner = p.lock();
    let (ctx, _) = inner.current()?;
    let dptr = allocate(p, &mut inner, ctx, size, AllocKind::Pitch, None)?;
    Ok((dptr, pitch))
}

/// `cuMemAllocManaged`.
pub fn alloc_managed(p: &Process, size: u64, flags: u32) -> Result<u64, CUresult> {
    if size == 0 || !matches!(flags, 1 | 2) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let len = usize::try_from(size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let mut inner = p.lock();
    let (ctx, _) = inner.current()?;
    let host = sys::map(len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    allocate(
        p,
        &mut inner,
        ctx,
        size,
        AllocKind::Managed,
        Some(host.as_ptr() as u64),
    )
    .inspect_err(|_| {
        // SAFETY: just mapped with this length and never handed out.
        unsafe { sys::unmap(host.as_ptr(), len) }
    })
}

/// `cuMemFree_v2`.
pub fn free(p: &Process, dptr: u64) -> Result<(), CUresult> {
    if dptr == 0 {
        return Ok(());
    }
    let mut inner = p.lock();
    release(p, &mut inner, dptr)
}

/// `cuMemGetInfo_v2`: (free, total) of the current context's device.
pub fn info(p: &Process) -> Result<(u64, u64), CUresult> {
    let device = p.lock().current()?.1.att.gpu;
    let m = p.sim.memory_info(device).map_err(sim_err)?;
    Ok((m.free, m.total))
}

/// `cuMemGetAddressRange_v2`: the allocation (or VMM mapping) containing
/// `dptr`.
pub fn address_range(p: &Process, dptr: u64) -> Result<(u64, u64), CUresult> {
    lookup(p, dptr)
        .map(|(base, size, ..)| (base, size))
        .ok_or(CUDA_ERROR_NOT_FOUND)
}

/// The allocation or VMM mapping containing `dptr`: (base, size, device,
/// context, managed).
pub fn lookup(p: &Process, dptr: u64) -> Option<(u64, u64, usize, u64, bool)> {
    let inner = p.lock();
    if let Some((&base, a)) = inner.allocations.range(..=dptr).next_back()
        && dptr < base + a.size
    {
        return Some((
            base,
            a.size,
            a.charge.att.gpu,
            a.ctx,
            a.kind == AllocKind::Managed,
        ));
    }
    let (&base, m) = inner.mappings.range(..=dptr).next_back()?;
    let ph = inner.physical.get(m.physical).ok()?;
    (dptr < base + m.size).then_some((base, m.size, ph.charge.att.gpu, ph.ctx, false))
}

/// `cuMemAllocHost_v2` / `cuMemHostAlloc`.
pub fn host_alloc(p: &Process, size: u64, flags: u32) -> Result<*mut u8, CUresult> {
    if size == 0 || flags & !0x7 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let len = usize::try_from(size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let mut inner = p.lock();
    let device = inner.current()?.1.att.gpu;
    let ptr = sys::map(len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let rm = p.driver.alloc_memory(device, NV01_MEMORY_SYSTEM, size);
    inner.host.insert(
        ptr.as_ptr() as usize,
        HostAlloc {
            len,
            flags,
            rm,
            device,
            registered: false,
        },
    );
    Ok(ptr.as_ptr())
}

/// `cuMemFreeHost`.
pub fn host_free(p: &Process, ptr: usize) -> Result<(), CUresult> {
    let mut inner = p.lock();
    match inner.host.get(&ptr) {
        Some(h) if !h.registered => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    let h = inner.host.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    p.driver.free(h.device, h.rm);
    // SAFETY: allocated by host_alloc with this length; the caller gave it
    // back.
    unsafe { sys::unmap(ptr as *mut u8, h.len) };
    Ok(())
}

/// `cuMemHostRegister_v2`: pins caller memory (recorded only).
pub fn host_register(p: &Process, ptr: usize, size: u64, flags: u32) -> Result<(), CUresult> {
    if ptr == 0 || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut inner = p.lock();
    let device = inner.current()?.1.att.gpu;
    if inner.host.contains_key(&ptr) {
        return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    let rm = p.driver.alloc_memory(device, NV01_MEMORY_SYSTEM, size);
    inner.host.insert(
        ptr,
        HostAlloc {
            len: size as usize,
            flags,
            rm,
            device,
            registered: true,
        },
    );
    Ok(())
}

/// `cuMemHostUnregister`.
pub fn host_unregister(p: &Process, ptr: usize) -> Result<(), CUresult> {
    let mut inner = p.lock();
    match inner.host.get(&ptr) {
        Some(h) if h.registered => {
            let h = inner
                .host
                .remove(&ptr)
                .ok_or(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)?;
            p.driver.free(h.device, h.rm);
            Ok(())
        }
        _ => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
    }
}

/// Flags of pinned host memory containing `ptr`.
pub fn host_flags(p: &Process, ptr: usize) -> Result<u32, CUresult> {
    let inner = p.lock();
    let (&base, h) = inner
        .host
        .range(..=ptr)
        .next_back()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ptr < base + h.len {
        Ok(h.flags)
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// The pool a stream-ordered allocation on `stream` uses.
fn stream_pool(inner: &mut Inner, stream: u64) -> Result<(u64, u64), CUresult> {
    let (ctx, _) = inner.stream_mut(stream)?;
    let device = inner.contexts.get(ctx)?.att.gpu;
    let default = inner.default_pool(device);
    Ok((ctx, inner.device_pools[device].unwrap_or(default)))
}

/// The graph `stream` is capturing into, if it is.
fn capturing(inner: &mut Inner, stream: u64) -> Result<Option<u64>, CUresult> {
    Ok(inner.stream_mut(stream)?.1.capture)
}

/// A stream-ordered allocation on a capturing stream: a memory node.
fn capture_alloc(inner: &mut Inner, stream: u64, graph: u64, size: u64) -> Result<u64, CUresult> {
    let (node, dptr) = crate::graph::capture_alloc(inner, graph, size)?;
    inner.stream_mut(stream)?.1.capture_tail = Some(node);
    Ok(dptr)
}

/// `cuMemAllocAsync`.
pub fn alloc_async(p: &Process, size: u64, stream: u64) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    if let Some(g) = capturing(&mut inner, stream)? {
        return capture_alloc(&mut inner, stream, g, size);
    }
    let (ctx, pool) = stream_pool(&mut inner, stream)?;
    pool_alloc(p, &mut inner, ctx, pool, size)
}

/// `cuMemAllocFromPoolAsync`.
pub fn alloc_from_pool(p: &Process, size: u64, pool: u64, stream: u64) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    if let Some(g) = capturing(&mut inner, stream)? {
        inner.pools.get(pool)?;
        return capture_alloc(&mut inner, stream, g, size);
    }
    let (ctx, _) = inner.stream_mut(stream)?;
    let device = inner.pools.get(pool)?.device;
    // The allocation is charged to the pool's device through a context on
    // it: the stream's if it matches, else the device's primary context.
    let ctx = if inner.contexts.get(ctx)?.att.gpu == device {
        ctx
    } else {
        inner.primary[device]
            .ctx
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?
    };
    pool_alloc(p, &mut inner, ctx, pool, size)
}

fn pool_alloc(
    p: &Process,
    inner: &mut Inner,
    ctx: u64,
    pool: u64,
    size: u64,
) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let rounded = p.sim.round_allocation(size);
    let cached = inner
        .pools
        .get_mut(pool)?
        .cached
        .iter()
        .position(|c| c.bytes == rounded);
    let dptr = match cached {
        // Memory the pool kept: no new charge.
        Some(i) => {
            let charge = inner.pools.get_mut(pool)?.cached.swap_remove(i);
            let dptr = inner.va.alloc(size, 1).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            inner.allocations.insert(
                dptr,
                Allocation {
                    ctx,
                    size,
                    charge,
                    kind: AllocKind::Pool(pool),
                },
            );
            dptr
        }
        None => match allocate(p, inner, ctx, size, AllocKind::Pool(pool), None) {
            // As the driver does when the device is out of memory: the
            // pool gives back what it keeps cached, then tries again.
            Err(CUDA_ERROR_OUT_OF_MEMORY) if !inner.pools.get(pool)?.cached.is_empty() => {
                let used = inner.pools.get(pool)?.used;
                trim(p, inner, pool, used)?;
                allocate(p, inner, ctx, size, AllocKind::Pool(pool), None)?
            }
            other => other?,
        },
    };
    let charged = inner.allocations[&dptr].charge.bytes;
    let pl = inner.pools.get_mut(pool)?;
    pl.used += charged;
    pl.used_high = pl.used_high.max(pl.used);
    Ok(dptr)
}

/// `cuMemFreeAsync` (on a capturing stream: a free node).
pub fn free_async(p: &Process, dptr: u64, stream: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    if let Some(g) = capturing(&mut inner, stream)? {
        let node = crate::graph::capture_free(&mut inner, g, dptr)?;
        inner.stream_mut(stream)?.1.capture_tail = Some(node);
        return Ok(());
    }
    release(p, &mut inner, dptr)
}

/// A graph launch reached a memory node: charges `bytes` at `dptr` to
/// `stream`'s context. The previous launch's allocation must have been
/// freed (`CUDA_ERROR_INVALID_VALUE` otherwise, nothing charged).
pub fn graph_alloc(p: &Process, stream: u64, bytes: u64, dptr: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    if inner.allocations.contains_key(&dptr) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, _) = inner.stream_mut(stream)?;
    allocate(p, &mut inner, ctx, bytes, AllocKind::Graph, Some(dptr)).map(|_| ())
}

/// `cuMemPoolCreate` for a device location.
pub fn pool_create(
    p: &Process,
    device: i32,
    alloc_type: i32,
    location_type: i32,
) -> Result<u64, CUresult> {
    if alloc_type != crate::abi::CU_MEM_ALLOCATION_TYPE_PINNED
        || location_type != crate::abi::CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let device = p.device(device)?;
    Ok(p.lock().pools.insert(Pool::new(device, false)))
}

/// Gives back cached memory of `pool` until it holds at most `keep` bytes.
fn trim(p: &Process, inner: &mut Inner, pool: u64, keep: u64) -> Result<(), CUresult> {
    let pl = inner.pools.get_mut(pool)?;
    let mut result = Ok(());
    while pl.reserved() > keep {
        let Some(c) = pl.cached.pop() else { break };
        result = result.and(p.uncharge(&c));
    }
    result
}

/// `cuMemPoolDestroy`: its cached memory goes back at once; allocations
/// from it stay valid until freed.
pub fn pool_destroy(p: &Process, pool: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    if inner.pools.get(pool)?.default {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for slot in inner.device_pools.iter_mut() {
        if *slot == Some(pool) {
            *slot = None;
        }
    }
    let trimmed = trim(p, &mut inner, pool, 0);
    inner.pools.remove(pool).map(|_| ()).and(trimmed)
}

/// `cuDeviceGetDefaultMemPool`.
pub fn default_pool(p: &Process, dev: i32) -> Result<u64, CUresult> {
    let device = p.device(dev)?;
    Ok(p.lock().default_pool(device))
}

/// `cuDeviceGetMemPool`.
pub fn device_pool(p: &Process, dev: i32) -> Result<u64, CUresult> {
    let device = p.device(dev)?;
    let mut inner = p.lock();
    let d = inner.default_pool(device);
    Ok(inner.device_pools[device].unwrap_or(d))
}

/// `cuDeviceSetMemPool`.
pub fn set_device_pool(p: &Process, dev: i32, pool: u64) -> Result<(), CUresult> {
    let device = p.device(dev)?;
    let mut inner = p.lock();
    if inner.pools.get(pool)?.device != device {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    inner.device_pools[device] = Some(pool);
    Ok(())
}

/// `cuMemPoolGetAttribute` for the 64-bit attributes we keep.
pub fn pool_attribute(p: &Process, pool: u64, attr: i32) -> Result<u64, CUresult> {
    let inner = p.lock();
    let pl = inner.pools.get(pool)?;
    match attr {
        // RELEASE_THRESHOLD
        4 => Ok(pl.release_threshold),
        // RESERVED_MEM_CURRENT
        5 => Ok(pl.reserved()),
        // USED_MEM_CURRENT
        7 => Ok(pl.used),
        // RESERVED_MEM_HIGH, USED_MEM_HIGH
        6 | 8 => Ok(pl.used_high),
        // The reuse policies (1..=3) are booleans, reported enabled.
        1..=3 => Ok(1),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemPoolSetAttribute`.
pub fn set_pool_attribute(p: &Process, pool: u64, attr: i32, value: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let pl = inner.pools.get_mut(pool)?;
    match attr {
        1..=3 => Ok(()),
        4 => {
            pl.release_threshold = value;
            Ok(())
        }
        6 | 8 if value == 0 => {
            pl.used_high = pl.used;
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemPoolTrimTo`.
pub fn pool_trim(p: &Process, pool: u64, keep: u64) -> Result<(), CUresult> {
    trim(p, &mut p.lock(), pool, keep)
}
