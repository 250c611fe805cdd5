//! `GpuNode` (`gpunodes.tessera.dev/v1alpha1`, cluster-scoped): one per GPU
//! node, named after the node. The agent on that node writes its status —
//! inventory, health, the shares granted to containers and live use — and
//! the scheduler reads it to place pods. The spec is empty: nothing about a
//! node's GPUs is desired state.
//!
//! Invariants the writer keeps and the schema checks: UUIDs are canonical
//! ([`GpuUuid`]); `devices` holds each UUID once (a list map keyed by
//! `uuid`); percentages are 0..=100.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::uuid::GpuUuid;

/// Most GPUs one node reports.
pub const MAX_DEVICES: usize = 64;
/// Most shares one node reports.
pub const MAX_ALLOCATIONS: usize = 4096;

/// The (empty) desired state: the agent writes status only.
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema,
)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "GpuNode",
    plural = "gpunodes",
    singular = "gpunode",
    shortname = "gpun",
    category = "tessera",
    status = "GpuNodeStatus",
    doc = "GPU inventory, shares and live use of one node, written by the Tessera agent on it.",
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".status.summary.gpus","description":"GPUs the agent found on the node."}"#,
    printcolumn = r#"{"name":"Healthy","type":"integer","jsonPath":".status.summary.healthyGpus","description":"GPUs that are healthy."}"#,
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".status.summary.model","description":"GPU model; \"mixed\" when the node has several."}"#,
    printcolumn = r#"{"name":"Memory-MiB","type":"integer","jsonPath":".status.summary.memoryMiB","description":"Total GPU memory on the node, MiB."}"#,
    printcolumn = r#"{"name":"Allocated-MiB","type":"integer","jsonPath":".status.summary.allocatedMemoryMiB","description":"GPU memory promised to pods, MiB."}"#,
    printcolumn = r#"{"name":"Used-MiB","type":"integer","jsonPath":".status.summary.usedMemoryMiB","description":"GPU memory in use now (NVML), MiB."}"#,
    printcolumn = r#"{"name":"SM-Util","type":"integer","jsonPath":".status.summary.smUtilPercent","description":"Mean SM utilisation over the node's GPUs, percent."}"#,
    printcolumn = r#"{"name":"Pods","type":"integer","jsonPath":".status.summary.pods","description":"Pods holding GPU shares on the node."}"#,
    printcolumn = r#"{"name":"Updated","type":"date","jsonPath":".status.updatedAt","description":"When the agent last wrote this status."}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct GpuNodeSpec {}

/// What the agent observed.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// When this status was computed.
    pub updated_at: Time,
    /// Version of the agent that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Node-wide totals, for printer columns and quick reads.
    #[serde(default)]
    pub summary: Summary,
    /// One entry per physical GPU, in NVML index order.
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["uuid"]))]
    pub devices: Vec<Device>,
    /// GPU shares granted to containers on this node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub allocations: Vec<Allocation>,
    /// Live use per GPU, sampled by the agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub usage: Vec<DeviceUsage>,
}

/// Node-wide totals.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// GPUs found.
    pub gpus: u32,
    /// GPUs that are healthy.
    pub healthy_gpus: u32,
    /// The GPUs' model; `mixed` when they differ.
    pub model: String,
    /// Total GPU memory, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// GPU memory promised to pods, MiB.
    #[serde(rename = "allocatedMemoryMiB")]
    pub allocated_memory_mib: u64,
    /// GPU memory in use now (NVML), MiB.
    #[serde(rename = "usedMemoryMiB")]
    pub used_memory_mib: u64,
    /// Mean SM utilisation over the node's GPUs, percent.
    #[schemars(extend("maximum" = 100))]
    pub sm_util_percent: u32,
    /// Pods holding GPU shares on the node.
    pub pods: u32,
}

/// Whether a GPU can take work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum Health {
    /// It answers and has no fatal error.
    #[default]
    Healthy,
    /// Lost, or a fatal Xid was seen.
    Unhealthy,
}

/// One physical GPU.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Its UUID.
    pub uuid: GpuUuid,
    /// NVML device index.
    pub index: u32,
    /// Model name as NVML reports it.
    pub model: String,
    /// Framebuffer size, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// NUMA node of the GPU's PCI device, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// GPUs of this node reachable over NVLink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub nvlink_peers: Vec<GpuUuid>,
    /// Whether it can take work.
    pub health: Health,
    /// Why it is unhealthy, e.g. `xid 79`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_reason: Option<String>,
}

/// How a container's SM share is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ComputeMode {
    /// Capped at its share always, also alone on its GPU.
    Hard,
    /// Uses idle SMs; capped to its share only under contention.
    Elastic,
}

/// A GPU share granted to one container.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// The GPU.
    pub device: GpuUuid,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's UID.
    #[serde(default, rename = "podUID", skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The container's name.
    pub container: String,
    /// Memory granted, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// SM share granted, percent of the GPU.
    #[schemars(extend("maximum" = 100))]
    pub cores_percent: u32,
    /// How the SM share is enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_mode: Option<ComputeMode>,
}

/// Live use of one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceUsage {
    /// The GPU.
    pub device: GpuUuid,
    /// Memory in use (NVML), MiB.
    #[serde(rename = "memoryUsedMiB")]
    pub memory_used_mib: u64,
    /// SM utilisation, percent.
    #[schemars(extend("maximum" = 100))]
    pub sm_util_percent: u32,
    /// Processes using the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
}
