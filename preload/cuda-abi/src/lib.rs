//! The C ABI of NVIDIA's user-space driver libraries, declared once for
//! every Tessera crate that speaks it: the interposer (`libtessera.so`)
//! and the simulated node's stand-ins (`libcuda.so.1`,
//! `libnvidia-ml.so.1`).
//!
//! - [`cuda`]: the CUDA driver API (`cuda.h`);
//! - [`nvml`]: NVML (`nvml.h`).
//!
//! Declarations only: no functions, no behaviour. Sharing them means a
//! wrong layout would be wrong on both sides of every test at once, so the
//! test `headers` compiles a C program against NVIDIA's own headers (from
//! the `nvidia-cuda-runtime-cu12` and `nvidia-nvml-dev-cu12` wheels, which
//! `cargo xtask setup` fetches) and compares every size, field offset and
//! constant declared here with what the C compiler says.
#![no_std]
#![deny(missing_docs)]

pub mod cuda;
pub mod nvml;
