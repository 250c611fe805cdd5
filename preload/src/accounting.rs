//! Charging device memory to the container: which GPU, how many bytes,
//! and the reservation against its limit.
//!
//! Charges match what the driver takes: linear memory (`cuMemAlloc`,
//! `cuMemAllocPitch`) costs the device pages it touches, pages being the
//! device's allocation granularity (`cuMemGetAllocationGranularity`,
//! minimum) — small allocations share pages ([`crate::pages`]); other
//! allocations are rounded up to the granularity; a context costs the
//! overhead the agent measured for the GPU (`context_overhead` in the
//! control region). A reservation is made
//! before the real allocation and returned if it fails, so the container's
//! account is never below what the driver holds for it — with one bounded
//! exception, a small allocation tried at the limit where the process's
//! own pages have room for it ([`reserve_pages`]).

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::{Books, Enforcer};

/// Granularity assumed when the driver cannot say (2 MiB).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

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

/// The number of times a context may have been destroyed so far: a fact
/// about a context handle learnt while it was this holds for as long as it
/// still is.
#[inline]
pub fn context_generation() -> u64 {
    CONTEXT_GENERATION.load(Ordering::Acquire)
}

/// The current context's device ordinal.
pub fn current_device() -> Result<CUdevice, CUresult> {
    current_context_device().map(|c| c.device)
}

/// The thread's current context and its device, and the
/// [`context_generation`] they were found in.
#[derive(Clone, Copy, Debug)]
pub struct CurrentDevice {
    /// Device ordinal.
    pub device: CUdevice,
    /// Context handle (0: none current).
    pub ctx: usize,
    /// Context generation, read after the handle and before its device.
    pub generation: u64,
}

/// The current context, its device ordinal, and the generation that
/// pairing holds for.
pub fn current_context_device() -> Result<CurrentDevice, CUresult> {
    let ctx = current_context();
    let generation = context_generation();
    let (g, c, d) = LAST_CONTEXT.get();
    let found = |device| CurrentDevice {
        device,
        ctx,
        generation,
    };
    if ctx != 0 && g == generation && c == ctx && d >= 0 {
        return Ok(found(d));
    }
    let mut d: CUdevice = 0;
    match real_cuda!(cuCtxGetDevice(&mut d)) {
        CUDA_SUCCESS => {
            LAST_CONTEXT.set((generation, ctx, d));
            Ok(found(d))
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
    let mut asked = None;
    let index = e.device_index(ordinal, || {
        let mut uuid = CUuuid::default();
        let mut rc = real_cuda!(cuDeviceGetUuid_v2(&mut uuid, ordinal));
        if rc == CUDA_ERROR_NOT_FOUND {
            rc = real_cuda!(cuDeviceGetUuid(&mut uuid, ordinal));
        }
        if rc != CUDA_SUCCESS {
            return Err(rc);
        }
        asked = Some(uuid.bytes);
        Ok(uuid.bytes)
    })?;
    if let (None, Some(uuid)) = (index, asked) {
        static ONCE: AtomicBool = AtomicBool::new(false);
        if !ONCE.swap(true, Ordering::Relaxed) {
            eprintln!(
                "tessera: GPU {} (device {ordinal}) is not assigned to this container",
                uuid_string(&uuid)
            );
        }
    }
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
    e.reclaim_now();
    e.usage
        .reserve(gpu, slot, bytes, limit)
        .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)
}

/// Records `bytes` on control GPU `gpu` whatever the limit (memory the
/// driver already holds).
pub fn force_reserve(e: &Enforcer, gpu: usize, bytes: u64) {
    if let Ok(slot) = e.slot() {
        let _ = e.usage.reserve(gpu, slot, bytes, tessera_region::UNLIMITED);
    }
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
            pool: 0,
        },
    ))
}

/// A reservation for a linear allocation, made before the real call.
#[derive(Debug)]
pub struct PageReservation {
    /// Control-region GPU index.
    pub gpu: usize,
    /// The device's page (allocation granularity).
    pub page: u64,
    /// Bytes reserved.
    pub reserved: u64,
    /// The current context.
    pub ctx: usize,
    /// Held while a small allocation is tried at the limit without a
    /// reservation (see [`reserve_pages`]).
    _at_limit: Option<std::sync::MutexGuard<'static, ()>>,
}

/// One try at the limit per process at a time.
static AT_LIMIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Reserves what a linear allocation of `len` bytes may make the driver
/// hold on the current device ([`crate::pages::expected`]).
///
/// At the limit, a small request that fits a free run in a page this
/// process already holds for the context (where the driver's first fit
/// puts it) is let through with nothing reserved, so a container at its
/// limit can still reuse the holes its frees left; [`book_pages`] refuses
/// it if the driver opened a page after all. Such tries are serialised
/// (a second concurrent one is refused), so a driver that does not fill
/// holes first costs at most one page over the limit per process, for the
/// length of one allocate-and-free.
pub fn reserve_pages(e: &Enforcer, len: u64) -> Result<PageReservation, CUresult> {
    let ordinal = current_device()?;
    let gpu = gpu_index(e, ordinal)?;
    let page = granularity(e, ordinal);
    let ctx = LAST_CONTEXT.get().1;
    let mut r = PageReservation {
        gpu,
        page,
        reserved: crate::pages::expected(len, page),
        ctx,
        _at_limit: None,
    };
    match reserve(e, gpu, r.reserved) {
        Ok(()) => Ok(r),
        Err(rc) if crate::pages::is_small(len, page) => {
            let guard = match AT_LIMIT.try_lock() {
                Ok(g) => g,
                // A panic under the guard leaves nothing half-done: the
                // book is updated under its own lock.
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return Err(rc),
            };
            if !e.books().pages.has_room(gpu, ctx, page, len) {
                return Err(rc);
            }
            r.reserved = 0;
            r._at_limit = Some(guard);
            Ok(r)
        }
        Err(rc) => Err(rc),
    }
}

/// Books the linear allocation the driver made at `addr` (`len` bytes)
/// under reservation `r` and settles the reservation on what its pages
/// really cost. `CUDA_ERROR_OUT_OF_MEMORY` (nothing booked, nothing
/// reserved) if it costs more than reserved and the rest does not fit; the
/// caller then frees it.
pub fn book_pages(e: &Enforcer, r: PageReservation, addr: u64, len: u64) -> Result<(), CUresult> {
    let span = crate::pages::Span {
        len: len.max(1),
        page: r.page,
        gpu: r.gpu,
        ctx: r.ctx,
    };
    let mut b = e.books();
    // A stale entry at this address (freed behind our back) is gone.
    let stale = b.pages.remove(addr);
    let cost = b.pages.add(addr, span);
    let extra = cost.saturating_sub(r.reserved);
    let fits = extra == 0 || reserve(e, r.gpu, extra).is_ok();
    if !fits {
        // Gives back exactly the pages it added.
        b.pages.remove(addr);
    }
    drop(b);
    if let Some((old, bytes)) = stale {
        unreserve(e, old.gpu, bytes);
    }
    if !fits {
        unreserve(e, r.gpu, r.reserved);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let surplus = r.reserved + extra - cost;
    if surplus > 0 {
        unreserve(e, r.gpu, surplus);
    }
    Ok(())
}

/// Ends a call made under reservation `charge`: on success `record`
/// books it (under the books lock), otherwise the reservation is
/// returned. Passes `rc` on.
pub fn settle(
    e: &Enforcer,
    rc: CUresult,
    charge: Charge,
    record: impl FnOnce(&mut Books, Charge),
) -> CUresult {
    if rc == CUDA_SUCCESS {
        record(&mut e.books(), charge);
    } else {
        release(e, charge);
    }
    rc
}

/// `CUDA_ARRAY3D_LAYERED`: depth counts layers, which mipmaps keep.
pub const ARRAY3D_LAYERED: u32 = 0x01;
/// `CUDA_ARRAY3D_CUBEMAP`: depth counts faces, which mipmaps keep.
pub const ARRAY3D_CUBEMAP: u32 = 0x04;
/// Bytes per channel charged for formats not listed here (video and
/// block-compressed ones): at least any real format's, so an unknown
/// format is overcharged, never free.
const UNKNOWN_FORMAT_BYTES: u64 = 16;

/// An array's shape, as its descriptor gives it.
#[derive(Clone, Copy, Debug)]
pub struct ArrayShape {
    /// Width, height, depth (0 = dimension unused).
    pub extent: [usize; 3],
    /// `CUarray_format`.
    pub format: u32,
    /// Channels per element.
    pub channels: u32,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: u32,
}

/// Bytes of mipmap `level` of a CUDA array: `width × max(height, 1) ×
/// max(depth, 1)` elements of `channels × bytes per channel`, halving
/// width, height and (unless it counts layers or cube faces) depth per
/// level, never below 1. `None` for shapes the driver rejects anyway.
pub fn array_bytes(s: &ArrayShape, level: u32) -> Option<u64> {
    let per_channel: u64 = match s.format {
        0x01 | 0x08 | 0xc0 | 0xc6 => 1,
        0x02 | 0x09 | 0x10 | 0xc1 | 0xc3 | 0xc7 | 0xc9 => 2,
        0x03 | 0x0a | 0x20 | 0xc2 | 0xc4 | 0xc8 | 0xca => 4,
        0xc5 | 0xcb => 8,
        _ => UNKNOWN_FORMAT_BYTES,
    };
    let [w, h, d] = s.extent;
    if !matches!(s.channels, 1 | 2 | 4) || w == 0 || level >= 64 {
        return None;
    }
    let extent = |x: usize, scales: bool| {
        if x == 0 {
            1
        } else if scales {
            ((x as u64) >> level).max(1)
        } else {
            x as u64
        }
    };
    let depth_scales = s.flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP) == 0;
    extent(w, true)
        .checked_mul(extent(h, true))?
        .checked_mul(extent(d, depth_scales))?
        .checked_mul(per_channel * u64::from(s.channels))
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

    #[test]
    fn arrays_are_sized_by_shape_and_level() {
        let shape = |extent, format, channels, flags| ArrayShape {
            extent,
            format,
            channels,
            flags,
        };
        // 100×10 RGBA8.
        assert_eq!(array_bytes(&shape([100, 10, 0], 0x01, 4, 0), 0), Some(4000));
        // Level 1 of a 3D float array halves every dimension.
        assert_eq!(
            array_bytes(&shape([8, 8, 8], 0x20, 1, 0), 1),
            Some(4 * 4 * 4 * 4)
        );
        // Layered and cube-map arrays keep their depth at every level.
        let layered = shape([8, 8, 6], 0x20, 1, ARRAY3D_LAYERED);
        assert_eq!(array_bytes(&layered, 1), Some(4 * 4 * 6 * 4));
        let cube = shape([8, 8, 6], 0x20, 1, ARRAY3D_CUBEMAP);
        assert_eq!(array_bytes(&cube, 2), Some(2 * 2 * 6 * 4));
        // Unknown formats are charged the widest channel.
        assert_eq!(array_bytes(&shape([10, 0, 0], 0x77, 1, 0), 0), Some(160));
        // Shapes the driver rejects are not sized.
        assert_eq!(array_bytes(&shape([10, 0, 0], 0x20, 3, 0), 0), None);
        assert_eq!(array_bytes(&shape([0, 10, 0], 0x20, 1, 0), 0), None);
    }
}
