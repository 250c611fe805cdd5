//! Virtual memory management: physical allocations (`cuMemCreate`),
//! reserved address ranges and mappings between them.
//!
//! Physical memory is charged when created and given back when it is both
//! released and unmapped everywhere, as the driver defers the free of a
//! released handle that is still mapped.

use crate::abi::{CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE};
use crate::process::{Inner, Mapping, Physical, Process};
use crate::status::*;

/// Allocation granularity of the node (`cuMemGetAllocationGranularity`).
pub fn granularity(p: &Process) -> u64 {
    p.sim.round_allocation(1)
}

/// `cuMemCreate`.
pub fn create(
    p: &Process,
    size: u64,
    kind: i32,
    location_type: i32,
    device: i32,
) -> Result<u64, CUresult> {
    if kind != CU_MEM_ALLOCATION_TYPE_PINNED || location_type != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let device = p.device(device)?;
    let g = granularity(p);
    if size == 0 || !size.is_multiple_of(g) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut inner = p.lock();
    let (ctx, c) = inner.current()?;
    // Charge through a context on the target device.
    let (ctx, att) = if c.att.gpu == device {
        (ctx, c.att)
    } else {
        let h = inner.primary[device]
            .ctx
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        (h, inner.contexts.get(h)?.att)
    };
    // A multiple of the granularity: charged as it is.
    let charge = p.charge(&att, size)?;
    Ok(inner.physical.insert(Physical {
        ctx,
        size,
        charge,
        mappings: 0,
        refs: 1,
    }))
}

fn maybe_free(p: &Process, inner: &mut Inner, h: u64) -> Result<(), CUresult> {
    let ph = inner.physical.get(h)?;
    if ph.refs == 0 && ph.mappings == 0 {
        // Its context is alive: a context's teardown takes its physical
        // allocations with it.
        let ph = inner.physical.remove(h)?;
        p.uncharge(&ph.charge)?;
    }
    Ok(())
}

/// `cuMemRelease`.
pub fn release(p: &Process, h: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let ph = inner.physical.get_mut(h)?;
    if ph.refs == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    ph.refs -= 1;
    maybe_free(p, &mut inner, h)
}

/// `cuMemRetainAllocationHandle`: the physical allocation mapped at
/// `addr`, with one more reference (the caller releases it).
pub fn retain_handle(p: &Process, addr: u64) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    let (&start, m) = inner
        .mappings
        .range(..=addr)
        .next_back()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if addr < start + m.size {
        let h = m.physical;
        inner.physical.get_mut(h)?.refs += 1;
        Ok(h)
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// Properties of a physical allocation: (location type, device).
pub fn properties(p: &Process, h: u64) -> Result<(i32, i32), CUresult> {
    let inner = p.lock();
    let ph = inner.physical.get(h)?;
    Ok((CU_MEM_LOCATION_TYPE_DEVICE, ph.charge.att.gpu as i32))
}

/// `cuMemAddressReserve`.
pub fn reserve(p: &Process, size: u64, alignment: u64, fixed: u64) -> Result<u64, CUresult> {
    let g = granularity(p);
    if size == 0 || !size.is_multiple_of(g) || (alignment != 0 && !alignment.is_power_of_two()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut inner = p.lock();
    // A requested address is a hint; the driver may place the range elsewhere.
    let _ = fixed;
    let start = inner
        .va
        .alloc(size, alignment.max(g))
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    inner.reservations.insert(start, size);
    Ok(start)
}

/// `cuMemAddressFree`.
pub fn address_free(p: &Process, ptr: u64, size: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    match inner.reservations.get(&ptr) {
        Some(&s) if s == size => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    if inner.mappings.range(ptr..ptr + size).next().is_some() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    inner.reservations.remove(&ptr);
    inner.va.free(ptr, size);
    Ok(())
}

fn reserved(inner: &Inner, ptr: u64, size: u64) -> bool {
    inner
        .reservations
        .range(..=ptr)
        .next_back()
        .is_some_and(|(&s, &len)| ptr + size <= s + len)
}

/// `cuMemMap` (offset must be 0 and the size the whole allocation's).
pub fn map(p: &Process, ptr: u64, size: u64, offset: u64, h: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let ph = inner.physical.get(h)?;
    if offset != 0 || size != ph.size || ph.refs == 0 || !reserved(&inner, ptr, size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let overlaps = inner
        .mappings
        .range(..ptr + size)
        .next_back()
        .is_some_and(|(&s, m)| s + m.size > ptr);
    if overlaps {
        return Err(CUDA_ERROR_ALREADY_MAPPED);
    }
    inner.physical.get_mut(h)?.mappings += 1;
    inner.mappings.insert(ptr, Mapping { size, physical: h });
    Ok(())
}

/// `cuMemUnmap`: unmaps every mapping inside `[ptr, ptr + size)`.
pub fn unmap(p: &Process, ptr: u64, size: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let inside: Vec<u64> = inner
        .mappings
        .range(ptr..ptr.saturating_add(size))
        .map(|(&s, _)| s)
        .collect();
    if inside.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for s in inside {
        if let Some(m) = inner.mappings.remove(&s)
            && let Ok(ph) = inner.physical.get_mut(m.physical)
        {
            ph.mappings = ph.mappings.saturating_sub(1);
            maybe_free(p, &mut inner, m.physical)?;
        }
    }
    Ok(())
}

/// `cuMemSetAccess`: the range must be mapped and the devices real.
pub fn set_access(
    p: &Process,
    ptr: u64,
    size: u64,
    devices: &[(i32, i32)],
) -> Result<(), CUresult> {
    for &(kind, id) in devices {
        if kind != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        p.device(id)?;
    }
    let inner = p.lock();
    let mapped = inner
        .mappings
        .range(..=ptr)
        .next_back()
        .is_some_and(|(&s, m)| ptr >= s && ptr + size <= s + m.size)
        || inner.mappings.range(ptr..ptr + size).next().is_some();
    if mapped {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}
