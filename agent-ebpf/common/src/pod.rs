//! `aya::Pod` for the shared types, so the agent can use them as map keys,
//! map values and globals.

use crate::config::{KernelOffsets, ProgramConfig};
use crate::dev::WatchedDevice;
use crate::keys::{IoctlKey, OpenKey};

// SAFETY: `#[repr(C)]`, only integer fields, no implicit padding (checked
// by the size tests of each type), so every bit pattern is valid.
unsafe impl aya::Pod for IoctlKey {}
// SAFETY: as above.
unsafe impl aya::Pod for OpenKey {}
// SAFETY: as above.
unsafe impl aya::Pod for WatchedDevice {}
// SAFETY: as above.
unsafe impl aya::Pod for KernelOffsets {}
// SAFETY: as above.
unsafe impl aya::Pod for ProgramConfig {}
