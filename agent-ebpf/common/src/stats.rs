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
/// Number of counters.
pub const LEN: u32 = 4;
