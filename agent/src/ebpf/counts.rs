//! What the observer has counted (summed over CPUs), which GPUs cgroups
//! registered with UVM, and the per-process video-memory estimate.

use std::collections::BTreeMap;

use tessera_ebpf_common::{
    keys::{IoctlKey, OpenKey},
    rm::RmProcess,
    stats,
    uvm::{GpuUse, GpuUseKey},
};

/// The programs' own counters (`OBS_STATS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramStats {
    /// ioctls whose fd did not resolve to an inode.
    pub fd_unresolved: u64,
    /// Counts lost to a full map (ioctls and opens; what was counted is
    /// [`Snapshot::ioctls_counted`] and [`Snapshot::opens_counted`]).
    pub count_dropped: u64,
    /// Bypass events sent.
    pub bypass_reported: u64,
    /// Bypass events lost to a full ring buffer.
    pub events_dropped: u64,
    /// Video-memory allocations added to the estimate.
    pub rm_allocs_tracked: u64,
    /// RM/UVM arguments unreadable, of unknown size or FINN-serialised.
    pub args_unreadable: u64,
    /// GPU-use or memory-estimate updates lost to a full map.
    pub track_dropped: u64,
    /// ioctls rejected from the cache of files known not to be watched.
    pub verdicts_cached: u64,
}

impl ProgramStats {
    /// From the per-index sums of `OBS_STATS`.
    pub fn from_sums(sums: &[u64]) -> Self {
        let at = |i: u32| sums.get(i as usize).copied().unwrap_or(0);
        Self {
            fd_unresolved: at(stats::FD_UNRESOLVED),
            count_dropped: at(stats::COUNT_DROPPED),
            bypass_reported: at(stats::BYPASS_REPORTED),
            events_dropped: at(stats::EVENT_DROPPED),
            rm_allocs_tracked: at(stats::RM_ALLOC_TRACKED),
            args_unreadable: at(stats::ARG_UNREADABLE),
            track_dropped: at(stats::TRACK_DROPPED),
            verdicts_cached: at(stats::VERDICT_CACHED),
        }
    }
}

/// One read of the observer's maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// ioctl counts per (cgroup, device, number, flags).
    pub ioctls: BTreeMap<IoctlKey, u64>,
    /// Open (access-check) counts per (cgroup, device, access).
    pub opens: BTreeMap<OpenKey, u64>,
    /// UVM GPU registrations per (cgroup, GPU UUID).
    pub gpu_use: BTreeMap<GpuUseKey, GpuUse>,
    /// Video-memory estimate per live process (tgid), from RM_ALLOC and
    /// RM_FREE: requested sizes, not what the driver granted.
    pub rm_procs: BTreeMap<u32, RmProcess>,
    /// The programs' own counters.
    pub stats: ProgramStats,
}

impl Snapshot {
    /// ioctls counted, all cgroups and devices (not those a full map lost,
    /// which are in `stats.count_dropped`).
    pub fn ioctls_counted(&self) -> u64 {
        self.ioctls.values().sum()
    }

    /// Opens counted, all cgroups and devices.
    pub fn opens_counted(&self) -> u64 {
        self.opens.values().sum()
    }

    /// Every ioctl count of cgroup `cgroup_id`, by (device, number, flags).
    pub fn ioctls_of(&self, cgroup_id: u64) -> Vec<(IoctlKey, u64)> {
        self.ioctls
            .iter()
            .filter(|(k, _)| k.cgroup_id == cgroup_id)
            .map(|(k, n)| (*k, *n))
            .collect()
    }

    /// ioctls from cgroup `cgroup_id` on device `kdev`, all numbers.
    pub fn ioctls_on(&self, cgroup_id: u64, kdev: u32) -> u64 {
        self.ioctls
            .iter()
            .filter(|(k, _)| k.cgroup_id == cgroup_id && k.dev == kdev)
            .map(|(_, n)| n)
            .sum()
    }

    /// ioctls from cgroup `cgroup_id` on device `kdev` with number `nr`
    /// and flags `flags`.
    pub fn ioctls_nr(&self, cgroup_id: u64, kdev: u32, nr: u32, flags: u32) -> u64 {
        let key = IoctlKey {
            cgroup_id,
            dev: kdev,
            nr,
            flags,
            reserved: 0,
        };
        self.ioctls.get(&key).copied().unwrap_or(0)
    }

    /// Opens from cgroup `cgroup_id` of device `kdev`, any access.
    pub fn opens_of(&self, cgroup_id: u64, kdev: u32) -> u64 {
        self.opens
            .iter()
            .filter(|(k, _)| k.cgroup_id == cgroup_id && k.dev == kdev)
            .map(|(_, n)| n)
            .sum()
    }

    /// UUIDs of the GPUs processes of cgroup `cgroup_id` registered with
    /// UVM, with the registrations seen.
    pub fn gpus_of(&self, cgroup_id: u64) -> Vec<([u8; 16], GpuUse)> {
        self.gpu_use
            .iter()
            .filter(|(k, _)| k.cgroup_id == cgroup_id)
            .map(|(k, v)| (k.uuid, *v))
            .collect()
    }

    /// Estimated live video memory of the processes that allocated from
    /// cgroup `cgroup_id` (requested bytes).
    pub fn rm_bytes_of(&self, cgroup_id: u64) -> u64 {
        self.rm_procs
            .values()
            .filter(|p| p.cgroup_id == cgroup_id)
            .map(RmProcess::live)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_by_cgroup_and_device() {
        let key = |cgroup_id, dev, nr| IoctlKey {
            cgroup_id,
            dev,
            nr,
            flags: 0,
            reserved: 0,
        };
        let mut s = Snapshot::default();
        s.ioctls.insert(key(7, 3, 1), 4);
        s.ioctls.insert(key(7, 3, 2), 5);
        s.ioctls.insert(key(7, 5, 1), 100);
        s.ioctls.insert(key(8, 3, 1), 1000);
        s.opens.insert(
            OpenKey {
                cgroup_id: 7,
                dev: 3,
                access: 2,
            },
            2,
        );
        s.opens.insert(
            OpenKey {
                cgroup_id: 7,
                dev: 3,
                access: 6,
            },
            1,
        );
        assert_eq!(s.ioctls_on(7, 3), 9);
        assert_eq!(s.ioctls_nr(7, 3, 2, 0), 5);
        assert_eq!(s.ioctls_nr(7, 3, 2, 1), 0);
        assert_eq!(s.ioctls_on(9, 3), 0);
        assert_eq!(s.opens_of(7, 3), 3);
        assert_eq!(s.ioctls_counted(), 1109);
        assert_eq!(s.ioctls_of(8), vec![(key(8, 3, 1), 1000)]);
        assert_eq!(s.ioctls_of(7).len(), 3);
        assert_eq!(s.opens_counted(), 3);
    }

    #[test]
    fn gpu_use_and_memory_by_cgroup() {
        let mut s = Snapshot::default();
        let use_ = |n| GpuUse {
            first_ns: 1,
            registrations: n,
            first_tgid: 10,
            reserved: 0,
        };
        s.gpu_use.insert(
            GpuUseKey {
                cgroup_id: 7,
                uuid: [1; 16],
            },
            use_(2),
        );
        s.gpu_use.insert(
            GpuUseKey {
                cgroup_id: 8,
                uuid: [2; 16],
            },
            use_(1),
        );
        assert_eq!(s.gpus_of(7), vec![([1; 16], use_(2))]);
        assert!(s.gpus_of(9).is_empty());
        let proc_ = |cgroup_id, live_bytes| RmProcess {
            cgroup_id,
            live_bytes,
            ..RmProcess::default()
        };
        s.rm_procs.insert(100, proc_(7, 1 << 20));
        s.rm_procs.insert(101, proc_(7, 3 << 20));
        s.rm_procs.insert(102, proc_(7, 0u64.wrapping_sub(4096)));
        s.rm_procs.insert(103, proc_(8, 5));
        assert_eq!(s.rm_bytes_of(7), 4 << 20);
        assert_eq!(s.rm_bytes_of(8), 5);
    }

    #[test]
    fn stats_tolerate_short_arrays() {
        let s = ProgramStats::from_sums(&[1, 2]);
        assert_eq!(
            (s.fd_unresolved, s.count_dropped, s.bypass_reported),
            (1, 2, 0)
        );
    }
}
