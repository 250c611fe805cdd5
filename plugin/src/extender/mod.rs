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
//! Prioritize places the pod on each candidate under its placement policy
//! ([`fit::place_task`]: fragmentation-aware by default, or binpack or
//! spread) and ranks the scores: the best node gets [`MAX_PRIORITY`], each
//! worse distinct score one less, down to 1 (see [`rank_scores`]). Nodes the
//! pod does not fit, or without telemetry, get 0.

pub mod fit;
mod view;
mod wire;

pub use fit::{Assignment, Unfit, place};
pub use view::{ClusterView, GpuView, NodeView};
pub use view::{MAX_WORKLOAD_CLASSES, RunningShare, WORKLOAD_MEMORY_STEP_MIB};
pub use wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
    MAX_PRIORITY, MIN_PRIORITY,
};

use serde_json::Value;
use thiserror::Error;

use crate::placement::Score;
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
        let Some((_, placed)) = view.entry(&name) else {
            result.failed_and_unresolvable_nodes.insert(
                name,
                "no tessera GPU telemetry for this node (no GpuNode status)".to_owned(),
            );
            continue;
        };
        match fit::fits(&task, placed) {
            Ok(()) => passing.push(name),
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
    let names = args.candidate_names();
    let scores: Vec<Option<Score>> = match pod_request(&args.pod) {
        Ok(request) if !request.shares.is_empty() => {
            let task = fit::task_of(&request.shares, &request.policy);
            let workload = view.workload_for(&task);
            names
                .iter()
                .map(|host| {
                    let (node, placed) = view.entry(host)?;
                    fit::place_task(&task, request.policy.placement, &workload, node, placed)
                        .ok()
                        .map(|(_, score)| score)
                })
                .collect()
        }
        _ => vec![None; names.len()],
    };
    names
        .into_iter()
        .zip(rank_scores(&scores))
        .map(|(host, score)| HostPriority { host, score })
        .collect()
}

/// Extender priorities from trial scores: the best distinct score gets
/// [`MAX_PRIORITY`], the next one less, and so on down to 1, so every node
/// the pod fits scores above one it does not (`None`: [`MIN_PRIORITY`]).
/// Equal scores get equal priorities.
pub fn rank_scores(scores: &[Option<Score>]) -> Vec<i64> {
    let mut distinct: Vec<Score> = scores.iter().flatten().copied().collect();
    distinct.sort_by(|a, b| b.cmp(a));
    distinct.dedup();
    scores
        .iter()
        .map(|s| match s {
            None => MIN_PRIORITY,
            Some(s) => {
                let rank = distinct.partition_point(|d| d > s);
                (MAX_PRIORITY - i64::try_from(rank).unwrap_or(MAX_PRIORITY)).max(MIN_PRIORITY + 1)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
