//! The Tessera node agent: one per GPU node.
//!
//! Its modules, bottom to top; each imports only those above it in this
//! list (`tests/layering.rs` holds the code to it):
//!
//! - leaves, crates of their own under `agent/`: [`gpu`] (the GPUs and
//!   their live state through NVML, behind a trait), [`control`] (the
//!   compute controller: SM targets held by one feedback loop per
//!   container and GPU, hard and elastic), [`cgroup`] (cgroup id → pod
//!   and container); and [`error_chain`], [`mountinfo`] (shared helpers);
//! - [`ebpf`]: the eBPF observer (per-cgroup NVIDIA ioctls and opens,
//!   bypass events, memory estimates) and the per-pod device guard, with
//!   attach-mode probing;
//! - [`containers`]: the agent's unit, a container's region directory
//!   under one root, and its metadata;
//! - [`policy`]: the node policy file (defaults and rules by namespace and
//!   pod labels), checked and hot-reloaded;
//! - [`view`]: what one control period saw and did, and the loop's status,
//!   read by everything above;
//! - [`watchdog`] (ground truth against each container's limits and usage
//!   region, and the policy's action), [`metrics`] (the Prometheus series
//!   at `/metrics`), [`telemetry`] (the node's `GpuNode` for the
//!   scheduler) and [`kubelet`] (the device plugin: registration, health,
//!   `Allocate`, PodResources and the collection of departed pods'
//!   directories);
//! - [`dra`]: the DRA driver `gpu.tessera.dev` (the node's ResourceSlice;
//!   claims prepared as the device plugin's answer, in CDI);
//! - [`config`]: the daemon's settings (file, flags, environment);
//! - [`daemon`]: `tessera-agent run`, the control loop with its HTTP
//!   endpoint;
//! - [`commands`]: the one-shot subcommands (`container`, `region`,
//!   `policy`).

#![forbid(unsafe_code)]

pub use tessera_cgroup as cgroup;
pub mod commands;
pub mod config;
pub mod containers;
pub use tessera_control as control;
pub mod daemon;
pub mod dra;
pub mod ebpf;
pub mod error_chain;
pub use tessera_gpu as gpu;
pub mod kubelet;
pub mod metrics;
pub use tessera_mountinfo as mountinfo;
pub mod policy;
pub mod telemetry;
pub mod view;
pub mod watchdog;
