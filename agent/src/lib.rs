//! The Tessera node agent.
//!
//! One agent runs on every GPU node. So far it has:
//! - [`gpu`]: the GPU inventory and live use through NVML (a trait with an
//!   NVML and a fake implementation);
//! - [`ebpf`]: the eBPF observer (per-cgroup NVIDIA ioctls and opens,
//!   bypass events, GPU use, memory estimates) and the per-pod device
//!   guard, with attach-mode probing;
//! - [`control`]: the compute controller (SM targets held by one feedback
//!   loop per container and GPU, hard and elastic modes);
//! - [`cgroup`]: cgroup id → pod/container mapping for the cgroup drivers
//!   and runtimes Kubernetes nodes use;
//! - [`error_chain`]: an error and its causes on one line;
//! - [`mountinfo`]: this process's mounts (the `tessera-mountinfo` crate,
//!   which xtask shares);
//! - [`region`]: the writer of container region directories (`tessera-agent
//!   region create|set|show`);
//! - [`containers`]: the agent's unit, a container's region directory
//!   under one root, and `tessera-agent container add|set|rm|list|show`;
//! - [`config`]: the daemon's settings (file, flags, environment);
//! - [`policy`]: the node policy file (defaults and rules by namespace and
//!   pod labels), checked and hot-reloaded;
//! - [`daemon`]: `tessera-agent run`, the control loop with `/healthz` and
//!   `/readyz`;
//! - [`metrics`]: the Prometheus series served at `/metrics`.
//! - [`watchdog`]: ground truth (NVML, cgroups, eBPF) against each
//!   container's limits and usage region, and the policy's action.
//!
//! - [`telemetry`]: the node's `GpuNode` (inventory, shares, live use)
//!   written to the API server for the scheduler.
//! - [`kubelet`]: the device plugin (vGPUs registered with kubelet,
//!   health from NVML, preferred allocation); Allocate comes later.

#![forbid(unsafe_code)]

pub mod cgroup;
pub mod config;
pub mod containers;
pub mod control;
pub mod daemon;
pub mod ebpf;
pub mod error_chain;
pub mod gpu;
pub mod kubelet;
pub mod metrics;
pub use tessera_mountinfo as mountinfo;
pub mod policy;
pub mod region;
pub mod telemetry;
pub mod watchdog;
