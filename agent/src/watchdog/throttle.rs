//! The throttle: the action that holds a container over its compute cap
//! to the cap without killing it, by freezing its cgroup for the part of
//! each period it may not run.
//!
//! Per granted GPU it keeps a debt: each period adds the GPU time the
//! container's processes took (NVML's samples, the same ground truth as
//! the finding) minus what its cap allows for the period, never below a
//! credit (see [`BURST_MS`]). For the next period it may take its cap's GPU
//! time less its debt; at the share it takes while thawed (learnt from
//! the periods it ran), that is a slice of the period: it is thawed for
//! the slice and frozen again by a timer, frozen for the whole period
//! when it owes more than a period's allowance, and thawed for the whole
//! period when the slice would cover it; after a slice it stays frozen
//! for a period, so that the work the slice queued is seen before the
//! next. So it gets its share in every
//! period, as a launch bucket would give it, whatever way it launches;
//! a container back under its cap is thawed for whole periods, and the
//! throttle lets go after [`RELEASE_AFTER`] of them without debt.
//!
//! What a freeze cannot stop: work already queued on the GPU (a stream
//! holds about a thousand launches) and a kernel already running. In a
//! slice a launch loop refills its queue; the queued work runs while it
//! is frozen, shows in the samples and adds to the debt, which keeps it
//! frozen longer: held on average, in bursts of a slice plus a queue. A
//! container whose share stays above cap + margin through
//! [`ESCALATE_AFTER`] periods frozen throughout has work the throttle
//! cannot hold (a persistent kernel, seconds of queued launches), and is
//! killed.
//!
//! Short thaws inside frozen periods (to let a process caught inside a
//! user-space driver's critical section leave it) are not made: each
//! would refill the queue. The simulator's waiters wait for a frozen
//! holder instead (`gpusim::Patience`).
//!
//! The state is the kernel's (I4): the cgroup's `cgroup.freeze` and an
//! extended attribute ([`MARK`]) naming the freeze as the throttle's, so a
//! new agent thaws what a previous one left frozen mid-throttle instead
//! of taking it for the freeze action.

use std::path::Path;
use std::time::Duration;

use tessera_error_chain::PathIoError;
use tessera_region::MAX_GPUS;

use super::compute::{MARGIN_PP, WINDOW};

/// Least credit a container may build up below its cap (ms of one GPU):
/// the margin over the window. (A step allows two periods' allowance
/// where that is more, so that the period frozen after each slice is made
/// up by the next.)
pub const BURST_MS: f64 = MARGIN_PP / 100.0 * WINDOW.as_millis() as f64;
/// The shortest thaw.
pub const MIN_SLICE: Duration = Duration::from_millis(5);
/// Periods frozen throughout with the share still above cap + margin
/// before the throttle gives up and kills.
pub const ESCALATE_AFTER: u32 = 5;
/// How much of the share it took while thawed is kept per period when a
/// period reads less.
pub const TAKES_DECAY: f64 = 0.9;
/// Whole thawed periods without debt after which the throttle lets go.
pub const RELEASE_AFTER: u32 = 20;
/// The extended attribute on a cgroup the throttle froze.
pub const MARK: &str = "trusted.tessera.throttle";

/// What to do for the next period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Frozen throughout: it owes a period's allowance or more, or it had a
    /// slice the period before.
    Freeze,
    /// Thawed for the slice given (then frozen until the next period), or
    /// for the whole period.
    Thaw(Option<Duration>),
    /// Thawed for [`RELEASE_AFTER`] whole periods without debt: thawed,
    /// and the throttle ends.
    Release,
    /// Stayed above cap + margin while frozen: freezing cannot hold it.
    Escalate,
}

/// The throttle of one container.
#[derive(Clone, Debug, Default)]
pub struct Throttle {
    debt_ms: [f64; MAX_GPUS],
    /// What the last step let it run: none (frozen), a fraction of the
    /// period, or the whole period (1).
    thawed: Option<f64>,
    /// The share it takes while thawed (none yet: 100).
    takes: Option<f64>,
    frozen_over: u32,
    calm: u32,
}

impl Throttle {
    /// One period of `dt`: `gpus` are (GPU index, measured %, cap %) over
    /// `covered`, the span since the last step that had measurements
    /// (NVML's samples of a period that had none are in the next one's:
    /// charged over the period alone, a burst in that gap would be
    /// diluted and never paid back).
    pub fn step(&mut self, gpus: &[(usize, f64, f64)], covered: Duration, dt: Duration) -> Step {
        let dt = dt.clamp(Duration::from_millis(10), Duration::from_secs(1));
        let ms = dt.as_secs_f64() * 1000.0;
        let covered_ms = covered
            .clamp(Duration::from_millis(10), Duration::from_secs(1))
            .as_secs_f64()
            * 1000.0;
        let mut slice: f64 = 1.0;
        let mut over = false;
        for &(i, measured, cap) in gpus {
            let Some(d) = self.debt_ms.get_mut(i) else {
                continue;
            };
            let credit = (2.0 * cap / 100.0 * ms).max(BURST_MS);
            *d = (*d + (measured - cap) / 100.0 * covered_ms).max(-credit);
            over |= measured > cap + MARGIN_PP;
            if let Some(f) = self.thawed.filter(|f| *f > 0.0) {
                // A slice that ran late or short reads low: the estimate
                // comes down by a tenth a period at most.
                let seen = (measured / f).clamp(cap.max(1.0), 100.0);
                let kept = self.takes.map_or(seen, |t| t * TAKES_DECAY);
                self.takes = Some(seen.max(kept));
            }
            let takes = self.takes.unwrap_or(100.0).max(cap.max(1.0));
            let allowed_ms = cap / 100.0 * ms - *d;
            slice = slice.min(allowed_ms / (takes / 100.0 * ms));
        }
        self.frozen_over = if self.thawed.is_none() && over {
            self.frozen_over + 1
        } else {
            0
        };
        if self.frozen_over >= ESCALATE_AFTER {
            return Step::Escalate;
        }
        // After a slice, a period frozen throughout: what the slice queued
        // shows in this one's samples, before it gets another.
        if self.thawed.is_some_and(|f| f < 1.0) {
            self.thawed = None;
            self.calm = 0;
            return Step::Freeze;
        }
        let min = MIN_SLICE.as_secs_f64() * 1000.0 / ms;
        if slice < min {
            self.thawed = None;
            self.calm = 0;
            return Step::Freeze;
        }
        if slice < 1.0 {
            self.thawed = Some(slice);
            self.calm = 0;
            return Step::Thaw(Some(dt.mul_f64(slice)));
        }
        self.thawed = Some(1.0);
        let owes = self.debt_ms.iter().any(|d| *d > 0.0);
        self.calm = if owes { 0 } else { self.calm + 1 };
        if self.calm >= RELEASE_AFTER {
            Step::Release
        } else {
            Step::Thaw(None)
        }
    }
}

fn write(dir: &Path, text: &str, action: &'static str) -> Result<(), PathIoError> {
    let path = dir.join("cgroup.freeze");
    std::fs::write(&path, text).map_err(|source| PathIoError::new(action, path, source))
}

/// Freezes cgroup `dir` for the throttle (marked first, not waited for).
pub fn freeze(dir: &Path) -> Result<(), PathIoError> {
    rustix::fs::setxattr(dir, MARK, b"1", rustix::fs::XattrFlags::empty())
        .map_err(|e| PathIoError::new("mark as throttled", dir, std::io::Error::from(e)))?;
    write(dir, "1", "write 1 to")
}

/// Thaws cgroup `dir` after the throttle froze it; `release` also
/// removes the mark.
pub fn thaw(dir: &Path, release: bool) -> Result<(), PathIoError> {
    write(dir, "0", "write 0 to")?;
    if release {
        unmark(dir)?;
    }
    Ok(())
}

/// Whether cgroup `dir` carries the throttle's mark.
pub fn marked(dir: &Path) -> bool {
    let mut buf = [0u8; 8];
    rustix::fs::getxattr(dir, MARK, &mut buf).is_ok()
}

/// Removes the throttle's mark from cgroup `dir` (absent is fine).
pub fn unmark(dir: &Path) -> Result<(), PathIoError> {
    match rustix::fs::removexattr(dir, MARK) {
        Ok(()) | Err(rustix::io::Errno::NODATA) => Ok(()),
        Err(e) => Err(PathIoError::new(
            "remove the throttle mark of",
            dir,
            e.into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Duration = Duration::from_millis(100);
    const PMS: f64 = 100.0;

    /// A plant: a process that takes `wants` % of the GPU while thawed,
    /// and leaves `queued_ms` of work queued whenever it ran, which keeps
    /// running while it is frozen; the throttle at cap `cap`. Returns
    /// each period's share and the steps.
    fn run(wants: f64, queued_ms: f64, cap: f64, periods: usize) -> (Vec<f64>, Vec<Step>) {
        let mut t = Throttle::default();
        let (mut thawed_ms, mut queue) = (PMS, 0.0_f64);
        let (mut shares, mut steps) = (Vec::new(), Vec::new());
        for _ in 0..periods {
            // Queued work first, then what it launches while thawed.
            let drained = queue.min(PMS);
            queue -= drained;
            let ran = (wants / 100.0 * thawed_ms).min(PMS - drained);
            if thawed_ms > 0.0 {
                queue = queued_ms;
            }
            let share = (drained + ran) / PMS * 100.0;
            shares.push(share);
            let s = t.step(&[(0, share, cap)], P, P);
            steps.push(s);
            thawed_ms = match s {
                Step::Freeze => 0.0,
                Step::Thaw(Some(slice)) => slice.as_secs_f64() * 1000.0,
                Step::Thaw(None) | Step::Release => PMS,
                Step::Escalate => break,
            };
        }
        (shares, steps)
    }

    fn mean(x: &[f64]) -> f64 {
        x.iter().sum::<f64>() / x.len() as f64
    }

    #[test]
    fn a_greedy_process_gets_its_cap() {
        for (wants, queued, cap) in [
            (100.0, 0.0, 20.0),
            (75.0, 0.0, 30.0),
            (100.0, 0.0, 50.0),
            (60.0, 0.0, 10.0),
            (100.0, 205.0, 20.0),
            (100.0, 100.0, 30.0),
        ] {
            let (shares, steps) = run(wants, queued, cap, 300);
            assert!(!steps.contains(&Step::Escalate), "{steps:?}");
            let m = mean(&shares[20..]);
            assert!(
                (m - cap).abs() < 2.0,
                "wants {wants} queued {queued} cap {cap}: {m}"
            );
            // Every 2 s window after the first second is within the
            // margin (a second may hold one burst more than the mean).
            for w in shares[10..].windows(20) {
                assert!(mean(w) <= cap + MARGIN_PP, "cap {cap}: {w:?}");
            }
        }
    }

    #[test]
    fn work_that_outruns_the_freeze_escalates() {
        // Seconds of queued work: found within about half a second.
        let (_, steps) = run(100.0, 5000.0, 20.0, 100);
        assert_eq!(steps.last(), Some(&Step::Escalate), "{steps:?}");
        assert!(steps.len() <= 2 + ESCALATE_AFTER as usize, "{steps:?}");
    }

    #[test]
    fn a_container_back_under_its_cap_is_released() {
        let mut t = Throttle::default();
        assert_eq!(t.step(&[(0, 80.0, 20.0)], P, P), Step::Freeze);
        let mut seen = Vec::new();
        for _ in 0..40 {
            let s = t.step(&[(0, 10.0, 20.0)], P, P);
            seen.push(s);
            if s == Step::Release {
                break;
            }
        }
        assert_eq!(seen.last(), Some(&Step::Release), "{seen:?}");
        // Frozen until the debt was paid, then thawed for good.
        assert!(seen.contains(&Step::Freeze), "{seen:?}");
    }

    #[test]
    fn credit_is_bounded() {
        // A long idle stretch buys at most BURST_MS of running over.
        let mut t = Throttle::default();
        for _ in 0..10 {
            t.step(&[(0, 0.0, 20.0)], P, P);
        }
        // Running at the cap plus the credit leaves no debt: still thawed.
        assert!(matches!(
            t.step(&[(0, 20.0 + BURST_MS, 20.0)], P, P),
            Step::Thaw(_)
        ));
        assert_eq!(t.step(&[(0, 100.0, 20.0)], P, P), Step::Freeze);
    }

    /// A measurement that covers periods which had none (NVML could not
    /// be read then) is charged over all of them: 60 % at a cap of 20
    /// over five periods owes 200 ms, paid by ten periods frozen; over
    /// one period it would owe 40 ms.
    #[test]
    fn a_measurement_after_a_gap_is_charged_over_the_gap() {
        let frozen_until_paid = |covered: Duration| {
            let mut t = Throttle::default();
            let mut n = 0;
            let mut s = t.step(&[(0, 60.0, 20.0)], covered, P);
            while s == Step::Freeze && n < 50 {
                n += 1;
                s = t.step(&[(0, 0.0, 20.0)], P, P);
            }
            n
        };
        let gap = frozen_until_paid(P * 5);
        let one = frozen_until_paid(P);
        assert!((9..=11).contains(&gap), "{gap} periods frozen after a gap");
        assert!(one <= 3, "{one} periods frozen after one period");
    }
}
