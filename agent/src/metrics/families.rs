//! Every series the agent exports: names, help, labels (one place).
//! The README's "Metrics" table lists the same.
//!
//! Two kinds:
//! - [`Families`]: the agent's own series (period histogram, health
//!   gauges), a handful of unlabelled metrics kept in a `prometheus`
//!   registry and advanced every period;
//! - [`ViewFamily`]: the per-GPU and per-container series. No child of
//!   them is kept between scrapes: each is built from the latest view
//!   when `/metrics` is read ([`super::scrape`]), so the agent holds no
//!   per-(container, GPU) metric objects and a gone container cannot
//!   linger.

use prometheus::core::Desc;
use prometheus::proto::MetricType;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};

use super::MetricsError;
use super::labels;

/// Label names of a per-GPU series of the node.
pub const GPU: [&str; 2] = ["gpu", "index"];
/// Label names of a per-(container, GPU) series: [`labels::CONTAINER`]
/// then `gpu`.
pub const CG: [&str; 6] = ["namespace", "pod", "container", "id", "claim", "gpu"];
/// [`CG`] then `source`.
pub const CG_SOURCE: [&str; 7] = [
    "namespace",
    "pod",
    "container",
    "id",
    "claim",
    "gpu",
    "source",
];
/// [`labels::CONTAINER`] then `reason` and `action`.
pub const C_REASON_ACTION: [&str; 7] = [
    "namespace",
    "pod",
    "container",
    "id",
    "claim",
    "reason",
    "action",
];

/// A family built from the latest view at each scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewFamily {
    /// `tessera_gpu_memory_used_bytes`.
    GpuMemoryUsed,
    /// `tessera_gpu_memory_total_bytes`.
    GpuMemoryTotal,
    /// `tessera_gpu_sm_utilization_ratio`.
    GpuSmUtilization,
    /// `tessera_gpu_up`.
    GpuUp,
    /// `tessera_container_memory_used_bytes`.
    MemoryUsed,
    /// `tessera_container_memory_limit_bytes`.
    MemoryLimit,
    /// `tessera_container_sm_utilization_ratio`.
    SmUtilization,
    /// `tessera_container_sm_target_ratio`.
    SmTarget,
    /// `tessera_container_sm_cap_ratio`.
    SmCap,
    /// `tessera_container_sm_control_error_ratio`.
    ControlError,
    /// `tessera_container_launch_rate_limit_warps_per_second`.
    LaunchRateLimit,
    /// `tessera_container_launches_total`.
    Launches,
    /// `tessera_container_warps_total`.
    Warps,
    /// `tessera_container_throttled_seconds_total`.
    Throttled,
    /// `tessera_container_ioctls_total`.
    Ioctls,
    /// `tessera_container_device_opens_total`.
    Opens,
    /// `tessera_container_bypass_events_total`.
    Bypass,
    /// `tessera_container_enforcement_actions_total`.
    Enforcement,
    /// `tessera_container_problems`.
    Problems,
}

impl ViewFamily {
    /// Every one, in the order `/metrics` writes them: by name, as a
    /// registry gathers (after the agent's own `tessera_agent_*`).
    pub const ALL: [ViewFamily; 19] = [
        ViewFamily::Bypass,
        ViewFamily::Opens,
        ViewFamily::Enforcement,
        ViewFamily::Ioctls,
        ViewFamily::LaunchRateLimit,
        ViewFamily::Launches,
        ViewFamily::MemoryLimit,
        ViewFamily::MemoryUsed,
        ViewFamily::Problems,
        ViewFamily::SmCap,
        ViewFamily::ControlError,
        ViewFamily::SmTarget,
        ViewFamily::SmUtilization,
        ViewFamily::Throttled,
        ViewFamily::Warps,
        ViewFamily::GpuMemoryTotal,
        ViewFamily::GpuMemoryUsed,
        ViewFamily::GpuSmUtilization,
        ViewFamily::GpuUp,
    ];

    /// Its name, help, type and label names (in the order the values are
    /// given).
    pub fn def(
        self,
    ) -> (
        &'static str,
        &'static str,
        MetricType,
        &'static [&'static str],
    ) {
        match self {
            Self::GpuMemoryUsed => (
                "tessera_gpu_memory_used_bytes",
                "Memory allocated on the GPU by all processes (NVML).",
                MetricType::GAUGE,
                &GPU,
            ),
            Self::GpuMemoryTotal => (
                "tessera_gpu_memory_total_bytes",
                "The GPU's framebuffer size (NVML).",
                MetricType::GAUGE,
                &GPU,
            ),
            Self::GpuSmUtilization => (
                "tessera_gpu_sm_utilization_ratio",
                "Fraction of the last period in which a kernel ran on the GPU (NVML process samples, 0-1).",
                MetricType::GAUGE,
                &GPU,
            ),
            Self::GpuUp => (
                "tessera_gpu_up",
                "1 when NVML answered for the GPU this period.",
                MetricType::GAUGE,
                &GPU,
            ),
            Self::MemoryUsed => (
                "tessera_container_memory_used_bytes",
                "GPU memory of the container by source: nvml (its processes as NVML reports them), preload (the interposer's accounting), ebpf (the observer's estimate from allocation ioctls).",
                MetricType::GAUGE,
                &CG_SOURCE,
            ),
            Self::MemoryLimit => (
                "tessera_container_memory_limit_bytes",
                "The container's memory limit on the GPU (absent: unlimited).",
                MetricType::GAUGE,
                &CG,
            ),
            Self::SmUtilization => (
                "tessera_container_sm_utilization_ratio",
                "Fraction of the GPU's time the container's kernels ran over the last period (NVML process samples, 0-1).",
                MetricType::GAUGE,
                &CG,
            ),
            Self::SmTarget => (
                "tessera_container_sm_target_ratio",
                "The container's SM target from its metadata (0-1).",
                MetricType::GAUGE,
                &CG,
            ),
            Self::SmCap => (
                "tessera_container_sm_cap_ratio",
                "The SM share the launch rate aims at: the target of a hard container, the allocation of an elastic one (0-1).",
                MetricType::GAUGE,
                &CG,
            ),
            Self::ControlError => (
                "tessera_container_sm_control_error_ratio",
                "Measured SM share minus the cap (0-1 scale; 0.01 is one percentage point).",
                MetricType::GAUGE,
                &CG,
            ),
            Self::LaunchRateLimit => (
                "tessera_container_launch_rate_limit_warps_per_second",
                "The launch rate written to the control region (absent: unlimited).",
                MetricType::GAUGE,
                &CG,
            ),
            Self::Launches => (
                "tessera_container_launches_total",
                "Kernel launches admitted by the interposer.",
                MetricType::COUNTER,
                &CG,
            ),
            Self::Warps => (
                "tessera_container_warps_total",
                "Warps admitted by the interposer's launch bucket.",
                MetricType::COUNTER,
                &CG,
            ),
            Self::Throttled => (
                "tessera_container_throttled_seconds_total",
                "Time the container's launches waited for the launch bucket.",
                MetricType::COUNTER,
                &CG,
            ),
            Self::Ioctls => (
                "tessera_container_ioctls_total",
                "NVIDIA ioctls issued by the container's processes (eBPF observer).",
                MetricType::COUNTER,
                &labels::CONTAINER,
            ),
            Self::Opens => (
                "tessera_container_device_opens_total",
                "Opens of GPU device nodes by the container's processes (eBPF observer).",
                MetricType::COUNTER,
                &labels::CONTAINER,
            ),
            Self::Bypass => (
                "tessera_container_bypass_events_total",
                "Processes of the container seen using the GPU without the interposer (eBPF observer).",
                MetricType::COUNTER,
                &labels::CONTAINER,
            ),
            Self::Enforcement => (
                "tessera_container_enforcement_actions_total",
                "Actions the watchdog took on the container, by reason and action.",
                MetricType::COUNTER,
                &C_REASON_ACTION,
            ),
            Self::Problems => (
                "tessera_container_problems",
                "Problems with the container in the last period (usage region unreadable, cgroup missing, control not written ...).",
                MetricType::GAUGE,
                &labels::CONTAINER,
            ),
        }
    }

    /// Its descriptor (validates the name and the label names).
    pub fn desc(self) -> Result<Desc, MetricsError> {
        let (name, help, _, labels) = self.def();
        Desc::new(
            name.to_owned(),
            help.to_owned(),
            labels.iter().map(|l| (*l).to_owned()).collect(),
            std::collections::HashMap::new(),
        )
        .map_err(|source| MetricsError::Define { name, source })
    }
}

/// The agent's own series, kept in the registry.
pub struct Families {
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
    /// Defines the agent's own families in `registry`.
    pub fn new(r: &Registry) -> Result<Self, MetricsError> {
        macro_rules! one {
            ($kind:ident, $name:literal, $help:literal) => {
                register(r, $name, $kind::new($name, $help))?
            };
        }
        Ok(Self {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_view_family_is_valid_and_container_series_lead_with_the_container_labels() {
        let mut names = std::collections::HashSet::new();
        let order: Vec<&str> = ViewFamily::ALL.iter().map(|f| f.def().0).collect();
        assert!(order.is_sorted(), "{order:?}");
        assert!(order.iter().all(|n| *n > "tessera_agent_~"), "{order:?}");
        for f in ViewFamily::ALL {
            let (name, _, kind, labels) = f.def();
            f.desc().unwrap();
            assert!(names.insert(name), "{name} twice");
            assert_eq!(
                kind == MetricType::COUNTER,
                name.ends_with("_total"),
                "{name}"
            );
            if name.starts_with("tessera_container_") {
                assert_eq!(&labels[..5], labels::CONTAINER.as_slice(), "{name}");
            }
        }
    }
}
