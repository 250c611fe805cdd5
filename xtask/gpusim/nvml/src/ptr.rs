//! Every read and write through a caller's pointer.
//!
//! These are the only places the library touches memory it did not
//! allocate. Each function checks for NULL (→ `NVML_ERROR_INVALID_ARGUMENT`)
//! and for the buffer sizes the caller states (→
//! `NVML_ERROR_INSUFFICIENT_SIZE`); what remains is the C contract that a
//! non-NULL pointer is valid, which the caller of each `unsafe fn` vouches
//! for. Writes are unaligned so that a caller's packed or odd buffer does not
//! make a write undefined.

use std::ffi::{CStr, c_char, c_uint};

use crate::error::NvmlError;

/// Writes `value` to `out`.
///
/// # Safety
/// `out` is NULL or valid for writing a `T`.
pub unsafe fn put<T>(out: *mut T, value: T) -> Result<(), NvmlError> {
    if out.is_null() {
        return Err(NvmlError::InvalidArgument);
    }
    // SAFETY: non-NULL, and valid for a `T` per the contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Writes the first `bytes` bytes of `value` to `out`: for entry points whose
/// older callers pass a shorter version of the struct.
///
/// # Safety
/// `out` is NULL or valid for writing `bytes` bytes.
pub unsafe fn put_prefix<T>(out: *mut T, value: &T, bytes: usize) -> Result<(), NvmlError> {
    if out.is_null() {
        return Err(NvmlError::InvalidArgument);
    }
    let bytes = bytes.min(size_of::<T>());
    // SAFETY: `value` is a whole `T` (at least `bytes` bytes); `out` is valid
    // for `bytes` bytes per the contract; they cannot overlap since `value`
    // is ours.
    unsafe {
        std::ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), out.cast::<u8>(), bytes)
    };
    Ok(())
}

/// Reads a `T` from `input`.
///
/// # Safety
/// `input` is NULL or valid for reading a `T`.
pub unsafe fn get<T: Copy>(input: *const T) -> Result<T, NvmlError> {
    if input.is_null() {
        return Err(NvmlError::InvalidArgument);
    }
    // SAFETY: non-NULL, and valid for a `T` per the contract.
    Ok(unsafe { input.read_unaligned() })
}

/// Reads the leading `version` field of a versioned struct.
///
/// # Safety
/// `input` is NULL or points to a struct that starts with an
/// `unsigned int version`.
pub unsafe fn version<T>(input: *const T) -> Result<c_uint, NvmlError> {
    // SAFETY: per the contract the first field is an `unsigned int`.
    unsafe { get(input.cast::<c_uint>()) }
}

/// Copies `s` and a terminating NUL into the caller's `buf` of `len` bytes.
///
/// # Safety
/// `buf` is NULL or valid for writing `len` bytes.
pub unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), NvmlError> {
    if buf.is_null() {
        return Err(NvmlError::InvalidArgument);
    }
    if s.len() + 1 > len as usize {
        return Err(NvmlError::InsufficientSize);
    }
    // SAFETY: `buf` holds `len` >= s.len() + 1 bytes per the contract; `s` is
    // ours, so the ranges do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// Reads the caller's NUL-terminated string.
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string that lives for `'a`.
pub unsafe fn get_str<'a>(s: *const c_char) -> Result<&'a str, NvmlError> {
    if s.is_null() {
        return Err(NvmlError::InvalidArgument);
    }
    // SAFETY: a valid C string per the contract.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str().map_err(|_| NvmlError::InvalidArgument)
}

/// The NVML "sized array" convention: `*count` holds the capacity of
/// `items_out`; on return it holds how many entries were written or, when
/// the array is too small, how many are needed
/// (`NVML_ERROR_INSUFFICIENT_SIZE`). A NULL array with a zero count is how
/// callers ask for the size.
///
/// # Safety
/// `count` is NULL or valid for reading and writing a `c_uint`; `items_out`
/// is NULL or valid for writing `*count` entries.
pub unsafe fn put_array<T: Copy>(
    count: *mut c_uint,
    items_out: *mut T,
    items: &[T],
) -> Result<(), NvmlError> {
    // SAFETY: per the contract.
    let capacity = unsafe { get(count) }? as usize;
    let needed = c_uint::try_from(items.len()).map_err(|_| NvmlError::Unknown)?;
    if capacity < items.len() {
        // SAFETY: per the contract (checked non-NULL by `get` above).
        unsafe { put(count, needed) }?;
        return Err(NvmlError::InsufficientSize);
    }
    if !items.is_empty() {
        if items_out.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        // SAFETY: `items_out` holds `capacity` >= items.len() entries per the
        // contract; `items` is ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                items.as_ptr().cast::<u8>(),
                items_out.cast::<u8>(),
                size_of_val(items),
            )
        };
    }
    // SAFETY: as above.
    unsafe { put(count, needed) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_need_room_for_the_nul() {
        let mut buf = [1 as c_char; 4];
        // SAFETY: buf holds 4 bytes.
        let r = unsafe { put_str(buf.as_mut_ptr(), 4, "abcd") };
        assert_eq!(r, Err(NvmlError::InsufficientSize));
        // SAFETY: as above.
        unsafe { put_str(buf.as_mut_ptr(), 4, "abc") }.unwrap();
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
        // SAFETY: NULL is allowed.
        let r = unsafe { put_str(std::ptr::null_mut(), 4, "a") };
        assert_eq!(r, Err(NvmlError::InvalidArgument));
    }

    #[test]
    fn arrays_report_the_size_they_need() {
        let items = [7u64, 8, 9];
        let mut count: c_uint = 0;
        // SAFETY: count is valid; NULL array with capacity 0.
        let r = unsafe { put_array(&mut count, std::ptr::null_mut(), &items) };
        assert_eq!(r, Err(NvmlError::InsufficientSize));
        assert_eq!(count, 3);

        let mut out = [0u64; 5];
        count = 5;
        // SAFETY: out holds 5 entries.
        unsafe { put_array(&mut count, out.as_mut_ptr(), &items) }.unwrap();
        assert_eq!(count, 3);
        assert_eq!(out, [7, 8, 9, 0, 0]);

        count = 0;
        // SAFETY: nothing to write.
        unsafe { put_array::<u64>(&mut count, std::ptr::null_mut(), &[]) }.unwrap();
        assert_eq!(count, 0);

        // SAFETY: NULL count is allowed.
        let r = unsafe { put_array(std::ptr::null_mut(), out.as_mut_ptr(), &items) };
        assert_eq!(r, Err(NvmlError::InvalidArgument));
    }

    #[test]
    fn prefixes_stop_at_the_given_size() {
        let mut out = [0u8; 8];
        let value = [1u8, 2, 3, 4, 5, 6, 7, 8];
        // SAFETY: out holds 8 bytes.
        unsafe { put_prefix(out.as_mut_ptr().cast::<[u8; 8]>(), &value, 3) }.unwrap();
        assert_eq!(out, [1, 2, 3, 0, 0, 0, 0, 0]);
    }
}
