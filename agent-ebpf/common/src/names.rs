//! Names of the maps, programs and globals in `tessera.bpf.o` and
//! `tessera-guard.bpf.o`.

/// `HashMap<u32 kernel dev_t, dev::WatchedDevice>`: the devices to count,
/// filled by the agent.
pub const WATCHED_DEVICES: &str = "WATCHED_DEVS";
/// `PerCpuHashMap<keys::IoctlKey, u64>`: ioctl counts.
pub const IOCTL_COUNTS: &str = "IOCTL_COUNTS";
/// `PerCpuHashMap<keys::OpenKey, u64>`: device open (access check) counts.
pub const OPEN_COUNTS: &str = "OPEN_COUNTS";
/// `PerCpuArray<u64>` indexed by `stats::*`: the programs' own counters.
pub const STATS: &str = "OBS_STATS";
/// `HashMap<u32 tgid, u32>`: processes registered with the preload,
/// filled by the agent; emptied of a process when it exits.
pub const REGISTERED: &str = "REGISTERED";
/// `LruHashMap<u32 tgid, u64 ktime>`: processes already reported as
/// bypassing the preload.
pub const REPORTED: &str = "REPORTED";
/// `HashMap<u64 cgroup id, u32>`: cgroups (with their subtrees) whose
/// processes must register, the GPU pods; filled by the agent.
pub const WATCHED_CGROUPS: &str = "WATCHED_CGROUPS";
/// `RingBuf` of `events::BypassEvent`.
pub const EVENTS: &str = "EVENTS";
/// `HashMap<uvm::GpuUseKey, uvm::GpuUse>`: UVM GPU registrations per cgroup.
pub const GPU_USE: &str = "GPU_USE";
/// `LruHashMap<rm::RmObjectKey, rm::RmObject>`: live video-memory objects.
pub const RM_OBJECTS: &str = "RM_OBJECTS";
/// `LruHashMap<rm::RmClientKey, rm::RmClient>`: video memory per RM client.
pub const RM_CLIENTS: &str = "RM_CLIENTS";
/// `HashMap<u32 tgid, rm::RmProcess>`: video-memory estimate per process.
pub const RM_PROCS: &str = "RM_PROCS";

/// `PerCpuArray<verdict::DevVerdict>` of `verdict::DEV_SLOTS`: whether a
/// device number is watched.
pub const DEV_VERDICTS: &str = "DEV_VERDICTS";
/// `PerCpuArray<verdict::CgroupVerdict>` of `verdict::CGROUP_SLOTS`: which
/// watched cgroup a cgroup is in.
pub const CGROUP_VERDICTS: &str = "CGROUP_VERDICTS";
/// `PerCpuArray<verdict::TaskVerdict>` of `verdict::TASK_SLOTS`: processes
/// that need no bypass report.
pub const TASK_VERDICTS: &str = "TASK_VERDICTS";
/// `Array<u64>` of `verdict::EPOCHS`: the epochs that invalidate
/// [`DEV_VERDICTS`], [`CGROUP_VERDICTS`] and [`TASK_VERDICTS`].
pub const EPOCHS: &str = "EPOCHS";

/// Global `config::ProgramConfig`, set by the agent before loading.
pub const CONFIG_GLOBAL: &str = "TESSERA_CONFIG";
/// Global `guard::GuardPolicy` of the guard object, set per pod.
pub const GUARD_GLOBAL: &str = "TESSERA_GUARD";

/// Tracepoint `syscalls/sys_enter_ioctl`; walks kernel structs with plain
/// loads after `bpf_rdonly_cast` (`config::RDONLY_CAST_MARK`).
pub const PROG_IOCTL_TRACEPOINT: &str = "ioctl_tp";
/// Raw tracepoint `sys_enter`; as [`PROG_IOCTL_TRACEPOINT`].
pub const PROG_IOCTL_RAW_TRACEPOINT: &str = "ioctl_raw_tp";
/// Kprobe on `nvidia_unlocked_ioctl` and `uvm_unlocked_ioctl_entry`; as
/// [`PROG_IOCTL_TRACEPOINT`].
pub const PROG_IOCTL_KPROBE: &str = "ioctl_kprobe";
/// [`PROG_IOCTL_TRACEPOINT`] reading with `bpf_probe_read_kernel`, for
/// kernels without `bpf_rdonly_cast` (before 6.2).
pub const PROG_IOCTL_TRACEPOINT_PROBE: &str = "ioctl_tp_probe";
/// [`PROG_IOCTL_RAW_TRACEPOINT`] so.
pub const PROG_IOCTL_RAW_TRACEPOINT_PROBE: &str = "ioctl_raw_tp_probe";
/// [`PROG_IOCTL_KPROBE`] so.
pub const PROG_IOCTL_KPROBE_PROBE: &str = "ioctl_kprobe_probe";
/// Cgroup device program counting opens of watched devices and reporting
/// the first by an unregistered process; never denies (Linux 6.4+).
pub const PROG_DEVICE_AUDIT: &str = "dev_open_audit";
/// Cgroup device program that only counts opens of watched devices; the
/// fallback where [`PROG_DEVICE_AUDIT`] does not load.
pub const PROG_DEVICE_COUNT: &str = "dev_open_count";
/// Tracepoint `sched/sched_process_exit`: forgets exited processes.
pub const PROG_PROCESS_EXIT: &str = "process_exit";
/// Cgroup device program of `tessera-guard.bpf.o`: the per-pod guard.
pub const PROG_POD_GUARD: &str = "pod_device_guard";
