//! A device-plugin container's cgroup, learnt once the container runs.
//!
//! `Allocate` comes before the container exists, so its region directory
//! is made without a cgroup. Without one the agent knows the container's
//! processes only from its usage region (cooperating ones, under the pids
//! they see in their own pid namespace), so NVML's host pids cannot be
//! joined with it and the watchdog has nothing to freeze or kill. This
//! task fills the gap: for each region that names a pod UID and container
//! but no cgroup, it reads the container's ID from the pod's status
//! (written by kubelet from the runtime, out of the tenant's reach) and
//! finds the cgroup the runtime made for that ID under the pod's cgroup in
//! the v2 tree ([`crate::cgroup::walk::CgroupMap`]: cgroupfs and systemd
//! drivers, containerd and CRI-O names), then records it in the region's
//! metadata. The control loop and the watchdog use it from their next
//! period.
//!
//! A restarted container gets a new ID and cgroup: the region keeps the
//! old path until the first is gone, then the binding is made again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::cgroup::path::Classified;
use crate::cgroup::walk::CgroupMap;
use crate::containers::{Container, Store};

/// How often unbound regions are looked for.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The runtime's ID of each running container of `pods`, by (pod UID,
/// container name): the part of `containerID` after `<runtime>://`.
pub fn container_ids(pods: &[Pod]) -> HashMap<(String, String), String> {
    let mut out = HashMap::new();
    for pod in pods {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            continue;
        };
        let statuses = pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten());
        for c in statuses {
            if let Some(id) = c.container_id.as_deref().and_then(|i| i.split_once("://"))
                && !id.1.is_empty()
            {
                out.insert((uid.to_ascii_lowercase(), c.name.clone()), id.1.to_owned());
            }
        }
    }
    out
}

/// The cgroup (relative to the v2 root, leading `/`) of container `id` of
/// pod `uid` in `map`: the topmost one classified as that container.
pub fn cgroup_of(map: &CgroupMap, uid: &str, id: &str) -> Option<String> {
    map.by_id
        .values()
        .filter(|e| {
            matches!(&e.kind, Classified::Container { pod, container }
                if pod.uid.eq_ignore_ascii_case(uid) && container.id == id && !container.conmon && container.nested.is_empty())
        })
        .map(|e| e.path.clone())
        .min_by_key(|p| p.matches('/').count())
}

/// Whether `c`'s cgroup should be (re)learnt: it names a pod and a
/// container, and no cgroup or one that is gone.
fn unbound(c: &Container, cgroup_root: &Path) -> bool {
    c.meta.pod_uid.is_some() && c.meta.container.is_some() && cgroup_unknown(c, cgroup_root)
}

/// Whether `c`'s metadata names no cgroup, or one no longer under
/// `cgroup_root` (its container restarted, or ended): its cgroup is to be
/// learnt (again). The DRA driver's claim binder asks the same.
pub fn cgroup_unknown(c: &Container, cgroup_root: &Path) -> bool {
    c.meta
        .cgroup
        .as_deref()
        .is_none_or(|rel| !cgroup_root.join(rel.trim_start_matches('/')).is_dir())
}

/// Binds the cgroups of `root`'s device-plugin containers on `node` until
/// `shutdown`; without a v2 hierarchy there is nothing to bind to.
pub async fn run(
    client: kube::Client,
    node: String,
    root: PathBuf,
    cgroup_root: Option<PathBuf>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let Some(cgroup_root) = cgroup_root else {
        tracing::warn!("no cgroup v2 hierarchy: containers' cgroups are not learnt");
        return;
    };
    tokio::pin!(shutdown);
    let store = Store::new(root);
    let pods: Api<Pod> = Api::all(client);
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
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::error_chain::with_causes(&e), "cannot list the region directories");
                continue;
            }
            Err(_) => continue,
        };
        let list = match pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
        {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(node = %node, error = %crate::error_chain::with_causes(&e), "cannot list the node's pods to learn containers' cgroups");
                continue;
            }
        };
        let ids = container_ids(&list);
        let (s, r) = (store.clone(), cgroup_root.clone());
        let _ = tokio::task::spawn_blocking(move || bind(&s, &r, &waiting, &ids)).await;
    }
}

/// Records the cgroup of each of `waiting` whose container runs.
fn bind(
    store: &Store,
    cgroup_root: &Path,
    waiting: &[Container],
    ids: &HashMap<(String, String), String>,
) {
    let Ok(map) = CgroupMap::build(cgroup_root) else {
        return;
    };
    for c in waiting {
        let (Some(uid), Some(name)) = (&c.meta.pod_uid, &c.meta.container) else {
            continue;
        };
        let Some(id) = ids.get(&(uid.to_ascii_lowercase(), name.clone())) else {
            continue;
        };
        let Some(path) = cgroup_of(&map, uid, id) else {
            continue;
        };
        match store.set(&c.id, |m| {
            m.cgroup = Some(path.clone());
            Ok(())
        }) {
            Ok(_) => tracing::info!(container = %c.id, cgroup = %path, "container cgroup learnt"),
            Err(e) => {
                tracing::warn!(container = %c.id, error = %crate::error_chain::with_causes(&e), "cannot record a container's cgroup")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const UID: &str = "0b3c9f1e-1111-2222-3333-444455556666";
    const CID: &str = "4d4fd1eddd5c520b78688fd33a7b8c9bd9ebe4219b1ec87fe23c45655893b8b5";
    const SANDBOX: &str = "1f7c7b833efd14973c032d1a7d55beff193b442b211e957bf68b99d6459a675d";

    #[test]
    fn the_status_names_each_running_container_s_id() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"uid": UID.to_uppercase(), "name": "p"},
            "status": {"containerStatuses": [
                {"name": "cuda", "containerID": format!("containerd://{CID}"), "image": "", "imageID": "", "ready": true, "restartCount": 0},
                {"name": "waiting", "image": "", "imageID": "", "ready": false, "restartCount": 0},
            ]},
        }))
        .unwrap();
        let ids = container_ids(&[pod]);
        assert_eq!(ids.len(), 1);
        assert_eq!(ids[&(UID.to_owned(), "cuda".to_owned())], CID);
    }

    #[test]
    fn the_container_s_cgroup_is_found_under_its_pod_by_id() {
        // As runc makes them on a cgroupfs node (the layout of a real pod).
        let root = tempfile::tempdir().unwrap();
        let pod = format!("kubepods/besteffort/pod{UID}");
        for dir in [
            format!("{pod}/{CID}"),
            format!("{pod}/{SANDBOX}"),
            "kubepods/burstable".into(),
        ] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
        }
        let map = CgroupMap::build(root.path()).unwrap();
        assert_eq!(cgroup_of(&map, UID, CID), Some(format!("/{pod}/{CID}")));
        assert_eq!(cgroup_of(&map, UID, "ab"), None);
        assert_eq!(cgroup_of(&map, "another-uid", CID), None);
    }
}
