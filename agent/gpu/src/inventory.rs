//! The node's GPUs as the agent reports them.

use std::fmt::Write as _;

use serde::Serialize;
use tessera_api::GpuUuid;
use tessera_api::gpunode as api;

use super::{GpuBackend, GpuDevice, GpuError, Health};

/// Every GPU of the node, with NVLink peers resolved to indices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Inventory {
    /// Kernel driver version.
    pub driver_version: String,
    /// CUDA driver API version, e.g. 12040.
    pub cuda_driver_version: i32,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<InventoryGpu>,
}

/// One GPU of the [`Inventory`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InventoryGpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Framebuffer size (MiB); `None` when the GPU is lost.
    pub memory_total_mib: Option<u64>,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// NUMA node, where NVML reports one.
    pub numa_node: Option<u32>,
    /// Streaming multiprocessors, where NVML tells.
    pub sm_count: Option<u32>,
    /// CUDA compute capability, e.g. `9.0`.
    pub compute_capability: Option<String>,
    /// Indices of the GPUs reachable over NVLink (once each, however many
    /// links lead there; ends that are not GPUs of this node, such as
    /// NVSwitch ports, are left out).
    pub nvlink_peers: Vec<u32>,
    /// Whether MIG mode is on; `None` where MIG is not supported.
    pub mig_enabled: Option<bool>,
    /// Whether the GPU answers.
    pub health: Health,
}

impl Inventory {
    /// Asks `backend` for every GPU.
    pub fn collect(backend: &dyn GpuBackend) -> Result<Self, GpuError> {
        let driver = backend.driver()?;
        let devices = (0..backend.device_count()?)
            .map(|i| backend.device(i))
            .collect::<Result<Vec<_>, _>>()?;
        let gpus = devices
            .iter()
            .map(|d| InventoryGpu::new(d, &devices))
            .collect();
        Ok(Self {
            driver_version: driver.driver_version,
            cuda_driver_version: driver.cuda_driver_version,
            gpus,
        })
    }

    /// A table for people.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let v = self.cuda_driver_version;
        let _ = writeln!(
            out,
            "driver {}, CUDA {}.{}, {} GPUs",
            self.driver_version,
            v / 1000,
            (v % 1000) / 10,
            self.gpus.len()
        );
        let name_w = self
            .gpus
            .iter()
            .map(|g| g.name.len())
            .max()
            .unwrap_or(0)
            .max(4);
        let _ = writeln!(
            out,
            "{:<3}  {:<40}  {:<name_w$}  {:>10}  {:<16}  {:>4}  {:>4}  {:>3}  {:<8}  {:<4}  HEALTH",
            "IDX", "UUID", "NAME", "MEMORY", "BUS ID", "NUMA", "SMS", "CC", "NVLINK", "MIG"
        );
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        for g in &self.gpus {
            let links = if g.nvlink_peers.is_empty() {
                "-".to_string()
            } else {
                g.nvlink_peers
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let _ = writeln!(
                out,
                "{:<3}  {:<40}  {:<name_w$}  {:>10}  {:<16}  {:>4}  {:>4}  {:>3}  {:<8}  {:<4}  {}",
                g.index,
                g.uuid,
                g.name,
                opt(g.memory_total_mib.map(|m| format!("{m} MiB"))),
                g.pci_bus_id,
                opt(g.numa_node.map(|n| n.to_string())),
                opt(g.sm_count.map(|n| n.to_string())),
                opt(g.compute_capability.clone()),
                links,
                opt(g
                    .mig_enabled
                    .map(|m| if m { "on" } else { "off" }.to_string())),
                match g.health {
                    Health::Healthy => "healthy",
                    Health::Lost => "LOST",
                }
            );
        }
        out
    }
}

impl Inventory {
    /// The GPUs as a `GpuNode` status lists them (`devices`), NVLink peers
    /// as UUIDs. A lost GPU is listed unhealthy, its size as 0 when NVML can
    /// no longer tell it.
    pub fn api_devices(&self) -> Result<Vec<api::Device>, GpuError> {
        self.gpus.iter().map(|g| g.api_device(&self.gpus)).collect()
    }
}

impl InventoryGpu {
    fn parsed_uuid(&self) -> Result<GpuUuid, GpuError> {
        self.uuid.parse().map_err(|source| GpuError::Uuid {
            index: self.index,
            source,
        })
    }

    fn api_device(&self, all: &[InventoryGpu]) -> Result<api::Device, GpuError> {
        let nvlink_peers = self
            .nvlink_peers
            .iter()
            .filter_map(|&i| all.iter().find(|g| g.index == i))
            .map(InventoryGpu::parsed_uuid)
            .collect::<Result<_, _>>()?;
        let (health, health_reason) = match self.health {
            Health::Healthy => (api::Health::Healthy, None),
            Health::Lost => (
                api::Health::Unhealthy,
                Some("lost (fallen off the bus)".to_owned()),
            ),
        };
        Ok(api::Device {
            uuid: self.parsed_uuid()?,
            index: self.index,
            model: self.name.clone(),
            memory_mib: self.memory_total_mib.unwrap_or(0),
            sm_count: self.sm_count.unwrap_or(0),
            numa_node: self.numa_node,
            nvlink_peers,
            health,
            health_reason,
        })
    }

    fn new(d: &GpuDevice, all: &[GpuDevice]) -> Self {
        let mut nvlink_peers: Vec<u32> = d
            .nvlink_remote_bus_ids
            .iter()
            .filter_map(|bus| {
                all.iter()
                    .find(|o| o.pci_bus_id.eq_ignore_ascii_case(bus))
                    .map(|o| o.index)
            })
            .filter(|&i| i != d.index)
            .collect();
        nvlink_peers.sort_unstable();
        nvlink_peers.dedup();
        Self {
            index: d.index,
            uuid: d.uuid.clone(),
            name: d.name.clone(),
            memory_total_mib: d.memory_total_bytes.map(|b| b >> 20),
            pci_bus_id: d.pci_bus_id.clone(),
            numa_node: d.numa_node,
            sm_count: d.sm_count,
            compute_capability: d.compute_capability.map(|[a, b]| format!("{a}.{b}")),
            nvlink_peers,
            mig_enabled: d.mig_enabled,
            health: d.health,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FakeBackend, FakeGpu};

    fn node() -> FakeBackend {
        let mut a = FakeGpu::new(0, "NVIDIA H100 80GB HBM3", 81559);
        let mut b = FakeGpu::new(1, "NVIDIA H100 80GB HBM3", 81559);
        let c = FakeGpu::new(2, "NVIDIA L4", 23034);
        // Two links from 0 to 1 (lower-case, as a remote end may print it)
        // and one to an NVSwitch port.
        a.device.nvlink_remote_bus_ids = vec![
            b.device.pci_bus_id.to_lowercase(),
            b.device.pci_bus_id.clone(),
            "00000000:C1:00.0".into(),
        ];
        b.device.nvlink_remote_bus_ids = vec![a.device.pci_bus_id.clone()];
        b.device.mig_enabled = Some(true);
        FakeBackend::new(vec![a, b, c.lost()])
    }

    #[test]
    fn api_devices_carry_uuids_peers_and_health() {
        let inv = Inventory::collect(&node()).unwrap();
        let devices = inv.api_devices().unwrap();
        assert_eq!(devices.len(), 3);
        assert_eq!(devices[0].uuid.to_string(), inv.gpus[0].uuid);
        assert_eq!(devices[0].nvlink_peers, vec![devices[1].uuid]);
        assert_eq!(devices[0].memory_mib, 81559);
        assert_eq!(devices[0].health, api::Health::Healthy);
        assert_eq!(devices[2].health, api::Health::Unhealthy);
        assert!(
            devices[2]
                .health_reason
                .as_deref()
                .unwrap()
                .contains("lost")
        );

        let mut bad = inv.clone();
        bad.gpus[1].uuid = "GPU-not-a-uuid".into();
        let e = bad.api_devices().unwrap_err();
        assert!(matches!(e, GpuError::Uuid { index: 1, .. }), "{e}");
        assert!(
            tessera_error_chain::with_causes(&e).contains("\"GPU-not-a-uuid\""),
            "{}",
            tessera_error_chain::with_causes(&e)
        );
    }

    #[test]
    fn nvlink_ends_become_peer_indices() {
        let inv = Inventory::collect(&node()).unwrap();
        assert_eq!(inv.gpus[0].nvlink_peers, vec![1]);
        assert_eq!(inv.gpus[1].nvlink_peers, vec![0]);
        assert!(inv.gpus[2].nvlink_peers.is_empty());
    }

    #[test]
    fn lost_gpus_are_listed_without_live_values() {
        let inv = Inventory::collect(&node()).unwrap();
        assert_eq!(inv.gpus.len(), 3);
        assert_eq!(inv.gpus[2].health, Health::Lost);
        assert_eq!(inv.gpus[2].memory_total_mib, None);
        assert_eq!(inv.gpus[0].memory_total_mib, Some(81559));
        assert_eq!(inv.gpus[0].compute_capability.as_deref(), Some("9.0"));
        let table = inv.table();
        assert!(
            table.starts_with("driver 550.54.15, CUDA 12.4, 3 GPUs\n"),
            "{table}"
        );
        assert!(table.lines().nth(4).unwrap().ends_with("LOST"), "{table}");
        assert!(
            table.lines().nth(2).unwrap().contains("81559 MiB"),
            "{table}"
        );
    }

    #[test]
    fn json_names_every_field() {
        let inv = Inventory::collect(&node()).unwrap();
        let v = serde_json::to_value(&inv).unwrap();
        assert_eq!(v["cuda_driver_version"], 12040);
        assert_eq!(v["gpus"][1]["mig_enabled"], true);
        assert_eq!(v["gpus"][2]["health"], "lost");
        assert_eq!(v["gpus"][2]["memory_total_mib"], serde_json::Value::Null);
        assert_eq!(v["gpus"][0]["nvlink_peers"], serde_json::json!([1]));
    }

    #[test]
    fn usage_of_a_lost_gpu_is_an_error() {
        let be = node();
        assert!(be.usage(0, 0).is_ok());
        let e = be.usage(2, 0).unwrap_err();
        assert_eq!(e.to_string(), "GPU 2 is lost (fallen off the bus)");
        let e = be.device(7).unwrap_err();
        assert_eq!(e.to_string(), "there is no GPU 7 on this node (3 GPUs)");
    }
}
