//! Virtual memory management: physical allocations are charged at
//! `cuMemCreate` and returned once they are released *and* unmapped, as
//! the driver defers freeing a released handle that is still mapped.

use std::ffi::c_ulonglong;

use super::{dispatch, hook};
use crate::accounting::{self, Charge, gpu_index, reserve, rounded};
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::{Enforcer, Physical};

/// Returns the charge of physical handle `h` once no reference or mapping
/// is left.
fn release_if_unused(e: &Enforcer, h: c_ulonglong) {
    let done = {
        let mut b = e.books();
        match b.physical.get(&h) {
            Some(p) if p.refs == 0 && p.mappings == 0 => b.physical.remove(&h),
            _ => None,
        }
    };
    if let Some(p) = done {
        accounting::release(e, p.charge);
    }
}

hook! {
    fn cuMemCreate(handle: *mut c_ulonglong, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong) {
        dispatch(
            || real_cuda!(cuMemCreate(handle, size, prop, flags)),
            |e| {
                if prop.is_null() || handle.is_null() || size == 0 {
                    return real_cuda!(cuMemCreate(handle, size, prop, flags));
                }
                // SAFETY: prop is non-NULL (checked above) and points to
                // allocation properties per the caller's contract.
                let p = unsafe { *prop };
                let ordinal = if p.location.kind == CU_MEM_LOCATION_TYPE_DEVICE {
                    p.location.id
                } else {
                    match accounting::current_device() {
                        Ok(d) => d,
                        Err(rc) => return rc,
                    }
                };
                let gpu = match gpu_index(e, ordinal) {
                    Ok(g) => g,
                    Err(rc) => return rc,
                };
                let charge = Charge { gpu, bytes: rounded(e, ordinal, size as u64), ctx: 0, pool: 0 };
                if let Err(rc) = reserve(e, gpu, charge.bytes) {
                    return rc;
                }
                accounting::settle(e, real_cuda!(cuMemCreate(handle, size, prop, flags)), charge, |b, charge| {
                    // SAFETY: handle is non-NULL (checked above), valid per
                    // the caller's contract; the successful call wrote it.
                    let h = unsafe { *handle };
                    b.physical.insert(h, Physical { charge, mappings: 0, refs: 1 });
                })
            },
        )
    }

    fn cuMemRelease(handle: c_ulonglong) {
        dispatch(
            || real_cuda!(cuMemRelease(handle)),
            |e| {
                let rc = real_cuda!(cuMemRelease(handle));
                if rc == CUDA_SUCCESS {
                    if let Some(p) = e.books().physical.get_mut(&handle) {
                        p.refs = p.refs.saturating_sub(1);
                    }
                    release_if_unused(e, handle);
                }
                rc
            },
        )
    }

    fn cuMemRetainAllocationHandle(handle: *mut c_ulonglong, addr: *mut std::ffi::c_void) {
        dispatch(
            || real_cuda!(cuMemRetainAllocationHandle(handle, addr)),
            |e| {
                let rc = real_cuda!(cuMemRetainAllocationHandle(handle, addr));
                if rc == CUDA_SUCCESS
                    && !handle.is_null()
                    // SAFETY: handle is non-NULL (checked), valid per the
                    // caller's contract; the successful call wrote it.
                    && let Some(p) = e.books().physical.get_mut(&unsafe { *handle })
                {
                    p.refs += 1;
                }
                rc
            },
        )
    }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: c_ulonglong, flags: c_ulonglong) {
        dispatch(
            || real_cuda!(cuMemMap(ptr, size, offset, handle, flags)),
            |e| {
                let rc = real_cuda!(cuMemMap(ptr, size, offset, handle, flags));
                if rc == CUDA_SUCCESS {
                    let mut b = e.books();
                    if let Some(p) = b.physical.get_mut(&handle) {
                        p.mappings += 1;
                    }
                    b.mappings.insert(ptr, handle);
                }
                rc
            },
        )
    }

    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        dispatch(
            || real_cuda!(cuMemUnmap(ptr, size)),
            |e| {
                let rc = real_cuda!(cuMemUnmap(ptr, size));
                if rc == CUDA_SUCCESS {
                    let handles: Vec<c_ulonglong> = {
                        let mut b = e.books();
                        let inside: Vec<u64> = b
                            .mappings
                            .range(ptr..ptr.saturating_add(size as u64))
                            .map(|(&a, _)| a)
                            .collect();
                        let mut handles = Vec::new();
                        for a in inside {
                            if let Some(h) = b.mappings.remove(&a) {
                                if let Some(p) = b.physical.get_mut(&h) {
                                    p.mappings = p.mappings.saturating_sub(1);
                                }
                                handles.push(h);
                            }
                        }
                        handles
                    };
                    for h in handles {
                        release_if_unused(e, h);
                    }
                }
                rc
            },
        )
    }
}
