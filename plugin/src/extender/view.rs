//! An immutable view of the cluster's GPUs, as the extender judges it.
//!
//! The view is built from `GpuNode` objects ([`NodeView::from_gpu_node`])
//! and handed in whole, so filter and prioritize are pure functions of it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_api::GpuNode;

use super::fit::node_of;
use crate::placement::Node;
use tessera_api::gpunode::Health;

/// One GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Model name as NVML reports it, e.g. `NVIDIA A100-SXM4-80GB`.
    pub model: String,
    /// Total memory, MiB.
    pub memory_mib: u64,
    /// Memory already committed, MiB: the sum of allocated shares, or live
    /// use where that is larger (the view's builder decides).
    pub used_mib: u64,
    /// SM percent already committed to shares (0..=100; more reads as full).
    pub cores_used_percent: u32,
    /// False when the agent marks the device unhealthy.
    pub healthy: bool,
}

impl GpuView {
    /// Memory not yet committed, MiB.
    pub fn free_mib(&self) -> u64 {
        self.memory_mib.saturating_sub(self.used_mib)
    }

    /// SM percent not yet committed.
    pub fn free_cores(&self) -> u32 {
        100u32.saturating_sub(self.cores_used_percent)
    }

    /// Committed share of the card, 0.0..=1.0: the mean of memory and SM use.
    pub fn load(&self) -> f64 {
        if self.memory_mib == 0 {
            return 1.0;
        }
        let mem = (self.used_mib as f64 / self.memory_mib as f64).min(1.0);
        let cores = (f64::from(self.cores_used_percent) / 100.0).min(1.0);
        (mem + cores) / 2.0
    }
}

/// One node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// Its GPUs.
    pub gpus: Vec<GpuView>,
}

impl NodeView {
    /// The scheduler's view of one `GpuNode`: each device with what its
    /// shares commit. Memory committed is the larger of the shares' sum and
    /// the live use NVML reports (memory held outside any share still
    /// occupies the card); SM percent committed is the shares' sum. A node
    /// whose status is missing has no GPUs to offer.
    pub fn from_gpu_node(node: &GpuNode) -> Self {
        let name = node.metadata.name.clone().unwrap_or_default();
        let Some(status) = &node.status else {
            return Self {
                name,
                gpus: Vec::new(),
            };
        };
        let gpus = status
            .devices
            .iter()
            .map(|d| {
                let shares = status.allocations.iter().filter(|a| a.device == d.uuid);
                let (mut mem, mut cores) = (0u64, 0u32);
                for a in shares {
                    mem = mem.saturating_add(a.memory_mib);
                    cores = cores.saturating_add(a.cores_percent);
                }
                let live = status
                    .usage
                    .iter()
                    .filter(|u| u.device == d.uuid)
                    .map(|u| u.memory_used_mib)
                    .max()
                    .unwrap_or(0);
                GpuView {
                    uuid: d.uuid.to_string(),
                    model: d.model.clone(),
                    memory_mib: d.memory_mib,
                    used_mib: mem.max(live),
                    cores_used_percent: cores,
                    healthy: d.health == Health::Healthy,
                }
            })
            .collect();
        Self { name, gpus }
    }
}

/// Every node with GPU telemetry, by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterView {
    /// Each node's view with its placement form, converted once
    /// ([`super::fit::node_of`]) so requests do not repeat it.
    nodes: BTreeMap<String, (NodeView, Node)>,
}

impl ClusterView {
    /// A view of these nodes; a later node of the same name replaces an
    /// earlier one.
    pub fn new(nodes: impl IntoIterator<Item = NodeView>) -> Self {
        Self {
            nodes: nodes
                .into_iter()
                .map(|n| {
                    let placed = node_of(&n);
                    (n.name.clone(), (n, placed))
                })
                .collect(),
        }
    }

    /// The node of this name, if it has telemetry.
    pub fn node(&self, name: &str) -> Option<&NodeView> {
        self.nodes.get(name).map(|(view, _)| view)
    }

    /// The node of this name with its placement form.
    pub fn entry(&self, name: &str) -> Option<(&NodeView, &Node)> {
        self.nodes.get(name).map(|(view, node)| (view, node))
    }

    /// Every node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeView> {
        self.nodes.values().map(|(view, _)| view)
    }

    /// This view with `nodes` in place of those of the same names.
    pub fn with_nodes(&self, nodes: impl IntoIterator<Item = NodeView>) -> Self {
        let mut out = self.clone();
        for n in nodes {
            let placed = node_of(&n);
            out.nodes.insert(n.name.clone(), (n, placed));
        }
        out
    }

    /// Number of nodes in the view.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the view has no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}
