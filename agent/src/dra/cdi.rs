//! A prepared claim as a CDI spec: the container runtime applies it to
//! every container that uses the claim, as kubelet applies the device
//! plugin's answer. The edits are the device plugin's
//! ([`crate::kubelet::allocate::gpus_edits`]), so both paths give a
//! container the same files, devices and environment.
//!
//! One spec file per claim, `<dir>/gpu.tessera.dev-claim_<uid>.json`, kind
//! [`KIND`], one device named by the claim's UID; written to a temporary
//! name and renamed, so a runtime reading the directory sees the whole
//! spec or none.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use tessera_api::dra::DRIVER;

use crate::kubelet::allocate::Edits;

/// The CDI kind of Tessera's claims (`vendor/class`).
pub const KIND: &str = "gpu.tessera.dev/claim";
/// The CDI spec version written (the oldest that has what we use).
pub const CDI_VERSION: &str = "0.6.0";

/// NVIDIA's CDI kind, as the NVIDIA Container Toolkit generates it
/// (`nvidia-ctk cdi generate`: devices named by index, by UUID and `all`).
pub const NVIDIA_KIND: &str = "nvidia.com/gpu";
/// Where the toolkit writes its specs besides the runtime's dynamic
/// directory (containerd and CRI-O read both).
pub const STATIC_DIR: &str = "/etc/cdi";

/// The part of a CDI spec read to find NVIDIA's devices.
#[derive(serde::Deserialize)]
struct SpecNames {
    kind: String,
    #[serde(default)]
    devices: Vec<DeviceName>,
}

#[derive(serde::Deserialize)]
struct DeviceName {
    name: String,
}

/// The names of NVIDIA's CDI devices that the specs in `dirs` define
/// (JSON or YAML files; unreadable ones are skipped).
pub fn nvidia_device_names(dirs: &[&Path]) -> Vec<String> {
    let mut names = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let ext = path
                .extension()
                .and_then(|x| x.to_str())
                .unwrap_or_default();
            if !matches!(ext, "json" | "yaml" | "yml") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            match serde_norway::from_str::<SpecNames>(&text) {
                Ok(spec) if spec.kind == NVIDIA_KIND => {
                    names.extend(spec.devices.into_iter().map(|d| d.name));
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(spec = %path.display(), error = %e, "not a CDI spec we read")
                }
            }
        }
    }
    names
}

/// NVIDIA's CDI device for the GPU with `uuid` and NVML index `index`
/// among `names` (by UUID, else by index), as a fully qualified name.
pub fn nvidia_device(names: &[String], uuid: &str, index: u32) -> Option<String> {
    let index = index.to_string();
    [uuid, index.as_str()]
        .into_iter()
        .find(|n| names.iter().any(|x| x == n))
        .map(|n| format!("{NVIDIA_KIND}={n}"))
}

/// Why a spec cannot be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// The claim UID makes no CDI device name.
    #[error("claim UID {uid:?} is not a valid CDI device name")]
    Name {
        /// The UID.
        uid: String,
    },
    /// The file system refused.
    #[error("cannot write CDI spec {path}")]
    Io {
        /// The spec file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    cdi_version: &'static str,
    kind: &'static str,
    devices: Vec<Device<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Device<'a> {
    name: &'a str,
    container_edits: ContainerEdits,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerEdits {
    env: Vec<String>,
    device_nodes: Vec<DeviceNode>,
    mounts: Vec<Mount>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeviceNode {
    path: String,
    host_path: String,
    permissions: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Mount {
    host_path: String,
    container_path: String,
    options: Vec<&'static str>,
}

/// The fully qualified CDI device of claim `uid` (what kubelet passes to
/// the runtime).
pub fn device_id(uid: &str) -> String {
    format!("{KIND}={uid}")
}

/// The spec file of claim `uid` in `dir`.
pub fn spec_path(dir: &Path, uid: &str) -> PathBuf {
    dir.join(format!("{DRIVER}-claim_{uid}.json"))
}

/// The spec of claim `uid` giving `edits`, as JSON text.
pub fn spec(uid: &str, edits: &Edits) -> Result<String, CdiError> {
    // CDI device names: letters, digits, '-', '_', '.', ':'.
    let valid = !uid.is_empty()
        && uid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if !valid {
        return Err(CdiError::Name {
            uid: uid.to_owned(),
        });
    }
    let spec = Spec {
        cdi_version: CDI_VERSION,
        kind: KIND,
        devices: vec![Device {
            name: uid,
            container_edits: ContainerEdits {
                env: edits.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                device_nodes: edits
                    .devices
                    .iter()
                    .map(|d| DeviceNode {
                        path: d.container.clone(),
                        host_path: d.host.to_string_lossy().into_owned(),
                        permissions: "rw",
                    })
                    .collect(),
                mounts: edits
                    .mounts
                    .iter()
                    .map(|m| Mount {
                        host_path: m.host.to_string_lossy().into_owned(),
                        container_path: m.container.clone(),
                        options: if m.read_only {
                            vec!["ro", "nosuid", "nodev", "bind"]
                        } else {
                            vec!["rw", "nosuid", "nodev", "bind"]
                        },
                    })
                    .collect(),
            },
        }],
    };
    Ok(serde_json::to_string_pretty(&spec).expect("a CDI spec always serialises"))
}

/// Writes claim `uid`'s spec into `dir` (replacing an older one whole).
pub fn write(dir: &Path, uid: &str, edits: &Edits) -> Result<PathBuf, CdiError> {
    let text = spec(uid, edits)?;
    let path = spec_path(dir, uid);
    let io = |source| CdiError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!(".{DRIVER}-claim_{uid}.json.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(path)
}

/// Removes claim `uid`'s spec from `dir`; absent is done.
pub fn remove(dir: &Path, uid: &str) -> Result<(), CdiError> {
    let path = spec_path(dir, uid);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CdiError::Io { path, source: e }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {

    /// NVIDIA's devices are found in JSON and YAML specs of its kind, by
    /// UUID first, else by index; other kinds and broken files are not.
    #[test]
    fn nvidia_s_devices_are_named_by_uuid_else_index() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(
            a.path().join("nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n- name: GPU-aa\n  containerEdits: {}\n- name: all\n  containerEdits: {}\n",
        )
        .unwrap();
        std::fs::write(
            b.path().join("other.json"),
            r#"{"cdiVersion":"0.6.0","kind":"vendor.com/x","devices":[{"name":"1","containerEdits":{}}]}"#,
        )
        .unwrap();
        std::fs::write(b.path().join("broken.json"), "{").unwrap();
        std::fs::write(b.path().join("notes.txt"), "kind: nvidia.com/gpu").unwrap();
        let names = nvidia_device_names(&[a.path(), b.path(), Path::new("/nonexistent")]);
        assert_eq!(names, ["0", "GPU-aa", "all"]);
        assert_eq!(
            nvidia_device(&names, "GPU-aa", 0).as_deref(),
            Some("nvidia.com/gpu=GPU-aa")
        );
        assert_eq!(
            nvidia_device(&names, "GPU-bb", 0).as_deref(),
            Some("nvidia.com/gpu=0")
        );
        assert_eq!(nvidia_device(&names, "GPU-bb", 1), None);
    }

    use super::*;
    use crate::kubelet::allocate::{Bind, DeviceNode as Node};

    fn edits() -> Edits {
        Edits {
            env: vec![("NVIDIA_VISIBLE_DEVICES".into(), "GPU-1".into())],
            mounts: vec![
                Bind {
                    host: "/h/control".into(),
                    container: "/run/tessera/control".into(),
                    read_only: true,
                },
                Bind {
                    host: "/h/usage".into(),
                    container: "/run/tessera/usage".into(),
                    read_only: false,
                },
            ],
            devices: vec![Node {
                host: "/dev/nvidia3".into(),
                container: "/dev/nvidia3".into(),
            }],
        }
    }

    #[test]
    fn the_spec_names_the_claim_and_carries_the_edits() {
        let uid = "0b3c9f1e-1111-2222-3333-444455556666";
        let v: serde_json::Value = serde_json::from_str(&spec(uid, &edits()).unwrap()).unwrap();
        assert_eq!(v["cdiVersion"], "0.6.0");
        assert_eq!(v["kind"], "gpu.tessera.dev/claim");
        let d = &v["devices"][0];
        assert_eq!(d["name"], uid);
        let e = &d["containerEdits"];
        assert_eq!(e["env"][0], "NVIDIA_VISIBLE_DEVICES=GPU-1");
        assert_eq!(e["deviceNodes"][0]["path"], "/dev/nvidia3");
        assert_eq!(e["mounts"][0]["options"][0], "ro");
        assert_eq!(e["mounts"][1]["options"][0], "rw");
        assert_eq!(device_id(uid), format!("gpu.tessera.dev/claim={uid}"));
    }

    #[test]
    fn a_uid_that_is_no_cdi_name_is_refused() {
        for bad in ["", "a/b", "a b", "../x"] {
            let e = spec(bad, &edits()).unwrap_err().to_string();
            assert!(e.contains("not a valid CDI device name"), "{e}");
        }
    }

    #[test]
    fn write_replaces_whole_and_remove_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "u1", &edits()).unwrap();
        assert_eq!(p, dir.path().join("gpu.tessera.dev-claim_u1.json"));
        write(dir.path(), "u1", &edits()).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        remove(dir.path(), "u1").unwrap();
        remove(dir.path(), "u1").unwrap();
        assert!(!p.exists());
    }
}
