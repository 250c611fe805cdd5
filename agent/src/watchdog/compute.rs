//! Compute overage: a container whose processes hold more of a GPU's time
//! than its cap, by NVML's per-process samples (the ground truth the
//! controller reads too), whatever the interposer's launch bucket says.
//!
//! A process that skips `libtessera.so` (static CUDA without the driver
//! library, a raw-ioctl stack, a private copy of the driver) or that
//! resets its bucket is not slowed by the launch rate; NVML still
//! attributes its kernels' time to its pid. So, per granted GPU, the
//! share the container's host processes took over the last
//! [`WINDOW`] is held against the cap in force over the same periods,
//! each period's cap taken one period late (a measurement describes the
//! rate set the period before; a lowered target or a smaller elastic
//! allocation is thus never an overage while the rate catches up):
//!
//! - `hard`: the target (the controller's guarantee when targets
//!   over-commit the GPU);
//! - `elastic`: the allocation the controller split for it that period.
//!
//! The finding needs the mean over at least [`MIN_SAMPLES`] periods to be
//! above the cap by more than [`MARGIN_PP`]. Both come from the
//! controller's measured noise on the simulator (README, "Compute
//! overage"): an honest container's 0.5 s mean stays within 2 pp of its
//! cap (the dips the 2-core host causes are under the cap, not over);
//! 5 pp leaves room for a real GPU's sampling noise while keeping what an
//! escape can take small.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tessera_region::MAX_GPUS;

use super::detect::Finding;
use crate::view::Reason;

/// The span over which a container's share is averaged.
pub const WINDOW: Duration = Duration::from_millis(500);
/// Periods (samples) the mean needs before it is judged.
pub const MIN_SAMPLES: usize = 3;
/// How far above its cap the mean may be (percentage points).
pub const MARGIN_PP: f64 = 5.0;

/// One granted GPU's compute this period.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Compute {
    /// SM percent the container's host processes took since the last
    /// period (NVML samples); none: no sample.
    pub measured: Option<f64>,
    /// The cap in force this period (target or allocation); none: no
    /// decision this period.
    pub cap: Option<f64>,
}

/// What the watchdog keeps of a container's compute between periods.
#[derive(Clone, Debug, Default)]
pub struct ComputeMemory {
    /// Per GPU index: (time, measured, cap of the period before).
    samples: [VecDeque<(Instant, f64, f64)>; MAX_GPUS],
    /// Per GPU index: the cap of the last period.
    last_cap: [Option<f64>; MAX_GPUS],
}

impl ComputeMemory {
    /// Records GPU `i`'s period at `now`; the mean (measured, cap) over
    /// the window once it has [`MIN_SAMPLES`].
    pub fn record(&mut self, i: usize, now: Instant, c: Compute) -> Option<(f64, f64)> {
        let (samples, last) = (self.samples.get_mut(i)?, self.last_cap.get_mut(i)?);
        let lagged = last.or(c.cap);
        *last = c.cap.or(*last);
        if let (Some(m), Some(cap)) = (c.measured, lagged) {
            samples.push_back((now, m, cap));
        }
        while samples
            .front()
            .is_some_and(|(t, _, _)| now.saturating_duration_since(*t) > WINDOW)
        {
            samples.pop_front();
        }
        if samples.len() < MIN_SAMPLES {
            return None;
        }
        let n = samples.len() as f64;
        let (m, c) = samples
            .iter()
            .fold((0.0, 0.0), |(m, c), (_, sm, cap)| (m + sm, c + cap));
        Some((m / n, c / n))
    }
}

/// The compute overage on GPU `i` (`gpu`, as `GPU-…`) of a container
/// whose processes on it are `pids`, if the window's mean says so.
pub fn overage(
    memory: &mut ComputeMemory,
    (i, gpu): (usize, &str),
    now: Instant,
    c: Compute,
    pids: &[u32],
) -> Option<Finding> {
    let (measured, cap) = memory.record(i, now, c)?;
    if measured <= cap + MARGIN_PP {
        return None;
    }
    Some(Finding {
        reason: Reason::ComputeOverage,
        gpu: Some(gpu.to_owned()),
        pids: pids.to_vec(),
        what: format!(
            "takes {measured:.1} % of {gpu} (NVML, mean of {} ms), may take {cap:.1} % + {MARGIN_PP} pp",
            WINDOW.as_millis()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_millis(100);

    fn feed(m: &mut ComputeMemory, series: &[(f64, f64)]) -> Vec<bool> {
        let t0 = Instant::now();
        series
            .iter()
            .enumerate()
            .map(|(k, &(measured, cap))| {
                let c = Compute {
                    measured: Some(measured),
                    cap: Some(cap),
                };
                overage(m, (0, "GPU-x"), t0 + PERIOD * k as u32, c, &[1]).is_some()
            })
            .collect()
    }

    #[test]
    fn an_escape_is_found_after_min_samples() {
        let mut m = ComputeMemory::default();
        let got = feed(&mut m, &[(75.0, 20.0); 6]);
        assert_eq!(got, [false, false, true, true, true, true]);
    }

    #[test]
    fn noise_within_the_margin_is_no_overage() {
        let mut m = ComputeMemory::default();
        let series: Vec<(f64, f64)> = (0..50)
            .map(|k| (30.0 + if k % 2 == 0 { 4.0 } else { -3.0 }, 30.0))
            .collect();
        assert!(feed(&mut m, &series).iter().all(|o| !o));
    }

    #[test]
    fn a_lowered_cap_is_judged_one_period_late() {
        // The elastic allocation falls from 70 to 30; the measurement
        // follows a period later.
        let mut m = ComputeMemory::default();
        let mut series = vec![(70.0, 70.0); 5];
        series.push((70.0, 30.0));
        series.extend([(30.0, 30.0); 5]);
        assert!(feed(&mut m, &series).iter().all(|o| !o));
        // A measurement two periods late is over its lagged cap: that
        // is the container not following its allocation.
        let mut m = ComputeMemory::default();
        let mut late = vec![(70.0, 70.0); 5];
        late.extend([(70.0, 30.0), (70.0, 30.0), (70.0, 30.0), (70.0, 30.0)]);
        assert!(feed(&mut m, &late).iter().any(|o| *o));
    }

    #[test]
    fn old_samples_leave_the_window() {
        let mut m = ComputeMemory::default();
        let t0 = Instant::now();
        let c = |x: f64| Compute {
            measured: Some(x),
            cap: Some(20.0),
        };
        for k in 0..3 {
            overage(&mut m, (0, "g"), t0 + PERIOD * k, c(90.0), &[]);
        }
        // A long gap (a quiet container): the old samples are gone, so
        // one new period is not enough to judge.
        let later = t0 + Duration::from_secs(5);
        assert!(overage(&mut m, (0, "g"), later, c(90.0), &[]).is_none());
    }

    #[test]
    fn a_gpu_index_past_the_region_is_ignored() {
        let mut m = ComputeMemory::default();
        let c = Compute {
            measured: Some(100.0),
            cap: Some(1.0),
        };
        for _ in 0..5 {
            assert!(overage(&mut m, (MAX_GPUS, "g"), Instant::now(), c, &[]).is_none());
        }
    }
}
