//! CUDA arrays (1D, 2D, 3D) and mipmapped arrays.
//!
//! An array's size is `width × max(height, 1) × max(depth, 1) × element
//! size × channels`; a mipmapped array's is the sum over its levels, each
//! level halving every non-zero dimension (never below 1). Levels belong to
//! their mipmapped array and cost nothing on their own.

use crate::abi::CudaArray3dDescriptor;
use crate::charge::Charge;
use crate::process::{Array, Inner, Mipmapped, Process};
use crate::status::*;

/// Bytes per channel of a `CUarray_format`, for the formats supported.
pub fn format_bytes(format: u32) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 | 0xc0 | 0xc6 => 1,
        0x02 | 0x09 | 0x10 | 0xc3 | 0xc9 => 2,
        0x03 | 0x0a | 0x20 => 4,
        0xc1 | 0xc7 => 2,
        0xc2 | 0xc8 | 0xc4 | 0xca => 4,
        0xc5 | 0xcb => 8,
        _ => return None,
    })
}

fn level_bytes(d: &CudaArray3dDescriptor, level: u32) -> Result<u64, CUresult> {
    let elem = format_bytes(d.format).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !matches!(d.num_channels, 1 | 2 | 4) || d.width == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dim = |x: usize| -> u64 {
        if x == 0 {
            1
        } else {
            ((x as u64) >> level).max(1)
        }
    };
    dim(d.width)
        .checked_mul(dim(d.height))
        .and_then(|v| v.checked_mul(dim(d.depth)))
        .and_then(|v| v.checked_mul(elem * u64::from(d.num_channels)))
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Bytes of an array with descriptor `d`.
pub fn array_bytes(d: &CudaArray3dDescriptor) -> Result<u64, CUresult> {
    level_bytes(d, 0)
}

/// Bytes of a mipmapped array with `levels` levels.
pub fn mipmapped_bytes(d: &CudaArray3dDescriptor, levels: u32) -> Result<u64, CUresult> {
    if levels == 0 || levels > 32 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    (0..levels).try_fold(0u64, |acc, l| {
        acc.checked_add(level_bytes(d, l)?)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    })
}

/// Charges `bytes` to the current context; returns it and the charge.
fn charge(p: &Process, inner: &Inner, bytes: u64) -> Result<(u64, Charge), CUresult> {
    let (ctx, c) = inner.current()?;
    Ok((ctx, p.charge(&c.att, bytes)?))
}

/// `cuArrayCreate_v2` / `cuArray3DCreate_v2`.
pub fn create(p: &Process, d: CudaArray3dDescriptor) -> Result<u64, CUresult> {
    let bytes = array_bytes(&d)?;
    let mut inner = p.lock();
    let (ctx, alloc) = charge(p, &inner, bytes)?;
    Ok(inner.arrays.insert(Array {
        ctx,
        alloc: Some(alloc),
        desc: d,
        parent: None,
    }))
}

/// `cuArrayDestroy`.
pub fn destroy(p: &Process, inner: &mut Inner, h: u64) -> Result<(), CUresult> {
    if inner.arrays.get(h)?.parent.is_some() {
        // Levels go with their mipmapped array.
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let a = inner.arrays.remove(h)?;
    if let Some(c) = a.alloc {
        p.uncharge(&c)?;
    }
    Ok(())
}

/// The descriptor of array `h`.
pub fn descriptor(p: &Process, h: u64) -> Result<CudaArray3dDescriptor, CUresult> {
    Ok(p.lock().arrays.get(h)?.desc)
}

/// `cuMipmappedArrayCreate`.
pub fn create_mipmapped(
    p: &Process,
    d: CudaArray3dDescriptor,
    levels: u32,
) -> Result<u64, CUresult> {
    let bytes = mipmapped_bytes(&d, levels)?;
    let mut inner = p.lock();
    let (ctx, alloc) = charge(p, &inner, bytes)?;
    Ok(inner.mipmaps.insert(Mipmapped {
        ctx,
        alloc,
        desc: d,
        levels,
        level_arrays: vec![None; levels as usize],
    }))
}

/// `cuMipmappedArrayDestroy`.
pub fn destroy_mipmapped(p: &Process, h: u64) -> Result<(), CUresult> {
    destroy_mipmapped_in(p, &mut p.lock(), h)
}

/// Destroys mipmapped array `h` and its levels.
pub fn destroy_mipmapped_in(p: &Process, inner: &mut Inner, h: u64) -> Result<(), CUresult> {
    let m = inner.mipmaps.remove(h)?;
    for a in m.level_arrays.into_iter().flatten() {
        let _ = inner.arrays.remove(a);
    }
    p.uncharge(&m.alloc)
}

/// `cuMipmappedArrayGetLevel`.
pub fn level(p: &Process, h: u64, level: u32) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    let m = inner.mipmaps.get(h)?;
    if level >= m.levels {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(a) = m.level_arrays[level as usize] {
        return Ok(a);
    }
    let shrink = |x: usize| if x == 0 { 0 } else { (x >> level).max(1) };
    let mut desc = m.desc;
    desc.width = shrink(desc.width);
    desc.height = shrink(desc.height);
    desc.depth = shrink(desc.depth);
    let ctx = m.ctx;
    let a = inner.arrays.insert(Array {
        ctx,
        alloc: None,
        desc,
        parent: Some(h),
    });
    inner.mipmaps.get_mut(h)?.level_arrays[level as usize] = Some(a);
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(w: usize, h: usize, depth: usize, format: u32, ch: u32) -> CudaArray3dDescriptor {
        CudaArray3dDescriptor {
            width: w,
            height: h,
            depth,
            format,
            num_channels: ch,
            flags: 0,
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(array_bytes(&d(100, 0, 0, 0x20, 1)).unwrap(), 400);
        assert_eq!(array_bytes(&d(100, 10, 0, 0x01, 4)).unwrap(), 4000);
        assert_eq!(array_bytes(&d(8, 8, 8, 0x10, 2)).unwrap(), 2048);
        // 64x64 float: 16384 + 4096 + 1024 + 256.
        assert_eq!(mipmapped_bytes(&d(64, 64, 0, 0x20, 1), 4).unwrap(), 21760);
        assert!(array_bytes(&d(1, 1, 0, 0x77, 1)).is_err());
        assert!(array_bytes(&d(1, 1, 0, 0x20, 3)).is_err());
        assert!(mipmapped_bytes(&d(4, 4, 0, 0x20, 1), 0).is_err());
    }
}
