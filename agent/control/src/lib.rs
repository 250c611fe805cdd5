//! Compute control: SM targets held by one feedback loop per (container,
//! GPU).
//!
//! A container's SM target is a percent of one GPU's time, as NVML reports
//! utilisation. The only lever is the launch rate (warps/s) and burst the
//! agent writes into the container's control region; `libtessera.so` then
//! delays launches with its token bucket. Every [`PERIOD`] the caller
//! (the daemon) measures, per container on a GPU:
//!
//! - SM use: NVML per-process samples since the previous tick, summed over
//!   the container's pids ([`sampling`]);
//! - launched warps and time spent waiting for tokens: the usage region's
//!   cumulative bucket counters, passed as read (untrusted; the controller
//!   takes the deltas, and clamps what no honest bucket can produce),
//!
//! and calls [`GpuController::tick`], which returns a [`RateDecision`] per
//! container for the caller to write with the region writer.
//!
//! **The loop** ([`feedback`]) is model based. It estimates the container's
//! GPU cost per warp (SM percent per warp/s) from its (SM %, warps/s)
//! observations, as a ratio of exponentially forgotten sums, and sets
//! `rate = (cap + I) / cost`, where `I` is a slow integral of the residual
//! error. Since the cost is re-estimated from the rate the container
//! actually runs at, the fixed point is exact whenever the bucket binds;
//! the integral only removes what the estimate gets systematically wrong.
//! No windup: the integral moves only while the bucket binds (the
//! container launches as much as it is allowed), never upwards while the
//! device is saturated, only on small errors (large ones are transients
//! the model handles), and stays within ±¼ of the cap (and at most 5 pp
//! above 100); the cost estimate
//! is a physical quantity that idling or memory-bound phases do not move.
//! Windows of a saturated device in which the warps look cheap (they
//! queued) are learnt as one with the busy windows after them (when the
//! queue runs and looks dear), so a neighbour's bursts move the estimate
//! neither way.
//! So the rate never exceeds 1.25 × what the cap needs at the estimated
//! cost, however long a workload idles. On a saturated device the rate
//! does not rise at all unless the cap it aims at rose (the split moved
//! share to it from a neighbour, whose cap fell in the same tick). A
//! container with no estimate yet starts at [`ControllerConfig::initial_rate`] and, while its bucket binds
//! below a quarter of its cap, quadruples the rate each period (probing
//! from below, never above the cap).
//!
//! **Modes** ([`allocator`]): a `hard` container is capped at its target
//! always, also alone on its GPU. An `elastic` container may use SMs that
//! no one else claims and is capped only under contention: each period the
//! GPU's capacity is split first into guarantees (each container's
//! `min(target, claim)`), then the rest among elastic containers that want
//! more, higher priority first, then in proportion to targets. A
//! container's claim is its measured use plus a small headroom, or
//! everything while its bucket binds (it wants more than it gets).
//!
//! **Live changes** ([`GpuController::upsert`]) take effect at the next
//! tick: the next decision already aims at the new target.
//!
//! The caller owns timing and I/O; this module does no I/O except the NVML
//! helper in [`sampling`], so the same code runs on real NVML, on the
//! simulator and against the plant model of the unit tests.
//!
//! **Use from the daemon** (one [`GpuController`] per GPU; what
//! `agent/tests/control_support` does on the simulator):
//!
//! ```text
//! at start, per container and GPU:  ctl.resume(id, control, pacing in its control region)
//! on a new container / changed meta: ctl.upsert(id, control)   // applies at the next tick
//! on a removed container:            ctl.remove(id)
//! every PERIOD, per GPU:
//!   s = sampling::read_sm_samples(&device, since)?; since = s.newest_us;
//!   per container: usage = tessera_region::reader::read_usage(bytes)?  (skip on error)
//!     ContainerSample::from_usage(id, Some(s.sum_over(container's host pids)), &usage, g)
//!   for d in ctl.tick(Instant::now(), &GpuSample { busy_percent: Some(s.total()), containers }):
//!     write d.pacing into GPU g of d.id's control region
//!     (the region skips a write that changes nothing); export d.error_pp() etc.
//! ```

#![forbid(unsafe_code)]

pub mod allocator;
pub mod feedback;
mod gpu;
pub mod sampling;

#[cfg(test)]
mod plant;
#[cfg(test)]
mod tests;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use gpu::GpuController;

/// How often the daemon should tick each [`GpuController`] (the loop is
/// tuned for it; other periods from 20 ms to 1 s work, with settling time
/// scaling along).
pub const PERIOD: Duration = Duration::from_millis(100);

/// The GPU's capacity in SM percent.
pub const CAPACITY_PERCENT: f64 = 100.0;

/// The caller's name for a container (e.g. its region directory name).
pub type ContainerId = String;

/// How a container's target binds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Capped at the target always, also alone on the GPU.
    #[default]
    Hard,
    /// Uses idle SMs; capped only under contention, by priority, then in
    /// proportion to targets; never below `min(target, demand)` while the
    /// targets on the GPU fit in it.
    Elastic,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Hard => "hard",
            Mode::Elastic => "elastic",
        })
    }
}

impl std::str::FromStr for Mode {
    type Err = ControlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hard" => Ok(Mode::Hard),
            "elastic" => Ok(Mode::Elastic),
            other => Err(ControlError::Mode {
                value: other.to_string(),
            }),
        }
    }
}

/// What the operator asked for one container on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerControl {
    /// SM target, percent of the GPU's time (0 < target ≤ 100).
    pub target_percent: f64,
    /// Hard or elastic.
    pub mode: Mode,
    /// Higher is served first under contention (like Kubernetes
    /// PriorityClass values; map HAMi's `nvidia.com/priority`, where 0 is
    /// high, before passing it).
    pub priority: i32,
}

impl ContainerControl {
    /// Checks the target's range.
    pub fn validate(&self) -> Result<(), ControlError> {
        let t = self.target_percent;
        if !t.is_finite() || t <= 0.0 || t > CAPACITY_PERCENT {
            return Err(ControlError::Target { value: t });
        }
        Ok(())
    }
}

/// One container's measurements at a tick.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSample {
    /// Which container.
    pub id: ContainerId,
    /// SM use over the window since the previous tick: NVML per-process
    /// samples summed over the container's pids
    /// ([`sampling::SmSamples::sum_over`]); `None` when NVML gave nothing
    /// usable (the loop then holds its rate).
    pub sm_percent: Option<f64>,
    /// The usage region's cumulative warp counter for this GPU
    /// (`BucketView::warps`), as read.
    pub warps: u64,
    /// The usage region's cumulative throttle time for this GPU
    /// (`BucketView::throttled_ns`), as read.
    pub throttled_ns: u64,
}

impl ContainerSample {
    /// The sample of container `id` on the GPU at index `gpu` of its
    /// control region, from its validated usage region and its SM use
    /// (an index past the region's GPUs reads as no launches).
    pub fn from_usage(
        id: &str,
        sm_percent: Option<f64>,
        usage: &tessera_region::reader::UsageSnapshot,
        gpu: usize,
    ) -> Self {
        let b = usage.buckets.get(gpu).copied().unwrap_or_default();
        Self {
            id: id.to_string(),
            sm_percent,
            warps: b.warps,
            throttled_ns: b.throttled_ns,
        }
    }
}

/// One GPU's measurements at a tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// Device busy over the same window, percent: the sum of all
    /// processes' samples ([`sampling::SmSamples::total`]), or `None` (the
    /// controller then uses the sum over its containers).
    pub busy_percent: Option<f64>,
    /// The containers measured; a managed container without a sample keeps
    /// what its loop learnt (its rate follows its cap only).
    pub containers: Vec<ContainerSample>,
}

/// What a loop is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoopState {
    /// No cost estimate yet: raising the rate from below.
    Probing,
    /// Holding the cap.
    Tracking,
    /// The container launched nothing in the last window.
    Idle,
}

/// The launch limits to write for one container, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RateDecision {
    /// Which container.
    pub id: ContainerId,
    /// The launch limits to write: a rate never 0 and never unlimited, its
    /// burst, and the GPU's floor.
    pub pacing: Pacing,
    /// The SM percent the rate aims at: the target for hard containers,
    /// the allocation for elastic ones.
    pub cap_percent: f64,
    /// SM use measured in the last window.
    pub measured_percent: Option<f64>,
    /// Estimated SM percent per warp/s, once known.
    pub cost: Option<f64>,
    /// Whether the container wanted more than it was allowed.
    pub hungry: bool,
    /// What the loop is doing.
    pub state: LoopState,
}

impl RateDecision {
    /// Measured minus cap, in percentage points (the controller error, for
    /// metrics); `None` without a measurement.
    pub fn error_pp(&self) -> Option<f64> {
        self.measured_percent.map(|m| m - self.cap_percent)
    }
}

/// The launch limits of one GPU of a container's control region: what the
/// controller decides, or what the region holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Pacing {
    /// Refill rate (warps/s).
    pub rate: u64,
    /// Burst (warps).
    pub burst: u64,
    /// Least warps a kernel is charged (the GPU's launch floor).
    pub floor: u64,
}

impl Pacing {
    /// No launch limit: what a region without one holds, and what a
    /// container without an open control region resumes from (then the
    /// controller's own start; see [`GpuController::resume`]).
    pub const UNLIMITED: Self = Self {
        rate: tessera_region::layout::UNLIMITED,
        burst: 0,
        floor: 0,
    };
}

impl From<&tessera_region::GpuLimits> for Pacing {
    fn from(g: &tessera_region::GpuLimits) -> Self {
        Self {
            rate: g.launch_rate,
            burst: g.launch_burst,
            floor: g.launch_floor,
        }
    }
}

/// Tuning of the loops and the allocator (the defaults are what the
/// benchmark measured; see the README's "Compute control").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ControllerConfig {
    /// Rate of a container with no cost estimate, in launches of the
    /// smallest charge per second (`initial_rate × max(launch_floor, 1)`
    /// warps/s): low enough that even kernels of milliseconds stay under
    /// a small cap (probing then grows it by `probe_growth` per period,
    /// so cheap kernels reach their cap in about a second).
    pub initial_rate: f64,
    /// Factor per period by which a probing container's rate grows.
    pub probe_growth: f64,
    /// Weight of the past in the cost estimate, per period (0..1).
    pub forget: f64,
    /// Integral gain (pp of cap per pp of error, per period).
    pub ki: f64,
    /// Most the rate may grow in one period (factor).
    pub max_growth: f64,
    /// Burst, as seconds of the rate.
    pub burst_s: f64,
    /// Headroom added to a satisfied container's use for its claim (pp).
    pub headroom_pp: f64,
    /// Device busy at or above which the GPU counts as saturated (pp).
    pub saturated_percent: f64,
    /// Periods a container stays hungry after its bucket last bound.
    pub hungry_hold: u32,
    /// The GPU's launch floor (`tessera_gpu::GpuDevice::launch_floor`),
    /// written with every rate: rates and warp counters are in charged
    /// warps, each kernel at least this many.
    pub launch_floor: u64,
}

impl ControllerConfig {
    /// The launch rate and burst a container's control region starts with
    /// before the agent's first period decides one: what the loop itself
    /// starts from ([`Self::initial_rate`]), so that nothing started right
    /// after a container is created runs unlimited until then.
    pub fn initial_limits(&self) -> Pacing {
        let rate = self.start_rate();
        Pacing {
            rate: rate as u64,
            burst: self.burst_for(rate) as u64,
            floor: self.launch_floor,
        }
    }

    /// The burst (warps) written with `rate`: `burst_s` of it, and at
    /// least the smallest charge of one launch (the launch floor, or one
    /// warp), so that the bucket's tolerance never falls below one launch
    /// of the smallest kind, whatever unit the rate is in.
    pub fn burst_for(&self, rate: f64) -> f64 {
        (rate * self.burst_s)
            .ceil()
            .max(self.launch_floor.max(1) as f64)
    }

    /// The rate (warps/s) a loop with no estimate starts from.
    pub fn start_rate(&self) -> f64 {
        (self.initial_rate * self.launch_floor.max(1) as f64).max(1.0)
    }

    /// This tuning on a GPU whose launch floor is `floor`.
    pub fn with_launch_floor(self, floor: u64) -> Self {
        Self {
            launch_floor: floor,
            ..self
        }
    }
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            initial_rate: 20.0,
            probe_growth: 4.0,
            forget: 0.6,
            ki: 0.3,
            max_growth: 4.0,
            burst_s: 0.005,
            headroom_pp: 1.0,
            saturated_percent: 99.0,
            hungry_hold: 5,
            launch_floor: 0,
        }
    }
}

/// Why a control request was refused.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A target outside (0, 100].
    #[error("SM target {value} is out of range; accepted: more than 0 up to 100 percent")]
    Target {
        /// The value given.
        value: f64,
    },
    /// An unknown mode name.
    #[error("compute mode {value:?} is unknown; accepted: hard, elastic")]
    Mode {
        /// The value given.
        value: String,
    },
    /// NVML failed while sampling a GPU.
    #[error("cannot read process utilisation samples from NVML")]
    Nvml {
        /// Cause.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
}
