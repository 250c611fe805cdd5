//! Reading and writing through caller pointers.
//!
//! Each helper checks for NULL (`CUDA_ERROR_INVALID_VALUE`); the rest of a
//! pointer's validity is the caller's contract.

use std::ffi::{CStr, c_char};

use crate::status::{CUDA_ERROR_INVALID_VALUE, CUresult};

/// Writes `v` through out-parameter `p`.
///
/// # Safety
/// `p` is NULL or valid for writing a `T` (alignment not required).
pub unsafe fn out<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid per the caller's contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes `v` through `p` when `p` is not NULL (optional out-parameters).
///
/// # Safety
/// As [`out`].
pub unsafe fn out_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: non-NULL and valid per the caller's contract.
        unsafe { p.write_unaligned(v) };
    }
}

/// Reads a `T` from `p`.
///
/// # Safety
/// `p` is NULL or valid for reading a `T` (alignment not required).
pub unsafe fn read<T: Copy>(p: *const T) -> Result<T, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid per the caller's contract.
    Ok(unsafe { p.read_unaligned() })
}

/// Reads a NUL-terminated UTF-8 string.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives `'a`.
pub unsafe fn cstr<'a>(p: *const c_char) -> Result<&'a str, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)
}

/// Reads `n` elements (an empty slice when `n` is 0, even from NULL).
///
/// # Safety
/// When `n > 0`, `p` is NULL or valid for reading `n` aligned `T`s.
pub unsafe fn slice<T: Copy>(p: *const T, n: usize) -> Result<Vec<T>, CUresult> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid for n elements per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
}

/// Copies `s` into the caller's buffer of `len` bytes, NUL-terminated and
/// truncated to fit.
///
/// # Safety
/// `dst` is NULL or valid for writing `len` bytes.
pub unsafe fn copy_str(dst: *mut c_char, len: i32, s: &str) -> Result<(), CUresult> {
    if dst.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: n + 1 <= len bytes, valid per the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst.cast(), n);
        *dst.add(n) = 0;
    }
    Ok(())
}
