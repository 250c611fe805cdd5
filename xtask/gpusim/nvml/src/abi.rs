//! The NVML C ABI this library speaks: declared once in `tessera-cuda-abi`
//! (shared with the interposer and checked against `nvml.h`).

pub use tessera_cuda_abi::nvml::*;
