//! A [`GpuBackend`] that serves fixed answers, for tests.

use super::{DriverInfo, GpuBackend, GpuDevice, GpuError, GpuUsage, Health};

/// One GPU of a [`FakeBackend`].
#[derive(Clone, Debug)]
pub struct FakeGpu {
    /// What [`GpuBackend::device`] returns (its `health` decides whether
    /// [`GpuBackend::usage`] fails with [`GpuError::Lost`]).
    pub device: GpuDevice,
    /// What [`GpuBackend::usage`] returns.
    pub usage: GpuUsage,
}

impl FakeGpu {
    /// An idle, healthy GPU with `memory_mib` of memory and no NVLink.
    pub fn new(index: u32, name: &str, memory_mib: u64) -> Self {
        Self {
            device: GpuDevice {
                index,
                uuid: format!("GPU-00000000-0000-0000-0000-{index:012x}"),
                name: name.into(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index * 0x10),
                memory_total_bytes: Some(memory_mib << 20),
                numa_node: Some(0),
                sm_count: Some(132),
                compute_capability: Some([9, 0]),
                nvlink_remote_bus_ids: Vec::new(),
                mig_enabled: Some(false),
                health: Health::Healthy,
            },
            usage: GpuUsage {
                memory_used_bytes: 0,
                memory_free_bytes: memory_mib << 20,
                utilization_gpu_percent: 0,
                utilization_memory_percent: 0,
                processes: Vec::new(),
            },
        }
    }

    /// Marks the GPU lost, as NVML would show it.
    pub fn lost(mut self) -> Self {
        self.device.health = Health::Lost;
        self.device.memory_total_bytes = None;
        self.device.mig_enabled = None;
        self.device.nvlink_remote_bus_ids.clear();
        self
    }
}

/// Fixed driver versions and GPUs.
#[derive(Clone, Debug)]
pub struct FakeBackend {
    /// What [`GpuBackend::driver`] returns.
    pub driver: DriverInfo,
    /// The GPUs, in index order.
    pub gpus: Vec<FakeGpu>,
}

impl FakeBackend {
    /// A node with `gpus`.
    pub fn new(gpus: Vec<FakeGpu>) -> Self {
        Self {
            driver: DriverInfo {
                driver_version: "550.54.15".into(),
                cuda_driver_version: 12040,
            },
            gpus,
        }
    }

    fn gpu(&self, index: u32) -> Result<&FakeGpu, GpuError> {
        self.gpus.get(index as usize).ok_or(GpuError::NoSuchDevice {
            index,
            count: self.gpus.len() as u32,
        })
    }
}

impl GpuBackend for FakeBackend {
    fn driver(&self) -> Result<DriverInfo, GpuError> {
        Ok(self.driver.clone())
    }

    fn device_count(&self) -> Result<u32, GpuError> {
        Ok(self.gpus.len() as u32)
    }

    fn device(&self, index: u32) -> Result<GpuDevice, GpuError> {
        Ok(self.gpu(index)?.device.clone())
    }

    fn usage(&self, index: u32, _since_unix_us: u64) -> Result<GpuUsage, GpuError> {
        let g = self.gpu(index)?;
        match g.device.health {
            Health::Healthy => Ok(g.usage.clone()),
            Health::Lost => Err(GpuError::Lost { index }),
        }
    }
}
