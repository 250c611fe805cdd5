//! Device handles (`nvmlDevice_t`).
//!
//! A handle is the address of one byte of a private static array, one byte
//! per possible GPU. Telling which GPU a handle names is pointer arithmetic
//! on its value: a handle is never dereferenced, so a stale, forged or
//! foreign pointer is rejected (`NVML_ERROR_INVALID_ARGUMENT`) rather than
//! read. Handles stay the same across `nvmlShutdown` / `nvmlInit`, as the
//! GPUs do.

use std::ffi::c_void;

use gpusim::layout::MAX_GPUS;

use crate::abi::DeviceHandle;

/// One distinct address per GPU index.
static SLOTS: [u8; MAX_GPUS] = [0; MAX_GPUS];

/// The handle of GPU `index` (`index < MAX_GPUS`).
pub fn of(index: usize) -> DeviceHandle {
    debug_assert!(index < MAX_GPUS);
    SLOTS
        .as_ptr()
        .wrapping_add(index.min(MAX_GPUS - 1))
        .cast::<c_void>()
        .cast_mut()
}

/// The GPU index a handle names, if it is one of ours.
pub fn index(handle: DeviceHandle) -> Option<usize> {
    let base = SLOTS.as_ptr() as usize;
    let addr = handle as usize;
    (base..base + MAX_GPUS).contains(&addr).then(|| addr - base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_foreign_pointers_are_rejected() {
        for i in 0..MAX_GPUS {
            assert_eq!(index(of(i)), Some(i));
        }
        assert_eq!(index(std::ptr::null_mut()), None);
        let mut other = 0u8;
        assert_eq!(index((&raw mut other).cast()), None);
        assert_eq!(index(of(MAX_GPUS - 1).wrapping_byte_add(1)), None);
    }
}
