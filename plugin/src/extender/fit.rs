//! Trial placement of a pod's GPU shares on one node: the extender's view
//! translated to [`crate::placement`], which decides.
//!
//! Containers are placed in pod order; each takes `count` distinct GPUs
//! that are healthy (and report memory), admitted by the pod's
//! `tessera.dev/gpu-*` selectors, and have the share's memory and SM
//! percent still free, counting what earlier containers of the same pod
//! took; a 100 % SM share only takes an idle GPU. Binpack tries the fullest
//! fitting GPUs first, spread the emptiest; ties go to the lower UUID so
//! the result is deterministic. SM percent maps to milli-GPU as ×10.

use crate::annotations::{GpuPolicy, Placement};
use crate::placement::fit::{Emptiest, Fullest};
use crate::placement::{self, Gpu, GpuAsk, Models, Node, Task};
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

impl Assignment {
    /// Mean load of the node's healthy GPUs after placement, 0.0..=1.0.
    pub fn node_load(&self) -> f64 {
        let healthy: Vec<&GpuView> = self.gpus_after.iter().filter(|g| g.healthy).collect();
        if healthy.is_empty() {
            return 1.0;
        }
        healthy.iter().map(|g| g.load()).sum::<f64>() / healthy.len() as f64
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
            })
            .collect(),
        models: Models::Matching(policy.models.clone()),
        uuids: policy.uuids.clone(),
    }
}

/// The node's GPUs as placement sees them. A GPU reporting no memory is
/// treated as unhealthy: nothing can be placed on it.
pub fn node_of(node: &NodeView) -> Node {
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
            })
            .collect(),
    }
}

/// Places `shares` on `node`, or says why not.
pub fn place(
    shares: &[GpuShare],
    policy: &GpuPolicy,
    node: &NodeView,
) -> Result<Assignment, Unfit> {
    place_task(
        &task_of(shares, policy),
        policy.placement,
        node,
        &node_of(node),
    )
}

/// Places a task already converted ([`task_of`]) on a node already
/// converted ([`node_of`] of `view`).
pub fn place_task(
    task: &Task,
    placement: Placement,
    view: &NodeView,
    node: &Node,
) -> Result<Assignment, Unfit> {
    let placed = match placement {
        Placement::Binpack => placement::place(task, node, &mut Fullest),
        Placement::Spread => placement::place(task, node, &mut Emptiest),
    }?;
    Ok(assignment(view, &placed))
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
