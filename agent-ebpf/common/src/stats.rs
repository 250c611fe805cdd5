//! Indices of the programs' own counters in the `OBS_STATS` per-CPU array.
//!
//! How many ioctls and opens were counted is not kept here: that is the
//! sum of the count maps (what a full map lost is [`COUNT_DROPPED`]), which
//! saves the hot path a map lookup per event.

/// A watched-device lookup was skipped because the fd did not resolve to
/// an inode (closed fd, race with close, unreadable kernel memory).
pub const FD_UNRESOLVED: u32 = 0;
/// A count was lost because the count map was full.
pub const COUNT_DROPPED: u32 = 1;
/// A bypass event was sent.
pub const BYPASS_REPORTED: u32 = 2;
/// A bypass event was lost (ring buffer full); the process stays marked
/// as reported.
pub const EVENT_DROPPED: u32 = 3;
/// A video-memory allocation was added to the estimate.
pub const RM_ALLOC_TRACKED: u32 = 4;
/// An RM_ALLOC/RM_FREE/UVM_REGISTER_GPU argument could not be read, had
/// an unknown size, or was FINN-serialised.
pub const ARG_UNREADABLE: u32 = 5;
/// A GPU-use, RM or registration map update failed (map full).
pub const TRACK_DROPPED: u32 = 6;
/// An ioctl on a device was answered "not watched" from the device cache
/// (`verdict`), without a `WATCHED_DEVS` lookup.
pub const VERDICT_CACHED: u32 = 7;
/// Number of counters.
pub const LEN: u32 = 8;
