//! A container's metadata file (`meta.json` in its region directory): who
//! it is (namespace, pod, container, labels, cgroup) and what it was
//! granted (SM target, memory limit per GPU, and optionally mode and
//! priority).
//!
//! Mode and priority are optional: a value here is explicit (in
//! Kubernetes: the pod's `tessera.dev/compute-mode` annotation and
//! priority) and wins over the node policy; an absent one is the policy's
//! to decide (the node policy reads this metadata, never the reverse). A file written before
//! they became optional has both, so they stay explicit.
//!
//! The metadata is the source of truth for the limits; the control region
//! follows it (the CLI writes both, the daemon reconciles the control
//! region with the metadata every period). The file is read as untrusted
//! input: unknown fields, out-of-range values and malformed UUIDs are
//! refused with the field named ([`Metadata::validate`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_region::control::GpuLimits;
use tessera_region::layout::{FLAG_FAIL_OPEN, UNLIMITED};
use tessera_region::spec::parse_uuid;
use tessera_region::{ControlSpec, MAX_GPUS};

use crate::control::Pacing;

/// File name of the metadata in a region directory.
pub const META_FILE: &str = "meta.json";
/// The metadata format this agent writes and reads.
pub const META_VERSION: u32 = 1;
/// Largest byte count accepted for a memory limit or context overhead (1 PiB).
pub const MAX_BYTES: u64 = 1 << 50;
/// Largest accepted priority.
pub const MAX_PRIORITY: u32 = 100;
/// Longest accepted name (namespace, pod, container), as Kubernetes allows.
pub const MAX_NAME_LEN: usize = 253;
/// Longest accepted cgroup path.
pub const MAX_CGROUP_LEN: usize = 4096;

/// How the SM target is held (the controller's type: one home).
pub use crate::control::Mode;

/// One GPU granted to the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuGrant {
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Device memory the container may hold (bytes); absent: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// Memory charged per CUDA context (bytes).
    #[serde(default)]
    pub context_overhead_bytes: u64,
}

/// The metadata of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Format version ([`META_VERSION`]).
    pub version: u32,
    /// Kubernetes namespace, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Kubernetes pod name, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Container name, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The DRA ResourceClaim the region was prepared for (its name in
    /// `namespace`), if any: metrics name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// The Kubernetes pod's UID, set only by the device plugin's
    /// `Allocate`. Invariant: a directory is garbage-collected (once
    /// kubelet's PodResources no longer lists its namespace, pod and
    /// container) only if its metadata has a `pod_uid`; directories the
    /// CLI made (no `pod_uid`) are the operator's and are never collected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The container's cgroup, relative to the cgroup v2 root (starting
    /// with `/`); absent: its processes are known only from the usage
    /// region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Percent of each GPU's time (as NVML reports utilisation), 1 to 100.
    pub sm_target: u32,
    /// How the target is held: `hard` or `elastic`; absent: as the node
    /// policy says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Under contention, higher priorities are served first (0 to
    /// [`MAX_PRIORITY`]); absent: as the node policy says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// The pod's labels (Kubernetes syntax, [`super::labels`]), matched by
    /// the node policy's rules.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Let CUDA calls pass unlimited if the region becomes unusable.
    #[serde(default)]
    pub fail_open: bool,
    /// The GPUs, in the order of the control region.
    pub gpus: Vec<GpuGrant>,
}

/// Why metadata was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field {field}: {problem}")]
pub struct MetaError {
    /// The field, e.g. `gpus[1].uuid`.
    pub field: String,
    /// What is wrong and what is accepted.
    pub problem: String,
}

fn bad(field: impl Into<String>, problem: impl Into<String>) -> MetaError {
    MetaError {
        field: field.into(),
        problem: problem.into(),
    }
}

fn check_name(field: &str, v: &Option<String>) -> Result<(), MetaError> {
    if let Some(v) = v
        && (v.is_empty() || v.len() > MAX_NAME_LEN || v.chars().any(char::is_control))
    {
        return Err(bad(
            field,
            format!(
                "{v:?} is not accepted; accepted: 1 to {MAX_NAME_LEN} characters without control characters"
            ),
        ));
    }
    Ok(())
}

/// Longest accepted pod UID (Kubernetes UIDs are 36-character UUIDs).
pub const MAX_POD_UID_LEN: usize = 64;

/// Why a pod UID or a cgroup path was refused ([`check_pod_uid`],
/// [`check_cgroup`]); the message says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not a pod UID.
    #[error(
        "{uid:?} is not accepted; accepted: 1 to {MAX_POD_UID_LEN} ASCII letters, digits and '-' (a Kubernetes pod UID)"
    )]
    PodUid {
        /// The UID as given.
        uid: String,
    },
    /// A cgroup path not relative to the v2 root.
    #[error(
        "{path:?} does not start with '/'; accepted: a path relative to the cgroup v2 root, e.g. /system.slice/docker-<id>.scope"
    )]
    CgroupNotRooted {
        /// The path as given.
        path: String,
    },
    /// A cgroup path too long or with control characters.
    #[error("{path:?} is too long or holds control characters")]
    CgroupChars {
        /// The path as given.
        path: String,
    },
    /// A cgroup path with a `.` or `..` component.
    #[error("{path:?} holds a '.' or '..' component")]
    CgroupDots {
        /// The path as given.
        path: String,
    },
}

/// Checks a pod UID: 1 to [`MAX_POD_UID_LEN`] ASCII letters, digits and
/// `-` (a Kubernetes UID is an RFC 4122 UUID).
pub fn check_pod_uid(uid: &str) -> Result<(), IdentityError> {
    if uid.is_empty()
        || uid.len() > MAX_POD_UID_LEN
        || !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(IdentityError::PodUid {
            uid: uid.to_owned(),
        });
    }
    Ok(())
}

/// Checks a cgroup path relative to the v2 root: starts with `/`, no `.`
/// or `..` components, no NUL or control characters.
pub fn check_cgroup(path: &str) -> Result<(), IdentityError> {
    if !path.starts_with('/') {
        return Err(IdentityError::CgroupNotRooted {
            path: path.to_owned(),
        });
    }
    if path.len() > MAX_CGROUP_LEN || path.chars().any(char::is_control) {
        return Err(IdentityError::CgroupChars {
            path: path.to_owned(),
        });
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return Err(IdentityError::CgroupDots {
            path: path.to_owned(),
        });
    }
    Ok(())
}

impl Metadata {
    /// Checks every field; the first bad one is named.
    pub fn validate(&self) -> Result<(), MetaError> {
        if self.version != META_VERSION {
            return Err(bad(
                "version",
                format!("is {}; accepted: {META_VERSION}", self.version),
            ));
        }
        check_name("namespace", &self.namespace)?;
        check_name("pod", &self.pod)?;
        check_name("container", &self.container)?;
        check_name("claim", &self.claim)?;
        if let Some(uid) = &self.pod_uid {
            check_pod_uid(uid).map_err(|p| bad("pod_uid", p.to_string()))?;
        }
        if let Some(c) = &self.cgroup {
            check_cgroup(c).map_err(|p| bad("cgroup", p.to_string()))?;
        }
        if !(1..=100).contains(&self.sm_target) {
            return Err(bad(
                "sm_target",
                format!("is {}; accepted: 1 to 100 (percent)", self.sm_target),
            ));
        }
        if let Some(p) = self.priority
            && p > MAX_PRIORITY
        {
            return Err(bad(
                "priority",
                format!(
                    "is {p}; accepted: 0 to {MAX_PRIORITY} (higher is served first) or absent (the node policy decides)"
                ),
            ));
        }
        if let Err((key, problem)) = super::labels::check_labels(&self.labels) {
            let field = key.map_or_else(|| "labels".to_owned(), |k| format!("labels.{k}"));
            return Err(bad(field, problem));
        }
        if self.gpus.is_empty() || self.gpus.len() > MAX_GPUS {
            return Err(bad(
                "gpus",
                format!("has {} entries; accepted: 1 to {MAX_GPUS}", self.gpus.len()),
            ));
        }
        let mut seen = Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            let uuid = parse_uuid(&g.uuid).ok_or_else(|| {
                bad(
                    format!("gpus[{i}].uuid"),
                    format!(
                        "{:?} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                        g.uuid
                    ),
                )
            })?;
            if seen.contains(&uuid) {
                return Err(bad(
                    format!("gpus[{i}].uuid"),
                    format!("{} is listed twice", g.uuid),
                ));
            }
            seen.push(uuid);
            if g.memory_limit_bytes.is_some_and(|b| b > MAX_BYTES) {
                return Err(bad(
                    format!("gpus[{i}].memory_limit_bytes"),
                    format!("is too large; accepted: up to {MAX_BYTES} or absent (unlimited)"),
                ));
            }
            if g.context_overhead_bytes > MAX_BYTES {
                return Err(bad(
                    format!("gpus[{i}].context_overhead_bytes"),
                    format!("is too large; accepted: up to {MAX_BYTES}"),
                ));
            }
        }
        Ok(())
    }

    /// Parses and validates the file's text.
    pub fn from_json(text: &[u8]) -> Result<Self, MetaError> {
        let m: Self = serde_json::from_slice(text).map_err(|e| bad("(file)", e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// The GPUs' UUID bytes (valid after [`Self::validate`]).
    pub fn uuids(&self) -> Vec<[u8; 16]> {
        self.gpus
            .iter()
            .filter_map(|g| parse_uuid(&g.uuid))
            .collect()
    }

    /// The control region this metadata asks for, with the launch rate,
    /// burst and floor of each GPU taken from `pacing` (by UUID; the
    /// controller's business, not the metadata's).
    pub fn control_spec(&self, pacing: impl Fn(&[u8; 16]) -> Pacing) -> ControlSpec {
        ControlSpec {
            flags: if self.fail_open { FLAG_FAIL_OPEN } else { 0 },
            gpus: self
                .gpus
                .iter()
                .filter_map(|g| {
                    let uuid = parse_uuid(&g.uuid)?;
                    let p = pacing(&uuid);
                    Some(GpuLimits {
                        uuid,
                        memory_limit: g.memory_limit_bytes.unwrap_or(UNLIMITED),
                        context_overhead: g.context_overhead_bytes,
                        launch_rate: p.rate,
                        launch_burst: p.burst,
                        launch_floor: p.floor,
                    })
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "GPU-5e1a0000-0000-4000-8000-000051510000";

    fn meta() -> Metadata {
        Metadata {
            version: META_VERSION,
            namespace: Some("default".into()),
            pod: Some("trainer".into()),
            container: Some("main".into()),
            claim: None,
            pod_uid: Some("6f1c2a4e-3b5d-4c7e-9a10-2b3c4d5e6f70".into()),
            cgroup: Some("/system.slice/docker-abc.scope".into()),
            sm_target: 30,
            mode: Some(Mode::Hard),
            priority: Some(1),
            labels: BTreeMap::from([("tier".to_owned(), "inference".to_owned())]),
            fail_open: false,
            gpus: vec![GpuGrant {
                uuid: U.into(),
                memory_limit_bytes: Some(4000 << 20),
                context_overhead_bytes: 0,
            }],
        }
    }

    #[test]
    fn round_trips_and_builds_the_control_spec() {
        let m = meta();
        let text = serde_json::to_vec(&m).unwrap();
        assert_eq!(Metadata::from_json(&text).unwrap(), m);
        let spec = m.control_spec(|_| Pacing {
            rate: 7,
            burst: 1,
            floor: 640,
        });
        assert_eq!(spec.gpus[0].memory_limit, 4000 << 20);
        assert_eq!(spec.gpus[0].launch_rate, 7);
        assert_eq!(spec.gpus[0].launch_floor, 640);
    }

    #[test]
    fn bad_fields_are_named() {
        type Edit = Box<dyn Fn(&mut Metadata)>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|m| m.version = 9), "version"),
            (Box::new(|m| m.sm_target = 0), "sm_target"),
            (Box::new(|m| m.sm_target = 101), "sm_target"),
            (Box::new(|m| m.priority = Some(1000)), "priority"),
            (
                Box::new(|m| {
                    m.labels.insert("bad key".into(), "x".into());
                }),
                "labels.bad key",
            ),
            (
                Box::new(|m| {
                    m.labels.insert("tier".into(), "-x".into());
                }),
                "labels.tier",
            ),
            (
                Box::new(|m| {
                    m.labels = (0..300).map(|i| (format!("k{i}"), String::new())).collect();
                }),
                "labels",
            ),
            (Box::new(|m| m.gpus.clear()), "gpus"),
            (
                Box::new(|m| m.gpus[0].uuid = "GPU-x".into()),
                "gpus[0].uuid",
            ),
            (Box::new(|m| m.gpus.push(m.gpus[0].clone())), "gpus[1].uuid"),
            (
                Box::new(|m| m.gpus[0].memory_limit_bytes = Some(u64::MAX)),
                "gpus[0].memory_limit_bytes",
            ),
            (Box::new(|m| m.cgroup = Some("/a/../..".into())), "cgroup"),
            (Box::new(|m| m.cgroup = Some("relative".into())), "cgroup"),
            (Box::new(|m| m.pod = Some("a\nb".into())), "pod"),
            (Box::new(|m| m.pod_uid = Some(String::new())), "pod_uid"),
            (Box::new(|m| m.pod_uid = Some("../x".into())), "pod_uid"),
            (Box::new(|m| m.pod_uid = Some("a".repeat(65))), "pod_uid"),
        ];
        for (edit, field) in cases {
            let mut m = meta();
            edit(&mut m);
            let e = m.validate().unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
        let e = Metadata::from_json(br#"{"version":1,"sm_target":5,"gpus":[],"evil":1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field"), "{e}");
        assert!(Metadata::from_json(b"\xff\xfe").is_err());
    }

    #[test]
    fn mode_and_priority_are_optional_and_old_files_keep_them_explicit() {
        let old = format!(
            r#"{{"version":1,"sm_target":30,"mode":"elastic","priority":7,"gpus":[{{"uuid":"{U}"}}]}}"#
        );
        let m = Metadata::from_json(old.as_bytes()).unwrap();
        assert_eq!((m.mode, m.priority), (Some(Mode::Elastic), Some(7)));
        assert!(m.labels.is_empty());
        let new = format!(r#"{{"version":1,"sm_target":30,"gpus":[{{"uuid":"{U}"}}]}}"#);
        let m = Metadata::from_json(new.as_bytes()).unwrap();
        assert_eq!((m.mode, m.priority), (None, None));
        // Unset stays unset through a round trip (not written as null or 0).
        let text = serde_json::to_string(&m).unwrap();
        assert!(
            !text.contains("mode") && !text.contains("priority"),
            "{text}"
        );
    }
}
