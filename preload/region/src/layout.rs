//! The two region files, byte for byte.
//!
//! Both are `#[repr(C)]`, little-endian, made only of atomics (so concurrent
//! readers and writers in different processes never race on plain memory)
//! and valid when all-zero except for the header.
//!
//! ```text
//! control (4096 bytes, written by the agent, mapped read-only in the container)
//!   0     ControlHeader    magic "TSRCTL\0\x01", abi_version, size, flags,
//!                          gpu_count, epoch (odd while the agent writes the
//!                          primary fields), backup_epoch (odd while it
//!                          writes the backup)
//!   64    ControlGpu × 16  uuid, memory_limit, context_overhead,
//!                          launch_rate, launch_burst, flags,
//!                          launch_floor (primary)
//!   1088  ControlBackupHeader  flags, gpu_count (backup)
//!   1152  ControlGpu × 16  the backup's GPUs
//!
//! usage (73728 bytes, written by the container's processes)
//!   0     UsageHeader      magic "TSRUSE\0\x01", abi_version, size, slot_count,
//!                          last_reclaim_ns, active-slot bitmap (256 bits)
//!   64    Bucket × 16      per-GPU launch token bucket and counters
//!   1088  owners[256]      slot owner words (generation << 40 | state << 32 | pid)
//!   3136  start_times[256] owner start words (pid-namespace tag << 40 | start
//!                          time in clock ticks after boot; see [`start`])
//!   5184  used[16][256]    device bytes charged, per GPU, per slot
//!   37952 launches[16][256] launches, per GPU, per slot
//! ```
//!
//! Units: bytes, ns, and *warps* for launch cost (a launch of G blocks of
//! T threads costs `G × ceil(T / 32)` warps, or the GPU's `launch_floor`
//! if that is more).
//!
//! Fields added within an ABI version take a word that was reserved
//! (zero) and give zero the meaning the word had before: `launch_floor`
//! (0: a kernel costs its warps) was `reserved1`, so regions written
//! before it and libraries older than it agree on everything else.

use std::sync::atomic::{AtomicU32, AtomicU64};

/// Magic of the control region.
pub const CONTROL_MAGIC: [u8; 8] = *b"TSRCTL\0\x01";
/// Magic of the usage region.
pub const USAGE_MAGIC: [u8; 8] = *b"TSRUSE\0\x01";
/// ABI version of both regions. A new version goes to a new library path
/// and new region files (invariant I4: running containers keep theirs).
pub const ABI_VERSION: u32 = 1;
/// GPUs a container may be given.
pub const MAX_GPUS: usize = 16;
/// Processes per container that may use GPUs at once.
pub const MAX_SLOTS: usize = 256;

/// Value of a limit meaning "no limit".
pub const UNLIMITED: u64 = u64::MAX;

/// `ControlHeader::flags`: when the control region cannot be used (missing
/// fields, another ABI version), let GPU calls pass through unlimited
/// instead of refusing them. The agent sets it per policy; offset 16 is
/// stable across ABI versions so an old library can still read it.
pub const FLAG_FAIL_OPEN: u32 = 1;

/// The slot owner word: `generation << 40 | state << 32 | pid`.
///
/// Every transition of a slot's word (claim, activate, reclaim, free) is a
/// compare-and-swap that also bumps the 24-bit generation, so a word never
/// comes back to a value a slow reclaimer read earlier (no ABA): a
/// reclaimer that judged an old owner dead cannot take over the slot once
/// a new process (even one with the same, reused pid) has claimed it.
/// Bits 34..40 are reserved (zero). Regions written before the generation
/// existed hold generation 0 everywhere, which reads the same.
pub mod owner {
    /// Slot is free.
    pub const FREE: u64 = 0;
    /// A process is claiming it.
    pub const CLAIMING: u64 = 1;
    /// Owned by a live process.
    pub const ACTIVE: u64 = 2;
    /// A dead owner's bytes are being returned.
    pub const RECLAIMING: u64 = 3;

    /// Bits of the generation.
    pub const GENERATION_BITS: u32 = 24;
    const GENERATION_SHIFT: u32 = 40;
    const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;

    /// Packs a state and a pid (generation 0).
    pub const fn word(state: u64, pid: u32) -> u64 {
        with_generation(state, pid, 0)
    }
    /// Packs a state, a pid and a generation (taken modulo 2^24).
    pub const fn with_generation(state: u64, pid: u32, generation: u64) -> u64 {
        ((generation & GENERATION_MASK) << GENERATION_SHIFT) | ((state & 0xff) << 32) | pid as u64
    }
    /// The word that follows `w` in state `state` owned by `pid`: its
    /// generation is `w`'s plus one.
    pub const fn next(w: u64, state: u64, pid: u32) -> u64 {
        with_generation(state, pid, generation(w).wrapping_add(1))
    }
    /// The state of a word (bits 32..40; a valid word has 0 to 3).
    pub const fn state(word: u64) -> u64 {
        (word >> 32) & 0xff
    }
    /// The pid of a word.
    pub const fn pid(word: u64) -> u32 {
        word as u32
    }
    /// The generation of a word.
    pub const fn generation(word: u64) -> u64 {
        (word >> GENERATION_SHIFT) & GENERATION_MASK
    }
}

/// A slot's start word: its owner's start time (clock ticks after boot,
/// as `/proc/<pid>/stat` says in any pid namespace) and a tag of the pid
/// namespace its pid is counted in. Processes of several pid namespaces
/// share one region (the containers of a pod sharing a DRA claim): a pid
/// means something only in its own namespace, so a process judges only
/// the slots of its namespace dead, and the agent, which sees every
/// namespace, judges the others. Tag 0: not known (a writer before tags),
/// judged as a slot of the reader's namespace.
pub mod start {
    /// Bits of the start time; the tag is above them.
    pub const TICK_BITS: u32 = 40;
    const TICK_MASK: u64 = (1 << TICK_BITS) - 1;
    /// Largest tag (24 bits).
    pub const MAX_TAG: u32 = (1 << (64 - TICK_BITS)) - 1;

    /// The tag of the pid namespace whose `/proc/<pid>/ns/pid` has inode
    /// `inode`: 1 to [`MAX_TAG`] (never 0). Namespace inodes are numbered
    /// from one counter, so the namespaces alive at once differ in it.
    pub const fn tag_of_inode(inode: u64) -> u32 {
        (inode % MAX_TAG as u64) as u32 + 1
    }
    /// Packs a tag and a start time (taken modulo 2^40 ticks).
    pub const fn word(tag: u32, ticks: u64) -> u64 {
        ((tag as u64) << TICK_BITS) | (ticks & TICK_MASK)
    }
    /// The start time of a word.
    pub const fn ticks(word: u64) -> u64 {
        word & TICK_MASK
    }
    /// The namespace tag of a word (0: not known).
    pub const fn tag(word: u64) -> u32 {
        (word >> TICK_BITS) as u32
    }
}

/// Control region header.
#[repr(C, align(64))]
pub struct ControlHeader {
    /// [`CONTROL_MAGIC`].
    pub magic: [u8; 8],
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// Size of the control file.
    pub size: u32,
    /// `FLAG_*` bits.
    pub flags: AtomicU32,
    /// GPUs in use (≤ [`MAX_GPUS`]).
    pub gpu_count: AtomicU32,
    /// Bumped twice per write of the primary fields (`flags`, `gpu_count`,
    /// `gpus`): odd while they are being written.
    pub epoch: AtomicU64,
    /// Bumped twice per write of [`ControlRegion::backup`]: odd while it
    /// is being written; 0 while it was never written (a file from before
    /// the backup existed).
    pub backup_epoch: AtomicU64,
    /// Reserved (zero).
    pub reserved: [AtomicU64; 3],
}

/// One GPU's limits.
#[repr(C, align(64))]
pub struct ControlGpu {
    /// UUID bytes 0..8 (little-endian).
    pub uuid_lo: AtomicU64,
    /// UUID bytes 8..16.
    pub uuid_hi: AtomicU64,
    /// Device memory the container may hold (bytes; [`UNLIMITED`]).
    pub memory_limit: AtomicU64,
    /// Memory charged per context created on this GPU (bytes).
    pub context_overhead: AtomicU64,
    /// Launch token refill rate (warps/s; [`UNLIMITED`]; 0 pauses launches).
    pub launch_rate: AtomicU64,
    /// Bucket depth (warps that may launch at once after idling).
    pub launch_burst: AtomicU64,
    /// Per-GPU flags (reserved).
    pub flags: AtomicU32,
    /// Reserved.
    pub reserved0: AtomicU32,
    /// Least warps one kernel is charged (0: its warps). The agent sets
    /// the warps one wave of the GPU holds (SMs × resident warps per SM),
    /// so that a kernel too small to fill the GPU is charged the time it
    /// holds it, as NVML's utilisation counts it.
    pub launch_floor: AtomicU64,
}

/// Header of the backup copy.
#[repr(C, align(64))]
pub struct ControlBackupHeader {
    /// The primary `flags` as of the backup's write.
    pub flags: AtomicU32,
    /// The primary `gpu_count` as of the backup's write.
    pub gpu_count: AtomicU32,
    /// Reserved (zero).
    pub reserved: [AtomicU64; 7],
}

/// A complete copy of the limits, written before the primary fields, so
/// that a reader always finds one of the two complete even while the
/// writer is stopped in the middle of a write (see [`crate::control`]).
#[repr(C)]
pub struct ControlBackup {
    /// Flags and GPU count.
    pub header: ControlBackupHeader,
    /// Per-GPU limits.
    pub gpus: [ControlGpu; MAX_GPUS],
}

/// The control file.
#[repr(C)]
pub struct ControlRegion {
    /// Header.
    pub header: ControlHeader,
    /// Per-GPU limits (primary); entries past `gpu_count` are ignored.
    pub gpus: [ControlGpu; MAX_GPUS],
    /// The backup copy.
    pub backup: ControlBackup,
}

/// Size of the control file.
pub const CONTROL_SIZE: usize = 4096;

/// Usage region header.
#[repr(C, align(64))]
pub struct UsageHeader {
    /// [`USAGE_MAGIC`].
    pub magic: [u8; 8],
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// Size of the usage file.
    pub size: u32,
    /// [`MAX_SLOTS`].
    pub slot_count: u32,
    /// Reserved.
    pub reserved0: u32,
    /// When dead processes were last looked for (monotonic ns).
    pub last_reclaim_ns: AtomicU64,
    /// Bitmap of slots that may hold bytes (set before a slot is used,
    /// cleared after it is zeroed), so sums visit only those.
    pub active: [AtomicU64; MAX_SLOTS / 64],
}

/// A GPU's container-wide launch bucket (GCRA) and counters.
#[repr(C, align(64))]
pub struct Bucket {
    /// Theoretical arrival time (monotonic ns).
    pub tat_ns: AtomicU64,
    /// Control epoch the TAT was computed under.
    pub epoch: AtomicU64,
    /// Launches admitted.
    pub launches: AtomicU64,
    /// Warps admitted.
    pub warps: AtomicU64,
    /// Time launches spent waiting for tokens (ns, summed over launches).
    pub throttled_ns: AtomicU64,
    /// The rate (warps/s) the outstanding debt was taken at.
    pub debt_rate: AtomicU64,
    /// Reserved.
    pub reserved: [AtomicU64; 2],
}

/// The usage file.
#[repr(C)]
pub struct UsageRegion {
    /// Header.
    pub header: UsageHeader,
    /// Per-GPU buckets.
    pub buckets: [Bucket; MAX_GPUS],
    /// Slot owner words (see [`owner`]).
    pub owners: [AtomicU64; MAX_SLOTS],
    /// Slot owner start times.
    pub start_times: [AtomicU64; MAX_SLOTS],
    /// Bytes charged, by GPU then slot.
    pub used: [[AtomicU64; MAX_SLOTS]; MAX_GPUS],
    /// Launches, by GPU then slot.
    pub launches: [[AtomicU64; MAX_SLOTS]; MAX_GPUS],
}

/// Size of the usage file.
pub const USAGE_SIZE: usize = size_of::<UsageRegion>().next_multiple_of(4096);

/// Byte offsets of the usage fields, for the validating reader.
pub mod usage_offsets {
    use super::*;
    /// `buckets`.
    pub const BUCKETS: usize = std::mem::offset_of!(UsageRegion, buckets);
    /// `owners`.
    pub const OWNERS: usize = std::mem::offset_of!(UsageRegion, owners);
    /// `start_times`.
    pub const START_TIMES: usize = std::mem::offset_of!(UsageRegion, start_times);
    /// `used`.
    pub const USED: usize = std::mem::offset_of!(UsageRegion, used);
    /// `launches`.
    pub const LAUNCHES: usize = std::mem::offset_of!(UsageRegion, launches);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_as_documented() {
        assert_eq!(size_of::<ControlHeader>(), 64);
        assert_eq!(size_of::<ControlGpu>(), 64);
        assert_eq!(size_of::<ControlRegion>(), 2 * (64 + 16 * 64));
        assert_eq!(std::mem::offset_of!(ControlHeader, backup_epoch), 32);
        assert_eq!(std::mem::offset_of!(ControlRegion, backup), 1088);
        assert_eq!(
            std::mem::offset_of!(ControlRegion, backup) + std::mem::offset_of!(ControlBackup, gpus),
            1152
        );
        assert!(size_of::<ControlRegion>() <= CONTROL_SIZE);
        assert_eq!(std::mem::offset_of!(ControlHeader, flags), 16);
        // Where `reserved1` was.
        assert_eq!(std::mem::offset_of!(ControlGpu, launch_floor), 56);
        assert_eq!(std::mem::size_of::<ControlGpu>(), 64);
        assert_eq!(std::mem::offset_of!(ControlHeader, epoch), 24);
        assert_eq!(size_of::<Bucket>(), 64);
        assert_eq!(usage_offsets::BUCKETS, 64);
        assert_eq!(usage_offsets::OWNERS, 1088);
        assert_eq!(usage_offsets::START_TIMES, 3136);
        assert_eq!(usage_offsets::USED, 5184);
        assert_eq!(usage_offsets::LAUNCHES, 37952);
        assert_eq!(USAGE_SIZE, 73728);
    }
}

#[cfg(test)]
mod start_tests {
    use super::start;

    #[test]
    fn a_start_word_keeps_tag_and_ticks_apart() {
        let w = start::word(start::tag_of_inode(4_026_532_456), 123_456);
        assert_eq!(start::ticks(w), 123_456);
        assert_eq!(start::tag(w), start::tag_of_inode(4_026_532_456));
        assert_ne!(start::tag(w), 0);
        assert_eq!(start::tag(123_456), 0, "a word without a tag");
        assert_eq!(
            start::tag_of_inode(u64::from(start::MAX_TAG) - 1),
            start::MAX_TAG
        );
        assert_eq!(start::tag_of_inode(u64::from(start::MAX_TAG)), 1);
        assert_ne!(
            start::tag_of_inode(4_026_531_836),
            start::tag_of_inode(4_026_532_456)
        );
    }
}
