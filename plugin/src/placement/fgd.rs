//! GPU fragmentation of a node with respect to a target workload, after
//! Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads
//! with Fragmentation Gradient Descent" (USENIX ATC '23), re-implemented
//! from the paper's description.
//!
//! The target workload is a set of task classes, each with its popularity
//! (share of tasks). For one node `n` and one class `m`, the fragment
//! `F_n(m)` is the free GPU compute of `n` that `m` cannot use:
//!
//! - if `m` cannot be placed on `n` at all (CPU, memory, too few GPUs with
//!   room, model not accepted) — or asks for no GPU — every free GPU
//!   milli of `n` is a fragment;
//! - otherwise the free milli of each GPU that cannot take one GPU of `m`'s
//!   ask (less free than the ask, not idle for a whole-GPU ask, model not
//!   accepted) is a fragment.
//!
//! The node's fragmentation is the popularity-weighted sum
//! `F_n(M) = Σ_m p_m F_n(m)`, in milli-GPU. FGD places a task where
//! `F_n(M)` grows least (the steepest descent of fragmentation). Unhealthy
//! GPUs are no capacity and never count.

use super::fit::{Node, Task, fits_quickly};

/// One task class of the target workload.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskClass {
    /// A representative task.
    pub task: Task,
    /// Popularity, 0.0..=1.0; the classes' popularities sum to 1.
    pub popularity: f64,
}

/// The workload a cluster is expected to receive, as task classes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Workload {
    classes: Vec<TaskClass>,
}

impl Workload {
    /// Groups identical tasks into classes weighted by their counts; an
    /// empty input gives an empty workload (no fragmentation anywhere).
    pub fn from_tasks<'a>(tasks: impl IntoIterator<Item = &'a Task>) -> Self {
        let mut counts: Vec<(Task, u64)> = Vec::new();
        let mut index: std::collections::HashMap<&'a Task, usize> = Default::default();
        let mut total = 0u64;
        for task in tasks {
            total += 1;
            match index.get(task) {
                Some(&i) => counts[i].1 += 1,
                None => {
                    index.insert(task, counts.len());
                    counts.push((task.clone(), 1));
                }
            }
        }
        let classes = counts
            .into_iter()
            .map(|(task, n)| TaskClass {
                task,
                popularity: n as f64 / total as f64,
            })
            .collect();
        Self { classes }
    }

    /// Its classes.
    pub fn classes(&self) -> &[TaskClass] {
        &self.classes
    }
}

/// `F_n(m)`: free milli-GPU of `node` that a task of class `task` cannot use.
pub fn class_fragment(node: &Node, task: &Task) -> u64 {
    let free = node.free_gpu_milli();
    if task.gpus.is_empty() || !fits_quickly(task, node) {
        return free;
    }
    node.gpus
        .iter()
        .filter(|g| g.healthy)
        .filter(|g| !task.admits(g) || !task.gpus.iter().any(|ask| g.has_room_for(ask)))
        .map(|g| u64::from(g.free_milli()))
        .sum()
}

/// `F_n(M)`: the node's fragmentation for the workload, milli-GPU.
pub fn fragmentation(node: &Node, workload: &Workload) -> f64 {
    workload
        .classes
        .iter()
        .map(|c| c.popularity * class_fragment(node, &c.task) as f64)
        .sum()
}
