//! The simulated node's `libcuda.so.1`: the CUDA driver API over
//! [`gpusim`].
//!
//! Programs load it like the real driver, by linking against it or with
//! `dlopen("libcuda.so.1")` + `cuGetProcAddress` (see [`proc_address`]).
//! Device memory holds no data: allocations are charged to the simulated
//! GPU, kernels and copies take simulated time on its timeline, and NVML
//! (`libnvidia-ml.so.1` from `gpusim-nvml`) sees the result.
//!
//! Layout: [`exports`] holds the C entry points (thin: argument checking
//! and pointer handling); the modules beside it hold the logic, one per
//! area of the API; [`process`] holds the per-process object tables.

pub mod abi;
pub mod array;
pub mod charge;
pub mod context;
pub mod device;
pub mod export_table;
pub mod exports;
pub mod graph;
pub mod handles;
pub mod heap;
pub mod launch;
pub mod memory;
pub mod module;
pub mod proc_address;
pub mod process;
pub mod status;
pub mod stream;
mod sys;
pub mod va;
pub mod vmm;
