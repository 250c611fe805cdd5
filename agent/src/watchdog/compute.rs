//! Compute overage: a container whose processes hold more of a GPU's time
//! than its cap, by NVML's per-process samples (the ground truth the
//! controller reads too), whatever the interposer's launch bucket says.
//!
//! A process that skips `libtessera.so` (static CUDA without the driver
//! library, a raw-ioctl stack, a private copy of the driver) or that
//! resets its bucket is not slowed by the launch rate; NVML still
//! attributes its kernels' time to its pid. So, per granted GPU, the GPU
//! time the container's host processes took is held against the cap in
//! force, each period's cap taken one period late (a measurement
//! describes the rate set the period before, so a lowered target or a
//! smaller elastic allocation is never an overage while the rate
//! catches up):
//!
//! - `hard`: the target (the controller's guarantee when targets
//!   over-commit the GPU);
//! - `elastic`: the allocation the controller split for it that period.
//!
//! Each period adds to an excess the GPU time taken above cap +
//! [`MARGIN_PP`] (negative below it), never below a credit of
//! [`CREDIT_MS`]; the finding is an excess above [`TOLERANCE_MS`], the
//! margin over [`WINDOW`]. A container held above its cap + margin is
//! found within a few periods; one that was held below its cap by a
//! neighbour's contention and catches up with the work that queued
//! meanwhile (its share above the cap for a while once the neighbour
//! stops) spends the credit it earned, and is not. The figures come from
//! the controller's measured noise on the simulator (README, "Watchdog
//! and enforcement").

use std::time::{Duration, Instant};

use tessera_region::MAX_GPUS;

use super::detect::Finding;
use crate::view::Reason;

/// The span the tolerance is the margin of.
pub const WINDOW: Duration = Duration::from_millis(500);
/// How far above its cap a container's share may be (percentage points).
pub const MARGIN_PP: f64 = 5.0;
/// GPU time above cap + margin tolerated (ms of one GPU): the margin
/// over the window.
pub const TOLERANCE_MS: f64 = MARGIN_PP / 100.0 * 500.0;
/// Most credit a container builds below cap + margin (ms of one GPU):
/// a period of the whole GPU.
pub const CREDIT_MS: f64 = 100.0;

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
    /// Per GPU index: the excess (ms), and when it was last updated.
    excess: [Option<(Instant, f64)>; MAX_GPUS],
    /// Per GPU index: the cap of the last period.
    last_cap: [Option<f64>; MAX_GPUS],
}

impl ComputeMemory {
    /// Records GPU `i`'s period at `now`; the excess (ms) and the cap the
    /// measurement was held against.
    pub fn record(&mut self, i: usize, now: Instant, c: Compute) -> Option<(f64, f64)> {
        let (excess, last) = (self.excess.get_mut(i)?, self.last_cap.get_mut(i)?);
        let lagged = last.or(c.cap);
        *last = c.cap.or(*last);
        let (measured, cap) = (c.measured?, lagged?);
        // The span the measurement covers: since the last one, at most a
        // window (a container skipped while quiet starts afresh).
        let (before, ms) = match *excess {
            Some((at, e)) if now.saturating_duration_since(at) <= WINDOW => {
                (e, now.saturating_duration_since(at).as_secs_f64() * 1000.0)
            }
            _ => (0.0, crate::control::PERIOD.as_secs_f64() * 1000.0),
        };
        let e = (before + (measured - cap - MARGIN_PP) / 100.0 * ms).max(-CREDIT_MS);
        *excess = Some((now, e));
        Some((e, cap))
    }
}

/// The compute overage on GPU `i` (`gpu`, as `GPU-…`) of a container
/// whose processes on it are `pids`, if its excess says so.
pub fn overage(
    memory: &mut ComputeMemory,
    (i, gpu): (usize, &str),
    now: Instant,
    c: Compute,
    pids: &[u32],
) -> Option<Finding> {
    let (excess, cap) = memory.record(i, now, c)?;
    if excess <= TOLERANCE_MS {
        return None;
    }
    Some(Finding {
        reason: Reason::ComputeOverage,
        gpu: Some(gpu.to_owned()),
        pids: pids.to_vec(),
        what: format!(
            "took {:.1} % of {gpu} last period (NVML) and {excess:.0} ms of GPU time more than {cap:.1} % + {MARGIN_PP} pp allow",
            c.measured.unwrap_or_default()
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
    fn an_escape_is_found_within_periods() {
        let mut m = ComputeMemory::default();
        let got = feed(&mut m, &[(75.0, 20.0); 4]);
        assert_eq!(got, [true, true, true, true]);
        // From a full credit: a few periods.
        let mut m = ComputeMemory::default();
        let mut series = vec![(0.0, 20.0); 10];
        series.extend([(75.0, 20.0); 6]);
        let got = feed(&mut m, &series);
        assert_eq!(got.iter().position(|o| *o), Some(12), "{got:?}");
    }

    #[test]
    fn noise_within_the_margin_is_no_overage() {
        let mut m = ComputeMemory::default();
        let series: Vec<(f64, f64)> = (0..500)
            .map(|k| (30.0 + if k % 2 == 0 { 7.0 } else { -2.0 }, 30.0))
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
        // A container that does not follow its allocation is found.
        let mut m = ComputeMemory::default();
        let mut late = vec![(70.0, 70.0); 5];
        late.extend([(70.0, 30.0); 4]);
        assert!(feed(&mut m, &late).iter().any(|o| *o));
    }

    #[test]
    fn catching_up_after_contention_spends_credit() {
        // Held at 60 of its 70 for a second by a neighbour, then its
        // queued work runs at 85 for half a second.
        let mut m = ComputeMemory::default();
        let mut series = vec![(60.0, 70.0); 10];
        series.extend([(85.0, 70.0); 5]);
        series.extend([(70.0, 70.0); 10]);
        assert!(feed(&mut m, &series).iter().all(|o| !o));
        // Without the credit it would be found.
        let mut m = ComputeMemory::default();
        assert!(feed(&mut m, &[(85.0, 70.0); 5]).iter().any(|o| *o));
    }

    #[test]
    fn a_gap_starts_afresh() {
        let mut m = ComputeMemory::default();
        let t0 = Instant::now();
        let c = |x: f64| Compute {
            measured: Some(x),
            cap: Some(20.0),
        };
        overage(&mut m, (0, "g"), t0, c(40.0), &[]);
        // Seconds later (a quiet container), one period is judged as one
        // period, not as the whole gap at its share.
        let later = t0 + Duration::from_secs(5);
        assert!(overage(&mut m, (0, "g"), later, c(40.0), &[]).is_none());
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
