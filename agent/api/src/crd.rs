//! The `GpuNode` CustomResourceDefinition, rendered from the Rust types so
//! the schema the API server enforces is the one the agent and the
//! scheduler compile against. `deploy/crds/gpunodes.tessera.dev.yaml` is
//! this rendering, committed; the test `crd_drift` fails when they differ
//! (`TESSERA_BLESS=1 cargo test -p tessera-api --test crd_drift` rewrites
//! the file).

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::GpuNode;

/// Labels every Tessera object carries.
const LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "tessera"),
    ("app.kubernetes.io/component", "crd"),
];

/// The CRD of [`GpuNode`], with Tessera's labels.
pub fn gpunode() -> CustomResourceDefinition {
    let mut crd = GpuNode::crd();
    let labels = crd.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in LABELS {
        labels.insert(k.to_owned(), v.to_owned());
    }
    crd
}

/// The file committed at `deploy/crds/gpunodes.tessera.dev.yaml`: a comment
/// header, then the CRD as YAML.
pub fn gpunode_file() -> Result<String, serde_norway::Error> {
    let yaml = serde_norway::to_string(&gpunode())?;
    Ok(format!(
        "# GpuNode: one per GPU node (name = node name), status written by the\n\
         # Tessera agent on that node, read by the Tessera scheduler.\n\
         # Generated from agent/api (tessera-api); do not edit: run\n\
         # `TESSERA_BLESS=1 cargo test -p tessera-api --test crd_drift`.\n\
         {yaml}"
    ))
}
