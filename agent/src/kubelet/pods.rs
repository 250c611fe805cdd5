//! Which pod and container an `Allocate` is for.
//!
//! Kubelet's `Allocate` carries no pod identity: only the device IDs of
//! one container (kubelet sends one call per container and resource, in
//! pod-spec order, init containers first, and reads only the first
//! response). So the agent picks among the pods on its node that the
//! scheduler assigned GPUs to ([`tessera_api::assignment`]) and that still
//! have a container to allocate:
//!
//! 1. a pod with some containers allocated already comes first (kubelet
//!    admits one pod at a time, so it is the pod being admitted now);
//! 2. then the earliest `boundAt`, then the earliest creation, then
//!    namespace and name (kubelet admits pods in the order it sees them,
//!    sorted by creation time);
//! 3. within the pod, the first container in spec order (init containers,
//!    then containers) that has an assignment for this resource, is not
//!    allocated, and is not being allocated by a concurrent call
//!    (`in_flight`);
//! 4. that container's GPU count must equal the request's device count,
//!    and its own `limits[resource]`; a pod whose next container differs
//!    is not this request's (it is named in the error if nothing fits).
//!
//! Pods deleting or finished are never chosen. Pods requesting the
//! resource without an assignment (not scheduled by Tessera's scheduler)
//! are never chosen either: guessing their GPUs could hand one pod
//! another's limits; the error names them.
//!
//! Limitation (documented in ARCHITECTURE.md): two pods bound to one node
//! at the same time whose next containers ask for the same number of
//! vGPUs cannot be told apart by `Allocate` alone; the earlier bind is
//! served first, as kubelet admits it first.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tessera_api::assignment::{ALLOCATED, ASSIGNMENT, Allocated, Assignment, ContainerAssignment};
use tessera_api::resources::{ContainerResources, ResourceError};

/// The container chosen for an `Allocate`.
#[derive(Debug, Clone)]
pub struct Choice {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// The pod's `resourceVersion` as read (the patch is conditioned on
    /// it).
    pub resource_version: String,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
    /// The pod's annotations.
    pub annotations: BTreeMap<String, String>,
    /// The container's spec.
    pub container: Container,
    /// Its assignment.
    pub assignment: ContainerAssignment,
    /// The containers already allocated.
    pub allocated: Allocated,
}

impl Choice {
    /// `namespace/name`.
    pub fn pod(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why no pod matched; [`NoMatch::message`] is what kubelet shows.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NoMatch {
    /// One line per pod that was looked at and why it did not fit.
    pub reasons: Vec<String>,
}

/// Most pods named in an error message.
const MAX_REASONS: usize = 8;

impl NoMatch {
    /// The message for `count` devices of `resource` on `node`.
    pub fn message(&self, node: &str, resource: &str, count: usize) -> String {
        let mut m = format!(
            "no pod on node {node} waits for a container with {count} {resource} assigned by tessera-scheduler"
        );
        if self.reasons.is_empty() {
            m.push_str(" (no pod on this node has a tessera.dev/assignment)");
        } else {
            m.push_str(": ");
            let shown: Vec<&str> = self
                .reasons
                .iter()
                .take(MAX_REASONS)
                .map(String::as_str)
                .collect();
            m.push_str(&shown.join("; "));
            if self.reasons.len() > MAX_REASONS {
                m.push_str(&format!("; and {} more", self.reasons.len() - MAX_REASONS));
            }
        }
        m
    }
}

/// The number a container asks for of `resource` (limits, else requests,
/// which must agree; any spelling of a whole number the API server
/// accepts, as it stores them: `4000` reads back as `4k`), if any.
pub fn container_quantity(c: &Container, resource: &str) -> Option<Result<u64, ResourceError>> {
    ContainerResources::from(c).whole(resource).transpose()
}

fn spec_containers(pod: &Pod) -> Vec<&Container> {
    pod.spec
        .as_ref()
        .map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
                .collect()
        })
        .unwrap_or_default()
}

fn asks_for(pod: &Pod, resource: &str) -> bool {
    spec_containers(pod)
        .iter()
        .any(|c| container_quantity(c, resource).is_some())
}

/// Picks the container `count` devices of `resource` on `node` are for;
/// see the module documentation. `in_flight` holds `(pod UID, container)`
/// pairs another call is allocating now.
pub fn choose(
    pods: &[Pod],
    node: &str,
    resource: &str,
    count: usize,
    in_flight: &HashSet<(String, String)>,
) -> Result<Choice, NoMatch> {
    type Key = (bool, Time, Option<Time>, String, String);
    let mut best: Option<(Key, Choice)> = None;
    let mut no = NoMatch::default();
    for pod in pods {
        let meta = &pod.metadata;
        let ns = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let id = format!("{ns}/{name}");
        let annotations = meta.annotations.clone().unwrap_or_default();
        let Some(text) = annotations.get(ASSIGNMENT) else {
            if asks_for(pod, resource) && meta.deletion_timestamp.is_none() {
                let sched = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.scheduler_name.as_deref())
                    .unwrap_or("default-scheduler");
                no.reasons.push(format!(
                    "pod {id} asks for {resource} but has no {ASSIGNMENT} (schedulerName {sched}; only pods bound by tessera-scheduler are served)"
                ));
            }
            continue;
        };
        if meta.deletion_timestamp.is_some() {
            continue;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let assignment = match Assignment::parse(text) {
            Ok(a) => a,
            Err(e) => {
                no.reasons.push(format!("pod {id}: {e}"));
                continue;
            }
        };
        if assignment.node != node {
            no.reasons.push(format!(
                "pod {id} is assigned to node {}, not {node}",
                assignment.node
            ));
            continue;
        }
        let allocated = match Allocated::parse(annotations.get(ALLOCATED).map(String::as_str)) {
            Ok(a) => a,
            Err(e) => {
                no.reasons.push(format!("pod {id}: {e}"));
                continue;
            }
        };
        let containers = spec_containers(pod);
        if let Some(missing) = assignment
            .containers
            .iter()
            .find(|a| !containers.iter().any(|c| c.name == a.name))
        {
            no.reasons.push(format!(
                "pod {id}: {ASSIGNMENT} names container {} that the pod does not have",
                missing.name
            ));
            continue;
        }
        let Some(uid) = meta.uid.clone() else {
            no.reasons.push(format!("pod {id} has no UID"));
            continue;
        };
        let next = containers.iter().find_map(|c| {
            let a = assignment.container(&c.name)?;
            (a.resource == resource
                && !allocated.0.contains(&c.name)
                && !in_flight.contains(&(uid.clone(), c.name.clone())))
            .then_some((*c, a))
        });
        let Some((container, a)) = next else {
            continue;
        };
        match container_quantity(container, resource) {
            Some(Ok(n)) if n == a.gpus.len() as u64 => {}
            Some(Ok(n)) => {
                no.reasons.push(format!(
                    "pod {id}: container {} asks for {n} {resource} but {ASSIGNMENT} gives it {} GPUs",
                    container.name,
                    a.gpus.len()
                ));
                continue;
            }
            Some(Err(e)) => {
                no.reasons.push(format!("pod {id}: {e}"));
                continue;
            }
            None => {
                no.reasons.push(format!(
                    "pod {id}: container {} has GPUs in {ASSIGNMENT} but does not ask for {resource}",
                    container.name
                ));
                continue;
            }
        }
        if a.gpus.len() != count {
            no.reasons.push(format!(
                "pod {id}: its next container {} has {} GPUs assigned, the request {count} devices",
                container.name,
                a.gpus.len()
            ));
            continue;
        }
        let key: Key = (
            allocated.0.is_empty(),
            assignment.bound_at.clone(),
            meta.creation_timestamp.clone(),
            ns.clone(),
            name.clone(),
        );
        if best.as_ref().is_some_and(|(k, _)| *k <= key) {
            continue;
        }
        let choice = Choice {
            namespace: ns,
            name,
            uid,
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations,
            container: container.clone(),
            assignment: a.clone(),
            allocated,
        };
        best = Some((key, choice));
    }
    best.map(|(_, c)| c).ok_or(no)
}

#[cfg(test)]
mod tests {
    use super::*;

    const U0: &str = "GPU-0a0a0a0a-1111-2222-3333-444444444444";

    fn pod(name: &str, bound: &str, containers: &[(&str, u32)], allocated: &[&str]) -> Pod {
        let spec: Vec<serde_json::Value> = containers
            .iter()
            .map(|(c, n)| {
                serde_json::json!({"name": c, "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": n.to_string()}}})
            })
            .collect();
        let assign = serde_json::json!({"version":1,"node":"n1","boundAt":bound,
            "containers": containers.iter().map(|(c, n)| serde_json::json!({"name": c,
                "gpus": (0..*n).map(|i| serde_json::json!({"uuid": U0.replace("0a0a0a0a", &format!("{i:08x}"))})).collect::<Vec<_>>()})).collect::<Vec<_>>()});
        let mut ann = serde_json::json!({ASSIGNMENT: assign.to_string()});
        if !allocated.is_empty() {
            ann[ALLOCATED] = serde_json::Value::String(serde_json::to_string(allocated).unwrap());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "resourceVersion": "7", "creationTimestamp": "2026-12-01T10:00:00Z",
                "annotations": ann},
            "spec": {"nodeName": "n1", "containers": spec},
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    #[test]
    fn earliest_bind_first_then_spec_order_skipping_allocated_and_in_flight() {
        let pods = vec![
            pod("late", "2026-12-01T10:00:09Z", &[("a", 1)], &[]),
            pod("early", "2026-12-01T10:00:01Z", &[("a", 1), ("b", 1)], &[]),
        ];
        let none = HashSet::new();
        let c = choose(&pods, "n1", "nvidia.com/gpu", 1, &none).unwrap();
        assert_eq!((c.name.as_str(), c.container.name.as_str()), ("early", "a"));
        // `a` being allocated concurrently: `b` of the same pod.
        let busy = HashSet::from([("uid-early".to_owned(), "a".to_owned())]);
        let c = choose(&pods, "n1", "nvidia.com/gpu", 1, &busy).unwrap();
        assert_eq!((c.name.as_str(), c.container.name.as_str()), ("early", "b"));
        // A pod mid-admission wins over an earlier bind.
        let pods = vec![
            pod("early", "2026-12-01T10:00:01Z", &[("a", 1)], &[]),
            pod(
                "half",
                "2026-12-01T10:00:05Z",
                &[("a", 1), ("b", 1)],
                &["a"],
            ),
        ];
        let c = choose(&pods, "n1", "nvidia.com/gpu", 1, &none).unwrap();
        assert_eq!((c.name.as_str(), c.container.name.as_str()), ("half", "b"));
        // Device count decides between pods.
        let pods = vec![
            pod("one", "2026-12-01T10:00:01Z", &[("a", 1)], &[]),
            pod("two", "2026-12-01T10:00:05Z", &[("a", 2)], &[]),
        ];
        let c = choose(&pods, "n1", "nvidia.com/gpu", 2, &none).unwrap();
        assert_eq!(c.name, "two");
    }

    #[test]
    fn nothing_to_match_names_every_pod_and_why() {
        let mut other = pod("elsewhere", "2026-12-01T10:00:01Z", &[("a", 1)], &[]);
        let ann = other.metadata.annotations.as_mut().unwrap();
        let v = ann[ASSIGNMENT].replace("\"node\":\"n1\"", "\"node\":\"n2\"");
        ann.insert(ASSIGNMENT.into(), v);
        let mut plain = pod("plain", "2026-12-01T10:00:01Z", &[("a", 1)], &[]);
        plain.metadata.annotations = None;
        let done = pod("done", "2026-12-01T10:00:01Z", &[("a", 1)], &["a"]);
        let mut tampered = pod("tampered", "2026-12-01T10:00:01Z", &[("a", 1)], &[]);
        tampered.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .limits
            .as_mut()
            .unwrap()
            .insert(
                "nvidia.com/gpu".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("3".into()),
            );
        let pods = vec![
            other,
            plain,
            done,
            tampered,
            pod("two", "2026-12-01T10:00:01Z", &[("a", 2)], &[]),
        ];
        let e = choose(&pods, "n1", "nvidia.com/gpu", 1, &HashSet::new()).unwrap_err();
        let m = e.message("n1", "nvidia.com/gpu", 1);
        assert!(m.contains("pod ns/elsewhere is assigned to node n2"), "{m}");
        assert!(
            m.contains("pod ns/plain asks for nvidia.com/gpu but has no tessera.dev/assignment"),
            "{m}"
        );
        assert!(
            m.contains("asks for 3 nvidia.com/gpu but tessera.dev/assignment gives it 1"),
            "{m}"
        );
        assert!(
            m.contains("pod ns/two: its next container a has 2 GPUs"),
            "{m}"
        );
        assert!(!m.contains("done"), "{m}");
        let m = NoMatch::default().message("n1", "nvidia.com/gpu", 1);
        assert!(
            m.contains("no pod on this node has a tessera.dev/assignment"),
            "{m}"
        );
    }
}
