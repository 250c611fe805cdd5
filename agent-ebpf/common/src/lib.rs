//! Types shared by Tessera's eBPF programs and the agent.
//!
//! Everything here is `no_std` and `#[repr(C)]`: the programs in
//! `agent-ebpf/programs` use these as map keys, map values and globals, and
//! the agent reads and writes the same bytes. With the `user` feature the
//! types implement `aya::Pod`.
//!
//! The object's maps, programs and globals are named in [`names`]; a key or
//! value layout that changes must bump [`ABI_VERSION`], which also names the
//! bpffs pin folder.
#![cfg_attr(not(test), no_std)]
#![deny(missing_docs)]

pub mod config;
pub mod dev;
pub mod events;
pub mod guard;
pub mod ioctl;
pub mod keys;
pub mod names;
pub mod rm;
pub mod stats;
pub mod uvm;
pub mod verdict;

#[cfg(feature = "user")]
mod pod;

/// Version of the layouts in this crate, shared by the object and the agent.
pub const ABI_VERSION: u32 = 2;
