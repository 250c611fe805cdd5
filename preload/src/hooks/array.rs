//! CUDA arrays and mipmapped arrays, charged by their element count (see
//! [`crate::accounting::array_bytes`]). The driver pads and tiles arrays,
//! so the charge is a floor of what the array occupies; the 2 MiB rounding
//! of every charge covers the padding of all but the largest arrays.

use std::ffi::c_uint;

use super::{dispatch, hook};
use crate::accounting::{self, ArrayShape, array_bytes, reserve_current};
use crate::ffi::*;
use crate::real::real_cuda;
use crate::state::Enforcer;

fn create(
    e: &Enforcer,
    arr: *mut Handle,
    bytes: Option<u64>,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(bytes) = bytes.filter(|_| !arr.is_null()) else {
        // The driver rejects what we cannot size.
        return real();
    };
    let (_, c) = match reserve_current(e, bytes) {
        Ok(x) => x,
        Err(rc) => return rc,
    };
    accounting::settle(e, real(), c, |b, c| {
        // SAFETY: the real call succeeded and wrote the handle.
        b.arrays.insert(unsafe { *arr } as usize, c);
    })
}

fn destroy(e: &Enforcer, arr: Handle, real: impl FnOnce() -> CUresult) -> CUresult {
    let rc = real();
    if rc == CUDA_SUCCESS {
        let c = e.books().arrays.remove(&(arr as usize));
        if let Some(c) = c {
            accounting::release(e, c);
        }
    }
    rc
}

fn shape_3d(d: &Array3dDescriptor) -> ArrayShape {
    ArrayShape {
        extent: [d.width, d.height, d.depth],
        format: d.format,
        channels: d.num_channels,
        flags: d.flags,
    }
}

fn mip_bytes(d: &Array3dDescriptor, levels: c_uint) -> Option<u64> {
    if levels == 0 || levels > 32 {
        return None;
    }
    let shape = shape_3d(d);
    (0..levels).try_fold(0u64, |acc, l| acc.checked_add(array_bytes(&shape, l)?))
}

hook! {
    fn cuArrayCreate_v2(arr: *mut Handle, desc: *const ArrayDescriptor) {
        dispatch(
            || real_cuda!(cuArrayCreate_v2(arr, desc)),
            |e| {
                // SAFETY: the caller's contract: desc is NULL or points to
                // an array descriptor.
                let bytes = unsafe { desc.as_ref() }.and_then(|d| {
                    let shape = ArrayShape { extent: [d.width, d.height, 0], format: d.format, channels: d.num_channels, flags: 0 };
                    array_bytes(&shape, 0)
                });
                create(e, arr, bytes, || real_cuda!(cuArrayCreate_v2(arr, desc)))
            },
        )
    }

    fn cuArray3DCreate_v2(arr: *mut Handle, desc: *const Array3dDescriptor) {
        dispatch(
            || real_cuda!(cuArray3DCreate_v2(arr, desc)),
            |e| {
                // SAFETY: the caller's contract: desc is NULL or points to
                // a 3D array descriptor.
                let bytes = unsafe { desc.as_ref() }.and_then(|d| array_bytes(&shape_3d(d), 0));
                create(e, arr, bytes, || real_cuda!(cuArray3DCreate_v2(arr, desc)))
            },
        )
    }

    fn cuArrayDestroy(arr: Handle) {
        dispatch(
            || real_cuda!(cuArrayDestroy(arr)),
            |e| destroy(e, arr, || real_cuda!(cuArrayDestroy(arr))),
        )
    }

    fn cuMipmappedArrayCreate(arr: *mut Handle, desc: *const Array3dDescriptor, levels: c_uint) {
        dispatch(
            || real_cuda!(cuMipmappedArrayCreate(arr, desc, levels)),
            |e| {
                // SAFETY: the caller's contract: desc is NULL or points to
                // a 3D array descriptor.
                let bytes = unsafe { desc.as_ref() }.and_then(|d| mip_bytes(d, levels));
                create(e, arr, bytes, || real_cuda!(cuMipmappedArrayCreate(arr, desc, levels)))
            },
        )
    }

    fn cuMipmappedArrayDestroy(arr: Handle) {
        dispatch(
            || real_cuda!(cuMipmappedArrayDestroy(arr)),
            |e| destroy(e, arr, || real_cuda!(cuMipmappedArrayDestroy(arr))),
        )
    }
}
