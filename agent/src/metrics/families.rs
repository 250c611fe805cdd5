//! Every series the agent exports: names, help, labels (one place).
//! The README's "Metrics" table lists the same.

use prometheus::{
    CounterVec, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use super::MetricsError;
use super::labels::names;

/// Label names of a per-GPU series of the node.
pub const GPU: [&str; 2] = ["gpu", "index"];

/// The metric families.
pub struct Families {
    pub gpu_memory_used: IntGaugeVec,
    pub gpu_memory_total: IntGaugeVec,
    pub gpu_sm_utilization: GaugeVec,
    pub gpu_up: IntGaugeVec,

    pub memory_used: IntGaugeVec,
    pub memory_limit: IntGaugeVec,
    pub sm_utilization: GaugeVec,
    pub sm_target: GaugeVec,
    pub sm_cap: GaugeVec,
    pub control_error: GaugeVec,
    pub launch_rate_limit: IntGaugeVec,
    pub launches: IntCounterVec,
    pub warps: IntCounterVec,
    pub throttled: CounterVec,

    pub ioctls: IntCounterVec,
    pub opens: IntCounterVec,
    pub bypass: IntCounterVec,
    pub enforcement: IntCounterVec,
    pub problems: IntGaugeVec,

    pub period_duration: Histogram,
    pub periods: IntCounter,
    pub containers: IntGauge,
    pub skipped: IntGauge,
    pub nvml_up: IntGauge,
    pub ebpf_up: IntGauge,
    pub policy_loads: IntCounter,
    pub policy_error: IntGauge,
}

fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    name: &'static str,
    c: Result<C, prometheus::Error>,
) -> Result<C, MetricsError> {
    let c = c.map_err(|source| MetricsError::Define { name, source })?;
    registry
        .register(Box::new(c.clone()))
        .map_err(|source| MetricsError::Define { name, source })?;
    Ok(c)
}

impl Families {
    /// Defines every family in `registry`.
    pub fn new(r: &Registry) -> Result<Self, MetricsError> {
        let cg = names(&["gpu"]);
        let c = names(&[]);
        macro_rules! family {
            ($kind:ident, $name:literal, $help:literal, $labels:expr) => {
                register(r, $name, $kind::new(Opts::new($name, $help), &$labels))?
            };
        }
        macro_rules! one {
            ($kind:ident, $name:literal, $help:literal) => {
                register(r, $name, $kind::new($name, $help))?
            };
        }
        Ok(Self {
            gpu_memory_used: family!(
                IntGaugeVec,
                "tessera_gpu_memory_used_bytes",
                "Memory allocated on the GPU by all processes (NVML).",
                GPU
            ),
            gpu_memory_total: family!(
                IntGaugeVec,
                "tessera_gpu_memory_total_bytes",
                "The GPU's framebuffer size (NVML).",
                GPU
            ),
            gpu_sm_utilization: family!(
                GaugeVec,
                "tessera_gpu_sm_utilization_ratio",
                "Fraction of the last period in which a kernel ran on the GPU (NVML process samples, 0-1).",
                GPU
            ),
            gpu_up: family!(
                IntGaugeVec,
                "tessera_gpu_up",
                "1 when NVML answered for the GPU this period.",
                GPU
            ),

            memory_used: family!(
                IntGaugeVec,
                "tessera_container_memory_used_bytes",
                "GPU memory of the container by source: nvml (its processes as NVML reports them), preload (the interposer's accounting), ebpf (the observer's estimate from allocation ioctls).",
                names(&["gpu", "source"])
            ),
            memory_limit: family!(
                IntGaugeVec,
                "tessera_container_memory_limit_bytes",
                "The container's memory limit on the GPU (absent: unlimited).",
                cg
            ),
            sm_utilization: family!(
                GaugeVec,
                "tessera_container_sm_utilization_ratio",
                "Fraction of the GPU's time the container's kernels ran over the last period (NVML process samples, 0-1).",
                cg
            ),
            sm_target: family!(
                GaugeVec,
                "tessera_container_sm_target_ratio",
                "The container's SM target from its metadata (0-1).",
                cg
            ),
            sm_cap: family!(
                GaugeVec,
                "tessera_container_sm_cap_ratio",
                "The SM share the launch rate aims at: the target of a hard container, the allocation of an elastic one (0-1).",
                cg
            ),
            control_error: family!(
                GaugeVec,
                "tessera_container_sm_control_error_ratio",
                "Measured SM share minus the cap (0-1 scale; 0.01 is one percentage point).",
                cg
            ),
            launch_rate_limit: family!(
                IntGaugeVec,
                "tessera_container_launch_rate_limit_warps_per_second",
                "The launch rate written to the control region (absent: unlimited).",
                cg
            ),
            launches: family!(
                IntCounterVec,
                "tessera_container_launches_total",
                "Kernel launches admitted by the interposer.",
                cg
            ),
            warps: family!(
                IntCounterVec,
                "tessera_container_warps_total",
                "Warps admitted by the interposer's launch bucket.",
                cg
            ),
            throttled: family!(
                CounterVec,
                "tessera_container_throttled_seconds_total",
                "Time the container's launches waited for the launch bucket.",
                cg
            ),

            ioctls: family!(
                IntCounterVec,
                "tessera_container_ioctls_total",
                "NVIDIA ioctls issued by the container's processes (eBPF observer).",
                c
            ),
            opens: family!(
                IntCounterVec,
                "tessera_container_device_opens_total",
                "Opens of GPU device nodes by the container's processes (eBPF observer).",
                c
            ),
            bypass: family!(
                IntCounterVec,
                "tessera_container_bypass_events_total",
                "Processes of the container seen using the GPU without the interposer (eBPF observer).",
                c
            ),
            enforcement: family!(
                IntCounterVec,
                "tessera_container_enforcement_actions_total",
                "Actions the watchdog took on the container, by reason and action.",
                names(&["reason", "action"])
            ),
            problems: family!(
                IntGaugeVec,
                "tessera_container_problems",
                "Problems with the container in the last period (usage region unreadable, cgroup missing, control not written ...).",
                c
            ),

            period_duration: register(
                r,
                "tessera_agent_period_duration_seconds",
                Histogram::with_opts(
                    HistogramOpts::new(
                        "tessera_agent_period_duration_seconds",
                        "How long a control period took.",
                    )
                    .buckets(vec![
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    ]),
                ),
            )?,
            periods: one!(
                IntCounter,
                "tessera_agent_periods_total",
                "Control periods completed."
            ),
            containers: one!(
                IntGauge,
                "tessera_agent_containers",
                "Containers managed in the last period."
            ),
            skipped: one!(
                IntGauge,
                "tessera_agent_skipped_entries",
                "Entries of the container root that are not usable containers."
            ),
            nvml_up: one!(
                IntGauge,
                "tessera_agent_nvml_up",
                "1 while NVML is initialised."
            ),
            ebpf_up: one!(
                IntGauge,
                "tessera_agent_ebpf_up",
                "1 while the eBPF observer runs."
            ),
            policy_loads: one!(
                IntCounter,
                "tessera_agent_policy_loads_total",
                "Policies loaded."
            ),
            policy_error: one!(
                IntGauge,
                "tessera_agent_policy_reload_error",
                "1 while the newest policy file is refused (the previous policy stays in force)."
            ),
        })
    }
}
