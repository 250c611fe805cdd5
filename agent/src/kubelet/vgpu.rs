//! vGPU device IDs and the device list kubelet sees.
//!
//! Each physical GPU is advertised as `split` devices named
//! `<GPU-UUID>::<n>`, `n` in `0..split` (the replica form NVIDIA's plugin
//! uses, so dcgm-exporter with `KUBERNETES_VIRTUAL_GPUS=true` maps them to
//! the GPU). A vGPU's health and NUMA node are its GPU's.

use std::fmt;
use std::str::FromStr;

use tessera_kubelet_api::deviceplugin::v1beta1 as dp;
use tessera_kubelet_api::deviceplugin::{HEALTHY, MAX_DEVICE_ID_LEN, UNHEALTHY};

use crate::gpu::InventoryGpu;

/// Separator between the GPU UUID and the replica number.
const SEP: &str = "::";

/// A vGPU: replica `replica` of the GPU `uuid`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VgpuId {
    /// `GPU-…` UUID of the physical GPU.
    pub uuid: String,
    /// Replica number, below the split count.
    pub replica: u32,
}

/// A device ID that is not `<GPU-UUID>::<n>`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("device id {id:?} is not <GPU-UUID>::<n>: {why}")]
pub struct VgpuIdError {
    /// The ID as received.
    pub id: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl FromStr for VgpuId {
    type Err = VgpuIdError;

    fn from_str(id: &str) -> Result<Self, Self::Err> {
        let err = |why| VgpuIdError {
            id: id.to_owned(),
            why,
        };
        let (uuid, n) = id.rsplit_once(SEP).ok_or_else(|| err("no \"::\""))?;
        if !uuid.starts_with("GPU-") || uuid.len() <= 4 {
            return Err(err("the GPU part does not start with GPU-"));
        }
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("the replica is not a decimal number"));
        }
        let replica = n.parse().map_err(|_| err("the replica is too large"))?;
        Ok(Self {
            uuid: uuid.to_owned(),
            replica,
        })
    }
}

impl fmt::Display for VgpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{SEP}{}", self.uuid, self.replica)
    }
}

/// The devices of `gpus` as `ListAndWatch` sends them, `split` per GPU;
/// `healthy[i]` is the health of `gpus[i]` (missing entries count as
/// unhealthy). GPUs whose IDs would exceed kubelet's 63 characters are
/// left out (a real `GPU-<uuid>` never does).
pub fn devices(gpus: &[InventoryGpu], split: u32, healthy: &[bool]) -> Vec<dp::Device> {
    let mut out = Vec::with_capacity(gpus.len() * split as usize);
    for (i, g) in gpus.iter().enumerate() {
        let health = if healthy.get(i).copied().unwrap_or(false) {
            HEALTHY
        } else {
            UNHEALTHY
        };
        let topology = g.numa_node.map(|n| dp::TopologyInfo {
            nodes: vec![dp::NumaNode { id: i64::from(n) }],
        });
        for replica in 0..split {
            let id = VgpuId {
                uuid: g.uuid.clone(),
                replica,
            }
            .to_string();
            if id.len() > MAX_DEVICE_ID_LEN {
                continue;
            }
            out.push(dp::Device {
                id,
                health: health.to_owned(),
                topology: topology.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{FakeBackend, FakeGpu, Inventory};

    #[test]
    fn ids_round_trip_and_bad_ones_are_named() {
        let id: VgpuId = "GPU-0a0a0a0a-1111-2222-3333-444444444444::7"
            .parse()
            .unwrap();
        assert_eq!(id.replica, 7);
        assert_eq!(id.uuid, "GPU-0a0a0a0a-1111-2222-3333-444444444444");
        assert_eq!(
            id.to_string(),
            "GPU-0a0a0a0a-1111-2222-3333-444444444444::7"
        );
        for bad in [
            "GPU-x",
            "GPU-x::",
            "GPU-x::-1",
            "GPU-x::1a",
            "MIG-x::1",
            "::3",
        ] {
            let e = bad.parse::<VgpuId>().unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        assert!("GPU-x::99999999999".parse::<VgpuId>().is_err());
    }

    #[test]
    fn devices_carry_split_health_and_numa() {
        let mut a = FakeGpu::new(0, "A", 1000);
        a.device.numa_node = Some(1);
        let mut b = FakeGpu::new(1, "B", 1000);
        b.device.numa_node = None;
        let inv = Inventory::collect(&FakeBackend::new(vec![a, b])).unwrap();
        let d = devices(&inv.gpus, 3, &[true, false]);
        assert_eq!(d.len(), 6);
        assert_eq!(d[0].id, format!("{}::0", inv.gpus[0].uuid));
        assert_eq!(d[2].id, format!("{}::2", inv.gpus[0].uuid));
        assert_eq!(d[3].id, format!("{}::0", inv.gpus[1].uuid));
        assert!(d[..3].iter().all(|x| x.health == HEALTHY));
        assert!(d[3..].iter().all(|x| x.health == UNHEALTHY));
        assert_eq!(d[0].topology.as_ref().unwrap().nodes[0].id, 1);
        assert_eq!(d[3].topology, None);
        assert!(
            devices(&inv.gpus, 2, &[true])
                .iter()
                .skip(2)
                .all(|x| x.health == UNHEALTHY)
        );
    }
}
