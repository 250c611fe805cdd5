//! A small deterministic model of a time-sliced GPU under token buckets,
//! for the unit tests: a fluid approximation of what the simulator does.
//!
//! Each container has a workload (what it would launch, warps/s, and
//! what a warp costs, GPU seconds) and a launch queue bounded in GPU time.
//! Per step of [`STEP_S`]: launches are admitted up to the bucket's rate,
//! the workload's demand and the queue's room; the GPU serves queued work
//! by processor sharing (equal shares, what one cannot use goes to the
//! others). SM use is what each container's work ran, rounded to whole
//! percents as NVML reports it.

use std::time::{Duration, Instant};

use super::{ContainerSample, GpuController, GpuSample, PERIOD, RateDecision};

/// Plant step (s).
pub const STEP_S: f64 = 0.001;

/// What a workload does at time `t` (s): warps/s it would launch (
/// `f64::INFINITY`: as fast as it can), and GPU seconds per warp.
pub type Workload = Box<dyn Fn(f64) -> (f64, f64)>;

/// A saturating workload whose warps cost `cost` GPU seconds.
pub fn saturating(cost: f64) -> Workload {
    Box::new(move |_| (f64::INFINITY, cost))
}

/// A container in the plant.
pub struct PlantContainer {
    pub id: String,
    pub workload: Workload,
    /// Launch rate in force (warps/s).
    pub rate: f64,
    /// Queued work (GPU s).
    backlog: f64,
    /// Cumulative counters, as the usage region holds them.
    pub warps: f64,
    pub throttled_ns: f64,
    /// GPU time run in the current window (s).
    ran: f64,
    /// Whether the container is present (its samples reported).
    pub present: bool,
    /// Request-driven work: every `.0` s a request of `.1` warps arrives;
    /// the container launches as fast as allowed while any is pending.
    pub requests: Option<(f64, f64)>,
    /// Warps of requests not launched yet.
    pub pending: f64,
}

/// The GPU and its containers, driven by a controller.
pub struct Plant {
    pub containers: Vec<PlantContainer>,
    pub controller: GpuController,
    /// Queue bound per container (GPU s).
    pub queue_s: f64,
    /// Time (s).
    pub t: f64,
    start: Instant,
    /// Per period: (t, SM percent per container, as measured).
    pub history: Vec<(f64, Vec<f64>)>,
    pub decisions: Vec<Vec<RateDecision>>,
}

impl Plant {
    /// A plant with `controller` and no containers.
    pub fn new(controller: GpuController) -> Self {
        Self {
            containers: Vec::new(),
            controller,
            queue_s: 0.02,
            t: 0.0,
            start: Instant::now(),
            history: Vec::new(),
            decisions: Vec::new(),
        }
    }

    /// Adds a container running `workload` (the controller must know it).
    pub fn add(&mut self, id: &str, workload: Workload) {
        self.containers.push(PlantContainer {
            id: id.to_string(),
            workload,
            rate: self.controller.config().initial_rate,
            backlog: 0.0,
            warps: 0.0,
            throttled_ns: 0.0,
            ran: 0.0,
            present: true,
            requests: None,
            pending: 0.0,
        });
    }

    /// The container `id`.
    pub fn get(&mut self, id: &str) -> &mut PlantContainer {
        self.containers
            .iter_mut()
            .find(|c| c.id == id)
            .expect("container in plant")
    }

    fn step(&mut self) {
        let t = self.t;
        for c in &mut self.containers {
            if !c.present {
                continue;
            }
            let (mut demand, cost) = (c.workload)(t);
            if let Some((every, warps)) = c.requests {
                let k = (t / every + 1e-9).floor();
                if (t - k * every).abs() < STEP_S / 2.0 {
                    c.pending += warps;
                }
                demand = if c.pending > 0.0 {
                    c.pending / STEP_S
                } else {
                    0.0
                };
            }
            let room = ((self.queue_s - c.backlog).max(0.0) / cost) / STEP_S;
            let want = demand.min(room);
            let admitted = want.min(c.rate);
            if demand > c.rate && room > c.rate {
                c.throttled_ns += STEP_S * 1e9;
            }
            c.warps += admitted * STEP_S;
            c.pending = (c.pending - admitted * STEP_S).max(0.0);
            c.backlog += admitted * STEP_S * cost;
        }
        // Processor sharing of STEP_S among backlogged containers.
        let mut left = STEP_S;
        loop {
            let open: Vec<usize> = (0..self.containers.len())
                .filter(|&i| self.containers[i].backlog > 1e-15)
                .collect();
            if open.is_empty() || left <= 1e-15 {
                break;
            }
            let share = left / open.len() as f64;
            for i in open {
                let c = &mut self.containers[i];
                let run = c.backlog.min(share);
                c.backlog -= run;
                c.ran += run;
                left -= run;
            }
        }
        self.t += STEP_S;
    }

    /// Runs one controller period.
    pub fn period(&mut self) {
        let steps = (PERIOD.as_secs_f64() / STEP_S).round() as usize;
        for _ in 0..steps {
            self.step();
        }
        let window = PERIOD.as_secs_f64();
        let mut used = Vec::new();
        let samples: Vec<ContainerSample> = self
            .containers
            .iter_mut()
            .filter(|c| c.present)
            .map(|c| {
                // NVML reports whole percents.
                let u = (100.0 * c.ran / window).round();
                c.ran = 0.0;
                used.push(u);
                ContainerSample {
                    id: c.id.clone(),
                    sm_percent: Some(u),
                    warps: c.warps as u64,
                    throttled_ns: c.throttled_ns as u64,
                }
            })
            .collect();
        let busy = used.iter().sum::<f64>().min(100.0);
        let now = self.start + Duration::from_secs_f64(self.t);
        let decisions = self.controller.tick(
            now,
            &GpuSample {
                busy_percent: Some(busy),
                containers: samples,
            },
        );
        for d in &decisions {
            if let Some(c) = self.containers.iter_mut().find(|c| c.id == d.id) {
                c.rate = d.pacing.rate as f64;
            }
        }
        self.history.push((self.t, used));
        self.decisions.push(decisions);
    }

    /// Runs `seconds` of periods.
    pub fn run(&mut self, seconds: f64) {
        let n = (seconds / PERIOD.as_secs_f64()).round() as usize;
        for _ in 0..n {
            self.period();
        }
    }

    /// Mean SM percent of present container `i` (in sample order) over
    /// the periods in `[from, to)` seconds.
    pub fn mean(&self, i: usize, from: f64, to: f64) -> f64 {
        let v: Vec<f64> = self
            .history
            .iter()
            .filter(|(t, _)| *t > from + 1e-9 && *t <= to + 1e-9)
            .filter_map(|(_, u)| u.get(i).copied())
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    }

    /// The first time (s) after which every period's use of container `i`
    /// stays within `tol` pp of `want` until the end.
    pub fn settled_at(&self, i: usize, want: f64, tol: f64) -> Option<f64> {
        let mut at = None;
        for (t, u) in &self.history {
            match u.get(i) {
                Some(x) if (x - want).abs() <= tol => {
                    at.get_or_insert(*t);
                }
                _ => at = None,
            }
        }
        at
    }
}
