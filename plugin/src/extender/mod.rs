//! The kube-scheduler extender: filter and prioritize as pure functions of
//! the request and a [`ClusterView`].
//!
//! Filter keeps the nodes where every GPU container of the pod can be
//! placed (see [`fit`]). A node that could take the pod once other shares
//! leave goes to `FailedNodes`; one that never could (no telemetry, too few
//! matching GPUs, cards too small) goes to `FailedAndUnresolvableNodes`, so
//! the scheduler does not preempt for it. A pod the extender cannot read
//! fails through the result's `Error`, never a panic or an HTTP error.
//!
//! Prioritize scores each node 0..=10 from the mean load of its healthy
//! GPUs after the trial placement: binpack gives full nodes high scores,
//! spread empty ones. Nodes the pod does not fit get 0.

pub mod fit;
mod view;
mod wire;

pub use fit::{Assignment, Unfit, place};
pub use view::{ClusterView, GpuView, NodeView};
pub use wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
    MAX_PRIORITY, MIN_PRIORITY,
};

use serde_json::Value;
use thiserror::Error;

use crate::annotations::Placement;
use crate::pod::Pod;
use crate::request::PodRequest;

/// Why a pod could not be judged at all.
#[derive(Debug, Error)]
pub enum ExtenderError {
    /// `Pod` is not a readable pod.
    #[error("pod could not be read")]
    Pod(#[source] serde_json::Error),
    /// The pod's GPU resources or annotations are invalid; one message each.
    #[error("pod {pod}: {}", .problems.join("; "))]
    Invalid {
        /// `namespace/name`.
        pod: String,
        /// What is wrong.
        problems: Vec<String>,
    },
}

impl ExtenderError {
    /// The message with its causes.
    pub fn full_message(&self) -> String {
        crate::error_chain::with_causes(self)
    }
}

/// Reads the pod's request from raw JSON.
///
/// # Errors
/// An [`ExtenderError`] for an unreadable pod or invalid values.
pub fn pod_request(pod: &Value) -> Result<PodRequest, ExtenderError> {
    let pod = Pod::from_json(pod).map_err(ExtenderError::Pod)?;
    PodRequest::from_pod(&pod).map_err(|problems| ExtenderError::Invalid {
        pod: format!("{}/{}", pod.metadata.namespace, pod.metadata.display_name()),
        problems,
    })
}

/// The `filter` verb.
pub fn filter(args: &ExtenderArgs, view: &ClusterView) -> ExtenderFilterResult {
    let names = args.candidate_names();
    let mut result = ExtenderFilterResult::default();
    let request = match pod_request(&args.pod) {
        Ok(request) => request,
        Err(error) => {
            result.error = error.full_message();
            return result;
        }
    };
    if request.shares.is_empty() {
        // No GPU asked for: every node passes, with or without telemetry.
        return with_passing(args, names, result);
    }
    let task = fit::task_of(&request.shares, &request.policy);
    let mut passing = Vec::new();
    for name in names {
        let Some((node, placed)) = view.entry(&name) else {
            result.failed_and_unresolvable_nodes.insert(
                name,
                "no tessera GPU telemetry for this node (no GpuNode status)".to_owned(),
            );
            continue;
        };
        match fit::place_task(&task, request.policy.placement, node, placed) {
            Ok(_) => passing.push(name),
            Err(Unfit::Busy(reason)) => {
                result.failed_nodes.insert(name, reason);
            }
            Err(Unfit::Never(reason)) => {
                result.failed_and_unresolvable_nodes.insert(name, reason);
            }
        }
    }
    with_passing(args, passing, result)
}

/// `result` with `passing` as the nodes that pass.
fn with_passing(
    args: &ExtenderArgs,
    passing: Vec<String>,
    mut result: ExtenderFilterResult,
) -> ExtenderFilterResult {
    if args.nodes.is_some() {
        result.nodes = Some(subset_of_nodes(args.nodes.as_ref(), &passing));
    }
    result.node_names = Some(passing);
    result
}

/// The original `NodeList` with only the passing items.
fn subset_of_nodes(nodes: Option<&Value>, passing: &[String]) -> Value {
    let items: Vec<Value> = wire::node_items(nodes)
        .iter()
        .filter(|node| {
            node.pointer("/metadata/name")
                .and_then(Value::as_str)
                .is_some_and(|name| passing.iter().any(|p| p == name))
        })
        .cloned()
        .collect();
    let mut list = nodes
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    if let Some(object) = list.as_object_mut() {
        object.insert("items".to_owned(), Value::Array(items));
    }
    list
}

/// The `prioritize` verb. Its errors are ignored by the scheduler, so a pod
/// it cannot read scores 0 everywhere.
pub fn prioritize(args: &ExtenderArgs, view: &ClusterView) -> Vec<HostPriority> {
    let request = pod_request(&args.pod).ok();
    let task = request.as_ref().map(|r| fit::task_of(&r.shares, &r.policy));
    args.candidate_names()
        .into_iter()
        .map(|host| {
            let score = request
                .as_ref()
                .zip(task.as_ref())
                .and_then(|(r, task)| node_score(r, task, view, &host))
                .unwrap_or(MIN_PRIORITY);
            HostPriority { host, score }
        })
        .collect()
}

/// The node's score for the request; `None` for a pod without GPU shares,
/// a node without telemetry, or one the pod does not fit.
fn node_score(
    request: &PodRequest,
    task: &crate::placement::Task,
    view: &ClusterView,
    host: &str,
) -> Option<i64> {
    if request.shares.is_empty() {
        return None;
    }
    let (node, placed) = view.entry(host)?;
    let assignment = fit::place_task(task, request.policy.placement, node, placed).ok()?;
    Some(score(&assignment, request.policy.placement))
}

/// 0..=10 from the node's load after placement.
pub fn score(assignment: &Assignment, placement: Placement) -> i64 {
    let load = assignment.node_load().clamp(0.0, 1.0);
    let preference = match placement {
        Placement::Binpack => load,
        Placement::Spread => 1.0 - load,
    };
    // In 0.0..=10.0 after the clamp, so the cast cannot truncate.
    ((preference * MAX_PRIORITY as f64).round() as i64).clamp(MIN_PRIORITY, MAX_PRIORITY)
}

#[cfg(test)]
mod tests;
