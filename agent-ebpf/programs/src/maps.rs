//! The object's maps; names and layouts are in `tessera_ebpf_common::names`.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
};
use tessera_ebpf_common::{
    dev::WatchedDevice,
    keys::{IoctlKey, OpenKey},
    stats,
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
