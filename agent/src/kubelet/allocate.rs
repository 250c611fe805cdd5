//! The shape of an `Allocate` answer for one container: what kubelet
//! mounts and which device nodes and environment it gives (step 4 of
//! "The path of a GPU pod" in ARCHITECTURE.md).
//!
//! [`gpus_edits`] is the one place that decides what a GPU container gets
//! once its region directory exists, as [`Edits`]: [`gpus_response`] turns
//! them into the answer ([`super::allocator`] calls it with the GPUs of
//! the pod's assignment; [`container_response`] is the same for the GPUs
//! named by vGPU IDs), and the DRA driver into a claim's CDI spec.
//!
//! Invariants:
//! - limits never travel in the environment: the only variable is
//!   `NVIDIA_VISIBLE_DEVICES` (which GPUs, for the NVIDIA runtime);
//! - the container gets the region's two files, `control` read-only and
//!   `usage` read-write, never the host directory itself (which also
//!   holds the agent's metadata), so it can neither replace `control` nor
//!   touch anything else there;
//! - the preload library and `/etc/ld.so.preload` come read-only from a
//!   versioned host directory (a new library version is a new directory,
//!   so running containers keep theirs);
//! - one vGPU per physical GPU (`nvidia.com/gpu: n` means `n` GPUs).

use std::path::{Path, PathBuf};

use tessera_kubelet_api::deviceplugin::v1beta1 as dp;
use tessera_region::file::{CONTROL_FILE, USAGE_FILE};

use crate::gpu::InventoryGpu;

use super::vgpu::{VgpuId, VgpuIdError};

/// Where the region's files appear in the container.
pub const CONTAINER_REGION_DIR: &str = "/run/tessera";
/// Where the versioned library directory appears in the container (the
/// host's `ld.so.preload` names `libtessera.so` under it).
pub const CONTAINER_LIBRARY_DIR: &str = "/usr/local/lib/tessera";
/// The preload list in the container.
pub const CONTAINER_LD_SO_PRELOAD: &str = "/etc/ld.so.preload";
/// File name of the preload list in the versioned library directory.
pub const LD_SO_PRELOAD_FILE: &str = "ld.so.preload";
/// The preload library's file name in the versioned library directory.
pub const LIBRARY_FILE: &str = "libtessera.so";
/// Device nodes every GPU container needs besides its GPUs' (those
/// present on the host are passed).
pub const SHARED_DEVICES: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

/// Host paths the answer refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPaths {
    /// The versioned library directory, e.g.
    /// `/var/lib/tessera/lib/0.1.0` (holds `libtessera.so` and
    /// `ld.so.preload`).
    pub library_dir: PathBuf,
    /// Where the device nodes are (`/dev`).
    pub dev_dir: PathBuf,
}

/// Why a container's devices cannot be answered.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// A device ID is not ours.
    #[error("cannot allocate")]
    BadId(#[source] VgpuIdError),
    /// The GPU is not on this node.
    #[error("device {id} names a GPU that is not on this node")]
    UnknownGpu {
        /// The device ID.
        id: String,
    },
    /// Two vGPUs of one GPU in one request.
    #[error(
        "devices {first} and {second} are on the same GPU; each vGPU of a container must be on a different GPU"
    )]
    SameGpu {
        /// One device ID.
        first: String,
        /// The other.
        second: String,
    },
    /// No device ID at all.
    #[error("the container request names no device")]
    Empty,
    /// NVML gave no minor number for the GPU.
    #[error("GPU {uuid} has no known device node (no minor number from NVML)")]
    NoMinor {
        /// The GPU.
        uuid: String,
    },
}

/// The answer for a container given `ids` (vGPU IDs), with its region
/// files in `region_dir` on the host. `minors[i]` is the `/dev/nvidia<N>`
/// minor of `gpus[i]`.
pub fn container_response(
    ids: &[String],
    gpus: &[InventoryGpu],
    minors: &[Option<u32>],
    paths: &HostPaths,
    region_dir: &Path,
) -> Result<dp::ContainerAllocateResponse, AllocateError> {
    if ids.is_empty() {
        return Err(AllocateError::Empty);
    }
    let mut chosen: Vec<(usize, &String)> = Vec::with_capacity(ids.len());
    for id in ids {
        let v: VgpuId = id.parse().map_err(AllocateError::BadId)?;
        let i = gpus
            .iter()
            .position(|g| g.uuid == v.uuid)
            .ok_or_else(|| AllocateError::UnknownGpu { id: id.clone() })?;
        if let Some((_, first)) = chosen.iter().find(|(j, _)| *j == i) {
            return Err(AllocateError::SameGpu {
                first: (*first).clone(),
                second: id.clone(),
            });
        }
        chosen.push((i, id));
    }
    let indices: Vec<usize> = chosen.iter().map(|(i, _)| *i).collect();
    gpus_response(&indices, gpus, minors, paths, region_dir)
}

/// What a GPU container gets, whoever hands it over: the device plugin's
/// `Allocate` answer ([`Edits::response`]) or a DRA claim's CDI spec
/// (the DRA driver's, a floor above). Host paths are absolute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edits {
    /// Environment: only `NVIDIA_VISIBLE_DEVICES` (never a limit).
    pub env: Vec<(String, String)>,
    /// Bind mounts, in order.
    pub mounts: Vec<Bind>,
    /// Device nodes (read and write, never mknod).
    pub devices: Vec<DeviceNode>,
}

/// A bind mount of [`Edits`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    /// On the host.
    pub host: PathBuf,
    /// In the container.
    pub container: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// A device node of [`Edits`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceNode {
    /// On the host.
    pub host: PathBuf,
    /// In the container.
    pub container: String,
}

/// The edits for a container given the GPUs `chosen` (indices into
/// `gpus`, distinct, in the container's order), with its region files in
/// `region_dir` on the host. `minors[i]` is the `/dev/nvidia<N>` minor of
/// `gpus[i]`.
pub fn gpus_edits(
    chosen: &[usize],
    gpus: &[InventoryGpu],
    minors: &[Option<u32>],
    paths: &HostPaths,
    region_dir: &Path,
) -> Result<Edits, AllocateError> {
    if chosen.is_empty() {
        return Err(AllocateError::Empty);
    }
    let mut devices = Vec::new();
    for name in SHARED_DEVICES {
        let host = paths.dev_dir.join(name);
        if host.exists() {
            devices.push(DeviceNode {
                host,
                container: format!("/dev/{name}"),
            });
        }
    }
    for i in chosen {
        let minor = minors
            .get(*i)
            .copied()
            .flatten()
            .ok_or_else(|| AllocateError::NoMinor {
                uuid: gpus[*i].uuid.clone(),
            })?;
        let name = format!("nvidia{minor}");
        devices.push(DeviceNode {
            host: paths.dev_dir.join(&name),
            container: format!("/dev/{name}"),
        });
    }
    let visible: Vec<&str> = chosen.iter().map(|i| gpus[*i].uuid.as_str()).collect();
    let bind = |host: PathBuf, container: String, read_only| Bind {
        host,
        container,
        read_only,
    };
    Ok(Edits {
        env: vec![("NVIDIA_VISIBLE_DEVICES".to_owned(), visible.join(","))],
        mounts: vec![
            bind(
                paths.library_dir.clone(),
                CONTAINER_LIBRARY_DIR.into(),
                true,
            ),
            bind(
                paths.library_dir.join(LD_SO_PRELOAD_FILE),
                CONTAINER_LD_SO_PRELOAD.into(),
                true,
            ),
            bind(
                region_dir.join(CONTROL_FILE),
                format!("{CONTAINER_REGION_DIR}/{CONTROL_FILE}"),
                true,
            ),
            bind(
                region_dir.join(USAGE_FILE),
                format!("{CONTAINER_REGION_DIR}/{USAGE_FILE}"),
                false,
            ),
        ],
        devices,
    })
}

impl Edits {
    /// As the device plugin's answer for one container.
    pub fn response(self) -> dp::ContainerAllocateResponse {
        dp::ContainerAllocateResponse {
            envs: self.env.into_iter().collect(),
            mounts: self
                .mounts
                .into_iter()
                .map(|m| dp::Mount {
                    container_path: m.container,
                    host_path: m.host.to_string_lossy().into_owned(),
                    read_only: m.read_only,
                })
                .collect(),
            devices: self
                .devices
                .iter()
                .map(|d| device(&d.host, &d.container))
                .collect(),
            annotations: Default::default(),
            cdi_devices: vec![],
        }
    }
}

/// The answer for a container given the GPUs `chosen` (indices into
/// `gpus`, distinct, in the container's order), with its region files in
/// `region_dir` on the host: [`gpus_edits`] as the device plugin's answer.
pub fn gpus_response(
    chosen: &[usize],
    gpus: &[InventoryGpu],
    minors: &[Option<u32>],
    paths: &HostPaths,
    region_dir: &Path,
) -> Result<dp::ContainerAllocateResponse, AllocateError> {
    gpus_edits(chosen, gpus, minors, paths, region_dir).map(Edits::response)
}

fn device(host: &Path, container: &str) -> dp::DeviceSpec {
    dp::DeviceSpec {
        container_path: container.to_owned(),
        host_path: host.to_string_lossy().into_owned(),
        // Read and write; never mknod.
        permissions: "rw".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{FakeBackend, FakeGpu, Inventory};

    fn setup() -> (Vec<InventoryGpu>, tempfile::TempDir, HostPaths) {
        let gpus = Inventory::collect(&FakeBackend::new(
            (0..3).map(|i| FakeGpu::new(i, "G", 1000)).collect(),
        ))
        .unwrap()
        .gpus;
        let dev = tempfile::tempdir().unwrap();
        std::fs::write(dev.path().join("nvidiactl"), b"").unwrap();
        std::fs::write(dev.path().join("nvidia-uvm"), b"").unwrap();
        let paths = HostPaths {
            library_dir: "/var/lib/tessera/lib/0.1.0".into(),
            dev_dir: dev.path().to_owned(),
        };
        (gpus, dev, paths)
    }

    #[test]
    fn two_gpus_get_their_nodes_mounts_and_visibility_only() {
        let (gpus, dev, paths) = setup();
        let ids = vec![
            format!("{}::3", gpus[2].uuid),
            format!("{}::0", gpus[0].uuid),
        ];
        // Minors need not equal indices.
        let minors = [Some(4), Some(5), Some(6)];
        let region = Path::new("/var/lib/tessera/containers/abc");
        let r = container_response(&ids, &gpus, &minors, &paths, region).unwrap();
        assert_eq!(r.envs.len(), 1, "nothing but visibility: {:?}", r.envs);
        assert_eq!(
            r.envs["NVIDIA_VISIBLE_DEVICES"],
            format!("{},{}", gpus[2].uuid, gpus[0].uuid)
        );
        let devs: Vec<(&str, &str, &str)> = r
            .devices
            .iter()
            .map(|d| {
                (
                    d.container_path.as_str(),
                    d.host_path.as_str(),
                    d.permissions.as_str(),
                )
            })
            .collect();
        let host = |n: &str| dev.path().join(n).to_string_lossy().into_owned();
        assert_eq!(
            devs,
            vec![
                ("/dev/nvidiactl", host("nvidiactl").as_str(), "rw"),
                ("/dev/nvidia-uvm", host("nvidia-uvm").as_str(), "rw"),
                ("/dev/nvidia6", host("nvidia6").as_str(), "rw"),
                ("/dev/nvidia4", host("nvidia4").as_str(), "rw"),
            ]
        );
        let m: Vec<(&str, &str, bool)> = r
            .mounts
            .iter()
            .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            m,
            vec![
                ("/usr/local/lib/tessera", "/var/lib/tessera/lib/0.1.0", true),
                (
                    "/etc/ld.so.preload",
                    "/var/lib/tessera/lib/0.1.0/ld.so.preload",
                    true
                ),
                (
                    "/run/tessera/control",
                    "/var/lib/tessera/containers/abc/control",
                    true
                ),
                (
                    "/run/tessera/usage",
                    "/var/lib/tessera/containers/abc/usage",
                    false
                ),
            ]
        );
        // The host region directory itself is never mounted.
        assert!(
            r.mounts
                .iter()
                .all(|m| m.host_path != region.to_string_lossy())
        );
    }

    #[test]
    fn bad_requests_are_named() {
        let (gpus, _dev, paths) = setup();
        let minors = [Some(0), Some(1), None];
        let region = Path::new("/r");
        let err = |ids: Vec<String>| {
            let e = container_response(&ids, &gpus, &minors, &paths, region).unwrap_err();
            crate::error_chain::with_causes(&e)
        };
        let same = err(vec![
            format!("{}::0", gpus[0].uuid),
            format!("{}::1", gpus[0].uuid),
        ]);
        assert!(same.contains("same GPU"), "{same}");
        let unknown = err(vec!["GPU-ffffffff-0000-0000-0000-000000000000::0".into()]);
        assert!(unknown.contains("not on this node"), "{unknown}");
        let bad = err(vec!["nvidia0".into()]);
        assert!(bad.contains("\"nvidia0\""), "{bad}");
        assert!(err(vec![]).contains("names no device"));
        let minor = err(vec![format!("{}::0", gpus[2].uuid)]);
        assert!(minor.contains("no minor number"), "{minor}");
    }
}
