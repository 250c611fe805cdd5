//! CUDA driver API types, constants and structure layouts: declared once in
//! `tessera-cuda-abi` (shared with the interposer and checked against
//! `cuda.h`).

pub use tessera_cuda_abi::cuda::*;
