//! GPU discovery and live state through NVML.
//!
//! [`GpuBackend`] is the one seam between the agent and the GPUs: the
//! real implementation ([`NvmlBackend`]) calls NVML through `nvml-wrapper`
//! (so a node without the driver gets an error, not a failed start), and
//! a fake backend (`fake.rs`, unit tests only) serves the unit tests. [`Inventory`] is the node's GPUs as
//! the agent reports them (`tessera-agent inventory`, and later the
//! `GpuNode` status).
//!
//! A GPU that has fallen off the bus keeps its identity (NVML caches it),
//! so it is listed with health [`Health::Lost`] and without live values.

#![forbid(unsafe_code)]

pub mod args;
#[cfg(any(test, feature = "fake"))]
mod fake;
pub mod inventory;
pub mod nvml;

use nvml_wrapper::error::NvmlError;
use serde::Serialize;

pub use args::GpuArgs;
#[cfg(any(test, feature = "fake"))]
pub use fake::{FakeBackend, FakeGpu};
pub use inventory::{Inventory, InventoryGpu};
pub use nvml::NvmlBackend;

/// What went wrong talking to the GPUs.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The NVML library could not be loaded or initialised.
    #[error("cannot initialise NVML from {library}")]
    Init {
        /// The library asked for.
        library: String,
        /// Cause.
        #[source]
        source: NvmlError,
    },
    /// A node-wide query failed.
    #[error("cannot read the {what} from NVML")]
    System {
        /// What was asked for, e.g. `driver version`.
        what: &'static str,
        /// Cause.
        #[source]
        source: NvmlError,
    },
    /// A query on one GPU failed.
    #[error("cannot read the {what} of GPU {index}")]
    Device {
        /// GPU index.
        index: u32,
        /// What was asked for, e.g. `UUID`.
        what: &'static str,
        /// Cause.
        #[source]
        source: NvmlError,
    },
    /// The GPU has fallen off the bus.
    #[error("GPU {index} is lost (fallen off the bus)")]
    Lost {
        /// GPU index.
        index: u32,
    },
    /// NVML reported a UUID that is not one.
    #[error("GPU {index} reports a malformed UUID")]
    Uuid {
        /// GPU index.
        index: u32,
        /// What is wrong with it.
        #[source]
        source: tessera_api::UuidError,
    },
    /// No GPU with this index.
    #[error("there is no GPU {index} on this node ({count} GPUs)")]
    NoSuchDevice {
        /// Index asked for.
        index: u32,
        /// GPUs present.
        count: u32,
    },
}

/// The driver stack of the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DriverInfo {
    /// Kernel driver version, e.g. `550.54.15`.
    pub driver_version: String,
    /// CUDA driver API version, e.g. 12040 for 12.4.
    pub cuda_driver_version: i32,
}

/// Whether a GPU can be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Answers queries.
    Healthy,
    /// Fallen off the bus (`NVML_ERROR_GPU_IS_LOST`).
    Lost,
}

/// One GPU as NVML describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuDevice {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// PCI bus id, `00000000:3B:00.0`.
    pub pci_bus_id: String,
    /// Framebuffer size (bytes); `None` when the GPU is lost.
    pub memory_total_bytes: Option<u64>,
    /// NUMA node, where NVML reports one.
    pub numa_node: Option<u32>,
    /// Streaming multiprocessors, where NVML tells (directly for MIG
    /// devices, else CUDA cores divided by the architecture's cores per
    /// SM).
    pub sm_count: Option<u32>,
    /// CUDA compute capability `[major, minor]`.
    pub compute_capability: Option<[u32; 2]>,
    /// PCI bus ids at the far end of the active NVLinks, one per link.
    pub nvlink_remote_bus_ids: Vec<String>,
    /// Whether MIG mode is on; `None` where MIG is not supported.
    pub mig_enabled: Option<bool>,
    /// Whether the GPU answers.
    pub health: Health,
}

/// A process holding memory on a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    /// Process id (host pid namespace).
    pub pid: u32,
    /// Device memory held (bytes), if NVML reports it.
    pub used_memory_bytes: Option<u64>,
    /// SM utilisation (%) over the sampled interval, if it had any.
    pub sm_percent: Option<u32>,
}

/// Live state of one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuUsage {
    /// Memory allocated by processes (bytes).
    pub memory_used_bytes: u64,
    /// Memory still allocatable (bytes).
    pub memory_free_bytes: u64,
    /// Percent of time a kernel ran.
    pub utilization_gpu_percent: u32,
    /// Percent of time memory was read or written.
    pub utilization_memory_percent: u32,
    /// Processes with memory on the GPU.
    pub processes: Vec<GpuProcess>,
}

/// What the daemon reads of a GPU every period: its memory and processes
/// (not the utilisation rates: its controllers take SM use per process).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuLive {
    /// Memory allocated by processes (bytes).
    pub memory_used_bytes: u64,
    /// Memory still allocatable (bytes).
    pub memory_free_bytes: u64,
    /// Processes with memory on the GPU.
    pub processes: Vec<GpuProcess>,
}

/// Access to the node's GPUs.
pub trait GpuBackend {
    /// Driver and CUDA versions.
    fn driver(&self) -> Result<DriverInfo, GpuError>;
    /// Number of GPUs.
    fn device_count(&self) -> Result<u32, GpuError>;
    /// GPU `index`'s description (also for a lost GPU).
    fn device(&self, index: u32) -> Result<GpuDevice, GpuError>;
    /// GPU `index`'s live state, with per-process SM use since
    /// `since_unix_us` ([`GpuError::Lost`] for a lost GPU).
    fn usage(&self, index: u32, since_unix_us: u64) -> Result<GpuUsage, GpuError>;
}

/// Warps one SM holds resident at once for a compute capability (the
/// "maximum number of resident warps per SM" of NVIDIA's published
/// per-capability figures; 64 for capabilities not listed).
pub fn resident_warps_per_sm([major, minor]: [u32; 2]) -> u32 {
    match (major, minor) {
        (7, 5) => 32,
        (8, 6..=9) | (12, _) => 48,
        _ => 64,
    }
}

impl GpuDevice {
    /// The launch floor the agent writes for this GPU: the warps one wave
    /// of it holds (SMs × resident warps per SM), so that a kernel too
    /// small to fill the GPU is charged the time it holds it (NVML's
    /// utilisation counts a GPU busy while any kernel runs, however few
    /// SMs it uses). 0 (kernels cost their warps) when the SM count is
    /// unknown.
    pub fn launch_floor(&self) -> u64 {
        let per_sm = self.compute_capability.map_or(64, resident_warps_per_sm);
        self.sm_count
            .map_or(0, |sms| u64::from(sms) * u64::from(per_sm))
    }
}

/// FP32 cores per SM of a compute capability (NVIDIA's published figures),
/// to turn NVML's core count into SMs.
pub fn cores_per_sm([major, minor]: [u32; 2]) -> u32 {
    match (major, minor) {
        (3, _) => 192,
        (6, 0) | (7, _) | (8, 0) => 64,
        _ => 128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(sm_count: Option<u32>, cc: Option<[u32; 2]>) -> GpuDevice {
        GpuDevice {
            index: 0,
            uuid: "GPU-5e1a0000-0000-4000-8000-000051510000".into(),
            name: "test".into(),
            pci_bus_id: "00000000:18:00.0".into(),
            memory_total_bytes: None,
            numa_node: None,
            sm_count,
            compute_capability: cc,
            nvlink_remote_bus_ids: Vec::new(),
            mig_enabled: None,
            health: Health::Healthy,
        }
    }

    #[test]
    fn the_launch_floor_is_one_wave_of_the_gpu() {
        // H100 / H200: 132 SMs, compute 9.0, 64 resident warps per SM.
        assert_eq!(device(Some(132), Some([9, 0])).launch_floor(), 8448);
        // A100: 108 SMs, 8.0.
        assert_eq!(device(Some(108), Some([8, 0])).launch_floor(), 6912);
        // L40S (8.9) and RTX 3090 (8.6): 48 warps per SM.
        assert_eq!(device(Some(142), Some([8, 9])).launch_floor(), 142 * 48);
        assert_eq!(device(Some(82), Some([8, 6])).launch_floor(), 82 * 48);
        // T4 (7.5): 32.
        assert_eq!(device(Some(40), Some([7, 5])).launch_floor(), 1280);
        // Unknown capability: 64; unknown SM count: no floor.
        assert_eq!(device(Some(10), None).launch_floor(), 640);
        assert_eq!(device(None, Some([9, 0])).launch_floor(), 0);
    }
}
