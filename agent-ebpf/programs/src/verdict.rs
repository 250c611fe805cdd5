//! Whether an open file is a watched device, answered from the per-CPU
//! cache of files known not to be (`tessera_ebpf_common::verdict`, where
//! the invariants are) before reading the file's device number.

use tessera_ebpf_common::{
    config::KernelOffsets,
    dev::WatchedDevice,
    stats,
    verdict::{DEVICE_EPOCH, FileVerdict, file_slot},
};

use crate::{
    counters::stat,
    kernel,
    maps::{EPOCHS, FILE_VERDICTS, WATCHED_DEVS},
};

/// The device number and watch entry of `file`, `None` if it is not a
/// watched device (or cannot be resolved, counted in `FD_UNRESOLVED`).
#[inline(always)]
pub fn watched_file(file: *const u8, off: &KernelOffsets) -> Option<(u32, WatchedDevice)> {
    // The epoch is read before the file is resolved: a verdict is stamped
    // with an epoch no later than what it saw.
    let epoch = match EPOCHS.get_ptr(DEVICE_EPOCH) {
        // SAFETY: an element of a live array; volatile, as the agent and
        // other CPUs change it.
        Some(p) => unsafe { core::ptr::read_volatile(p) },
        None => 0,
    };
    let slot = FILE_VERDICTS.get_ptr_mut(file_slot(file as u64));
    if epoch != 0
        && let Some(slot) = slot
    {
        // SAFETY: this CPU's element of a live per-CPU array; only ioctl
        // programs, which are not preempted, access it.
        let cached = unsafe { *slot };
        if cached.file == file as u64 && cached.epoch == epoch {
            stat(stats::VERDICT_CACHED);
            return None;
        }
    }
    let Some(rdev) = kernel::file_rdev(file, off) else {
        stat(stats::FD_UNRESOLVED);
        return None;
    };
    if rdev != 0 {
        // SAFETY: the value is copied out at once; a concurrent update by
        // the agent can at worst give the old or the new entry.
        if let Some(watched) = unsafe { WATCHED_DEVS.get(rdev) }.copied() {
            return Some((rdev, watched));
        }
    }
    if epoch != 0
        && let Some(slot) = slot
    {
        // SAFETY: as above.
        unsafe {
            *slot = FileVerdict {
                file: file as u64,
                epoch,
            }
        };
    }
    None
}
