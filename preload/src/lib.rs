//! `libtessera.so`: the in-container layer of Tessera's enforcement.
//!
//! Loaded into every process of a GPU container (through
//! `/etc/ld.so.preload`, or `LD_PRELOAD`), it interposes the CUDA driver
//! API and NVML:
//!
//! - **memory**: every allocation family is reserved against the
//!   container's per-GPU limit before it reaches the driver, linear
//!   memory by the device pages it really holds ([`pages`])
//!   ([`accounting`], `hooks/memory.rs`, `vmm.rs`, `array.rs`,
//!   `context.rs`); over the limit the call fails with
//!   `CUDA_ERROR_OUT_OF_MEMORY` and nothing is allocated; memory
//!   information shows the limit (`hooks/info.rs`, `hooks/nvml.rs`);
//! - **launch rate**: every launch path draws from the container's token
//!   bucket for the GPU, whose rate the agent sets ([`throttle`],
//!   `hooks/launch.rs`);
//! - **reach**: linked programs, `dlsym` and `cuGetProcAddress` all end up
//!   in the hooks ([`hooks`]).
//!
//! Limits come from the container's control region, usage goes to its
//! usage region (crate `tessera-region`, re-exported as [`region`]). A
//! process that never calls CUDA or NVML never touches either: the library
//! sets itself up on the first hooked call ([`state`]).

pub use tessera_region as region;

pub mod accounting;
pub mod config;
pub mod ffi;
pub mod fork;
pub mod hooks;
pub mod pages;
pub mod proc_table;
pub mod real;
pub mod state;
mod sys;
pub mod throttle;
