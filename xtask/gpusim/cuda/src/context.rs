//! Contexts: primary (retained per device) and explicit ones.
//!
//! A context's first creation on a device attaches the process to that
//! GPU's channel (charging the context overhead) and issues the stand-in
//! registration ioctls; destroying a context frees everything allocated in
//! it, as the driver does.
//!
//! Two knobs reproduce races around a destroy deterministically:
//! `GPUSIM_REUSE_CONTEXT_HANDLES=1` gives a new context the handle of the
//! last one destroyed (as the driver's pointers may be reused), and
//! `GPUSIM_CONTEXT_DESTROY_DELAY_MS=N` makes `cuCtxDestroy` return N ms
//! after the context is gone (other threads run meanwhile).

use gpusim::sim::Attachment;

use crate::process::{self, Context, Inner, Process, StreamState, sim_err};
use crate::status::*;

fn attach(p: &Process, device: usize) -> Result<Attachment, CUresult> {
    let (att, first) = p.sim.attach_channel(device).map_err(sim_err)?;
    if first {
        let numa = p.sim.node().gpu[device].numa_node;
        if let Err(e) = p
            .driver
            .register_gpu(device, p.sim.uuid_bytes(device), numa)
        {
            eprintln!("gpusim: {}", tessera_error_chain::with_causes(&e));
            let _ = p.sim.detach(&att);
            return Err(CUDA_ERROR_OPERATING_SYSTEM);
        }
    }
    Ok(att)
}

fn new_context(
    p: &Process,
    inner: &mut Inner,
    device: usize,
    flags: u32,
    primary: bool,
) -> Result<u64, CUresult> {
    let att = attach(p, device)?;
    let ctx = Context {
        att,
        flags,
        primary,
        default_stream: StreamState::default(),
    };
    if !primary {
        return Ok(inner.contexts.insert(ctx));
    }
    let h = primary_handle(inner, device);
    if let Err(e) = inner.contexts.fill(h, ctx) {
        let _ = p.sim.detach(&att);
        return Err(e);
    }
    Ok(h)
}

/// The primary context's handle on `device` (reserved on first use).
fn primary_handle(inner: &mut Inner, device: usize) -> u64 {
    match inner.primary[device].handle {
        Some(h) => h,
        None => {
            let h = inner.contexts.reserve();
            inner.primary[device].handle = Some(h);
            h
        }
    }
}

/// Frees everything that belongs to context `h` and gives back its claim
/// on the GPU. Every object is released even if one release fails; the
/// first error is returned at the end.
fn teardown(p: &Process, inner: &mut Inner, h: u64) -> Result<(), CUresult> {
    let att = inner.contexts.get(h)?.att;
    let mut result = Ok(());
    let mut note = |r: Result<(), CUresult>| {
        if result.is_ok() {
            result = r;
        }
    };
    let owned: Vec<u64> = inner
        .allocations
        .iter()
        .filter(|(_, a)| a.ctx == h)
        .map(|(&d, _)| d)
        .collect();
    for dptr in owned {
        note(crate::memory::release(p, inner, dptr));
    }
    let arrays: Vec<u64> = inner
        .arrays
        .iter()
        .filter(|(_, a)| a.ctx == h && a.parent.is_none())
        .map(|(x, _)| x)
        .collect();
    for a in arrays {
        note(crate::array::destroy(p, inner, a));
    }
    let mipmaps: Vec<u64> = inner
        .mipmaps
        .iter()
        .filter(|(_, m)| m.ctx == h)
        .map(|(x, _)| x)
        .collect();
    for m in mipmaps {
        note(crate::array::destroy_mipmapped_in(p, inner, m));
    }
    let physical: Vec<u64> = inner
        .physical
        .iter()
        .filter(|(_, ph)| ph.ctx == h)
        .map(|(x, _)| x)
        .collect();
    for ph in physical {
        if let Ok(phys) = inner.physical.remove(ph) {
            note(p.uncharge(&phys.charge));
        }
    }
    let streams: Vec<u64> = inner
        .streams
        .iter()
        .filter(|(_, s)| s.ctx == h)
        .map(|(s, _)| s)
        .collect();
    for s in streams {
        let _ = inner.streams.remove(s);
    }
    if inner.contexts.get(h)?.primary {
        let _ = inner.contexts.vacate(h);
    } else {
        let _ = inner.contexts.remove(h);
    }
    process::with_stack(|s| s.retain(|&c| c != h));
    match p.sim.detach(&att) {
        Ok(true) => p.driver.unregister_gpu(p.sim.uuid_bytes(att.gpu)),
        Ok(false) => {}
        Err(e) => note(Err(sim_err(e))),
    }
    result
}

/// `cuCtxCreate`: a new context on `dev`, made current.
pub fn create(p: &Process, dev: i32, flags: u32) -> Result<u64, CUresult> {
    let device = p.device(dev)?;
    let h = new_context(p, &mut p.lock(), device, flags, false)?;
    process::with_stack(|s| s.push(h));
    Ok(h)
}

/// Race knobs, from the environment (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Knobs {
    /// `GPUSIM_REUSE_CONTEXT_HANDLES=1`.
    pub reuse_handles: bool,
    /// `GPUSIM_CONTEXT_DESTROY_DELAY_MS`.
    pub destroy_delay: std::time::Duration,
}

/// The knobs, read once.
pub fn knobs() -> Knobs {
    static KNOBS: std::sync::OnceLock<Knobs> = std::sync::OnceLock::new();
    *KNOBS.get_or_init(|| Knobs {
        reuse_handles: std::env::var("GPUSIM_REUSE_CONTEXT_HANDLES").is_ok_and(|v| v == "1"),
        destroy_delay: std::time::Duration::from_millis(
            std::env::var("GPUSIM_CONTEXT_DESTROY_DELAY_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        ),
    })
}

/// `cuCtxDestroy`.
pub fn destroy(p: &Process, h: u64) -> Result<(), CUresult> {
    let result = {
        let mut inner = p.lock();
        let ctx = inner.contexts.get(h)?;
        if ctx.primary {
            // Primary contexts go through retain/release.
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        teardown(p, &mut inner, h)
    };
    std::thread::sleep(knobs().destroy_delay);
    result
}

/// `cuDevicePrimaryCtxRetain`.
pub fn primary_retain(p: &Process, dev: i32) -> Result<u64, CUresult> {
    let device = p.device(dev)?;
    let mut inner = p.lock();
    let prim = inner.primary[device];
    let h = match prim.ctx {
        Some(h) => h,
        None => {
            let h = new_context(p, &mut inner, device, prim.flags, true)?;
            inner.primary[device].ctx = Some(h);
            h
        }
    };
    inner.primary[device].retains += 1;
    Ok(h)
}

/// The primary context of `dev`, whether active or not (the CUDA
/// runtime's private "primary context" call, made while it counts the
/// devices): its handle, which names a context once it is retained.
pub fn primary_handle_of(p: &Process, dev: i32) -> Result<u64, CUresult> {
    let device = p.device(dev)?;
    Ok(primary_handle(&mut p.lock(), device))
}

/// `cuDevicePrimaryCtxRelease`.
pub fn primary_release(p: &Process, dev: i32) -> Result<(), CUresult> {
    let device = p.device(dev)?;
    let mut inner = p.lock();
    let prim = inner.primary[device];
    let Some(h) = prim.ctx else {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    };
    if prim.retains <= 1 {
        inner.primary[device].ctx = None;
        inner.primary[device].retains = 0;
        teardown(p, &mut inner, h)
    } else {
        inner.primary[device].retains -= 1;
        Ok(())
    }
}

/// `cuDevicePrimaryCtxReset`: destroys the primary context's resources.
pub fn primary_reset(p: &Process, dev: i32) -> Result<(), CUresult> {
    let device = p.device(dev)?;
    let mut inner = p.lock();
    let prim = inner.primary[device];
    if let Some(h) = prim.ctx {
        inner.primary[device].ctx = None;
        inner.primary[device].retains = 0;
        teardown(p, &mut inner, h)?;
    }
    Ok(())
}

/// `cuDevicePrimaryCtxGetState`: (flags, active).
pub fn primary_state(p: &Process, dev: i32) -> Result<(u32, bool), CUresult> {
    let device = p.device(dev)?;
    let prim = p.lock().primary[device];
    Ok((prim.flags, prim.ctx.is_some()))
}

/// `cuDevicePrimaryCtxSetFlags`.
pub fn primary_set_flags(p: &Process, dev: i32, flags: u32) -> Result<(), CUresult> {
    let device = p.device(dev)?;
    if flags & !0xff != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut inner = p.lock();
    inner.primary[device].flags = flags;
    if let Some(h) = inner.primary[device].ctx {
        inner.contexts.get_mut(h)?.flags = flags;
    }
    Ok(())
}

/// Checks that `h` is a live context (0 is allowed where the API allows
/// "no context").
pub fn check(p: &Process, h: u64) -> Result<(), CUresult> {
    p.lock()
        .contexts
        .get_or(h, CUDA_ERROR_INVALID_CONTEXT)
        .map(|_| ())
}

/// Checks that `h` may be made current: a live context, or a primary
/// context's handle while the primary context is inactive (the CUDA
/// runtime makes it current before it retains it; calls that need it then
/// fail until it is retained).
pub fn check_current(p: &Process, h: u64) -> Result<(), CUresult> {
    let inner = p.lock();
    if inner.primary.iter().any(|prim| prim.handle == Some(h)) {
        return Ok(());
    }
    inner
        .contexts
        .get_or(h, CUDA_ERROR_INVALID_CONTEXT)
        .map(|_| ())
}

/// The current context's device.
pub fn current_device(p: &Process) -> Result<usize, CUresult> {
    Ok(p.lock().current()?.1.att.gpu)
}

/// `cuCtxSynchronize`: waits for all work of the current context.
pub fn synchronize(p: &Process) -> Result<(), CUresult> {
    let att = p.lock().current()?.1.att;
    if let Some(seq) = p.sim.last_submitted(&att).map_err(sim_err)? {
        p.sim.wait(&att, seq).map_err(sim_err)?;
    }
    crate::stream::wait_callbacks(p);
    Ok(())
}
