//! A simulated GPU node for machines without GPUs.
//!
//! The stand-in `libcuda.so.1` and `libnvidia-ml.so.1` (crates
//! `gpusim-cuda`, `gpusim-nvml`) and the `gpusim` CLI are thin layers over
//! this crate:
//!
//! - [`node`]: the node description (GPUs, memory, SMs, NUMA, NVLink, cost
//!   model, stand-in devices);
//! - [`state`] / [`layout`]: the node-wide shared state file that lets many
//!   processes share the simulated GPUs;
//! - [`timeline`]: per-GPU queues, time slicing and activity history;
//! - [`cost`]: how long kernels and copies take;
//! - [`ioctl`] / [`nvrm`]: real NVIDIA ioctls on stand-in devices;
//! - [`pci`]: PCI bus ids as CUDA and NVML parse and print them;
//! - [`liveness`]: whether channel owners still run (pidfds, `/proc`);
//! - [`pidns`]: recorded pids as a reader in any pid namespace sees them;
//! - [`sim`]: the operations a process performs (attach, allocate, submit,
//!   wait, query);
//! - [`connect`]: what `cuInit` and `nvmlInit` open.

pub mod clocks;
pub mod connect;
pub mod cost;
pub mod ioctl;
pub mod launch_log;
pub mod layout;
pub mod liveness;
pub mod node;
pub mod nvrm;
pub mod pci;
pub mod pidns;
pub mod procfs;
pub mod sim;
pub mod state;
mod sys;
pub mod timeline;

pub use node::NodeDescription;
pub use sim::{Attachment, Sim, SimError};
pub use sys::{Patience, with_patience};

/// Monotonic clock shared with the timeline (ns).
pub fn monotonic_ns() -> u64 {
    sys::monotonic_ns()
}

/// Wall clock (ns since the Unix epoch).
pub fn realtime_ns() -> u64 {
    sys::realtime_ns()
}
