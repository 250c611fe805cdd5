//! The ioctl programs' cache of files known not to be watched devices
//! (`tessera_ebpf_common::verdict` has the invariants): the agent attaches
//! `dev_open_epoch` to the cgroup v2 root, which makes every open of a
//! watched device on the node invalidate the cache, and only then turns
//! the cache on by writing a non-zero device epoch; it writes a fresh
//! epoch after each change of the watched devices.
//!
//! Without the epoch program (no cgroup v2, a kernel that refuses a link
//! on the root) the epoch stays 0 and every ioctl is resolved: slower,
//! never wrong. The cgroup cache of the bypass check has an epoch of its
//! own, which the agent advances after every change of the watched
//! cgroups ([`CgroupEpoch`]).

use std::path::PathBuf;

use aya::{
    Ebpf,
    maps::{Array, MapData},
    programs::{CgroupAttachMode, CgroupDevice},
};
use tessera_ebpf_common::{
    names,
    verdict::{CGROUP_EPOCH, DEVICE_EPOCH, agent_device_epoch},
};

use super::load;
use super::observer::ObserverError;
use crate::cgroup;

/// The cache is on; `generation` is the agent's last epoch generation.
#[derive(Debug)]
pub(super) struct VerdictCache {
    generation: u32,
    root: PathBuf,
}

impl VerdictCache {
    /// Attaches the epoch program to the cgroup v2 root, then turns the
    /// cache on.
    pub(super) fn enable(ebpf: &mut Ebpf) -> Result<Self, ObserverError> {
        let root = cgroup::cgroup2_root().map_err(ObserverError::NoCgroup2)?;
        let dir = std::fs::File::open(&root).map_err(|source| ObserverError::Cgroup {
            path: root.clone(),
            source,
        })?;
        // A bpf link: coexists with every other device program and never
        // denies.
        load::load_attach(ebpf, names::PROG_DEVICE_EPOCH, |p: &mut CgroupDevice| {
            p.attach(dir, CgroupAttachMode::Single).map(drop)
        })?;
        let mut cache = Self {
            generation: 0,
            root,
        };
        cache.invalidate(ebpf)?;
        Ok(cache)
    }

    /// The cgroup v2 root the epoch program is attached to.
    pub(super) fn root(&self) -> &std::path::Path {
        &self.root
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
