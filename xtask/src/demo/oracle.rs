//! The judge of the demo: the simulator's own record of each workload
//! process (its per-process SM samples, i.e. the kernel time its channel
//! got on the GPU's timeline, and the device memory it holds), never the
//! agent's numbers.
//!
//! A container's *cap* is what it may use while every container saturates:
//! its SM target when hard; when elastic, its target or whatever the
//! others' targets on its GPU leave, whichever is more (alone: the whole
//! GPU). The limit held when the mean of its per-second samples over each
//! steady window (from [`SETTLE_S`] after the start or a target change to
//! the next change or the end) is at most cap + [`TOLERANCE_PP`], and its
//! memory never exceeded its limit.

use gpusim::Sim;

use super::plan::{MIB, Mode, Plan};

/// Seconds the controller gets after a start or a change before the
/// oracle holds it to the cap (the accuracy benchmark settles in ≤ 1.3 s).
pub(super) const SETTLE_S: f64 = 3.0;
/// Percentage points of SM time a container may be above its cap over a
/// window (the simulator's samples are whole percents; the controller's
/// steady error on this node is ~1 pp).
pub(super) const TOLERANCE_PP: f64 = 5.0;

/// The simulator's record of one container.
#[derive(Clone, Debug, Default)]
pub(super) struct Record {
    /// (seconds since the workloads started, SM percent over the second
    /// before).
    pub(super) sm: Vec<(f64, f64)>,
    /// Most device memory its process held at any sample (bytes).
    pub(super) peak_bytes: u64,
}

/// Samples the simulator once a second.
pub(super) struct Sampler {
    sim: Sim,
    /// Per GPU: the Unix µs of the previous sample.
    last_us: Vec<u64>,
}

impl Sampler {
    pub(super) fn new(sim: Sim, gpus: usize) -> Self {
        let now = now_us();
        Self {
            sim,
            last_us: vec![now; gpus],
        }
    }

    /// Adds a sample at `t` s to each container's record: `pids[i]` is the
    /// workload process of `plans[i]`.
    pub(super) fn sample(
        &mut self,
        t: f64,
        plans: &[Plan],
        pids: &[i32],
        records: &mut [Record],
    ) -> anyhow::Result<()> {
        for gpu in 0..self.last_us.len() {
            let since = self.last_us[gpu];
            self.last_us[gpu] = now_us();
            let samples = self.sim.process_samples(gpu, since)?;
            let memory = self.sim.processes(gpu)?;
            for (i, _) in plans.iter().enumerate().filter(|(_, p)| p.gpu == gpu) {
                let sm: u32 = samples
                    .iter()
                    .filter(|s| s.pid == pids[i])
                    .map(|s| s.sm_percent)
                    .sum();
                let bytes: u64 = memory
                    .iter()
                    .filter(|m| m.pid == pids[i])
                    .map(|m| m.bytes)
                    .sum();
                records[i].sm.push((t, f64::from(sm)));
                records[i].peak_bytes = records[i].peak_bytes.max(bytes);
            }
        }
        Ok(())
    }
}

fn now_us() -> u64 {
    gpusim::realtime_ns() / 1000
}

/// What `plan` may use with the target `target`, all its GPU's containers
/// saturating (`targets_of_others`: the others' targets then).
pub(super) fn cap(mode: Mode, target: u32, targets_of_others: u32) -> f64 {
    match mode {
        Mode::Hard => f64::from(target),
        Mode::Elastic => f64::from(target.max(100u32.saturating_sub(targets_of_others))),
    }
}

/// One steady window of one container.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Window {
    pub(super) from_s: f64,
    pub(super) to_s: f64,
    pub(super) target: u32,
    pub(super) cap: f64,
    /// Mean SM percent over it (`None`: no sample in it, the run ended
    /// before).
    pub(super) achieved: Option<f64>,
}

impl Window {
    pub(super) fn held(&self) -> bool {
        self.achieved.is_none_or(|a| a <= self.cap + TOLERANCE_PP)
    }

    pub(super) fn converged(&self) -> bool {
        self.achieved
            .is_some_and(|a| (a - self.cap).abs() <= TOLERANCE_PP)
    }
}

/// The verdict on one container.
#[derive(Clone, Debug)]
pub(super) struct Verdict {
    pub(super) name: &'static str,
    pub(super) mode: Mode,
    /// Its GPU on the node.
    pub(super) gpu: usize,
    pub(super) windows: Vec<Window>,
    pub(super) peak_mib: f64,
    pub(super) limit_mib: u64,
}

impl Verdict {
    pub(super) fn memory_held(&self) -> bool {
        self.peak_mib <= self.limit_mib as f64
    }

    /// Whether its process is in the record: every workload holds its
    /// CUDA context from its first operation on, so a container that held
    /// no device memory at any sample while a window was sampled ran on
    /// another GPU or not at all, and an SM share of 0 says nothing.
    pub(super) fn seen(&self) -> bool {
        self.peak_mib > 0.0 || self.windows.iter().all(|w| w.achieved.is_none())
    }

    pub(super) fn held(&self) -> bool {
        self.seen() && self.memory_held() && self.windows.iter().all(Window::held)
    }
}

/// Judges every container: `change_at` is when the live change was made
/// (s; `None`: not made), `end_s` when the run ended.
pub(super) fn judge(
    plans: &[Plan],
    records: &[Record],
    change_at: Option<f64>,
    end_s: f64,
) -> Vec<Verdict> {
    let target = |p: &Plan, after: bool| match (after, p.change_to) {
        (true, Some(t)) => t,
        _ => p.sm_target,
    };
    plans
        .iter()
        .zip(records)
        .map(|(p, r)| {
            // Every container's windows split at the change: a neighbour's
            // new target moves an elastic container's cap.
            let mut spans = vec![(SETTLE_S, change_at.unwrap_or(end_s), false)];
            if let Some(at) = change_at {
                spans.push((at + SETTLE_S, end_s, true));
            }
            let windows = spans
                .into_iter()
                // Less than a sample's second is no window.
                .filter(|(from, to, _)| to - from >= 1.0)
                .map(|(from_s, to_s, after)| {
                    let others: u32 = plans
                        .iter()
                        .filter(|o| o.gpu == p.gpu && o.name != p.name)
                        .map(|o| target(o, after))
                        .sum();
                    let in_window: Vec<f64> =
                        r.sm.iter()
                            // A sample covers the second before its time.
                            .filter(|(t, _)| *t - 1.0 >= from_s - 0.05 && *t <= to_s + 0.05)
                            .map(|(_, v)| *v)
                            .collect();
                    Window {
                        from_s,
                        to_s,
                        target: target(p, after),
                        cap: cap(p.mode, target(p, after), others),
                        achieved: (!in_window.is_empty())
                            .then(|| in_window.iter().sum::<f64>() / in_window.len() as f64),
                    }
                })
                .collect();
            Verdict {
                name: p.name,
                mode: p.mode,
                gpu: p.gpu,
                windows,
                peak_mib: r.peak_bytes as f64 / MIB as f64,
                limit_mib: p.memory_mib,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::plan::plans;
    use super::*;

    fn flat(values: &[f64], until: f64) -> Record {
        // One sample a second, cycling through `values` per container.
        Record {
            sm: (1..=until as usize)
                .map(|t| (t as f64, values[t % values.len()]))
                .collect(),
            peak_bytes: 0,
        }
    }

    #[test]
    fn caps_are_targets_when_hard_and_what_is_left_when_elastic() {
        assert_eq!(cap(Mode::Hard, 30, 0), 30.0);
        assert_eq!(cap(Mode::Elastic, 30, 0), 100.0);
        assert_eq!(cap(Mode::Elastic, 20, 30), 70.0);
        assert_eq!(cap(Mode::Elastic, 60, 70), 60.0);
    }

    #[test]
    fn a_container_above_its_cap_or_its_memory_fails_and_one_at_it_holds() {
        let plans = plans();
        // As the plans should get: serve-b 20 then 40.
        let at = |i: usize, before: f64, after: f64| Record {
            sm: (1..=20)
                .map(|t| (t as f64, if t <= 10 { before } else { after }))
                .collect(),
            peak_bytes: (plans[i].memory_mib - 1) * MIB,
        };
        let good = vec![
            at(0, 50.0, 50.0),
            at(1, 20.0, 40.0),
            at(2, 100.0, 100.0),
            at(3, 25.0, 25.0),
            at(4, 30.0, 30.0),
            at(5, 70.0, 70.0),
        ];
        let v = judge(&plans, &good, Some(10.0), 20.0);
        assert!(v.iter().all(Verdict::held), "{v:#?}");
        assert!(v.iter().all(|c| c.windows.iter().all(Window::converged)));
        assert_eq!(v[1].windows.len(), 2);
        assert_eq!((v[1].windows[0].target, v[1].windows[1].target), (20, 40));
        assert_eq!(v[1].windows[1].achieved, Some(40.0));

        // serve-b keeping 40 before the change: over its cap of 20.
        let mut early = good.clone();
        early[1] = at(1, 40.0, 40.0);
        let v = judge(&plans, &early, Some(10.0), 20.0);
        assert!(!v[1].held() && v[0].held());
        // etl-f taking more than infer-e leaves.
        let mut greedy = good.clone();
        greedy[5] = flat(&[80.0], 20.0);
        assert!(!judge(&plans, &greedy, Some(10.0), 20.0)[5].held());
        // A byte over the memory limit.
        let mut over = good.clone();
        over[3].peak_bytes = plans[3].memory_mib * MIB + 1;
        let v = judge(&plans, &over, Some(10.0), 20.0);
        assert!(!v[3].memory_held() && !v[3].held());
        // A process never in the record (no memory at any sample) is not
        // judged as holding its cap by its share of 0.
        let mut unseen = good;
        unseen[4] = Record {
            sm: (1..=20).map(|t| (t as f64, 0.0)).collect(),
            peak_bytes: 0,
        };
        let v = judge(&plans, &unseen, Some(10.0), 20.0);
        assert!(v[4].windows.iter().all(Window::held));
        assert!(!v[4].seen() && !v[4].held() && v[5].held());
    }

    #[test]
    fn a_run_stopped_early_judges_only_what_it_saw() {
        let plans = plans();
        let recs: Vec<Record> = plans.iter().map(|_| flat(&[10.0], 2.0)).collect();
        // Stopped at 2 s: before the first window starts.
        let v = judge(&plans, &recs, None, 2.0);
        assert!(v.iter().all(|c| c.windows.is_empty() && c.held()));
        // Changed at 2 s, ended at 5.4 s: no window of a second or more
        // (3..2 and 5..5.4).
        let v = judge(&plans, &recs, Some(2.0), 5.4);
        assert!(v.iter().all(|c| c.windows.is_empty()), "{v:#?}");
        // Samples at 1..=5 s, stopped at 5 s: the window 3..5 has 4 and 5
        // (train-a, hard at 50, over its cap + 5 pp).
        let recs: Vec<Record> = plans.iter().map(|_| flat(&[30.0, 90.0], 5.0)).collect();
        let w = &judge(&plans, &recs, None, 5.0)[0].windows[0];
        assert_eq!(w.achieved, Some(60.0));
        assert!(!w.held());
    }
}
