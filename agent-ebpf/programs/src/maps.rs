//! The object's maps; names and layouts are in `tessera_ebpf_common::names`.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use tessera_ebpf_common::{
    dev::WatchedDevice,
    keys::{IoctlKey, OpenKey},
    rm::{RmClient, RmClientKey, RmObject, RmObjectKey, RmProcess},
    stats,
    uvm::{GpuUse, GpuUseKey},
    verdict::{self, CgroupVerdict, DevVerdict, TaskVerdict},
};

/// Devices to count, keyed by kernel `dev_t`; filled by the agent.
#[map(name = "WATCHED_DEVS")]
pub static WATCHED_DEVS: HashMap<u32, WatchedDevice> = HashMap::with_max_entries(1024, 0);

/// ioctl counts. The agent may resize it before loading.
#[map(name = "IOCTL_COUNTS")]
pub static IOCTL_COUNTS: PerCpuHashMap<IoctlKey, u64> = PerCpuHashMap::with_max_entries(16384, 0);

/// Device access-check (open) counts.
#[map(name = "OPEN_COUNTS")]
pub static OPEN_COUNTS: PerCpuHashMap<OpenKey, u64> = PerCpuHashMap::with_max_entries(4096, 0);

/// The programs' own counters, indexed by `stats::*`.
#[map(name = "OBS_STATS")]
pub static OBS_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stats::LEN, 0);

/// Processes registered with the preload (tgid → 0); filled by the agent.
#[map(name = "REGISTERED")]
pub static REGISTERED: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

/// Processes already reported as bypassing (tgid → ktime of the report).
#[map(name = "REPORTED")]
pub static REPORTED: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// Cgroups whose subtrees must register (cgroup id → 0); filled by the
/// agent with the GPU pods' cgroups.
#[map(name = "WATCHED_CGROUPS")]
pub static WATCHED_CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(4096, 0);

/// Bypass events. Rare (one per offending process), so 64 KiB is plenty.
#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// UVM GPU registrations per cgroup.
#[map(name = "GPU_USE")]
pub static GPU_USE: HashMap<GpuUseKey, GpuUse> = HashMap::with_max_entries(4096, 0);

/// Live video-memory objects (LRU: objects of exited processes age out).
#[map(name = "RM_OBJECTS")]
pub static RM_OBJECTS: LruHashMap<RmObjectKey, RmObject> = LruHashMap::with_max_entries(65536, 0);

/// Video memory per RM client (LRU: clients of exited processes age out).
#[map(name = "RM_CLIENTS")]
pub static RM_CLIENTS: LruHashMap<RmClientKey, RmClient> = LruHashMap::with_max_entries(16384, 0);

/// Video-memory estimate per process; removed when the process exits.
#[map(name = "RM_PROCS")]
pub static RM_PROCS: HashMap<u32, RmProcess> = HashMap::with_max_entries(16384, 0);

/// Whether a device number is watched, per CPU (see
/// `tessera_ebpf_common::verdict`); written only by the ioctl programs.
#[map(name = "DEV_VERDICTS")]
pub static DEV_VERDICTS: PerCpuArray<DevVerdict> =
    PerCpuArray::with_max_entries(verdict::DEV_SLOTS, 0);

/// Which watched cgroup a cgroup is in, per CPU; written only by the
/// ioctl programs.
#[map(name = "CGROUP_VERDICTS")]
pub static CGROUP_VERDICTS: PerCpuArray<CgroupVerdict> =
    PerCpuArray::with_max_entries(verdict::CGROUP_SLOTS, 0);

/// Processes that need no bypass report, per CPU; written only by the
/// ioctl programs.
#[map(name = "TASK_VERDICTS")]
pub static TASK_VERDICTS: PerCpuArray<TaskVerdict> =
    PerCpuArray::with_max_entries(verdict::TASK_SLOTS, 0);

/// The epochs that invalidate `DEV_VERDICTS`, `CGROUP_VERDICTS` and
/// `TASK_VERDICTS`, written by the agent.
#[map(name = "EPOCHS")]
pub static EPOCHS: Array<u64> = Array::with_max_entries(verdict::EPOCHS, 0);
