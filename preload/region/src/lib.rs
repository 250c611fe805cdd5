//! The region ABI between `libtessera.so` (in the container) and the node
//! agent (on the host).
//!
//! Each container gets a directory with two files:
//!
//! - `control` ([`layout::ControlRegion`]): per-GPU memory limit, context
//!   overhead, launch rate and burst, policy flags and an epoch. Written
//!   only by the agent ([`control`]), mapped read-only by the container.
//! - `usage` ([`layout::UsageRegion`]): per-process slots with the bytes
//!   each process holds per GPU, launch counters and the container-wide
//!   launch buckets ([`usage`], [`rate`]). Written by the container's
//!   processes, lock-free; the agent reads it as untrusted input
//!   ([`reader`]).
//!
//! This crate is linked by both sides. `libtessera.so` (crate
//! `tessera-preload`) re-exports it; the agent links this crate rather
//! than the preload's rlib, so the interposer's exported `dlsym` and CUDA
//! symbols can never end up inside another binary.

pub mod control;
pub mod error;
pub mod file;
pub mod layout;
pub mod rate;
pub mod reader;
pub mod spec;
pub mod usage;
pub mod usage_file;

pub use control::{ControlSnapshot, ControlSpec, GpuLimits, LaunchLimits};
pub use error::RegionError;
pub use layout::{ABI_VERSION, MAX_GPUS, MAX_SLOTS, UNLIMITED};
