//! Whether a device number is watched, answered from the per-CPU device
//! cache (`tessera_ebpf_common::verdict`, where the invariants are) before
//! asking `WATCHED_DEVS`.

use tessera_ebpf_common::{
    dev::WatchedDevice,
    stats,
    verdict::{DEVICE_EPOCH, DevVerdict, dev_slot},
};

use crate::{
    counters::stat,
    maps::{DEV_VERDICTS, EPOCHS, WATCHED_DEVS},
};

/// The watch entry of device `rdev`, `None` if it is not watched (or not
/// a device: 0).
#[inline(always)]
pub fn watched_dev(rdev: u32) -> Option<WatchedDevice> {
    if rdev == 0 {
        return None;
    }
    // The epoch is read before `WATCHED_DEVS`: a verdict is stamped with
    // an epoch no later than the map it saw.
    let epoch = match EPOCHS.get_ptr(DEVICE_EPOCH) {
        // SAFETY: an element of a live array; volatile, as the agent
        // changes it.
        Some(p) => unsafe { core::ptr::read_volatile(p) },
        None => 0,
    };
    let slot = DEV_VERDICTS.get_ptr_mut(dev_slot(rdev));
    if epoch != 0
        && let Some(slot) = slot
    {
        // SAFETY: this CPU's element of a live per-CPU array; only ioctl
        // programs, which are not preempted, access it.
        let cached = unsafe { *slot };
        if cached.rdev == rdev && cached.epoch == epoch {
            if cached.watched != 0 {
                return Some(cached.device);
            }
            stat(stats::VERDICT_CACHED);
            return None;
        }
    }
    // SAFETY: the value is copied out at once; a concurrent update by the
    // agent can at worst give the old or the new entry (and a new epoch
    // follows it).
    let watched = unsafe { WATCHED_DEVS.get(rdev) }.copied();
    if epoch != 0
        && let Some(slot) = slot
    {
        // SAFETY: as above.
        unsafe {
            *slot = DevVerdict {
                rdev,
                watched: u32::from(watched.is_some()),
                device: watched.unwrap_or_default(),
                epoch,
            }
        };
    }
    watched
}
