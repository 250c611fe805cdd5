//! kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go types carry no json tags, so the JSON keys are the Go field names
//! (`Pod`, `NodeNames`, `FailedNodes`, ...). Nil pointers arrive as `null`.
//! `Pod` and `Nodes` stay raw JSON here: a pod this crate cannot read must
//! become an error in the result, not a failed request.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The body of `filter` and `prioritize` calls.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
pub struct ExtenderArgs {
    /// The full `v1.Pod` being scheduled.
    #[serde(rename = "Pod", default)]
    pub pod: Value,
    /// A full `v1.NodeList`; sent only when `nodeCacheCapable` is false.
    #[serde(rename = "Nodes", default)]
    pub nodes: Option<Value>,
    /// Candidate node names; sent only when `nodeCacheCapable` is true.
    #[serde(rename = "NodeNames", default)]
    pub node_names: Option<Vec<String>>,
}

impl ExtenderArgs {
    /// The candidate node names, from `NodeNames` or else from
    /// `Nodes.items[].metadata.name`.
    pub fn candidate_names(&self) -> Vec<String> {
        if let Some(names) = &self.node_names {
            return names.clone();
        }
        node_items(self.nodes.as_ref())
            .iter()
            .filter_map(|node| node.pointer("/metadata/name")?.as_str().map(str::to_owned))
            .collect()
    }
}

/// The `items` of a `NodeList`, or nothing.
pub(crate) fn node_items(nodes: Option<&Value>) -> &[Value] {
    nodes
        .and_then(|n| n.get("items"))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The answer to `filter`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
pub struct ExtenderFilterResult {
    /// The passing subset of `Nodes` (only when `Nodes` was sent).
    #[serde(rename = "Nodes")]
    pub nodes: Option<Value>,
    /// The passing subset of the candidate names.
    #[serde(rename = "NodeNames")]
    pub node_names: Option<Vec<String>>,
    /// Node → reason; preemption might make room.
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Node → reason; preemption cannot help.
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// Set when the request as a whole could not be judged.
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// One node's score from `prioritize`; the body is a JSON array of these.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct HostPriority {
    /// Node name.
    #[serde(rename = "Host")]
    pub host: String,
    /// 0 ([`MIN_PRIORITY`]) ..= 10 ([`MAX_PRIORITY`]).
    #[serde(rename = "Score")]
    pub score: i64,
}

/// `MinExtenderPriority`.
pub const MIN_PRIORITY: i64 = 0;
/// `MaxExtenderPriority`.
pub const MAX_PRIORITY: i64 = 10;

/// The body of a `bind` call.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct ExtenderBindingArgs {
    /// Pod name.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// Pod namespace.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// Pod UID.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// The node chosen.
    #[serde(rename = "Node")]
    pub node: String,
}

/// The answer to `bind`; an empty `Error` means bound.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct ExtenderBindingResult {
    /// Why binding failed, or empty.
    #[serde(rename = "Error")]
    pub error: String,
}
