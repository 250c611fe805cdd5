//! The epochs of the ioctl programs' caches (`tessera_ebpf_common::verdict`
//! has the invariants): the device cache says whether a device number is
//! watched, which depends only on `WATCHED_DEVS`, so the agent writes a
//! fresh device epoch after each change of the watched devices
//! ([`VerdictCache`]); the bypass check's cgroup cache has an epoch of its
//! own, advanced after every change of the watched cgroups
//! ([`CgroupEpoch`]). An epoch of 0 (never written) keeps a cache off.

use aya::{
    Ebpf,
    maps::{Array, MapData},
};
use tessera_ebpf_common::{
    names,
    verdict::{CGROUP_EPOCH, DEVICE_EPOCH, agent_device_epoch},
};

use super::observer::ObserverError;

/// The device cache; `generation` is the agent's last epoch generation.
#[derive(Debug)]
pub(super) struct VerdictCache {
    generation: u32,
}

impl VerdictCache {
    /// Turns the cache on (the first epoch). Call after the watched
    /// devices are written.
    pub(super) fn enable(ebpf: &mut Ebpf) -> Result<Self, ObserverError> {
        let mut cache = Self { generation: 0 };
        cache.invalidate(ebpf)?;
        Ok(cache)
    }

    /// Writes a fresh device epoch: every cached verdict is void. Call
    /// after the watched devices changed.
    pub(super) fn invalidate(&mut self, ebpf: &mut Ebpf) -> Result<(), ObserverError> {
        self.generation = self.generation.wrapping_add(1).max(1);
        write_epoch(ebpf, DEVICE_EPOCH, agent_device_epoch(self.generation))
    }
}

/// The cgroup cache's epoch, which only the agent writes: every change of
/// the watched cgroups is followed by a new value; 0 (never written) keeps
/// the cache off.
#[derive(Debug, Default)]
pub(super) struct CgroupEpoch(u64);

impl CgroupEpoch {
    /// Writes the next epoch: every cached cgroup verdict is void.
    pub(super) fn advance(&mut self, ebpf: &mut Ebpf) -> Result<(), ObserverError> {
        self.0 = self.0.wrapping_add(1).max(1);
        write_epoch(ebpf, CGROUP_EPOCH, self.0)
    }
}

fn write_epoch(ebpf: &mut Ebpf, index: u32, value: u64) -> Result<(), ObserverError> {
    let name = names::EPOCHS;
    let err = ObserverError::map(name);
    let map = ebpf.map_mut(name).ok_or(ObserverError::Missing(name))?;
    let mut epochs = Array::<&mut MapData, u64>::try_from(map).map_err(err)?;
    epochs.set(index, value, 0).map_err(err)
}
