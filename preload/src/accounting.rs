//! Charging device memory to the container: which GPU, how many bytes,
//! and the reservation against its limit.
//!
//! Charges match what the driver takes: an allocation is rounded up to the
//! device's allocation granularity (`cuMemGetAllocationGranularity`,
//! minimum); a context costs the overhead the agent measured for the GPU
//! (`context_overhead` in the control region). A reservation is made
//! before the real allocation and returned if it fails, so the container's
//! account is never below what the driver holds for it.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::ffi::*;
use crate::state::Enforcer;

/// Granularity assumed when the driver cannot say (2 MiB).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// Calls a real CUDA entry point, or answers `CUDA_ERROR_NOT_FOUND` if the
/// driver lacks it. The arguments are the hook's own (plain values and
/// pointers), evaluated inside the call.
#[allow(clippy::macro_metavars_in_unsafe)]
macro_rules! real_cuda {
    ($name:ident($($arg:expr),* $(,)?)) => {
        match $crate::real::cuda().and_then(|c| c.$name) {
            // SAFETY: the real driver function, called with the arguments
            // our caller passed us (same contract) or values we built.
            Some(f) => unsafe { f($($arg),*) },
            None => $crate::ffi::CUDA_ERROR_NOT_FOUND,
        }
    };
}
pub(crate) use real_cuda;

/// Bumped whenever a context may have been destroyed, so per-thread
/// context → device caches cannot outlive a reused context handle.
static CONTEXT_GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (generation, context, device) last seen by this thread.
    static LAST_CONTEXT: Cell<(u64, usize, CUdevice)> = const { Cell::new((u64::MAX, 0, -1)) };
}

/// Forgets cached context → device facts (a context went away).
pub fn contexts_changed() {
    CONTEXT_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The current context's device ordinal.
pub fn current_device() -> Result<CUdevice, CUresult> {
    let ctx = current_context();
    let generation = CONTEXT_GENERATION.load(Ordering::Acquire);
    let (g, c, d) = LAST_CONTEXT.get();
    if ctx != 0 && g == generation && c == ctx && d >= 0 {
        return Ok(d);
    }
    let mut d: CUdevice = 0;
    match real_cuda!(cuCtxGetDevice(&mut d)) {
        CUDA_SUCCESS => {
            LAST_CONTEXT.set((generation, ctx, d));
            Ok(d)
        }
        e => Err(e),
    }
}

/// The current context handle (0 if none).
pub fn current_context() -> usize {
    let mut c: Handle = std::ptr::null_mut();
    if real_cuda!(cuCtxGetCurrent(&mut c)) == CUDA_SUCCESS {
        c as usize
    } else {
        0
    }
}

/// The control-region index of device `ordinal`, or
/// `CUDA_ERROR_INVALID_DEVICE` if the GPU is not assigned to the container.
pub fn gpu_index(e: &Enforcer, ordinal: CUdevice) -> Result<usize, CUresult> {
    if let Some(cached) = e.cached_device(ordinal) {
        return cached.ok_or(CUDA_ERROR_INVALID_DEVICE);
    }
    let mut uuid = CUuuid::default();
    let mut rc = real_cuda!(cuDeviceGetUuid_v2(&mut uuid, ordinal));
    if rc == CUDA_ERROR_NOT_FOUND {
        rc = real_cuda!(cuDeviceGetUuid(&mut uuid, ordinal));
    }
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    let index = e.control.find(&uuid.bytes);
    if index.is_none() {
        static ONCE: AtomicBool = AtomicBool::new(false);
        if !ONCE.swap(true, Ordering::Relaxed) {
            eprintln!(
                "tessera: GPU {} (device {ordinal}) is not assigned to this container",
                uuid_string(&uuid.bytes)
            );
        }
    }
    e.cache_device(ordinal, index);
    index.ok_or(CUDA_ERROR_INVALID_DEVICE)
}

pub use tessera_region::spec::{format_uuid as uuid_string, parse_uuid};

/// Device `ordinal`'s allocation granularity.
pub fn granularity(e: &Enforcer, ordinal: CUdevice) -> u64 {
    if let Some(g) = e.cached_granularity(ordinal) {
        return g;
    }
    let prop = CUmemAllocationProp {
        kind: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location: CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    };
    let mut g: usize = 0;
    let rc = real_cuda!(cuMemGetAllocationGranularity(
        &mut g,
        &prop,
        CU_MEM_ALLOC_GRANULARITY_MINIMUM as c_int
    ));
    let g = if rc == CUDA_SUCCESS && g.is_power_of_two() {
        g as u64
    } else {
        DEFAULT_GRANULARITY
    };
    e.cache_granularity(ordinal, g);
    g
}

/// Bytes the driver charges for `bytes` on `ordinal`.
pub fn rounded(e: &Enforcer, ordinal: CUdevice, bytes: u64) -> u64 {
    let g = granularity(e, ordinal);
    bytes.max(1).div_ceil(g).saturating_mul(g)
}

/// Reserves `bytes` on control GPU `gpu`; `CUDA_ERROR_OUT_OF_MEMORY` if the
/// container's limit does not allow it.
pub fn reserve(e: &Enforcer, gpu: usize, bytes: u64) -> Result<(), CUresult> {
    let slot = e.slot().map_err(|why| {
        eprintln!("tessera: {why}");
        CUDA_ERROR_OUT_OF_MEMORY
    })?;
    e.maybe_reclaim(false);
    let limit = e.control.gpu(gpu).0.memory_limit;
    if e.usage.reserve(gpu, slot, bytes, limit).is_ok() {
        return Ok(());
    }
    // Dead processes may still hold bytes: look now, then try once more.
    e.maybe_reclaim(true);
    e.usage
        .reserve(gpu, slot, bytes, limit)
        .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)
}

/// Returns a reservation.
pub fn unreserve(e: &Enforcer, gpu: usize, bytes: u64) {
    if let Ok(slot) = e.slot() {
        e.usage.unreserve(gpu, slot, bytes);
    }
}

/// Returns the bytes of a charge.
pub fn release(e: &Enforcer, c: Charge) {
    unreserve(e, c.gpu, c.bytes);
}

pub use crate::state::Charge;

/// Makes a reservation for the current device and returns its charge.
pub fn reserve_current(e: &Enforcer, bytes: u64) -> Result<(CUdevice, Charge), CUresult> {
    let ordinal = current_device()?;
    let gpu = gpu_index(e, ordinal)?;
    let charged = rounded(e, ordinal, bytes);
    reserve(e, gpu, charged)?;
    let ctx = LAST_CONTEXT.get().1;
    Ok((
        ordinal,
        Charge {
            gpu,
            bytes: charged,
            ctx,
        },
    ))
}

/// Real allocation result: returns the reservation if the call failed.
pub fn settle(e: &Enforcer, rc: CUresult, c: Charge) -> bool {
    if rc != CUDA_SUCCESS {
        release(e, c);
        false
    } else {
        true
    }
}

/// Bytes of a CUDA array: `width × max(height, 1) × max(depth, 1)` elements
/// of `channels × bytes per channel`, halving each non-zero dimension per
/// mipmap `level` (never below 1). `None` for formats not known here.
pub fn array_bytes(
    w: usize,
    h: usize,
    d: usize,
    format: u32,
    channels: u32,
    level: u32,
) -> Option<u64> {
    let per_channel: u64 = match format {
        0x01 | 0x08 | 0xc0 | 0xc6 => 1,
        0x02 | 0x09 | 0x10 | 0xc1 | 0xc3 | 0xc7 | 0xc9 => 2,
        0x03 | 0x0a | 0x20 | 0xc2 | 0xc4 | 0xc8 | 0xca => 4,
        0xc5 | 0xcb => 8,
        _ => return None,
    };
    if !matches!(channels, 1 | 2 | 4) || w == 0 {
        return None;
    }
    let extent = |x: usize| {
        if x == 0 {
            1
        } else {
            ((x as u64) >> level).max(1)
        }
    };
    extent(w)
        .checked_mul(extent(h))?
        .checked_mul(extent(d))?
        .checked_mul(per_channel * u64::from(channels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip() {
        let s = "GPU-5e1a0000-0000-4000-8000-000051510001";
        let b = parse_uuid(s).unwrap();
        assert_eq!(uuid_string(&b), s);
        assert_eq!(parse_uuid("GPU-zz"), None);
    }
}
