//! The extended resources a pod asks for. The names are HAMi's, so HAMi
//! manifests run unchanged on Tessera.
//!
//! | resource | meaning |
//! |---|---|
//! | `nvidia.com/gpu` | vGPUs; more than one means distinct physical GPUs |
//! | `nvidia.com/gpumem` | memory per GPU, MiB |
//! | `nvidia.com/gpumem-percentage` | memory per GPU, percent of the GPU (when `gpumem` is absent) |
//! | `nvidia.com/gpucores` | percent of one GPU's SMs |
//! | `nvidia.com/priority` | 0 = high, 1 = low (HAMi's meaning) |

/// vGPUs per container.
pub const GPU: &str = "nvidia.com/gpu";
/// Memory per GPU, MiB.
pub const GPU_MEM: &str = "nvidia.com/gpumem";
/// Memory per GPU, percent of the device.
pub const GPU_MEM_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
/// Percent of one GPU's SMs.
pub const GPU_CORES: &str = "nvidia.com/gpucores";
/// Compute priority.
pub const PRIORITY: &str = "nvidia.com/priority";

/// Every resource name above.
pub const ALL: [&str; 5] = [GPU, GPU_MEM, GPU_MEM_PERCENTAGE, GPU_CORES, PRIORITY];
