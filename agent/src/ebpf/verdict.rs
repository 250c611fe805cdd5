//! The epochs of the ioctl programs' caches (`tessera_ebpf_common::verdict`
//! has the invariants): the device cache says whether a device number is
//! watched, which depends only on `WATCHED_DEVS`, so the agent writes a
//! fresh device epoch after each change of the watched devices
//! ([`VerdictCache`]); the bypass check's cgroup cache has an epoch of its
//! own, advanced after every change of the watched cgroups, and the task
//! cache (processes that need no bypass report) one advanced after every
//! removal of a registration ([`AgentEpoch`]). An epoch of 0 (never written) keeps a cache off.

use aya::{
    Ebpf,
    maps::{Array, MapData},
};
use tessera_ebpf_common::{
    names,
    verdict::{CGROUP_EPOCH, DEVICE_EPOCH, TASK_EPOCH, agent_device_epoch},
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

/// An epoch only the agent writes: of the cgroup cache (every change of
/// the watched cgroups is followed by a new value) or of the task cache
/// (every removal of a registration is); 0 (never written) keeps the cache
/// off.
#[derive(Debug)]
pub(super) struct AgentEpoch {
    index: u32,
    value: u64,
}

impl AgentEpoch {
    /// The cgroup cache's epoch.
    pub(super) fn cgroups() -> Self {
        Self {
            index: CGROUP_EPOCH,
            value: 0,
        }
    }

    /// The task cache's epoch.
    pub(super) fn tasks() -> Self {
        Self {
            index: TASK_EPOCH,
            value: 0,
        }
    }

    /// Writes the next epoch: every verdict cached under this one is void.
    pub(super) fn advance(&mut self, ebpf: &mut Ebpf) -> Result<(), ObserverError> {
        self.value = self.value.wrapping_add(1).max(1);
        write_epoch(ebpf, self.index, self.value)
    }
}

fn write_epoch(ebpf: &mut Ebpf, index: u32, value: u64) -> Result<(), ObserverError> {
    let name = names::EPOCHS;
    let err = ObserverError::map(name);
    let map = ebpf.map_mut(name).ok_or(ObserverError::Missing(name))?;
    let mut epochs = Array::<&mut MapData, u64>::try_from(map).map_err(err)?;
    epochs.set(index, value, 0).map_err(err)
}
