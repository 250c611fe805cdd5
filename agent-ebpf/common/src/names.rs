//! Names of the maps, programs and globals in `tessera.bpf.o`.

/// `HashMap<u32 kernel dev_t, dev::WatchedDevice>`: the devices to count,
/// filled by the agent.
pub const WATCHED_DEVICES: &str = "WATCHED_DEVS";
/// `PerCpuHashMap<keys::IoctlKey, u64>`: ioctl counts.
pub const IOCTL_COUNTS: &str = "IOCTL_COUNTS";
/// `PerCpuHashMap<keys::OpenKey, u64>`: device open (access check) counts.
pub const OPEN_COUNTS: &str = "OPEN_COUNTS";
/// `PerCpuArray<u64>` indexed by `stats::*`: the programs' own counters.
pub const STATS: &str = "OBS_STATS";

/// Global `config::ProgramConfig`, set by the agent before loading.
pub const CONFIG_GLOBAL: &str = "TESSERA_CONFIG";

/// Tracepoint `syscalls/sys_enter_ioctl`.
pub const PROG_IOCTL_TRACEPOINT: &str = "ioctl_tp";
/// Raw tracepoint `sys_enter`.
pub const PROG_IOCTL_RAW_TRACEPOINT: &str = "ioctl_raw_tp";
/// Kprobe on `nvidia_unlocked_ioctl` and `uvm_unlocked_ioctl_entry`.
pub const PROG_IOCTL_KPROBE: &str = "ioctl_kprobe";
/// Cgroup device program counting opens of watched devices; never denies.
pub const PROG_DEVICE_AUDIT: &str = "dev_open_audit";
