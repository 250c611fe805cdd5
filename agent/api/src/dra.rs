//! Tessera's Dynamic Resource Allocation vocabulary: the driver's name,
//! how its devices are named, the attributes and consumable capacities
//! they carry, and the one reading of what a claim's allocation consumed
//! ([`Share`]). The agent publishes and prepares with these; the webhook
//! writes claims with them.
//!
//! One device per GPU, `gpu-<NVML index>`, shared by claims
//! (`allowMultipleAllocations`): capacity [`MEMORY`] in bytes (requests
//! rounded up to whole MiB) and [`CORES`], percent of the GPU's SMs. A
//! request that names no capacity consumes each capacity's default, the
//! whole GPU.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity::{QuantityError, parse_whole};

/// The driver's name: ResourceSlices, DeviceClass and CDI vendor.
pub const DRIVER: &str = "gpu.tessera.dev";
/// The DeviceClass the chart ships (selects every device of [`DRIVER`]).
pub const DEVICE_CLASS: &str = "gpu.tessera.dev";
/// Consumable capacity: device memory, in bytes.
pub const MEMORY: &str = "memory";
/// Consumable capacity: percent of the GPU's SMs (1 to 100).
pub const CORES: &str = "cores";
/// Steps of [`MEMORY`]: whole MiB.
pub const MIB: u64 = 1 << 20;

/// Attribute names of a device (unqualified names are in [`DRIVER`]'s
/// domain, as DRA qualifies them).
pub mod attribute {
    /// The GPU's UUID (`GPU-…`), string.
    pub const UUID: &str = "uuid";
    /// Product name as NVML reports it, string.
    pub const PRODUCT_NAME: &str = "productName";
    /// Architecture from the compute capability (`hopper`, …), string.
    pub const ARCHITECTURE: &str = "architecture";
    /// CUDA compute capability, version (`9.0.0`).
    pub const COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
    /// Kernel driver version, version (`595.45.4`).
    pub const DRIVER_VERSION: &str = "driverVersion";
    /// CUDA driver API version, version (`12.8.0`).
    pub const CUDA_DRIVER_VERSION: &str = "cudaDriverVersion";
    /// NUMA node, int.
    pub const NUMA_NODE: &str = "numaNode";
    /// NVML index, int.
    pub const INDEX: &str = "index";
    /// The PCIe root complex, the standard attribute's qualified name.
    pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
    /// NVLink peers' UUIDs, comma-separated, string.
    pub const NVLINK_PEERS: &str = "nvlinkPeers";
}

/// Why an allocation's consumed capacity cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    /// A capacity value is not a whole-number quantity.
    #[error("consumed capacity {name} = {value:?} {problem}")]
    Quantity {
        /// The capacity.
        name: String,
        /// The value as recorded.
        value: String,
        /// What is wrong.
        problem: QuantityError,
    },
    /// A capacity value is outside what the device has.
    #[error("consumed capacity {name} = {value:?} is outside {range}")]
    Range {
        /// The capacity.
        name: String,
        /// The value as recorded.
        value: String,
        /// The accepted range.
        range: String,
    },
    /// A capacity this driver does not publish.
    #[error("consumed capacity {name} is not one of {MEMORY} and {CORES}")]
    Unknown {
        /// The capacity.
        name: String,
    },
}

/// What one allocation of a device holds: its limits in the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Device memory (MiB).
    pub memory_mib: u64,
    /// Percent of the SMs (1 to 100).
    pub cores: u32,
}

impl Share {
    /// The share recorded by the scheduler in a device's
    /// `consumedCapacity` (absent or missing entries: the whole GPU), on a
    /// GPU of `total_mib` MiB. Memory is rounded up to whole MiB, as the
    /// published request policy has the scheduler do.
    ///
    /// # Errors
    /// A [`ShareError`] naming the capacity and what is wrong.
    pub fn from_consumed(
        consumed: Option<&BTreeMap<String, Quantity>>,
        total_mib: u64,
    ) -> Result<Self, ShareError> {
        let mut share = Self {
            memory_mib: total_mib,
            cores: 100,
        };
        for (name, value) in consumed.into_iter().flatten() {
            let whole = parse_whole(&value.0).map_err(|problem| ShareError::Quantity {
                name: name.clone(),
                value: value.0.clone(),
                problem,
            })?;
            let range = |range: String| ShareError::Range {
                name: name.clone(),
                value: value.0.clone(),
                range,
            };
            match name.as_str() {
                MEMORY => {
                    let mib = whole.div_ceil(MIB);
                    if mib == 0 || mib > total_mib {
                        return Err(range(format!("1 byte to {total_mib}Mi")));
                    }
                    share.memory_mib = mib;
                }
                CORES => {
                    share.cores = u32::try_from(whole)
                        .ok()
                        .filter(|c| (1..=100).contains(c))
                        .ok_or_else(|| range("1 to 100".to_owned()))?;
                }
                _ => return Err(ShareError::Unknown { name: name.clone() }),
            }
        }
        Ok(share)
    }
}

/// An attribute's fully qualified name, as claims' constraints name it
/// (`uuid` → `gpu.tessera.dev/uuid`).
pub fn qualified(attribute: &str) -> String {
    format!("{DRIVER}/{attribute}")
}

/// The device name of the GPU with NVML index `index`.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The NVML index a device name of this driver stands for.
pub fn device_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("gpu-")?;
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    digits.parse().ok()
}

/// The architecture of a CUDA compute capability (`major.minor`), in
/// lower case; `None` for one this table does not know.
pub fn architecture(compute_capability: &str) -> Option<&'static str> {
    let (major, minor) = compute_capability.split_once('.')?;
    let minor: u32 = minor.parse().ok()?;
    Some(match (major.parse::<u32>().ok()?, minor) {
        (7, 0 | 2) => "volta",
        (7, 5) => "turing",
        (8, 9) => "ada",
        (8, _) => "ampere",
        (9, _) => "hopper",
        (10..=12, _) => "blackwell",
        _ => return None,
    })
}

/// A dotted version as DRA's semantic-version attributes want it
/// (`major.minor.patch`, no leading zeros): `9.0` → `9.0.0`,
/// `595.45.04` → `595.45.4`; `None` when it is not 1 to 3 numbers.
pub fn semver(text: &str) -> Option<String> {
    let parts: Vec<u64> = text
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let at = |i: usize| parts.get(i).copied().unwrap_or(0);
    Some(format!("{}.{}.{}", at(0), at(1), at(2)))
}

/// A CUDA driver API version (`12080`) as a semantic version (`12.8.0`).
pub fn cuda_semver(version: i32) -> Option<String> {
    let v = u32::try_from(version).ok().filter(|v| *v > 0)?;
    Some(format!("{}.{}.0", v / 1000, (v % 1000) / 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumed(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect()
    }

    #[test]
    fn a_share_reads_the_scheduler_s_spellings() {
        let s = Share::from_consumed(
            Some(&consumed(&[("memory", "4Gi"), ("cores", "30")])),
            81559,
        )
        .unwrap();
        assert_eq!(
            s,
            Share {
                memory_mib: 4096,
                cores: 30
            }
        );
        // Rounded up to whole MiB; decimal suffixes as the API server stores them.
        let s = Share::from_consumed(Some(&consumed(&[("memory", "4e9")])), 81559).unwrap();
        assert_eq!(
            s,
            Share {
                memory_mib: 3815,
                cores: 100
            }
        );
        let whole = Share::from_consumed(None, 1000).unwrap();
        assert_eq!(
            whole,
            Share {
                memory_mib: 1000,
                cores: 100
            }
        );
    }

    #[test]
    fn a_share_outside_the_device_is_refused_naming_the_capacity() {
        let err = |pairs| {
            Share::from_consumed(Some(&consumed(pairs)), 1000)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[("memory", "2000Mi")]).contains("memory = \"2000Mi\" is outside"));
        assert!(err(&[("memory", "0")]).contains("outside"));
        assert!(err(&[("cores", "0")]).contains("cores = \"0\" is outside 1 to 100"));
        assert!(err(&[("cores", "101")]).contains("outside 1 to 100"));
        assert!(err(&[("cores", "500m")]).contains("is not a whole number"));
        assert!(err(&[("power", "1")]).contains("power is not one of"));
    }

    #[test]
    fn attributes_qualify_in_the_driver_s_domain() {
        assert_eq!(qualified(attribute::UUID), "gpu.tessera.dev/uuid");
    }

    #[test]
    fn device_names_round_trip_and_others_are_not_ours() {
        assert_eq!(device_index(&device_name(7)), Some(7));
        for bad in ["gpu-", "gpu-01", "gpu-x", "mig-1", "gpu--1"] {
            assert_eq!(device_index(bad), None, "{bad}");
        }
    }

    #[test]
    fn versions_become_semantic_versions() {
        assert_eq!(semver("9.0").as_deref(), Some("9.0.0"));
        assert_eq!(semver("595.45.04").as_deref(), Some("595.45.4"));
        assert_eq!(semver("1.2.3.4"), None);
        assert_eq!(semver("x"), None);
        assert_eq!(cuda_semver(12080).as_deref(), Some("12.8.0"));
        assert_eq!(cuda_semver(13050).as_deref(), Some("13.5.0"));
        assert_eq!(architecture("9.0"), Some("hopper"));
        assert_eq!(architecture("8.9"), Some("ada"));
        assert_eq!(architecture("8.6"), Some("ampere"));
        assert_eq!(architecture("3.5"), None);
    }
}
