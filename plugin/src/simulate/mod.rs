//! The placement simulator behind `tessera-scheduler simulate`: an openb
//! trace ([`trace`]) replayed by workload inflation ([`inflate`]) through
//! the same fit and scoring as the extender ([`crate::placement`]), with
//! per-policy figures ([`report`]), a lower bound on what any policy
//! leaves unallocated ([`bound`]) and the extender's filter + prioritize
//! latency on the same cluster ([`latency`]). [`derive`] makes pod lists
//! with more model-constrained tasks than the published ones.

pub mod bound;
pub mod derive;
pub mod inflate;
pub mod latency;
pub mod report;
pub mod trace;

use std::path::PathBuf;

use thiserror::Error;

use crate::placement::{Policy, Task, Workload};
use inflate::{Arrivals, Classes};
use report::{BoundReport, Latency, PolicyReport};

/// Why a simulation could not run.
#[derive(Debug, Error)]
pub enum SimulateError {
    /// A trace file is unreadable or malformed.
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    /// No task of the pod list asks for GPU: inflation would never end.
    #[error("{}: no task asks for GPU; workload inflation needs at least one", .0.display())]
    NoGpuTask(PathBuf),
    /// The node list has no GPU.
    #[error("{}: no node has a GPU", .0.display())]
    NoGpu(PathBuf),
    /// The bound's linear programme failed.
    #[error(transparent)]
    Bound(#[from] bound::BoundError),
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Options {
    /// Node list CSV.
    pub nodes: PathBuf,
    /// Pod list CSV.
    pub pods: PathBuf,
    /// Policies to run.
    pub policies: Vec<Policy>,
    /// Seeds of the task sequences, one run per seed and policy.
    pub seeds: Vec<u64>,
    /// Pods to time through filter + prioritize (0: none).
    pub latency_pods: usize,
    /// Whether to compute the lower bound on unallocated GPUs for each
    /// seed's arrivals.
    pub bound: bool,
}

/// Figures of a simulation.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Per policy, in the order asked.
    pub policies: Vec<PolicyReport>,
    /// Extender latency on the cluster half full (Tessera's placement).
    pub latency: Option<Latency>,
    /// The lower bound on unallocated GPUs, per seed, if asked for.
    pub bound: Option<BoundReport>,
    /// Nodes and GPUs of the cluster.
    pub nodes: usize,
    /// GPUs of the cluster.
    pub gpus: usize,
    /// Tasks in the pod list.
    pub tasks: usize,
}

/// Runs the simulation.
///
/// # Errors
/// A [`SimulateError`] for unreadable or unusable traces.
pub fn simulate(options: &Options) -> Result<Outcome, SimulateError> {
    let nodes = trace::read_nodes(&options.nodes)?;
    let tasks: Vec<Task> = trace::read_pods(&options.pods)?
        .into_iter()
        .map(|t| t.task)
        .collect();
    let gpus = nodes.iter().map(|n| n.gpus.len()).sum();
    if gpus == 0 {
        return Err(SimulateError::NoGpu(options.nodes.clone()));
    }
    if !inflate::has_gpu_task(&tasks) {
        return Err(SimulateError::NoGpuTask(options.pods.clone()));
    }
    let classes = Classes::new(&tasks);
    let workload = Workload::from_tasks(&tasks).with_supply(&nodes);
    let mut policies = Vec::new();
    for &policy in &options.policies {
        let runs = options
            .seeds
            .iter()
            .map(|&seed| inflate::run(&nodes, &tasks, &classes, &workload, policy, seed, None).0)
            .collect();
        policies.push(PolicyReport { policy, runs });
    }
    let latency = if options.latency_pods > 0 {
        let seed = options.seeds.first().copied().unwrap_or(0);
        let (_, half) = inflate::run(
            &nodes,
            &tasks,
            &classes,
            &workload,
            Policy::Tessera,
            seed,
            Some(0.5),
        );
        half.and_then(|half| latency::measure(&half, &tasks, options.latency_pods, seed))
    } else {
        None
    };
    let bound = if options.bound {
        let capacity: u64 = nodes
            .iter()
            .map(crate::placement::Node::free_gpu_milli)
            .sum();
        let mut runs = Vec::with_capacity(options.seeds.len());
        for &seed in &options.seeds {
            let arrived = Arrivals::new(&classes, capacity, seed).counts();
            let gpus = bound::unallocated_gpus(&nodes, &classes.tasks, &arrived, capacity)?;
            runs.push((seed, gpus));
        }
        Some(BoundReport { runs })
    } else {
        None
    };
    Ok(Outcome {
        policies,
        latency,
        bound,
        nodes: nodes.len(),
        gpus,
        tasks: tasks.len(),
    })
}

#[cfg(test)]
mod tests;
