//! The ioctl programs' caches and the epochs that invalidate them.
//!
//! Every ioctl on a node enters the programs, and most are on sockets,
//! ttys and devices nobody watches. After the fd walk gives the file's
//! device number (`i_rdev`; 0 for sockets, pipes and regular files, which
//! are rejected at once), the programs ask a per-CPU direct-mapped array
//! indexed by a hash of the device number ([`DevVerdict`]) whether that
//! device is watched, and how: an inlined array lookup instead of a hash
//! lookup of `WATCHED_DEVS`. An entry counts only while its device number
//! and epoch both match.
//!
//! Why it cannot go stale: the answer is a function of the device number
//! and `WATCHED_DEVS` alone, which only the agent writes, and after every
//! change of which it writes a fresh device epoch (its generation in the
//! high half: [`agent_device_epoch`]); an entry is stamped with the epoch
//! read *before* `WATCHED_DEVS` was. It is keyed by the device, not by the
//! `struct file`, so freed and reused files, `dup2` over a cached fd and
//! fds passed between processes cannot confuse it. Epoch 0 (never written)
//! means the cache is off: every ioctl asks `WATCHED_DEVS`.
//!
//! Only the ioctl programs touch the per-CPU arrays, and they run with
//! preemption disabled (syscall tracepoints, raw tracepoints and kprobes
//! all do), so one CPU's slot is never written by two runs at once.
//!
//! The bypass check caches the same way, per CPU, which watched cgroup a
//! cgroup is in ([`CgroupVerdict`]), so host processes using NVIDIA
//! devices do not walk their cgroup ancestry on every ioctl; only the
//! ioctl programs use that cache (device programs can be preempted).
//! Inside a watched cgroup, it then asks a per-CPU cache of processes
//! known to need no report ([`TaskVerdict`]) before the `REGISTERED` and
//! `REPORTED` hash lookups.

use crate::dev::WatchedDevice;

/// Slots of the per-CPU device cache (a power of two).
pub const DEV_SLOTS: u32 = 256;

/// Index of the device epoch in the `EPOCHS` array: written by the agent
/// after every change of the watched devices, never by the kernel.
pub const DEVICE_EPOCH: u32 = 0;
/// Index of the cgroup epoch: written by the agent after every change of
/// the watched cgroups, never by the kernel; 0 turns the cgroup cache off.
pub const CGROUP_EPOCH: u32 = 1;
/// Index of the task epoch: written by the agent after every removal of a
/// registration, never by the kernel; 0 turns the task cache off.
pub const TASK_EPOCH: u32 = 2;
/// Number of epochs.
pub const EPOCHS: u32 = 3;

/// Slots of the per-CPU task cache (a power of two).
pub const TASK_SLOTS: u32 = 256;

/// One slot of the task cache: process `tgid`, whose leader thread started
/// at `start_ns` (`task_struct.start_time`), needs no bypass report (it is
/// registered, or already reported), as of task epoch `epoch`.
///
/// Only that positive answer is cached, so a registration added later is
/// never missed. It goes stale only when the registration is removed: by
/// the agent, which advances the task epoch after every removal, or by the
/// process's exit, after which a process reusing the tgid has another
/// start time. A "reported" answer never goes stale while the process
/// lives (reports are once per process).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskVerdict {
    /// The process.
    pub tgid: u32,
    /// Zero.
    pub reserved: u32,
    /// Its leader's start time (ns since boot, `CLOCK_MONOTONIC`).
    pub start_ns: u64,
    /// The task epoch read before the registration was looked up.
    pub epoch: u64,
}

/// The slot of process `tgid` in the task cache.
pub const fn task_slot(tgid: u32) -> u32 {
    ((tgid as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - TASK_SLOTS.trailing_zeros())) as u32
}

/// Slots of the per-CPU cgroup cache (a power of two).
pub const CGROUP_SLOTS: u32 = 256;

/// One slot of the device cache: whether device `rdev` is watched, and
/// its entry, as of device epoch `epoch`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevVerdict {
    /// The device asked about (kernel `dev_t`, never 0).
    pub rdev: u32,
    /// 1 if it is watched, 0 if not.
    pub watched: u32,
    /// Its `WATCHED_DEVS` entry when watched, zero otherwise.
    pub device: WatchedDevice,
    /// The device epoch read before `WATCHED_DEVS` was.
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

/// The slot of device `rdev` in the device cache: a multiplicative hash,
/// so neighbouring minors of one major spread over the slots.
pub const fn dev_slot(rdev: u32) -> u32 {
    ((rdev as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - DEV_SLOTS.trailing_zeros())) as u32
}

/// The device epoch the agent writes for its `generation`-th change of the
/// watched devices (from 1), in the high half (the layout of earlier
/// objects, whose kernel side bumped the low half): never 0, never
/// repeated while the agent runs.
pub const fn agent_device_epoch(generation: u32) -> u64 {
    (generation as u64) << 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stay_in_range_and_spread_one_major() {
        let mut seen = std::collections::BTreeSet::new();
        for minor in 0..64 {
            let slot = dev_slot(crate::dev::kdev(195, minor));
            assert!(slot < DEV_SLOTS);
            seen.insert(slot);
        }
        // 64 minors of the NVIDIA major land in (nearly) distinct slots.
        assert!(seen.len() >= 56, "{}", seen.len());
        assert_eq!(DEV_SLOTS.count_ones(), 1);
    }

    #[test]
    fn agent_epochs_are_fresh_and_never_zero() {
        assert_ne!(agent_device_epoch(1), 0);
        assert!(agent_device_epoch(2) > agent_device_epoch(1) + u64::from(u32::MAX));
        assert_eq!(core::mem::size_of::<DevVerdict>(), 24);
        assert_eq!(core::mem::size_of::<CgroupVerdict>(), 24);
        assert_eq!(core::mem::size_of::<TaskVerdict>(), 24);
        assert!((0..1000).all(|tgid| task_slot(tgid) < TASK_SLOTS));
        assert!((0..1000).all(|id| cgroup_slot(id) < CGROUP_SLOTS));
    }
}
