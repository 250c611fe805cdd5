//! `aya::Pod` for the shared types, so the agent can use them as map keys,
//! map values and globals.

use crate::config::{CastConfig, KernelOffsets, ProgramConfig};
use crate::dev::WatchedDevice;
use crate::events::BypassEvent;
use crate::guard::{DevRange, GuardPolicy};
use crate::keys::{IoctlKey, OpenKey};
use crate::rm::{RmClient, RmClientKey, RmLayout, RmObject, RmObjectKey, RmProcess};
use crate::uvm::{GpuUse, GpuUseKey};

// SAFETY: `#[repr(C)]`, only integer fields (and arrays of them), no
// implicit padding (checked by the size tests of each type), so every bit
// pattern is valid.
unsafe impl aya::Pod for IoctlKey {}
// SAFETY: as above.
unsafe impl aya::Pod for OpenKey {}
// SAFETY: as above.
unsafe impl aya::Pod for WatchedDevice {}
// SAFETY: as above.
unsafe impl aya::Pod for KernelOffsets {}
// SAFETY: as above.
unsafe impl aya::Pod for RmLayout {}
// SAFETY: as above.
unsafe impl aya::Pod for CastConfig {}
// SAFETY: as above.
unsafe impl aya::Pod for ProgramConfig {}
// SAFETY: as above.
unsafe impl aya::Pod for BypassEvent {}
// SAFETY: as above.
unsafe impl aya::Pod for GpuUseKey {}
// SAFETY: as above.
unsafe impl aya::Pod for GpuUse {}
// SAFETY: as above.
unsafe impl aya::Pod for RmObjectKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RmObject {}
// SAFETY: as above.
unsafe impl aya::Pod for RmProcess {}
// SAFETY: as above.
unsafe impl aya::Pod for RmClientKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RmClient {}
// SAFETY: as above.
unsafe impl aya::Pod for DevRange {}
// SAFETY: as above.
unsafe impl aya::Pod for GuardPolicy {}
