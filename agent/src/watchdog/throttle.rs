//! The throttle: the action that holds a container over its compute cap
//! to the cap without killing it, by freezing its cgroup for the periods
//! in which it owes GPU time.
//!
//! Per granted GPU it keeps a debt: each period adds the GPU time the
//! container's processes took (NVML's samples, the same ground truth as
//! the finding) minus what its cap allows for the period, never below a
//! credit of [`BURST_MS`]. While any GPU's debt is positive the cgroup is
//! frozen for the next period; frozen, its processes launch nothing, the
//! debt is paid back at the cap's rate, and it thaws. So, over time, the
//! container gets its share, as a launch bucket would give it, whatever
//! way it launches.
//!
//! What a freeze cannot stop: work already queued on the GPU (a stream
//! holds up to about a thousand launches) and a kernel already running.
//! Queued work only delays the thaw (it shows in the samples and adds to
//! the debt); a container whose share stays above cap + margin through
//! [`ESCALATE_AFTER`] frozen periods has work the throttle cannot hold (a
//! persistent kernel, seconds of queued launches), and is killed. The
//! throttle lets go after [`RELEASE_AFTER`] periods in which nothing was
//! owed.
//!
//! A frozen stretch lasting several periods is broken by a thaw of
//! [`BREATHER`] at each period: a process frozen inside a critical
//! section of a user-space driver (the simulator's GPU lock, which other
//! processes wait on) gets to leave it. The state is the kernel's (I4):
//! the cgroup's `cgroup.freeze` and an extended attribute
//! ([`MARK`]) naming the freeze as the throttle's, so a new agent thaws
//! what a previous one left frozen mid-throttle instead of taking it for
//! the freeze action.

use std::path::Path;
use std::time::Duration;

use tessera_error_chain::PathIoError;
use tessera_region::MAX_GPUS;

use super::compute::{MARGIN_PP, WINDOW};

/// Credit a container may build up below its cap (ms of one GPU): the
/// margin over the window.
pub const BURST_MS: f64 = MARGIN_PP / 100.0 * WINDOW.as_millis() as f64;
/// Frozen periods with the share still above cap + margin before the
/// throttle gives up and kills.
pub const ESCALATE_AFTER: u32 = 10;
/// Periods without debt after which the throttle lets go.
pub const RELEASE_AFTER: u32 = 20;
/// The thaw between two frozen periods.
pub const BREATHER: Duration = Duration::from_millis(3);
/// The extended attribute on a cgroup the throttle froze.
pub const MARK: &str = "trusted.tessera.throttle";

/// What to do for the next period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Owes GPU time: frozen.
    Freeze,
    /// Owes nothing: thawed.
    Thaw,
    /// Has owed nothing for [`RELEASE_AFTER`] periods: thawed, and the
    /// throttle ends.
    Release,
    /// Stayed above cap + margin while frozen: the freeze cannot hold it.
    Escalate,
}

/// The throttle of one container.
#[derive(Clone, Debug, Default)]
pub struct Throttle {
    debt_ms: [f64; MAX_GPUS],
    froze_last: bool,
    over_while_frozen: u32,
    calm: u32,
}

impl Throttle {
    /// One period of `dt`: `gpus` are (GPU index, measured %, cap %) of
    /// the period that just ended.
    pub fn step(&mut self, gpus: &[(usize, f64, f64)], dt: Duration) -> Step {
        let ms = dt
            .clamp(Duration::from_millis(10), Duration::from_secs(1))
            .as_secs_f64()
            * 1000.0;
        let (mut owes, mut over) = (false, false);
        for &(i, measured, cap) in gpus {
            let Some(d) = self.debt_ms.get_mut(i) else {
                continue;
            };
            *d = (*d + (measured - cap) / 100.0 * ms).max(-BURST_MS);
            owes |= *d > 0.0;
            over |= measured > cap + MARGIN_PP;
        }
        self.over_while_frozen = if self.froze_last && over {
            self.over_while_frozen + 1
        } else {
            0
        };
        if self.over_while_frozen >= ESCALATE_AFTER {
            return Step::Escalate;
        }
        self.froze_last = owes;
        if owes {
            self.calm = 0;
            return Step::Freeze;
        }
        self.calm += 1;
        if self.calm >= RELEASE_AFTER {
            Step::Release
        } else {
            Step::Thaw
        }
    }

    /// Whether the last step froze.
    pub fn frozen(&self) -> bool {
        self.froze_last
    }
}

fn write(dir: &Path, text: &str, action: &'static str) -> Result<(), PathIoError> {
    let path = dir.join("cgroup.freeze");
    std::fs::write(&path, text).map_err(|source| PathIoError::new(action, path, source))
}

/// Freezes cgroup `dir` for the throttle (marked first, not waited for);
/// one `already` frozen gets its [`BREATHER`] first.
pub fn freeze(dir: &Path, already: bool) -> Result<(), PathIoError> {
    rustix::fs::setxattr(dir, MARK, b"1", rustix::fs::XattrFlags::empty())
        .map_err(|e| PathIoError::new("mark as throttled", dir, std::io::Error::from(e)))?;
    if already {
        write(dir, "0", "write 0 to")?;
        std::thread::sleep(BREATHER);
    }
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

    /// A plant: a process that takes `wants` % of the GPU when thawed,
    /// with `queued` ms of work that keeps running while frozen; the
    /// throttle at cap `cap`. Returns the share of each period.
    fn run(wants: f64, queued_ms: f64, cap: f64, periods: usize) -> (Vec<f64>, Vec<Step>) {
        let mut t = Throttle::default();
        let (mut frozen, mut queue) = (false, 0.0_f64);
        let (mut shares, mut steps) = (Vec::new(), Vec::new());
        for _ in 0..periods {
            let share = if frozen {
                let ran = queue.min(100.0);
                queue -= ran;
                ran
            } else {
                queue = queued_ms;
                wants
            };
            shares.push(share);
            let s = t.step(&[(0, share, cap)], P);
            steps.push(s);
            frozen = s == Step::Freeze;
            if s == Step::Escalate {
                break;
            }
        }
        (shares, steps)
    }

    fn mean(x: &[f64]) -> f64 {
        x.iter().sum::<f64>() / x.len() as f64
    }

    #[test]
    fn a_greedy_process_gets_its_cap_over_time() {
        for (wants, cap) in [(100.0, 20.0), (75.0, 30.0), (100.0, 50.0), (60.0, 10.0)] {
            let (shares, steps) = run(wants, 0.0, cap, 200);
            assert!(!steps.contains(&Step::Escalate));
            let m = mean(&shares[20..]);
            assert!((m - cap).abs() < 2.0, "wants {wants} cap {cap}: {m}");
            // Every 1 s window after the first second is within the margin.
            for w in shares[10..].windows(10) {
                assert!(mean(w) <= cap + MARGIN_PP, "{w:?}");
            }
        }
    }

    #[test]
    fn queued_work_delays_the_thaw() {
        let (shares, steps) = run(100.0, 150.0, 20.0, 300);
        assert!(!steps.contains(&Step::Escalate), "{steps:?}");
        let m = mean(&shares[30..]);
        assert!((m - 20.0).abs() < 2.0, "{m}");
    }

    #[test]
    fn work_that_outruns_the_freeze_escalates() {
        // Seconds of queued work: the share stays up while frozen.
        let (_, steps) = run(100.0, 5000.0, 20.0, 100);
        assert_eq!(steps.last(), Some(&Step::Escalate), "{steps:?}");
        assert!(
            steps.len() <= 2 + ESCALATE_AFTER as usize,
            "{}",
            steps.len()
        );
    }

    #[test]
    fn a_container_back_under_its_cap_is_released() {
        let mut t = Throttle::default();
        assert_eq!(t.step(&[(0, 80.0, 20.0)], P), Step::Freeze);
        let mut last = Step::Freeze;
        for _ in 0..40 {
            last = t.step(&[(0, 10.0, 20.0)], P);
            if last == Step::Release {
                break;
            }
        }
        assert_eq!(last, Step::Release);
    }

    #[test]
    fn credit_is_bounded() {
        // A long idle stretch buys at most BURST_MS of running over.
        let mut t = Throttle::default();
        for _ in 0..10 {
            t.step(&[(0, 0.0, 20.0)], P);
        }
        assert_eq!(t.step(&[(0, 20.0 + BURST_MS, 20.0)], P), Step::Thaw);
        assert_eq!(t.step(&[(0, 100.0, 20.0)], P), Step::Freeze);
    }
}
