//! The assignment contract: which GPUs, with what limits, the scheduler
//! gave each container of a pod, and which containers the node agent has
//! already allocated. The scheduler's bind writes [`ASSIGNMENT`]; the
//! agent's `Allocate` reads it and records its progress in [`ALLOCATED`].
//!
//! Both are pod annotations holding JSON:
//!
//! ```json
//! "tessera.dev/assignment": {
//!   "version": 1,
//!   "node": "gpu-node-7",
//!   "boundAt": "2026-12-01T15:04:05Z",
//!   "containers": [
//!     { "name": "main", "resource": "nvidia.com/gpu",
//!       "gpus": [ { "uuid": "GPU-…", "memoryMiB": 4000, "coresPercent": 30 } ] }
//!   ]
//! }
//! "tessera.dev/allocated": ["main"]
//! ```
//!
//! | field | meaning |
//! |---|---|
//! | `version` | [`VERSION`]; another value is refused |
//! | `node` | the node the pod was bound to; another node's agent refuses it |
//! | `boundAt` | when the bind happened (RFC 3339); the agent serves earlier binds first |
//! | `containers[].name` | a container (or init container) of the pod, once each |
//! | `containers[].resource` | the extended resource its vGPUs come from (default `nvidia.com/gpu`) |
//! | `containers[].gpus[].uuid` | a GPU of `node`, once per container |
//! | `containers[].gpus[].memoryMiB` | memory limit on that GPU (MiB, 1 to [`MAX_MEMORY_MIB`]) |
//! | `containers[].gpus[].memoryPercent` | or the limit as percent of the GPU's memory (1 to 100) |
//! | `containers[].gpus[].coresPercent` | SM target, percent of the GPU (1 to 100) |
//!
//! Absent limits take HAMi's defaults, applied by the agent (in this
//! order): the container's own `nvidia.com/gpumem` /
//! `nvidia.com/gpumem-percentage` / `nvidia.com/gpucores` limits, else all
//! of the GPU's memory and no compute cap (HAMi's `defaultMem: 0`,
//! `defaultCores: 0`). An assignment may not grant more than the
//! container's own explicit resource asks for (the agent refuses it), so
//! an annotation edited after the bind cannot raise a container's limits
//! beyond its immutable spec.
//!
//! `tessera.dev/allocated` is a JSON array of container names, written
//! only by the agent, by a patch conditioned on the pod's
//! `resourceVersion` (so two writers never both claim one container).
//! Invariant: a name is in it iff the agent created that container's
//! region directory and answered kubelet's `Allocate` for it.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use crate::GpuUuid;

pub use crate::annotations::{ALLOCATED, ASSIGNMENT};
/// The assignment format this crate reads and writes.
pub const VERSION: u32 = 1;
/// Most GPUs one container may be given.
pub const MAX_GPUS: usize = 16;
/// Largest memory limit accepted (MiB; 1 PiB).
pub const MAX_MEMORY_MIB: u64 = 1 << 30;
/// Longest annotation value read (bytes).
pub const MAX_LEN: usize = 64 << 10;

/// One GPU given to a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuAssignment {
    /// The GPU.
    pub uuid: GpuUuid,
    /// Memory limit (MiB).
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Memory limit as percent of the GPU's memory (when `memoryMiB` is
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_percent: Option<u32>,
    /// SM target (percent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_percent: Option<u32>,
}

/// The GPUs of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerAssignment {
    /// The container's name.
    pub name: String,
    /// The extended resource the vGPUs come from.
    #[serde(default = "default_resource")]
    pub resource: String,
    /// Its GPUs, in the order the container sees them.
    pub gpus: Vec<GpuAssignment>,
}

fn default_resource() -> String {
    crate::resources::GPU.to_owned()
}

/// A pod's assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assignment {
    /// [`VERSION`].
    pub version: u32,
    /// The node bound to.
    pub node: String,
    /// When the bind happened.
    pub bound_at: Time,
    /// The containers with GPUs.
    pub containers: Vec<ContainerAssignment>,
}

/// Why an annotation was refused; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: field {field}: {problem}")]
pub struct AssignmentError {
    /// The annotation key.
    pub annotation: &'static str,
    /// The field, e.g. `containers[0].gpus[1].memoryMiB`.
    pub field: String,
    /// What is wrong and what is accepted.
    pub problem: String,
}

fn bad(
    annotation: &'static str,
    field: impl Into<String>,
    problem: impl Into<String>,
) -> AssignmentError {
    AssignmentError {
        annotation,
        field: field.into(),
        problem: problem.into(),
    }
}

fn check_len(annotation: &'static str, text: &str) -> Result<(), AssignmentError> {
    if text.len() > MAX_LEN {
        return Err(bad(
            annotation,
            "(value)",
            format!("is {} bytes; accepted: up to {MAX_LEN}", text.len()),
        ));
    }
    Ok(())
}

impl Assignment {
    /// Parses and validates the annotation's value.
    pub fn parse(text: &str) -> Result<Self, AssignmentError> {
        check_len(ASSIGNMENT, text)?;
        let a: Self = serde_json::from_str(text)
            .map_err(|e| bad(ASSIGNMENT, "(value)", format!("is not an assignment: {e}")))?;
        a.validate()?;
        Ok(a)
    }

    /// The annotation's value.
    pub fn to_json(&self) -> String {
        // Plain data: serialisation cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Checks every field; the first bad one is named.
    pub fn validate(&self) -> Result<(), AssignmentError> {
        let bad = |f: String, p: String| Err(bad(ASSIGNMENT, f, p));
        if self.version != VERSION {
            return bad(
                "version".into(),
                format!("is {}; accepted: {VERSION}", self.version),
            );
        }
        if self.node.is_empty() || self.node.len() > 253 || self.node.chars().any(char::is_control)
        {
            return bad("node".into(), format!("{:?} is not a node name", self.node));
        }
        if self.containers.is_empty() {
            return bad("containers".into(), "is empty; accepted: 1 or more".into());
        }
        let mut names = BTreeSet::new();
        for (i, c) in self.containers.iter().enumerate() {
            if !is_dns_label(&c.name) {
                return bad(
                    format!("containers[{i}].name"),
                    format!("{:?} is not a container name (a DNS-1123 label)", c.name),
                );
            }
            if !names.insert(c.name.as_str()) {
                return bad(
                    format!("containers[{i}].name"),
                    format!("{:?} is listed twice", c.name),
                );
            }
            if !c.resource.contains('/') || c.resource.len() > 253 {
                return bad(
                    format!("containers[{i}].resource"),
                    format!("{:?} is not an extended resource name", c.resource),
                );
            }
            if c.gpus.is_empty() || c.gpus.len() > MAX_GPUS {
                return bad(
                    format!("containers[{i}].gpus"),
                    format!("has {} entries; accepted: 1 to {MAX_GPUS}", c.gpus.len()),
                );
            }
            for (j, g) in c.gpus.iter().enumerate() {
                let at = |f: &str| format!("containers[{i}].gpus[{j}].{f}");
                if c.gpus[..j].iter().any(|o| o.uuid == g.uuid) {
                    return bad(at("uuid"), format!("{} is listed twice", g.uuid));
                }
                if let Some(m) = g.memory_mib
                    && !(1..=MAX_MEMORY_MIB).contains(&m)
                {
                    return bad(
                        at("memoryMiB"),
                        format!("is {m}; accepted: 1 to {MAX_MEMORY_MIB}"),
                    );
                }
                if let Some(p) = g.memory_percent {
                    if g.memory_mib.is_some() {
                        return bad(
                            at("memoryPercent"),
                            "is given with memoryMiB; accepted: one of the two".into(),
                        );
                    }
                    if !(1..=100).contains(&p) {
                        return bad(at("memoryPercent"), format!("is {p}; accepted: 1 to 100"));
                    }
                }
                if let Some(p) = g.cores_percent
                    && !(1..=100).contains(&p)
                {
                    return bad(
                        at("coresPercent"),
                        format!("is {p}; accepted: 1 to 100 (absent: no compute cap)"),
                    );
                }
            }
        }
        Ok(())
    }

    /// The container named `name`.
    pub fn container(&self, name: &str) -> Option<&ContainerAssignment> {
        self.containers.iter().find(|c| c.name == name)
    }
}

/// The containers of a pod the agent has allocated ([`ALLOCATED`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocated(pub BTreeSet<String>);

impl Allocated {
    /// Parses the annotation's value (absent: none allocated).
    pub fn parse(text: Option<&str>) -> Result<Self, AssignmentError> {
        let Some(text) = text else {
            return Ok(Self::default());
        };
        check_len(ALLOCATED, text)?;
        let names: Vec<String> = serde_json::from_str(text).map_err(|e| {
            bad(
                ALLOCATED,
                "(value)",
                format!("is not a JSON array of container names: {e}"),
            )
        })?;
        let mut set = BTreeSet::new();
        for (i, n) in names.into_iter().enumerate() {
            if !is_dns_label(&n) {
                return Err(bad(
                    ALLOCATED,
                    format!("[{i}]"),
                    format!("{n:?} is not a container name"),
                ));
            }
            set.insert(n);
        }
        Ok(Self(set))
    }

    /// The annotation's value.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_default()
    }
}

/// A DNS-1123 label (what Kubernetes accepts as a container name).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    const U0: &str = "GPU-0a0a0a0a-1111-2222-3333-444444444444";
    const U1: &str = "GPU-0b0b0b0b-1111-2222-3333-444444444444";

    fn text() -> String {
        format!(
            r#"{{"version":1,"node":"n1","boundAt":"2026-12-01T15:04:05Z","containers":[
              {{"name":"main","gpus":[{{"uuid":"{U0}","memoryMiB":4000,"coresPercent":30}}]}},
              {{"name":"side","resource":"nvidia.com/gpu","gpus":[{{"uuid":"{U1}","memoryPercent":25}},{{"uuid":"{U0}"}}]}}]}}"#
        )
    }

    #[test]
    fn parses_round_trips_and_defaults_the_resource() {
        let a = Assignment::parse(&text()).unwrap();
        assert_eq!(a.containers[0].resource, "nvidia.com/gpu");
        assert_eq!(a.containers[0].gpus[0].memory_mib, Some(4000));
        assert_eq!(a.containers[1].gpus[0].memory_percent, Some(25));
        assert_eq!(a.containers[1].gpus[1].cores_percent, None);
        assert_eq!(Assignment::parse(&a.to_json()).unwrap(), a);
        assert!(
            a.to_json().contains("\"memoryMiB\":4000"),
            "{}",
            a.to_json()
        );
        assert!(a.container("side").is_some() && a.container("x").is_none());
    }

    #[test]
    fn bad_fields_are_named() {
        let cases: [(&str, &str, &str); 11] = [
            ("\"version\":1", "\"version\":2", "version"),
            ("\"node\":\"n1\"", "\"node\":\"\"", "node"),
            (
                "\"name\":\"main\"",
                "\"name\":\"Main_1\"",
                "containers[0].name",
            ),
            (
                "\"name\":\"side\"",
                "\"name\":\"main\"",
                "containers[1].name",
            ),
            (
                "\"memoryMiB\":4000",
                "\"memoryMiB\":0",
                "containers[0].gpus[0].memoryMiB",
            ),
            (
                "\"memoryMiB\":4000",
                "\"memoryMiB\":4000,\"memoryPercent\":5",
                "containers[0].gpus[0].memoryPercent",
            ),
            (
                "\"memoryPercent\":25",
                "\"memoryPercent\":101",
                "containers[1].gpus[0].memoryPercent",
            ),
            (
                "\"coresPercent\":30",
                "\"coresPercent\":0",
                "containers[0].gpus[0].coresPercent",
            ),
            (
                &format!("{{\"uuid\":\"{U0}\"}}"),
                &format!("{{\"uuid\":\"{U1}\"}}"),
                "containers[1].gpus[1].uuid",
            ),
            (
                "\"resource\":\"nvidia.com/gpu\"",
                "\"resource\":\"gpu\"",
                "containers[1].resource",
            ),
            ("\"coresPercent\":30", "\"cores\":30", "(value)"),
        ];
        for (from, to, field) in cases {
            let t = text().replacen(from, to, 1);
            assert_ne!(t, text(), "{from}");
            let e = Assignment::parse(&t).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().contains("tessera.dev/assignment"), "{e}");
        }
        let e = Assignment::parse(&text().replace(
            &format!("[{{\"uuid\":\"{U0}\",\"memoryMiB\":4000,\"coresPercent\":30}}]"),
            "[]",
        ))
        .unwrap_err();
        assert_eq!(e.field, "containers[0].gpus");
        let e = Assignment::parse(&text().replace(U0, "GPU-nope")).unwrap_err();
        assert!(e.problem.contains("GPU-nope"), "{e}");
        let e = Assignment::parse(&"x".repeat(MAX_LEN + 1)).unwrap_err();
        assert!(e.problem.contains("bytes"), "{e}");
        let e =
            Assignment::parse(&text().replace("2026-12-01T15:04:05Z", "yesterday")).unwrap_err();
        assert_eq!(e.field, "(value)");
    }

    #[test]
    fn allocated_parses_and_names_bad_entries() {
        assert!(Allocated::parse(None).unwrap().0.is_empty());
        let a = Allocated::parse(Some(r#"["main","side"]"#)).unwrap();
        assert_eq!(a.to_json(), r#"["main","side"]"#);
        let e = Allocated::parse(Some(r#"["main","../x"]"#)).unwrap_err();
        assert_eq!((e.annotation, e.field.as_str()), (ALLOCATED, "[1]"));
        assert!(Allocated::parse(Some("main")).is_err());
    }
}
