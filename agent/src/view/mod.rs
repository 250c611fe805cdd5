//! What one control period saw and did: served as JSON at `/containers`,
//! rendered as Prometheus series, shown by the demo. The daemon's loop
//! builds it; readers never see a half-built one. It sits one
//! level above the daemon's modules, so that metrics, telemetry, the
//! watchdog and the HTTP endpoint read it without depending on the loop
//! that writes it.
//!
//! Counters here (`warps`, `ioctls`, enforcement counts …) are cumulative
//! since the agent started (or since the usage region was created, for the
//! region's own counters), so a reader can turn them into rates.

use std::path::PathBuf;

use serde::Serialize;

use crate::containers::Metadata;
use crate::containers::pids::ProcessView;
use crate::control::LoopState;
use crate::policy::{Action, Effective};

pub use crate::policy::reload::PolicyView;

pub mod status;

pub use status::Status;

/// The measured use of one (container, GPU) in one period.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuView {
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Memory limit written to the control region (bytes; null: unlimited).
    pub memory_limit_bytes: Option<u64>,
    /// Launch rate in the control region (warps/s; null: unlimited).
    pub launch_rate: Option<u64>,
    /// Least warps a kernel is charged on this GPU (0: its warps).
    pub launch_floor: u64,
    /// Bytes the preload accounts for (usage region).
    pub preload_used_bytes: u64,
    /// Bytes NVML reports for the container's processes.
    pub nvml_used_bytes: Option<u64>,
    /// SM use from NVML per-process samples over the last period
    /// (percent of the GPU, summed over the container's host pids).
    pub sm_percent: Option<f64>,
    /// The SM percent the launch rate aims at (the target for hard
    /// containers, the allocation for elastic ones).
    pub cap_percent: Option<f64>,
    /// Measured minus cap (percentage points).
    pub error_pp: Option<f64>,
    /// What the controller's loop is doing.
    pub loop_state: Option<LoopState>,
    /// Warps admitted by the launch bucket (cumulative).
    pub warps: u64,
    /// Launches admitted (cumulative).
    pub launches: u64,
    /// Time spent throttled (ns, cumulative).
    pub throttled_ns: u64,
    /// Bytes the eBPF observer estimates from the container's allocation
    /// ioctls on this GPU (null: no observer).
    pub ebpf_used_bytes: Option<u64>,
}

/// One container in the view.
#[derive(Debug, Clone, Serialize)]
pub struct ContainerView {
    /// Id.
    pub id: String,
    /// Region directory.
    pub dir: PathBuf,
    /// Its metadata.
    pub meta: std::sync::Arc<Metadata>,
    /// Control region epoch after this period.
    pub epoch: u64,
    /// The period (of this agent) in which it took the container over: 0
    /// for containers that existed when it started.
    pub since_period: Option<u64>,
    /// Per GPU.
    pub gpus: Vec<GpuView>,
    /// Its processes (cgroup members and usage slots, joined).
    pub processes: Vec<ProcessView>,
    /// Problems of this period (usage region unreadable, cgroup missing,
    /// control not written …).
    pub problems: Vec<String>,
    /// What the policy decided for it.
    pub policy: Effective,
    /// What the eBPF observer saw (null: no observer).
    pub ebpf: Option<EbpfView>,
    /// What the watchdog did.
    pub enforcement: EnforcementView,
}

/// The view of one period (served at `/containers`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct View {
    /// Periods completed before this one.
    pub period: u64,
    /// The root.
    pub root: PathBuf,
    /// Managed containers.
    /// (Shared with the agent's memory of each container: a period that
    /// skips a quiet container shows the same view again, uncopied.)
    pub containers: Vec<std::sync::Arc<ContainerView>>,
    /// Entries of the root that are not usable containers.
    pub skipped: Vec<SkippedView>,
    /// NVML state.
    pub nvml: String,
    /// How long the period took (µs).
    pub duration_us: u64,
    /// The node's GPUs as NVML sees them this period (empty without NVML).
    pub devices: Vec<DeviceView>,
    /// The eBPF observer's state (`running (<mode>)`, or why not).
    pub ebpf: String,
    /// The policy in force.
    pub policy: PolicyView,
}

/// One GPU of the node in one period.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceView {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Memory allocated by all processes (bytes; null: NVML did not answer).
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer size (bytes; null: NVML did not answer).
    pub memory_total_bytes: Option<u64>,
    /// Percent of the GPU's time a kernel ran over the last period, summed
    /// over NVML's per-process samples (null: no samples).
    pub sm_percent: Option<f64>,
    /// Whether NVML answered for it this period.
    pub healthy: bool,
}

/// A skipped entry in the view.
#[derive(Debug, Clone, Serialize)]
pub struct SkippedView {
    /// Entry name.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// What the eBPF observer saw of one container (cumulative since the agent
/// started watching its cgroup).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EbpfView {
    /// NVIDIA ioctls issued by its processes.
    pub ioctls: u64,
    /// Opens of GPU device nodes.
    pub opens: u64,
    /// Processes reported as using the GPU without the interposer.
    pub bypass_events: u64,
}

/// Why the watchdog acted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Real memory (NVML) above the container's limit.
    MemoryOverage,
    /// A process used the GPU without the interposer.
    Bypass,
    /// The usage region contradicts NVML or its own invariants (bitmap
    /// cleared, byte counters rewritten, launch bucket reset); the
    /// watchdog gives it the policy's bypass action.
    Tampering,
    /// A share of a GPU (NVML) above the compute cap, by more than the
    /// margin over the window (`watchdog::compute`).
    ComputeOverage,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 4] = [
        Reason::MemoryOverage,
        Reason::Bypass,
        Reason::Tampering,
        Reason::ComputeOverage,
    ];

    /// The name used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MemoryOverage => "memory_overage",
            Reason::Bypass => "bypass",
            Reason::Tampering => "tampering",
            Reason::ComputeOverage => "compute_overage",
        }
    }
}

/// How often the watchdog took one action for one reason (cumulative).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionCount {
    /// Why.
    pub reason: Reason,
    /// What.
    pub action: Action,
    /// How often.
    pub count: u64,
}

/// What the watchdog has done to a container.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EnforcementView {
    /// `running`, `denied` (GPU opens refused), `throttled` (frozen in the
    /// periods it owes GPU time), `frozen` or `killed`.
    pub state: String,
    /// Actions taken, per reason and action.
    pub actions: Vec<ActionCount>,
    /// The latest event, one line (of a period with several, the harshest
    /// action's; none yet: null).
    pub last_event: Option<String>,
}
