//! Indices of the programs' own counters in the `OBS_STATS` per-CPU array.

/// A watched-device lookup was skipped because the fd did not resolve to
/// an inode (closed fd, race with close, unreadable kernel memory).
pub const FD_UNRESOLVED: u32 = 0;
/// A count was lost because the count map was full.
pub const COUNT_DROPPED: u32 = 1;
/// An ioctl on a watched device was counted.
pub const IOCTL_COUNTED: u32 = 2;
/// An access check on a watched device was counted.
pub const OPEN_COUNTED: u32 = 3;
/// A bypass event was sent.
pub const BYPASS_REPORTED: u32 = 4;
/// A bypass event was lost (ring buffer full); the process stays marked
/// as reported.
pub const EVENT_DROPPED: u32 = 5;
/// A video-memory allocation was added to the estimate.
pub const RM_ALLOC_TRACKED: u32 = 6;
/// An RM_ALLOC/RM_FREE/UVM_REGISTER_GPU argument could not be read, had
/// an unknown size, or was FINN-serialised.
pub const ARG_UNREADABLE: u32 = 7;
/// A GPU-use, RM or registration map update failed (map full).
pub const TRACK_DROPPED: u32 = 8;
/// Number of counters.
pub const LEN: u32 = 9;
