//! An immutable view of the cluster's GPUs, as the extender judges it.
//!
//! The view is built from `GpuNode` objects ([`NodeView::from_gpu_node`])
//! and handed in whole, so filter and prioritize are pure functions of it.
//! Besides each node's GPUs it holds the cluster's workload estimate
//! ([`ClusterView::workload_for`]): the GPU shares of the containers the agents
//! report running, grouped into the classes the fragmentation-aware
//! placement keeps room for.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tessera_api::GpuNode;

use super::fit::node_of;
use crate::placement::{GpuAsk, Node, Task, Workload};
use crate::resources::Memory;
use tessera_api::gpunode::Health;

/// Most task classes the workload estimate keeps (the most popular); the
/// fragmentation score costs one fit check per class and GPU.
pub const MAX_WORKLOAD_CLASSES: usize = 32;

/// Memory of a running share is counted in classes of this many MiB
/// (rounded up), so shares differing by a few MiB make one class.
pub const WORKLOAD_MEMORY_STEP_MIB: u64 = 1024;

/// One GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
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
    /// NUMA node of its PCI device, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// UUIDs of the node's GPUs it has an NVLink to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_peers: Vec<String>,
    /// SM utilisation NVML measured last, percent (0 where unknown).
    #[serde(default)]
    pub live_sm_percent: u32,
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

/// One running container's GPU share, as the node's agent reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningShare {
    /// GPUs it holds.
    pub gpus: u32,
    /// Memory on each, MiB.
    pub memory_mib: u64,
    /// SM percent on each.
    pub cores_percent: u32,
}

impl RunningShare {
    /// The share as a task class of the workload estimate (memory rounded
    /// up to [`WORKLOAD_MEMORY_STEP_MIB`]).
    pub fn task(&self) -> Task {
        let step = WORKLOAD_MEMORY_STEP_MIB;
        Task {
            gpus: vec![GpuAsk {
                container: String::new(),
                count: self.gpus.max(1),
                memory: Memory::Mib(self.memory_mib.div_ceil(step).saturating_mul(step)),
                milli: self.cores_percent.min(100) * 10,
                numa_bind: false,
                elastic: false,
            }],
            ..Task::default()
        }
    }
}

/// One node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// Its GPUs.
    pub gpus: Vec<GpuView>,
    /// The shares its containers hold (one per container).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub running: Vec<RunningShare>,
}

impl NodeView {
    /// The scheduler's view of one `GpuNode`: each device with what its
    /// shares commit. Memory committed is the larger of the shares' sum and
    /// the live use NVML reports (memory held outside any share still
    /// occupies the card); SM percent committed is the shares' sum, and the
    /// measured SM use is kept beside it. A node whose status is missing
    /// has no GPUs to offer.
    pub fn from_gpu_node(node: &GpuNode) -> Self {
        let name = node.metadata.name.clone().unwrap_or_default();
        let Some(status) = &node.status else {
            return Self {
                name,
                ..Self::default()
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
                let usage = status.usage.iter().filter(|u| u.device == d.uuid);
                let live = usage.clone().map(|u| u.memory_used_mib).max().unwrap_or(0);
                let live_sm = usage.map(|u| u.sm_util_percent).max().unwrap_or(0);
                GpuView {
                    uuid: d.uuid.to_string(),
                    model: d.model.clone(),
                    memory_mib: d.memory_mib,
                    used_mib: mem.max(live),
                    cores_used_percent: cores,
                    healthy: d.health == Health::Healthy,
                    numa_node: d.numa_node,
                    nvlink_peers: d.nvlink_peers.iter().map(ToString::to_string).collect(),
                    live_sm_percent: live_sm,
                }
            })
            .collect();
        // One share per container: its devices, the largest per-device
        // memory and SM percent.
        let mut by_container: BTreeMap<(&str, &str, &str), RunningShare> = BTreeMap::new();
        for a in &status.allocations {
            let pod = a.pod_uid.as_deref().unwrap_or(&a.pod);
            let share = by_container
                .entry((&a.namespace, pod, &a.container))
                .or_insert(RunningShare {
                    gpus: 0,
                    memory_mib: 0,
                    cores_percent: 0,
                });
            share.gpus += 1;
            share.memory_mib = share.memory_mib.max(a.memory_mib);
            share.cores_percent = share.cores_percent.max(a.cores_percent);
        }
        Self {
            name,
            gpus,
            running: by_container.into_values().collect(),
        }
    }
}

/// Every node with GPU telemetry, by name. Cloning it shares the nodes
/// and the estimate (no node is copied), so a view kept between requests
/// costs one map of pointers per copy.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// Unique per view built ([`ClusterView::id`]); copies share it.
    id: u64,
    /// Each node's view with its placement form, converted once
    /// ([`super::fit::node_of`]) so requests do not repeat it.
    nodes: BTreeMap<String, Arc<(NodeView, Node)>>,
    /// The running shares of every node as task classes, at most
    /// [`MAX_WORKLOAD_CLASSES`] of them.
    workload: Arc<Workload>,
}

impl ClusterView {
    /// A view of these nodes; a later node of the same name replaces an
    /// earlier one.
    pub fn new(nodes: impl IntoIterator<Item = NodeView>) -> Self {
        let nodes: BTreeMap<String, Arc<(NodeView, Node)>> = nodes
            .into_iter()
            .map(|n| {
                let placed = node_of(&n);
                (n.name.clone(), Arc::new((n, placed)))
            })
            .collect();
        let tasks: Vec<Task> = nodes
            .values()
            .flat_map(|entry| entry.0.running.iter().map(RunningShare::task))
            .collect();
        let workload = Workload::from_tasks(&tasks)
            .most_popular(MAX_WORKLOAD_CLASSES)
            .with_supply(nodes.values().map(|entry| &entry.1));
        Self {
            id: next_id(),
            nodes,
            workload: Arc::new(workload),
        }
    }

    /// An identity of this view: equal for its copies, different for any
    /// view built or derived ([`Self::with_nodes`], [`Self::with_workload`])
    /// since, so a result computed from a view can be kept by its id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The workload estimate: the running shares' classes, or — when no
    /// node reports one (a new cluster) — `task` itself, so a placement
    /// keeps room for more pods like the one being placed.
    pub fn workload_for(&self, task: &Task) -> Cow<'_, Workload> {
        if self.workload.classes().is_empty() {
            Cow::Owned(Workload::from_tasks([task]))
        } else {
            Cow::Borrowed(&self.workload)
        }
    }

    /// The node of this name, if it has telemetry.
    pub fn node(&self, name: &str) -> Option<&NodeView> {
        self.nodes.get(name).map(|entry| &entry.0)
    }

    /// The node of this name with its placement form.
    pub fn entry(&self, name: &str) -> Option<(&NodeView, &Node)> {
        self.nodes.get(name).map(|entry| (&entry.0, &entry.1))
    }

    /// Every node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeView> {
        self.nodes.values().map(|entry| &entry.0)
    }

    /// This view with `workload` as its estimate in place of the running
    /// shares' (a replay that knows the workload it sends).
    pub fn with_workload(mut self, workload: Workload) -> Self {
        self.workload = Arc::new(
            workload
                .most_popular(MAX_WORKLOAD_CLASSES)
                .with_supply(self.nodes.values().map(|entry| &entry.1)),
        );
        self.id = next_id();
        self
    }

    /// This view with `nodes` in place of those of the same names (their
    /// GPUs; the workload estimate stays).
    pub fn with_nodes(&self, nodes: impl IntoIterator<Item = NodeView>) -> Self {
        let mut out = self.clone();
        out.id = next_id();
        for n in nodes {
            let placed = node_of(&n);
            out.nodes.insert(n.name.clone(), Arc::new((n, placed)));
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

/// The next [`ClusterView::id`].
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl PartialEq for ClusterView {
    /// Views are equal when their nodes and estimates are (ids aside).
    fn eq(&self, other: &Self) -> bool {
        self.nodes == other.nodes && self.workload == other.workload
    }
}
