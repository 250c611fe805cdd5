//! `NodePrepareResources` for one claim, on the host: the devices the
//! scheduler allocated to it on this node (with the capacity each
//! consumed) become one region directory, `claim_<UID>`, whose limits all
//! of the claim's containers share, and one CDI spec giving them the same
//! files, devices and environment as the device plugin's answer.
//! `NodeUnprepareResources` removes both.
//!
//! State lives on the host only (the region directory and the spec), so a
//! restarted agent or kubelet finds a prepared claim prepared: preparing
//! again keeps the directory that running containers map, as long as it
//! holds the same GPUs and limits. Order of effects: the directory first,
//! then the spec; a failed spec removes a directory made by this call.
//!
//! A claim's directory carries no pod UID, so the device plugin's
//! collection of departed pods never takes it; unprepare does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_api::dra::{self, DRIVER, Share, ShareError};
use tessera_kubelet_api::dra::v1 as api;

use crate::containers::meta::{GpuGrant, META_VERSION, Metadata};
use crate::containers::{ContainerId, Store, StoreError};
use crate::gpu::InventoryGpu;
use crate::kubelet::allocate::{AllocateError, HostPaths, gpus_edits};

use super::cdi::{self, CdiError};

/// Why a claim cannot be prepared or unprepared; the message names the
/// claim (kubelet shows it in the pod's events).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The claim has no allocation (kubelet asked too early, or it was
    /// deallocated).
    #[error("claim {claim} is not allocated")]
    NotAllocated {
        /// `namespace/name`.
        claim: String,
    },
    /// The UID the API server returned is not the one kubelet named.
    #[error("claim {claim} has UID {found}, not {wanted} (it was deleted and made again)")]
    Uid {
        /// `namespace/name`.
        claim: String,
        /// The UID kubelet named.
        wanted: String,
        /// The UID found.
        found: String,
    },
    /// None of the claim's devices is this driver's on this node.
    #[error("claim {claim} has no device of driver {DRIVER} in pool {pool}")]
    NoDevice {
        /// `namespace/name`.
        claim: String,
        /// This node's pool.
        pool: String,
    },
    /// A device name is not one of this node's GPUs.
    #[error("claim {claim}: device {device} is not a GPU of node {node}")]
    UnknownDevice {
        /// `namespace/name`.
        claim: String,
        /// The device name.
        device: String,
        /// This node.
        node: String,
    },
    /// The consumed capacity cannot be read.
    #[error("claim {claim}: device {device}")]
    Share {
        /// `namespace/name`.
        claim: String,
        /// The device name.
        device: String,
        /// Cause.
        #[source]
        source: ShareError,
    },
    /// The devices ask for different SM shares (one target per region).
    #[error(
        "claim {claim}: its devices consume different cores ({cores:?}); a claim's GPUs must share one SM target"
    )]
    MixedCores {
        /// `namespace/name`.
        claim: String,
        /// Cores per device, in order.
        cores: Vec<u32>,
    },
    /// The claim UID makes no region id.
    #[error("claim {claim}: UID {uid:?} makes no region id")]
    Id {
        /// `namespace/name`.
        claim: String,
        /// The UID.
        uid: String,
    },
    /// The region directory could not be made, read or removed.
    #[error("claim {claim}: region directory")]
    Region {
        /// `namespace/name` (or the UID on unprepare).
        claim: String,
        /// Cause.
        #[source]
        source: StoreError,
    },
    /// The container's edits could not be made.
    #[error("claim {claim}")]
    Edits {
        /// `namespace/name`.
        claim: String,
        /// Cause.
        #[source]
        source: AllocateError,
    },
    /// The CDI spec could not be written or removed.
    #[error("claim {claim}")]
    Cdi {
        /// `namespace/name` (or the UID on unprepare).
        claim: String,
        /// Cause.
        #[source]
        source: CdiError,
    },
}

/// One of the claim's GPUs and its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    /// Index into the inventory.
    pub gpu: usize,
    /// The device name.
    pub device: String,
    /// The claim's requests served by it.
    pub requests: Vec<String>,
    /// What the claim holds of it (summed over its requests).
    pub share: Share,
}

/// The devices of `claim` (UID `uid`, as kubelet named it) that are this
/// driver's in `node`'s pool, in the order the allocation lists them,
/// several requests on one device merged (memory and cores added, cores at
/// most 100).
pub fn allocated(
    claim: &ResourceClaim,
    uid: &str,
    node: &str,
    gpus: &[InventoryGpu],
) -> Result<Vec<Allocated>, PrepareError> {
    let name = claim_name(claim);
    let found = claim.metadata.uid.as_deref().unwrap_or_default();
    if found != uid {
        return Err(PrepareError::Uid {
            claim: name,
            wanted: uid.to_owned(),
            found: found.to_owned(),
        });
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .ok_or_else(|| PrepareError::NotAllocated {
            claim: name.clone(),
        })?;
    let mut out: Vec<Allocated> = Vec::new();
    for r in results
        .iter()
        .filter(|r| r.driver == DRIVER && r.pool == node)
    {
        let unknown = || PrepareError::UnknownDevice {
            claim: name.clone(),
            device: r.device.clone(),
            node: node.to_owned(),
        };
        let index = dra::device_index(&r.device).ok_or_else(unknown)?;
        let gpu = gpus
            .iter()
            .position(|g| g.index == index)
            .ok_or_else(unknown)?;
        let total = gpus[gpu].memory_total_mib.ok_or_else(unknown)?;
        let share =
            Share::from_consumed(r.consumed_capacity.as_ref(), total).map_err(|source| {
                PrepareError::Share {
                    claim: name.clone(),
                    device: r.device.clone(),
                    source,
                }
            })?;
        match out.iter_mut().find(|a| a.gpu == gpu) {
            Some(a) => {
                a.share.memory_mib = (a.share.memory_mib + share.memory_mib).min(total);
                a.share.cores = (a.share.cores + share.cores).min(100);
                a.requests.push(r.request.clone());
            }
            None => out.push(Allocated {
                gpu,
                device: r.device.clone(),
                requests: vec![r.request.clone()],
                share,
            }),
        }
    }
    if out.is_empty() {
        return Err(PrepareError::NoDevice {
            claim: name,
            pool: node.to_owned(),
        });
    }
    Ok(out)
}

fn claim_name(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Prepares and unprepares claims on this node.
#[derive(Debug, Clone)]
pub struct Preparer {
    /// This node (its pool).
    pub node: String,
    /// The region directories.
    pub store: Store,
    /// Library and device paths, as for `Allocate`.
    pub paths: HostPaths,
    /// Where CDI specs go (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The inventory.
    pub gpus: Vec<InventoryGpu>,
    /// `minors[i]`: the device minor of `gpus[i]`.
    pub minors: Vec<Option<u32>>,
}

/// The region id of claim `uid`.
pub fn region_id(uid: &str) -> Option<ContainerId> {
    ContainerId::new(&format!("claim_{uid}")).ok()
}

impl Preparer {
    /// Prepares `claim` (kubelet's UID `uid`): region directory and CDI
    /// spec, then the devices kubelet hands to the runtime.
    pub fn prepare(
        &self,
        claim: &ResourceClaim,
        uid: &str,
    ) -> Result<Vec<api::Device>, PrepareError> {
        let name = claim_name(claim);
        let devices = allocated(claim, uid, &self.node, &self.gpus)?;
        let cores: Vec<u32> = devices.iter().map(|d| d.share.cores).collect();
        if cores.iter().any(|c| *c != cores[0]) {
            return Err(PrepareError::MixedCores { claim: name, cores });
        }
        let id = region_id(uid).ok_or_else(|| PrepareError::Id {
            claim: name.clone(),
            uid: uid.to_owned(),
        })?;
        let meta = Metadata {
            version: META_VERSION,
            namespace: claim.metadata.namespace.clone(),
            pod: None,
            container: None,
            claim: claim.metadata.name.clone(),
            pod_uid: None,
            cgroup: None,
            sm_target: cores[0],
            mode: None,
            priority: None,
            labels: BTreeMap::new(),
            fail_open: false,
            gpus: devices
                .iter()
                .map(|d| GpuGrant {
                    uuid: self.gpus[d.gpu].uuid.clone(),
                    memory_limit_bytes: Some(d.share.memory_mib << 20),
                    context_overhead_bytes: 0,
                })
                .collect(),
        };
        let region = |source| PrepareError::Region {
            claim: name.clone(),
            source,
        };
        let (dir, made) = match self.store.add(&id, &meta) {
            Ok(c) => (c.dir, true),
            Err(StoreError::Exists { .. }) => {
                let old = self.store.load(&id).map_err(region)?;
                if old.meta.gpus == meta.gpus && old.meta.sm_target == meta.sm_target {
                    // Prepared before (kubelet or agent restarted): keep
                    // the directory running containers map.
                    (old.dir, false)
                } else {
                    self.store.remove(&id).map_err(region)?;
                    (self.store.add(&id, &meta).map_err(region)?.dir, true)
                }
            }
            Err(e) => return Err(region(e)),
        };
        let chosen: Vec<usize> = devices.iter().map(|d| d.gpu).collect();
        let written = gpus_edits(&chosen, &self.gpus, &self.minors, &self.paths, &dir)
            .map_err(|source| PrepareError::Edits {
                claim: name.clone(),
                source,
            })
            .and_then(|edits| {
                cdi::write(&self.cdi_dir, uid, &edits).map_err(|source| PrepareError::Cdi {
                    claim: name.clone(),
                    source,
                })
            });
        if let Err(e) = written {
            if made {
                let _ = self.store.remove(&id);
            }
            return Err(e);
        }
        tracing::info!(claim = %name, region = %dir.display(), gpus = ?meta.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>(), "claim prepared");
        // Where the NVIDIA Container Toolkit defines the GPU as a CDI
        // device (a real node with CDI specs generated), the runtime also
        // applies NVIDIA's edits (driver libraries, device nodes); the
        // claim's own spec adds the region and the preload.
        let nvidia = cdi::nvidia_device_names(&[&self.cdi_dir, Path::new(cdi::STATIC_DIR)]);
        Ok(devices
            .into_iter()
            .map(|d| {
                let gpu = &self.gpus[d.gpu];
                let mut ids = vec![cdi::device_id(uid)];
                ids.extend(cdi::nvidia_device(&nvidia, &gpu.uuid, gpu.index));
                api::Device {
                    request_names: d.requests,
                    pool_name: self.node.clone(),
                    device_name: d.device,
                    cdi_device_ids: ids,
                }
            })
            .collect())
    }

    /// Removes claim `uid`'s CDI spec and region directory; a claim not
    /// prepared here is done.
    pub fn unprepare(&self, uid: &str) -> Result<(), PrepareError> {
        cdi::remove(&self.cdi_dir, uid).map_err(|source| PrepareError::Cdi {
            claim: uid.to_owned(),
            source,
        })?;
        let Some(id) = region_id(uid) else {
            return Ok(());
        };
        match self.store.remove(&id) {
            Ok(()) | Err(StoreError::Missing { .. }) => Ok(()),
            Err(source) => Err(PrepareError::Region {
                claim: uid.to_owned(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use serde_json::json;

    use super::*;
    use crate::gpu::{FakeBackend, FakeGpu, Inventory};

    const UID: &str = "6f1c2b9a-0000-4000-8000-00000000c1a1";

    fn claim(results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": UID},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .unwrap()
    }

    fn result(device: &str, request: &str, memory: &str, cores: &str) -> serde_json::Value {
        json!({"driver": "gpu.tessera.dev", "pool": "n1", "device": device, "request": request,
               "consumedCapacity": {"memory": memory, "cores": cores}})
    }

    struct Fixture {
        _dirs: tempfile::TempDir,
        preparer: Preparer,
    }

    fn fixture() -> Fixture {
        let dirs = tempfile::tempdir().unwrap();
        let gpus = Inventory::collect(&FakeBackend::new(
            (0..2).map(|i| FakeGpu::new(i, "H100", 81559)).collect(),
        ))
        .unwrap()
        .gpus;
        let preparer = Preparer {
            node: "n1".into(),
            store: Store::new(dirs.path().join("containers")),
            paths: HostPaths {
                library_dir: "/var/lib/tessera/lib/0.1.0".into(),
                dev_dir: dirs.path().join("dev"),
            },
            cdi_dir: dirs.path().join("cdi"),
            gpus,
            minors: vec![Some(0), Some(1)],
        };
        Fixture {
            _dirs: dirs,
            preparer,
        }
    }

    #[test]
    fn a_claim_becomes_one_region_with_its_share_and_one_cdi_device() {
        let f = fixture();
        let c = claim(json!([result("gpu-1", "r", "4Gi", "30")]));
        let devices = f.preparer.prepare(&c, UID).unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].device_name, "gpu-1");
        assert_eq!(devices[0].pool_name, "n1");
        assert_eq!(devices[0].request_names, ["r"]);
        assert_eq!(
            devices[0].cdi_device_ids,
            [format!("gpu.tessera.dev/claim={UID}")]
        );
        let id = region_id(UID).unwrap();
        let region = f.preparer.store.load(&id).unwrap();
        assert_eq!(region.meta.sm_target, 30);
        assert_eq!(region.meta.gpus[0].uuid, f.preparer.gpus[1].uuid);
        assert_eq!(region.meta.gpus[0].memory_limit_bytes, Some(4096 << 20));
        // Metrics name the claim.
        assert_eq!(region.meta.claim.as_deref(), Some("c"));
        assert_eq!(region.meta.namespace.as_deref(), Some("ns"));
        assert_eq!(
            region.meta.pod_uid, None,
            "never taken by the pods' collection"
        );
        let spec: serde_json::Value = serde_json::from_slice(
            &std::fs::read(cdi::spec_path(&f.preparer.cdi_dir, UID)).unwrap(),
        )
        .unwrap();
        let mounts = &spec["devices"][0]["containerEdits"]["mounts"];
        let control = region.dir.join("control").to_string_lossy().into_owned();
        assert!(
            mounts
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["hostPath"] == control.as_str()
                    && m["containerPath"] == "/run/tessera/control"
                    && m["options"][0] == "ro"),
            "{mounts}"
        );
    }

    #[test]
    fn preparing_again_keeps_the_directory_and_unprepare_removes_everything() {
        let f = fixture();
        let c = claim(json!([result("gpu-0", "r", "1Gi", "50")]));
        f.preparer.prepare(&c, UID).unwrap();
        let dir = f.preparer.store.dir(&region_id(UID).unwrap());
        let ino = std::fs::metadata(dir.join("control")).unwrap().ino();
        f.preparer.prepare(&c, UID).unwrap();
        assert_eq!(
            std::fs::metadata(dir.join("control")).unwrap().ino(),
            ino,
            "the mapped files stay"
        );
        f.preparer.unprepare(UID).unwrap();
        assert!(!dir.exists());
        assert!(!cdi::spec_path(&f.preparer.cdi_dir, UID).exists());
        f.preparer.unprepare(UID).unwrap();
    }

    #[test]
    fn two_requests_on_one_gpu_add_up() {
        let f = fixture();
        let c = claim(json!([
            result("gpu-0", "a", "1Gi", "20"),
            result("gpu-0", "b", "2Gi", "20"),
        ]));
        let got = allocated(&c, UID, "n1", &f.preparer.gpus).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].share,
            Share {
                memory_mib: 3072,
                cores: 40
            }
        );
        assert_eq!(got[0].requests, ["a", "b"]);
    }

    #[test]
    fn claims_that_cannot_be_prepared_say_why_and_leave_nothing() {
        let f = fixture();
        let err = |c: ResourceClaim, uid: &str| {
            let e = f.preparer.prepare(&c, uid).unwrap_err();
            crate::error_chain::with_causes(&e)
        };
        let one = claim(json!([result("gpu-0", "r", "1Gi", "10")]));
        assert!(err(one.clone(), "other").contains("has UID"));
        let elsewhere = claim(
            json!([{"driver": "gpu.tessera.dev", "pool": "n2", "device": "gpu-0", "request": "r"}]),
        );
        assert!(err(elsewhere, UID).contains("no device of driver gpu.tessera.dev in pool n1"));
        assert!(
            err(claim(json!([result("gpu-7", "r", "1Gi", "10")])), UID)
                .contains("device gpu-7 is not a GPU of node n1")
        );
        assert!(
            err(claim(json!([result("gpu-0", "r", "1Gi", "0")])), UID).contains("cores = \"0\"")
        );
        let mixed = claim(json!([
            result("gpu-0", "a", "1Gi", "10"),
            result("gpu-1", "b", "1Gi", "20")
        ]));
        assert!(err(mixed, UID).contains("different cores"));
        let mut unallocated = one;
        unallocated.status = None;
        assert!(err(unallocated, UID).contains("is not allocated"));
        assert!(f.preparer.store.list().unwrap().containers.is_empty());
    }

    /// Where NVIDIA's toolkit has a CDI device for the GPU, the runtime
    /// gets it beside the claim's own.
    #[test]
    fn nvidia_s_cdi_device_comes_with_the_claim_s_where_there_is_one() {
        let f = fixture();
        let uuid = f.preparer.gpus[1].uuid.clone();
        std::fs::create_dir_all(&f.preparer.cdi_dir).unwrap();
        std::fs::write(
            f.preparer.cdi_dir.join("nvidia.com-gpu.json"),
            json!({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [
                {"name": "0", "containerEdits": {}},
                {"name": uuid, "containerEdits": {}},
            ]})
            .to_string(),
        )
        .unwrap();
        let c = claim(json!([result("gpu-1", "r", "4Gi", "30")]));
        let devices = f.preparer.prepare(&c, UID).unwrap();
        assert_eq!(
            devices[0].cdi_device_ids,
            [
                format!("gpu.tessera.dev/claim={UID}"),
                format!("nvidia.com/gpu={uuid}")
            ]
        );
    }

    #[test]
    fn a_whole_gpu_claim_gets_the_whole_gpu() {
        let f = fixture();
        let c = claim(
            json!([{"driver": "gpu.tessera.dev", "pool": "n1", "device": "gpu-0", "request": "r"}]),
        );
        let got = allocated(&c, UID, "n1", &f.preparer.gpus).unwrap();
        assert_eq!(
            got[0].share,
            Share {
                memory_mib: 81559,
                cores: 100
            }
        );
    }
}
