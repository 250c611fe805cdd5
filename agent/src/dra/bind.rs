//! A prepared claim's pod, containers and cgroup, learnt once they run.
//!
//! `NodePrepareResources` comes before the claim's containers exist, so a
//! claim's region directory (`claim_<UID>`) is made naming only its
//! namespace: without a cgroup the agent cannot join NVML's host pids
//! with the claim, and the watchdog has nothing to freeze or kill. This
//! task does for claims what [`crate::kubelet::bind`] does for
//! device-plugin containers: for each claim region with no cgroup (or one
//! that is gone) it reads the claim (its `reservedFor` pod, written by the
//! scheduler), that pod's spec (which of its containers use the claim;
//! for the claim the scheduler made for extended resources such as
//! `nvidia.com/gpu`, the status's request mappings say) and status
//! (their runtime IDs, written by kubelet), and records in the
//! region the pod's name and labels (the node policy's rules match them;
//! metrics name the pod) and the cgroup: the container's own when one
//! container uses the claim, else the pod's (its containers all below it).
//!
//! The region is never given the pod's UID, so the device plugin's
//! collection of departed pods never takes it: unprepare does.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams};

use crate::cgroup::path::Classified;
use crate::cgroup::walk::CgroupMap;
use crate::containers::{Container, Store};
use crate::kubelet::bind::{cgroup_of, container_ids};

use super::prepare::region_id;

/// How often unbound claim regions are looked for.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The pod a claim is reserved for, and which of its containers use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Users {
    /// The pod's name.
    pub pod: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// Its containers (init containers included) that name the claim.
    pub containers: Vec<String>,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
}

/// The pod of `pods` that `claim` is reserved for (the first one the
/// claim's `reservedFor` names that is among `pods`), with the containers
/// that use the claim: those whose `resources.claims` name the pod's
/// claim entry that resolves to `claim` (by `resourceClaimName`, or for a
/// template through the pod's `resourceClaimStatuses`), and those that
/// `extendedResourceClaimStatus` maps to it.
pub fn users(claim: &ResourceClaim, pods: &[Pod]) -> Option<Users> {
    let name = claim.metadata.name.as_deref()?;
    let reserved = claim.status.as_ref()?.reserved_for.as_ref()?;
    for consumer in reserved
        .iter()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
    {
        let Some(pod) = pods.iter().find(|p| {
            p.metadata.uid.as_deref() == Some(consumer.uid.as_str())
                && p.metadata.namespace == claim.metadata.namespace
        }) else {
            continue;
        };
        let spec = pod.spec.as_ref()?;
        let statuses: HashMap<&str, &str> = pod
            .status
            .iter()
            .flat_map(|s| s.resource_claim_statuses.iter().flatten())
            .filter_map(|s| Some((s.name.as_str(), s.resource_claim_name.as_deref()?)))
            .collect();
        let entries: Vec<&str> = spec
            .resource_claims
            .iter()
            .flatten()
            .filter(|e| {
                e.resource_claim_name.as_deref() == Some(name)
                    || statuses.get(e.name.as_str()) == Some(&name)
            })
            .map(|e| e.name.as_str())
            .collect();
        // The scheduler's claim for the pod's extended resources (a
        // DeviceClass's `extendedResourceName`): its containers are
        // those the status maps a request of it to.
        let extended: Vec<&str> = pod
            .status
            .iter()
            .filter_map(|s| s.extended_resource_claim_status.as_ref())
            .filter(|e| e.resource_claim_name == name)
            .flat_map(|e| &e.request_mappings)
            .map(|m| m.container_name.as_str())
            .collect();
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .filter(|c| {
                extended.contains(&c.name.as_str())
                    || c.resources
                        .iter()
                        .flat_map(|r| r.claims.iter().flatten())
                        .any(|r| entries.contains(&r.name.as_str()))
            })
            .map(|c| c.name.clone())
            .collect();
        return Some(Users {
            pod: pod.metadata.name.clone()?,
            pod_uid: consumer.uid.clone(),
            containers,
            labels: pod.metadata.labels.clone().unwrap_or_default(),
        });
    }
    None
}

/// The cgroup (relative to the v2 root) the claim's region acts on: the
/// container's when one container of the pod uses it and runs, else the
/// pod's.
pub fn claim_cgroup(
    map: &CgroupMap,
    users: &Users,
    ids: &HashMap<(String, String), String>,
) -> Option<String> {
    let uid = users.pod_uid.to_ascii_lowercase();
    if let [one] = users.containers.as_slice() {
        return cgroup_of(map, &uid, ids.get(&(uid.clone(), one.clone()))?);
    }
    map.by_id
        .values()
        .filter(|e| matches!(&e.kind, Classified::Pod(p) if p.uid.eq_ignore_ascii_case(&uid)))
        .map(|e| e.path.clone())
        .min_by_key(|p| p.matches('/').count())
}

/// Whether `c` is a claim's region whose cgroup should be (re)learnt.
fn unbound(c: &Container, cgroup_root: &Path) -> bool {
    c.id.as_str().starts_with("claim_") && crate::kubelet::bind::cgroup_unknown(c, cgroup_root)
}

/// Binds claim regions under `root` on `node` until `shutdown`.
pub async fn run(
    client: kube::Client,
    node: String,
    root: PathBuf,
    cgroup_root: Option<PathBuf>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let Some(cgroup_root) = cgroup_root else {
        tracing::warn!("no cgroup v2 hierarchy: claims' cgroups are not learnt");
        return;
    };
    tokio::pin!(shutdown);
    let store = Store::new(root);
    let pods: Api<Pod> = Api::all(client.clone());
    let claims: Api<ResourceClaim> = Api::all(client);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(INTERVAL) => {}
        }
        let (s, r) = (store.clone(), cgroup_root.clone());
        let waiting = tokio::task::spawn_blocking(move || {
            s.list().map(|l| {
                l.containers
                    .into_iter()
                    .filter(|c| unbound(c, &r))
                    .collect::<Vec<_>>()
            })
        })
        .await;
        let waiting = match waiting {
            Ok(Ok(w)) if !w.is_empty() => w,
            Ok(Ok(_)) | Err(_) => continue,
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::error_chain::with_causes(&e), "cannot list the region directories");
                continue;
            }
        };
        let claim_list = match claims.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain::with_causes(&e), "cannot list the claims to learn their cgroups");
                continue;
            }
        };
        let pod_list = match pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
        {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(node = %node, error = %crate::error_chain::with_causes(&e), "cannot list the node's pods to learn claims' cgroups");
                continue;
            }
        };
        let mut found = Vec::new();
        for c in waiting {
            let Some(claim) = claim_list.iter().find(|k| {
                k.metadata
                    .uid
                    .as_deref()
                    .and_then(region_id)
                    .is_some_and(|id| id == c.id)
            }) else {
                continue;
            };
            if let Some(u) = users(claim, &pod_list) {
                found.push((c, u));
            }
        }
        if found.is_empty() {
            continue;
        }
        let ids = container_ids(&pod_list);
        let (s, r) = (store.clone(), cgroup_root.clone());
        let _ = tokio::task::spawn_blocking(move || bind(&s, &r, &found, &ids)).await;
    }
}

/// Records each claim's pod, labels and cgroup once its cgroup exists.
fn bind(
    store: &Store,
    cgroup_root: &Path,
    found: &[(Container, Users)],
    ids: &HashMap<(String, String), String>,
) {
    let Ok(map) = CgroupMap::build(cgroup_root) else {
        return;
    };
    for (c, users) in found {
        let Some(path) = claim_cgroup(&map, users, ids) else {
            continue;
        };
        let container = match users.containers.as_slice() {
            [one] => Some(one.clone()),
            _ => None,
        };
        match store.set(&c.id, |m| {
            m.pod = Some(users.pod.clone());
            m.container.clone_from(&container);
            m.labels.clone_from(&users.labels);
            m.cgroup = Some(path.clone());
            Ok(())
        }) {
            Ok(_) => {
                tracing::info!(claim = %c.id, pod = %users.pod, cgroup = %path, "claim cgroup learnt")
            }
            Err(e) => {
                tracing::warn!(claim = %c.id, error = %crate::error_chain::with_causes(&e), "cannot record a claim's cgroup")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const POD_UID: &str = "0b3c9f1e-1111-2222-3333-444455556666";
    const CID: &str = "4d4fd1eddd5c520b78688fd33a7b8c9bd9ebe4219b1ec87fe23c45655893b8b5";

    fn claim(name: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": "c-1"},
            "spec": {"devices": {"requests": []}},
            "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": POD_UID}]},
        }))
        .unwrap()
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": POD_UID, "labels": {"tier": "a"}},
            "spec": {
                "resourceClaims": [
                    {"name": "gpu", "resourceClaimName": "direct"},
                    {"name": "tmpl", "resourceClaimTemplateName": "t"},
                ],
                "containers": [
                    {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                    {"name": "side", "resources": {"claims": [{"name": "tmpl"}]}},
                    {"name": "both", "resources": {"claims": [{"name": "tmpl"}]}},
                    {"name": "none"},
                ],
            },
            "status": {
                "resourceClaimStatuses": [{"name": "tmpl", "resourceClaimName": "p-tmpl-x7"}],
                "containerStatuses": [
                    {"name": "main", "containerID": format!("containerd://{CID}"), "image": "", "imageID": "", "ready": true, "restartCount": 0},
                ],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_names_its_pod_and_the_containers_that_use_it() {
        let u = users(&claim("direct"), &[pod()]).unwrap();
        assert_eq!(u.pod, "p");
        assert_eq!(u.containers, ["main"]);
        assert_eq!(u.labels["tier"], "a");
        // Made from a template: found through the pod's status.
        let u = users(&claim("p-tmpl-x7"), &[pod()]).unwrap();
        assert_eq!(u.containers, ["side", "both"]);
        // The scheduler's claim for extended resources: its mappings.
        let mut p = pod();
        p.status.as_mut().unwrap().extended_resource_claim_status = Some(
            serde_json::from_value(json!({
                "resourceClaimName": "p-extended-resources-k2",
                "requestMappings": [
                    {"containerName": "none", "resourceName": "nvidia.com/gpu", "requestName": "container-3-request-0"},
                ],
            }))
            .unwrap(),
        );
        let u = users(&claim("p-extended-resources-k2"), &[p.clone()]).unwrap();
        assert_eq!(u.containers, ["none"]);
        let u = users(&claim("direct"), &[p]).unwrap();
        assert_eq!(u.containers, ["main"]);
        // Reserved for a pod not on this node, or not reserved: nothing.
        assert_eq!(users(&claim("direct"), &[]), None);
        let mut free = claim("direct");
        free.status = None;
        assert_eq!(users(&free, &[pod()]), None);
    }

    #[test]
    fn one_container_gets_its_own_cgroup_several_the_pod_s() {
        let root = tempfile::tempdir().unwrap();
        let pod_dir = format!("kubepods/besteffort/pod{POD_UID}");
        for dir in [format!("{pod_dir}/{CID}"), format!("{pod_dir}/other")] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
        }
        let map = CgroupMap::build(root.path()).unwrap();
        let ids = container_ids(&[pod()]);
        let one = users(&claim("direct"), &[pod()]).unwrap();
        assert_eq!(
            claim_cgroup(&map, &one, &ids).as_deref(),
            Some(format!("/{pod_dir}/{CID}").as_str())
        );
        let two = users(&claim("p-tmpl-x7"), &[pod()]).unwrap();
        assert_eq!(
            claim_cgroup(&map, &two, &ids).as_deref(),
            Some(format!("/{pod_dir}").as_str())
        );
        // One container not running yet: nothing to bind to.
        let mut waiting = one.clone();
        waiting.containers = vec!["side".into()];
        assert_eq!(claim_cgroup(&map, &waiting, &ids), None);
    }
}
