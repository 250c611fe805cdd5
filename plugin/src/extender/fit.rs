//! Trial placement of a pod's GPU shares on one node: the extender's view
//! translated to [`crate::placement`], which decides and scores.
//!
//! Containers are placed in pod order; each takes `count` distinct GPUs
//! that are healthy (and report memory), admitted by the pod's
//! `tessera.dev/gpu-*` selectors, and have the share's memory and SM
//! percent still free, counting what earlier containers of the same pod
//! took; a 100 % SM share only takes an idle GPU; `tessera.dev/numa-bind`
//! keeps each container's GPUs on one NUMA node. Which fitting GPUs a
//! container takes follows [`crate::placement::pick`] (live SM headroom
//! for elastic shares, NVLink and NUMA locality for several GPUs), then the
//! pod's placement: fragmentation-aware ([`Policy::Tessera`] against the
//! view's workload estimate), binpack (fullest first) or spread (emptiest
//! first); ties go to the lower UUID so the result is deterministic. SM
//! percent maps to milli-GPU as ×10.

use crate::annotations::{ComputeMode, GpuPolicy, Placement};
use crate::placement::fit::Fullest;
use crate::placement::{self, Gpu, GpuAsk, Models, Node, Policy, Score, Task, Workload};
use crate::resources::GpuShare;

use super::view::{GpuView, NodeView};

pub use crate::placement::Unfit;

/// Where each container's shares would go.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// (container, GPU UUIDs) in pod order.
    pub containers: Vec<(String, Vec<String>)>,
    /// The node's GPUs with the pod's shares added.
    pub gpus_after: Vec<GpuView>,
}

/// The scoring policy of a pod's placement.
pub fn policy_of(placement: Placement) -> Policy {
    match placement {
        Placement::Fragmentation => Policy::Tessera,
        Placement::Binpack => Policy::Binpack,
        Placement::Spread => Policy::Spread,
    }
}

/// The pod's shares as a placement task (CPU and memory are left to
/// kube-scheduler's own filters).
pub fn task_of(shares: &[GpuShare], policy: &GpuPolicy) -> Task {
    Task {
        cpu_milli: 0,
        memory_mib: 0,
        gpus: shares
            .iter()
            .map(|s| GpuAsk {
                container: s.container.clone(),
                count: s.count,
                memory: s.effective_memory(),
                milli: u32::from(s.effective_cores()) * 10,
                numa_bind: policy.numa_bind,
                elastic: policy.compute_mode == Some(ComputeMode::Elastic),
            })
            .collect(),
        models: Models::Matching(policy.models.clone()),
        uuids: policy.uuids.clone(),
    }
}

/// The node's GPUs as placement sees them. A GPU reporting no memory is
/// treated as unhealthy: nothing can be placed on it. NVLink peers that
/// are not GPUs of this node are dropped.
pub fn node_of(node: &NodeView) -> Node {
    let index = |uuid: &str| {
        node.gpus
            .iter()
            .position(|g| g.uuid.eq_ignore_ascii_case(uuid))
    };
    Node {
        name: node.name.as_str().into(),
        cpu_milli: None,
        memory_mib: None,
        gpus: node
            .gpus
            .iter()
            .map(|g| Gpu {
                uuid: g.uuid.as_str().into(),
                model: g.model.as_str().into(),
                memory_mib: g.memory_mib,
                used_mib: g.used_mib,
                used_milli: g.cores_used_percent.saturating_mul(10),
                healthy: g.healthy && g.memory_mib > 0,
                numa: g.numa_node,
                nvlink: g.nvlink_peers.iter().filter_map(|p| index(p)).collect(),
                live_milli: g.live_sm_percent.min(100) * 10,
            })
            .collect(),
    }
}

/// Whether the task fits the node, without choosing by policy: fit does
/// not depend on which fitting GPUs a container takes, except between the
/// containers of one pod, where the fullest-first choice leaves the most
/// room for the next.
///
/// # Errors
/// Why not.
pub fn fits(task: &Task, node: &Node) -> Result<(), Unfit> {
    // One ask without NUMA binding: the quick count is exact (and copies
    // nothing); otherwise, and for the reason of a refusal, place it.
    if let [ask] = task.gpus.as_slice()
        && !ask.numa_bind
        && placement::fit::fits_quickly(task, node)
    {
        return Ok(());
    }
    placement::place(task, node, &mut Fullest).map(|_| ())
}

/// Places `shares` on `node` by the pod's policy, or says why not.
///
/// # Errors
/// Why the pod does not fit.
pub fn place(
    shares: &[GpuShare],
    policy: &GpuPolicy,
    workload: &Workload,
    node: &NodeView,
) -> Result<Assignment, Unfit> {
    place_task(
        &task_of(shares, policy),
        policy.placement,
        workload,
        node,
        &node_of(node),
    )
    .map(|(assignment, _)| assignment)
}

/// Places a task already converted ([`task_of`]) on a node already
/// converted ([`node_of`] of `view`), with its score under the pod's
/// placement (higher is better; see [`crate::placement::score`]).
///
/// # Errors
/// Why the task does not fit.
pub fn place_task(
    task: &Task,
    placement: Placement,
    workload: &Workload,
    view: &NodeView,
    node: &Node,
) -> Result<(Assignment, Score), Unfit> {
    let scored = placement::evaluate(policy_of(placement), task, node, workload)?;
    Ok((assignment(view, &scored.placed), scored.score))
}

/// The placement in the extender's terms.
pub fn assignment(node: &NodeView, placed: &placement::Placed) -> Assignment {
    let containers = placed
        .containers
        .iter()
        .map(|(c, idx)| {
            (
                c.clone(),
                idx.iter().map(|&i| node.gpus[i].uuid.clone()).collect(),
            )
        })
        .collect();
    let gpus_after = node
        .gpus
        .iter()
        .zip(&placed.after.gpus)
        .map(|(view, after)| GpuView {
            used_mib: after.used_mib,
            cores_used_percent: after.used_milli / 10,
            ..view.clone()
        })
        .collect();
    Assignment {
        containers,
        gpus_after,
    }
}
