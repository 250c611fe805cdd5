//! The node's ResourceSlice: one device per healthy GPU, shared by claims,
//! with the attributes selectors match on and the capacities claims
//! consume (vocabulary in [`tessera_api::dra`]).
//!
//! Pure: the inventory and the PCIe roots in, the object out. A lost GPU
//! leaves the slice (nothing new is allocated on it); the pool's
//! generation is the caller's, raised whenever the devices change.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tessera_api::dra::{self, MIB, attribute};

use crate::gpu::{Health, Inventory, InventoryGpu};

/// The name of `node`'s slice (one per node: every GPU fits in it).
pub fn slice_name(node: &str) -> String {
    format!("{node}-{}", dra::DRIVER)
}

/// The node object a slice belongs to (deleted with it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRef {
    /// Node name (also the pool's name).
    pub name: String,
    /// Node UID.
    pub uid: String,
}

/// The slice of `node` for `inventory`, pool generation `generation`.
/// `pcie_roots` maps a GPU's PCI bus id to its root complex, where known.
pub fn resource_slice(
    node: &NodeRef,
    inventory: &Inventory,
    pcie_roots: &BTreeMap<String, String>,
    generation: i64,
) -> res::ResourceSlice {
    let devices = inventory
        .gpus
        .iter()
        .filter(|g| g.health == Health::Healthy)
        .filter_map(|g| device(g, inventory, pcie_roots))
        .collect();
    res::ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(&node.name)),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.name.clone(),
                uid: node.uid.clone(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: res::ResourceSliceSpec {
            driver: dra::DRIVER.into(),
            node_name: Some(node.name.clone()),
            pool: res::ResourcePool {
                name: node.name.clone(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..res::ResourceSliceSpec::default()
        },
    }
}

/// One GPU as a device; `None` when NVML no longer tells its memory.
fn device(
    gpu: &InventoryGpu,
    inventory: &Inventory,
    pcie_roots: &BTreeMap<String, String>,
) -> Option<res::Device> {
    let memory_bytes = gpu.memory_total_mib?.checked_mul(MIB)?;
    let mut attributes = BTreeMap::new();
    let mut put = |name: &str, a: res::DeviceAttribute| {
        attributes.insert(name.to_owned(), a);
    };
    put(attribute::UUID, string(&gpu.uuid));
    put(attribute::PRODUCT_NAME, string(&gpu.name));
    put(attribute::INDEX, int(i64::from(gpu.index)));
    if let Some(cc) = &gpu.compute_capability {
        if let Some(v) = dra::semver(cc) {
            put(attribute::COMPUTE_CAPABILITY, version(v));
        }
        if let Some(arch) = dra::architecture(cc) {
            put(attribute::ARCHITECTURE, string(arch));
        }
    }
    if let Some(v) = dra::semver(&inventory.driver_version) {
        put(attribute::DRIVER_VERSION, version(v));
    }
    if let Some(v) = dra::cuda_semver(inventory.cuda_driver_version) {
        put(attribute::CUDA_DRIVER_VERSION, version(v));
    }
    if let Some(numa) = gpu.numa_node {
        put(attribute::NUMA_NODE, int(i64::from(numa)));
    }
    if let Some(root) = pcie_roots.get(&gpu.pci_bus_id) {
        put(attribute::PCIE_ROOT, string(root));
    }
    let peers: Vec<&str> = gpu
        .nvlink_peers
        .iter()
        .filter_map(|i| inventory.gpus.iter().find(|g| g.index == *i))
        .map(|g| g.uuid.as_str())
        .collect();
    if !peers.is_empty() {
        put(attribute::NVLINK_PEERS, string(&peers.join(",")));
    }
    let capacity = [
        (
            dra::MEMORY,
            res::DeviceCapacity {
                value: Quantity(memory_bytes.to_string()),
                request_policy: Some(res::CapacityRequestPolicy {
                    // No request: the whole memory.
                    default: Some(Quantity(memory_bytes.to_string())),
                    valid_range: Some(res::CapacityRequestPolicyRange {
                        min: Quantity(MIB.to_string()),
                        max: Some(Quantity(memory_bytes.to_string())),
                        step: Some(Quantity(MIB.to_string())),
                    }),
                    valid_values: None,
                }),
            },
        ),
        (
            dra::CORES,
            res::DeviceCapacity {
                value: Quantity("100".into()),
                request_policy: Some(res::CapacityRequestPolicy {
                    default: Some(Quantity("100".into())),
                    valid_range: Some(res::CapacityRequestPolicyRange {
                        min: Quantity("1".into()),
                        max: Some(Quantity("100".into())),
                        step: Some(Quantity("1".into())),
                    }),
                    valid_values: None,
                }),
            },
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    Some(res::Device {
        name: dra::device_name(gpu.index),
        attributes: Some(attributes),
        capacity: Some(capacity),
        allow_multiple_allocations: Some(true),
        ..res::Device::default()
    })
}

fn string(s: &str) -> res::DeviceAttribute {
    res::DeviceAttribute {
        string: Some(s.to_owned()),
        ..res::DeviceAttribute::default()
    }
}

fn int(i: i64) -> res::DeviceAttribute {
    res::DeviceAttribute {
        int: Some(i),
        ..res::DeviceAttribute::default()
    }
}

fn version(v: String) -> res::DeviceAttribute {
    res::DeviceAttribute {
        version: Some(v),
        ..res::DeviceAttribute::default()
    }
}

/// The PCIe root complex of the device at `bus_id` (`pci<domain>:<bus>`,
/// the first component of its sysfs path under `sys_root`, usually
/// `/sys`), as `resource.kubernetes.io/pcieRoot` names it; `None` where
/// sysfs does not have it (a simulated node).
pub fn pcie_root(sys_root: &Path, bus_id: &str) -> Option<String> {
    let link = sys_root
        .join("bus/pci/devices")
        .join(sysfs_address(bus_id)?);
    let target = std::fs::canonicalize(link).ok()?;
    let devices = std::fs::canonicalize(sys_root.join("devices")).ok()?;
    let first = target.strip_prefix(devices).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?;
    name.starts_with("pci").then(|| name.to_owned())
}

/// NVML's bus id (`00000000:3B:00.0`, an 8-digit domain) as sysfs names
/// the device (`0000:3b:00.0`).
fn sysfs_address(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{FakeBackend, FakeGpu};

    fn inventory() -> Inventory {
        let mut gpus: Vec<FakeGpu> = (0..3)
            .map(|i| FakeGpu::new(i, "NVIDIA H100", 81559))
            .collect();
        gpus[0].device.nvlink_remote_bus_ids = vec![gpus[1].device.pci_bus_id.clone()];
        gpus[1].device.nvlink_remote_bus_ids = vec![gpus[0].device.pci_bus_id.clone()];
        let mut inv = Inventory::collect(&FakeBackend::new(gpus)).unwrap();
        inv.gpus[2].health = Health::Lost;
        inv
    }

    fn node() -> NodeRef {
        NodeRef {
            name: "n1".into(),
            uid: "u1".into(),
        }
    }

    #[test]
    fn one_shared_device_per_healthy_gpu_with_its_capacities() {
        let inv = inventory();
        let roots = [(inv.gpus[0].pci_bus_id.clone(), "pci0000:00".to_owned())].into();
        let s = resource_slice(&node(), &inv, &roots, 4);
        assert_eq!(s.metadata.name.as_deref(), Some("n1-gpu.tessera.dev"));
        assert_eq!(s.spec.driver, "gpu.tessera.dev");
        assert_eq!(s.spec.pool.generation, 4);
        let devices = s.spec.devices.unwrap();
        assert_eq!(devices.len(), 2, "the lost GPU is left out");
        let d0 = &devices[0];
        assert_eq!(d0.name, "gpu-0");
        assert_eq!(d0.allow_multiple_allocations, Some(true));
        let attrs = d0.attributes.as_ref().unwrap();
        assert_eq!(
            attrs["uuid"].string.as_deref(),
            Some(inv.gpus[0].uuid.as_str())
        );
        assert_eq!(attrs["index"].int, Some(0));
        assert_eq!(
            attrs["resource.kubernetes.io/pcieRoot"].string.as_deref(),
            Some("pci0000:00")
        );
        assert_eq!(
            attrs["nvlinkPeers"].string.as_deref(),
            Some(inv.gpus[1].uuid.as_str())
        );
        assert!(
            !devices[1]
                .attributes
                .as_ref()
                .unwrap()
                .contains_key("resource.kubernetes.io/pcieRoot")
        );
        let cap = d0.capacity.as_ref().unwrap();
        let bytes = (81559u64 << 20).to_string();
        assert_eq!(cap["memory"].value.0, bytes);
        let policy = cap["memory"].request_policy.as_ref().unwrap();
        assert_eq!(
            policy.default.as_ref().unwrap().0,
            bytes,
            "no request: the whole GPU"
        );
        assert_eq!(
            policy
                .valid_range
                .as_ref()
                .unwrap()
                .step
                .as_ref()
                .unwrap()
                .0,
            "1048576"
        );
        assert_eq!(cap["cores"].value.0, "100");
    }

    #[test]
    fn the_slice_is_valid_json_for_the_api_server() {
        let s = resource_slice(&node(), &inventory(), &BTreeMap::new(), 1);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(v["kind"], "ResourceSlice");
        assert_eq!(v["spec"]["devices"][0]["allowMultipleAllocations"], true);
        assert_eq!(
            v["spec"]["devices"][0]["capacity"]["cores"]["requestPolicy"]["validRange"]["min"],
            "1"
        );
    }

    #[test]
    fn the_pcie_root_is_the_first_folder_of_the_sysfs_path() {
        let sys = tempfile::tempdir().unwrap();
        let dev = sys
            .path()
            .join("devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(sys.path().join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(&dev, sys.path().join("bus/pci/devices/0000:3b:00.0")).unwrap();
        assert_eq!(
            pcie_root(sys.path(), "00000000:3B:00.0").as_deref(),
            Some("pci0000:3a")
        );
        assert_eq!(pcie_root(sys.path(), "0000:99:00.0"), None);
    }
}
