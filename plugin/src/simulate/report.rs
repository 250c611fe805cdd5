//! Per-policy figures over the runs of each seed, as text or JSON.

use serde_json::{Value, json};

use super::inflate::Run;
use crate::placement::Policy;

/// Figures of one policy over all its runs (means, with the range).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyReport {
    /// The policy.
    pub policy: Policy,
    /// Each run, by seed.
    pub runs: Vec<Run>,
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / f64::from(n) }
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    })
}

impl PolicyReport {
    /// Mean share of requested GPU compute allocated.
    pub fn allocated_share(&self) -> f64 {
        mean(self.runs.iter().map(Run::allocated_share))
    }

    /// Mean GPUs left unallocated at 100 % arrived workload.
    pub fn unallocated_gpus(&self) -> f64 {
        mean(self.runs.iter().map(Run::unallocated_gpus))
    }

    /// One JSON object.
    pub fn to_json(&self) -> Value {
        let (lo, hi) = range(self.runs.iter().map(Run::unallocated_gpus));
        json!({
            "policy": self.policy.name(),
            "allocated_share": self.allocated_share(),
            "unallocated_gpus": self.unallocated_gpus(),
            "unallocated_gpus_min": lo,
            "unallocated_gpus_max": hi,
            "runs": self.runs.iter().map(|r| json!({
                "seed": r.seed,
                "allocated_share": r.allocated_share(),
                "unallocated_gpus": r.unallocated_gpus(),
                "tasks_arrived": r.arrived,
                "tasks_placed": r.placed,
                "gpu_tasks_arrived": r.gpu_arrived,
                "gpu_tasks_placed": r.gpu_placed,
                "requested_gpus": r.requested_milli as f64 / 1000.0,
                "allocated_gpus": r.allocated_milli as f64 / 1000.0,
                "capacity_gpus": r.capacity_milli as f64 / 1000.0,
            })).collect::<Vec<_>>(),
        })
    }

    /// One line of the text table.
    pub fn to_line(&self) -> String {
        let (lo, hi) = range(self.runs.iter().map(Run::unallocated_gpus));
        format!(
            "{:<8} {:>9.4}% {:>11.1} {:>7.1}..{:<7.1}",
            self.policy.name(),
            self.allocated_share() * 100.0,
            self.unallocated_gpus(),
            lo,
            hi
        )
    }
}

/// The lower bound on unallocated GPUs ([`super::bound`]), per seed.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundReport {
    /// (seed, bound in GPUs) for each run.
    pub runs: Vec<(u64, f64)>,
}

impl BoundReport {
    /// Mean over the seeds.
    pub fn unallocated_gpus(&self) -> f64 {
        mean(self.runs.iter().map(|r| r.1))
    }

    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "bound_unallocated_gpus": self.unallocated_gpus(),
            "runs": self.runs.iter().map(|(seed, gpus)| json!({
                "seed": seed,
                "bound_unallocated_gpus": gpus,
            })).collect::<Vec<_>>(),
        })
    }

    /// One line of the text table, in its columns.
    pub fn to_line(&self) -> String {
        let (lo, hi) = range(self.runs.iter().map(|r| r.1));
        format!(
            "{:<8} {:>10} {:>11.1} {:>7.1}..{:<7.1} (lower bound: no policy leaves fewer)",
            "bound",
            "",
            self.unallocated_gpus(),
            lo,
            hi
        )
    }
}

/// The text table's header.
pub const HEADER: &str = "policy   allocated   unalloc GPUs   (min..max over seeds)";

/// Latency of filter + prioritize per pod, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// Pods timed.
    pub pods: usize,
    /// Nodes per request.
    pub nodes: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Latency {
    /// From per-pod durations in milliseconds (any order; at least one).
    pub fn from_samples(mut ms: Vec<f64>, nodes: usize) -> Self {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1;
            ms[i]
        };
        Self {
            pods: ms.len(),
            nodes,
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: ms.last().copied().unwrap_or(0.0),
        }
    }

    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({"latency": {"pods": self.pods, "nodes": self.nodes,
            "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "max_ms": self.max_ms}})
    }
}
