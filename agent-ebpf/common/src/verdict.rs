//! The ioctl programs' cache of files known *not* to be watched devices,
//! and the epochs that invalidate it.
//!
//! Most ioctls on a node are on sockets, ttys and other devices nobody
//! watches; proving that takes two kernel reads after the fd lookup
//! (`file->f_inode->i_rdev`) and a hash lookup. The programs remember, per
//! CPU, in a direct-mapped array indexed by a hash of the `struct file`
//! pointer, that a file is not watched, stamped with the device epoch read
//! *before* the file was resolved. An entry counts only while its pointer
//! and epoch both match.
//!
//! Invariants that make a stale "not watched" impossible (a process must
//! not hide watched ioctls behind a file pointer reused by a later open):
//! - a struct file's device never changes while it lives, so an entry can
//!   only go stale when its memory is freed and reused for a new file;
//! - every new file of a watched device is opened through the device
//!   cgroup check, where the `dev_open_epoch` program, attached to the
//!   cgroup v2 root (every task), bumps the device epoch before the open
//!   completes (before the file reaches any fd table); fds passed by
//!   `SCM_RIGHTS`, `pidfd_getfd`, `dup` or fork share a file that was
//!   opened so;
//! - the agent writes a new epoch after every change of the watched
//!   devices (its generation in the high half: [`agent_device_epoch`]);
//! - epoch 0 means "no epoch program attached": the cache is neither read
//!   nor written, and every ioctl is resolved;
//! - only the ioctl programs touch the array, and they run with
//!   preemption disabled (syscall tracepoints, raw tracepoints and kprobes
//!   all do), so one CPU's slot is never written by two runs at once.
//!
//! The bypass check caches the same way, per CPU, which watched cgroup a
//! cgroup is in ([`CgroupVerdict`]), so host processes using NVIDIA
//! devices do not walk their cgroup ancestry on every ioctl; only the
//! ioctl programs use that cache (device programs can be preempted).
//!
//! Only negative file verdicts are cached: a file of a watched device is
//! resolved on every ioctl, so a reused pointer can never make an
//! unwatched file count as watched either.

/// Slots of the per-CPU cache (a power of two).
pub const FILE_SLOTS: u32 = 1024;

/// Index of the device epoch in the `EPOCHS` array.
pub const DEVICE_EPOCH: u32 = 0;
/// Index of the cgroup epoch: written by the agent after every change of
/// the watched cgroups, never by the kernel; 0 turns the cgroup cache off.
pub const CGROUP_EPOCH: u32 = 1;
/// Number of epochs.
pub const EPOCHS: u32 = 2;

/// Slots of the per-CPU cgroup cache (a power of two).
pub const CGROUP_SLOTS: u32 = 256;

/// One slot: `file` is not a watched device as of device epoch `epoch`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileVerdict {
    /// The `struct file` pointer.
    pub file: u64,
    /// The device epoch read before the file was resolved.
    pub epoch: u64,
}

/// One slot of the cgroup cache: the watched cgroup that cgroup
/// `cgroup_id` is in (itself or an ancestor), 0 for none, as of cgroup
/// epoch `epoch`. Valid for as long as the epoch holds: cgroup ids are
/// never reused and a cgroup never changes parent, so the answer depends
/// only on the watched set, whose every change gets a new epoch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupVerdict {
    /// The cgroup asked about.
    pub cgroup_id: u64,
    /// The cgroup epoch read before the ancestry was walked.
    pub epoch: u64,
    /// The watched cgroup it is in, 0 for none.
    pub watched: u64,
}

/// The slot of cgroup `id` in the cgroup cache.
pub const fn cgroup_slot(id: u64) -> u32 {
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CGROUP_SLOTS.trailing_zeros())) as u32
}

/// The slot of `file`: a multiplicative hash of the pointer (slab objects
/// share their low bits), reduced to `FILE_SLOTS`.
pub const fn file_slot(file: u64) -> u32 {
    (file.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FILE_SLOTS.trailing_zeros())) as u32
}

/// The device epoch the agent writes for its `generation`-th change of the
/// watched devices (from 1): the generation in the high half, the kernel's
/// open bumps counting up in the low half. A value the agent writes was
/// never seen before (unless 2^32 watched opens happen between two agent
/// changes), whatever bumps it overwrites, and is never 0.
pub const fn agent_device_epoch(generation: u32) -> u64 {
    (generation as u64) << 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stay_in_range_and_spread_slab_neighbours() {
        let base = 0xffff_8881_0a3c_0000u64;
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..64 {
            let slot = file_slot(base + i * 256);
            assert!(slot < FILE_SLOTS);
            seen.insert(slot);
        }
        // 64 consecutive 256-byte objects land in (nearly) distinct slots.
        assert!(seen.len() >= 60, "{}", seen.len());
        assert_eq!(FILE_SLOTS.count_ones(), 1);
    }

    #[test]
    fn agent_epochs_are_fresh_and_never_zero() {
        assert_ne!(agent_device_epoch(1), 0);
        assert!(agent_device_epoch(2) > agent_device_epoch(1) + u64::from(u32::MAX));
        assert_eq!(core::mem::size_of::<FileVerdict>(), 16);
        assert_eq!(core::mem::size_of::<CgroupVerdict>(), 24);
        assert!((0..1000).all(|id| cgroup_slot(id) < CGROUP_SLOTS));
    }
}
