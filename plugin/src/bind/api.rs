//! The API server calls bind makes: read the pod, write its assignment on
//! the condition that the pod is unchanged, create its Binding, and list
//! the pods that already hold assignments.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_api::assignment::ASSIGNMENT;

/// Page size when listing pods.
const PAGE: u32 = 500;

/// The pod `namespace/name`.
pub async fn get_pod(client: &kube::Client, ns: &str, name: &str) -> Result<Pod, kube::Error> {
    Api::<Pod>::namespaced(client.clone(), ns).get(name).await
}

/// Sets (`Some`) or removes (`None`) the assignment annotation with a JSON
/// merge patch carrying `resourceVersion`: the API server applies it only
/// if the pod is still at that version, else answers 409 Conflict.
pub async fn patch_assignment(
    client: &kube::Client,
    ns: &str,
    name: &str,
    resource_version: &str,
    assignment: Option<&str>,
) -> Result<Pod, kube::Error> {
    let patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { ASSIGNMENT: assignment },
        }
    });
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// Creates the pod's `Binding` to `node` (`pods/binding`), naming the
/// pod's UID so a pod re-created under the same name is not bound.
pub async fn create_binding(
    client: &kube::Client,
    ns: &str,
    name: &str,
    uid: &str,
    node: &str,
) -> Result<(), kube::Error> {
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": { "name": name, "namespace": ns, "uid": uid },
        "target": { "apiVersion": "v1", "kind": "Node", "name": node },
    });
    let _status: Value = Api::<Pod>::namespaced(client.clone(), ns)
        .create_subresource("binding", name, &PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// Every pod in the cluster, page by page.
pub async fn list_pods(client: &kube::Client) -> Result<Vec<Pod>, kube::Error> {
    let api = Api::<Pod>::all(client.clone());
    let mut pods = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        pods.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(pods),
        }
    }
}
