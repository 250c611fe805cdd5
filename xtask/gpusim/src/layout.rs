//! The node-wide shared state file, byte for byte.
//!
//! ```text
//! offset 0            Header (magic, version, sizes, node description)
//! offset GPU_OFFSET   GpuShared × gpu_count, each STATE_ALIGN-aligned
//! ```
//!
//! Every structure is `#[repr(C)]` and valid when all-zero, because a fresh
//! file is created by `ftruncate`. [`STATE_VERSION`] changes whenever a
//! layout changes; the header also records `size_of::<GpuShared>()`, so a
//! file written by a different build is refused rather than misread.
//!
//! Concurrency: everything inside [`GpuInner`] is touched only while the
//! GPU's robust mutex is held (`state.rs`); the atomics in [`GpuShared`] and
//! [`Header`] may be read without it. A holder may be SIGKILLed anywhere in
//! an update, with any subset of its stores landed: the next holder is told
//! (`GpuGuard::recovered`) and runs `timeline::repair` and a reap, so every
//! update must leave a state those two restore; in practice a process only
//! writes its own channel (which the reap releases once it is dead), other
//! dead processes' channels, and timeline fields `advance` re-checks.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// `b"GPUSIMST"`.
pub const STATE_MAGIC: [u8; 8] = *b"GPUSIMST";
/// Layout version of the state file.
pub const STATE_VERSION: u32 = 7;
/// GPUs a node may have.
pub const MAX_GPUS: usize = 16;
/// Processes that may hold a context on one GPU at a time.
pub const MAX_CHANNELS: usize = 64;
/// Ring capacity of a channel's launch queue.
pub const QUEUE_CAPACITY: usize = 1024;
/// Completion times remembered per channel for markers (stream syncs).
pub const MARKER_LOG: usize = 256;
/// Event slots per channel: an event's marker writes its completion time
/// into its own slot, so it is never forgotten however many markers follow.
pub const EVENT_SLOTS: usize = 4096;
/// Milliseconds of kernel launches each channel's [`LaunchLog`] keeps.
pub const LAUNCH_LOG_MS: usize = 512;
/// Utilisation history buckets per GPU.
pub const HISTORY_BUCKETS: usize = 1024;
/// Width of one history bucket (5 ms; 1024 buckets keep 5.12 s).
pub const BUCKET_NS: u64 = 5_000_000;
/// Xid events remembered per GPU.
pub const XID_LOG: usize = 64;
/// Room for the canonical node description in the header.
pub const NODE_TEXT_MAX: usize = 64 * 1024;
/// Alignment of the GPU blocks.
pub const STATE_ALIGN: usize = 4096;

/// File header.
#[repr(C)]
pub struct Header {
    /// [`STATE_MAGIC`].
    pub magic: [u8; 8],
    /// [`STATE_VERSION`].
    pub version: u32,
    /// `size_of::<Header>()` of the writer.
    pub header_size: u32,
    /// `size_of::<GpuShared>()` of the writer.
    pub gpu_size: u64,
    /// Total file size.
    pub total_size: u64,
    /// Number of GPU blocks.
    pub gpu_count: u32,
    /// Bytes used in `node`.
    pub node_len: u32,
    /// `/proc/sys/kernel/random/boot_id` of the boot that created the
    /// file: monotonic times and robust mutexes mean nothing after a reboot.
    pub boot_id: [u8; 36],
    /// Reserved.
    pub _reserved: [u8; 4],
    /// Bumped by every in-place reset.
    pub generation: AtomicU64,
    /// Canonical node description (JSON).
    pub node: [u8; NODE_TEXT_MAX],
}

/// One queued piece of work.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Item {
    /// [`ItemKind`] as u32.
    pub kind: u32,
    /// For markers: event slot + 1 whose time to set (0 = none).
    pub event_slot_plus_one: u32,
    /// Time still to run (ns).
    pub remaining_ns: u64,
}

/// What an [`Item`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ItemKind {
    /// A kernel: occupies the SMs.
    Kernel = 1,
    /// A copy: occupies the channel, counted as memory activity.
    Copy = 2,
    /// A zero-length marker (events, stream sync points).
    Marker = 3,
}

impl ItemKind {
    /// Decodes a stored kind; unknown values read as markers (take no time).
    pub fn from_raw(v: u32) -> Self {
        match v {
            1 => Self::Kernel,
            2 => Self::Copy,
            _ => Self::Marker,
        }
    }
}

/// When a marker completed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MarkerDone {
    /// Item sequence number + 1 (0 = empty).
    pub seq_plus_one: u64,
    /// Completion time (monotonic ns).
    pub time_ns: u64,
}

/// The process a channel or launch log belongs to, as it saw itself, so
/// that a reader in any pid namespace can tell which process it is (see
/// `pidns.rs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// Its pid in its own pid namespace (`getpid`).
    pub pid: i32,
    /// The inode of that pid namespace (`/proc/self/ns/pid`; 0: unknown,
    /// read as the reader's own).
    pub pid_ns: u32,
    /// Its start time (clock ticks after boot), to tell pid reuse apart.
    pub start_time: u64,
    /// Its pid in the initial pid namespace once known (0: not yet): set
    /// at attach by a process in that namespace, else by the first reader
    /// there that finds it running, so the host can still name it after
    /// it exits.
    pub init_pid: i32,
    /// Reserved (0).
    pub _reserved: u32,
}

/// A process's presence on one GPU: its memory and its launch queue.
#[repr(C)]
pub struct Channel {
    /// 1 while owned by a process.
    pub active: u32,
    /// Contexts the owner holds on this GPU.
    pub contexts: u32,
    /// The owner.
    pub owner: Owner,
    /// Random per attach: lets the owner notice a reassignment.
    pub token: u64,
    /// Device memory held, including context overhead (bytes).
    pub mem_bytes: u64,
    /// Items ever enqueued.
    pub submitted: u64,
    /// Items ever completed.
    pub completed: u64,
    /// Ring index of the oldest pending item.
    pub head: u32,
    /// Reserved.
    pub _reserved2: u32,
    /// Pending work, `head..head + (submitted - completed)` modulo capacity.
    pub queue: [Item; QUEUE_CAPACITY],
    /// Recently completed markers, indexed by `seq % MARKER_LOG`.
    pub markers: [MarkerDone; MARKER_LOG],
    /// Completion times of event markers by slot (0 = not yet).
    pub event_times: [u64; EVENT_SLOTS],
    /// The kernels this channel's owner launched (kept after it detaches,
    /// until the channel is claimed again).
    pub launches: LaunchLog,
}

/// The kernels one process launched on one GPU: what the simulated driver
/// executed, as the judge of launch limits.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchLog {
    /// The process the log is of: set when a process claims the channel
    /// (and the log is cleared for it), kept after it exits and its
    /// channel is freed, so its record stays readable until another
    /// process claims the channel.
    pub owner: Owner,
    /// Kernels queued.
    pub kernels: u64,
    /// Their warps (blocks × ceil(threads per block / 32)).
    pub warps: u64,
    /// The latest millisecond (monotonic ns / 10⁶) a kernel was queued in.
    pub last_ms: u64,
    /// Warps queued in millisecond `m`, at `m % LAUNCH_LOG_MS`, for the
    /// [`LAUNCH_LOG_MS`] milliseconds up to `last_ms`.
    pub per_ms: [u32; LAUNCH_LOG_MS],
}

/// Activity in one [`BUCKET_NS`] slice of time.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Bucket {
    /// Absolute bucket number (`time / BUCKET_NS`) this entry holds.
    pub epoch: u64,
    /// ns with a kernel running.
    pub sm_ns: u32,
    /// ns with a copy running.
    pub mem_ns: u32,
    /// Kernel ns per channel.
    pub channel_sm_ns: [u32; MAX_CHANNELS],
}

/// One injected Xid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XidRecord {
    /// 1-based sequence number (0 = empty).
    pub seq: u64,
    /// The Xid code.
    pub xid: u64,
    /// When (Unix ns).
    pub unix_ns: u64,
}

/// Lock-protected state of one GPU.
#[repr(C)]
pub struct GpuInner {
    /// Time up to which the timeline has been simulated (monotonic ns).
    pub sim_time_ns: u64,
    /// When the current time slice began.
    pub slice_start_ns: u64,
    /// Channel holding the slice + 1 (0 = none).
    pub slice_owner_plus_one: u32,
    /// Reserved.
    pub _reserved: u32,
    /// Last time dead processes were looked for.
    pub last_reap_ns: u64,
    /// Sequence number of the next Xid.
    pub xid_next: u64,
    /// Recent Xids, indexed by `(seq - 1) % XID_LOG`.
    pub xids: [XidRecord; XID_LOG],
    /// Activity history, indexed by `epoch % HISTORY_BUCKETS`.
    pub history: [Bucket; HISTORY_BUCKETS],
    /// Per-process channels.
    pub channels: [Channel; MAX_CHANNELS],
}

/// A `pthread_mutex_t` padded to a cache line.
#[repr(C, align(64))]
pub struct RawLock {
    /// The process-shared, robust mutex.
    pub mutex: UnsafeCell<libc::pthread_mutex_t>,
}

/// One GPU's block in the file.
#[repr(C, align(4096))]
pub struct GpuShared {
    /// Guards `inner`.
    pub lock: RawLock,
    /// Nonzero once the GPU has been marked lost (readable without the lock).
    pub lost: AtomicU32,
    /// Reserved.
    pub _reserved: u32,
    /// Guarded state.
    pub inner: UnsafeCell<GpuInner>,
}

/// Offset of the first GPU block.
pub const fn gpu_offset() -> usize {
    size_of::<Header>().next_multiple_of(STATE_ALIGN)
}

/// Total file size for `gpus` GPUs.
pub const fn total_size(gpus: usize) -> usize {
    gpu_offset() + gpus * size_of::<GpuShared>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_sizes_are_stable() {
        assert_eq!(size_of::<Item>(), 16);
        assert_eq!(size_of::<MarkerDone>(), 16);
        assert_eq!(size_of::<Bucket>(), 16 + 4 * MAX_CHANNELS);
        assert_eq!(size_of::<RawLock>(), 64);
        assert_eq!(size_of::<Owner>(), 24);
        assert_eq!(size_of::<LaunchLog>(), 48 + 4 * LAUNCH_LOG_MS);
        assert_eq!(gpu_offset() % STATE_ALIGN, 0);
        assert_eq!(size_of::<GpuShared>() % STATE_ALIGN, 0);
        // A node of 16 GPUs stays a few tens of MiB (sparse).
        assert!(total_size(MAX_GPUS) < 64 << 20, "{}", total_size(MAX_GPUS));
    }
}
