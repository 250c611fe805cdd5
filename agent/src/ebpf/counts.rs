//! What the observer has counted, summed over CPUs.

use std::collections::BTreeMap;

use tessera_ebpf_common::{
    keys::{IoctlKey, OpenKey},
    stats,
};

/// The programs' own counters (`OBS_STATS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramStats {
    /// ioctls whose fd did not resolve to an inode.
    pub fd_unresolved: u64,
    /// Counts lost to a full map.
    pub count_dropped: u64,
    /// ioctls counted.
    pub ioctls_counted: u64,
    /// Opens counted.
    pub opens_counted: u64,
}

impl ProgramStats {
    /// From the per-index sums of `OBS_STATS`.
    pub fn from_sums(sums: &[u64]) -> Self {
        let at = |i: u32| sums.get(i as usize).copied().unwrap_or(0);
        Self {
            fd_unresolved: at(stats::FD_UNRESOLVED),
            count_dropped: at(stats::COUNT_DROPPED),
            ioctls_counted: at(stats::IOCTL_COUNTED),
            opens_counted: at(stats::OPEN_COUNTED),
        }
    }
}

/// One read of the count maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// ioctl counts per (cgroup, device, number, flags).
    pub ioctls: BTreeMap<IoctlKey, u64>,
    /// Open (access-check) counts per (cgroup, device, access).
    pub opens: BTreeMap<OpenKey, u64>,
    /// The programs' own counters.
    pub stats: ProgramStats,
}

impl Snapshot {
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
    }

    #[test]
    fn stats_tolerate_short_arrays() {
        let s = ProgramStats::from_sums(&[1, 2]);
        assert_eq!(
            (s.fd_unresolved, s.count_dropped, s.ioctls_counted),
            (1, 2, 0)
        );
    }
}
