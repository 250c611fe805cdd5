//! Memory information as the container should see it: total = its limit
//! (or the device, if smaller), free = total − what the container holds.

use super::{dispatch, hook};
use crate::accounting::{current_device, gpu_index};
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::Enforcer;

/// `(total, free)` for control GPU `gpu`, given the device's real figures.
/// Looks for dead processes first, so their bytes do not show as used.
pub fn virtual_memory(e: &Enforcer, gpu: usize, real_total: u64, real_free: u64) -> (u64, u64) {
    e.maybe_reclaim(true);
    super::pool::reconcile_all(e);
    let limit = e.control.gpu(gpu).0.memory_limit;
    let total = limit.min(real_total);
    let used = e.usage.used_bytes(gpu);
    (total, total.saturating_sub(used).min(real_free))
}

hook! {
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        dispatch(
            || real_cuda!(cuMemGetInfo_v2(free, total)),
            |e| {
                let rc = real_cuda!(cuMemGetInfo_v2(free, total));
                if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
                    return rc;
                }
                let gpu = match current_device().and_then(|d| gpu_index(e, d)) {
                    Ok(g) => g,
                    Err(rc) => return rc,
                };
                // SAFETY: both are non-NULL (checked above) output
                // arguments, valid per the caller's contract, which the
                // successful real call wrote.
                let (real_total, real_free) = unsafe { (*total, *free) };
                let (t, f) = virtual_memory(e, gpu, real_total as u64, real_free as u64);
                // SAFETY: as above.
                unsafe {
                    *total = t as usize;
                    *free = f as usize;
                }
                rc
            },
        )
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        dispatch(
            || real_cuda!(cuDeviceTotalMem_v2(bytes, dev)),
            |e| {
                let rc = real_cuda!(cuDeviceTotalMem_v2(bytes, dev));
                if rc != CUDA_SUCCESS || bytes.is_null() {
                    return rc;
                }
                match gpu_index(e, dev) {
                    Ok(g) => {
                        // SAFETY: non-NULL (checked above) output argument,
                        // valid per the caller's contract, which the
                        // successful real call wrote.
                        let real = unsafe { *bytes } as u64;
                        let shown = e.control.gpu(g).0.memory_limit.min(real);
                        // SAFETY: as above.
                        unsafe { *bytes = shown as usize };
                        rc
                    }
                    Err(rc) => rc,
                }
            },
        )
    }
}
