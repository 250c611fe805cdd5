//! A lower bound on the GPUs any policy leaves unallocated, for the
//! workload that arrived: `simulate --bound`.
//!
//! The simulator's figure is `unallocated = capacity − allocated`, in
//! milli-GPU, where `allocated` sums the GPU compute (`num_gpu ×
//! gpu_milli`) of the arrived tasks that were placed. So a bound on
//! unallocated GPUs is `capacity − A*`, where `A*` is at least the most
//! GPU compute any placement of the arrived task multiset could allocate.
//!
//! `A*` is the optimum of a linear programme (LP) over classes of
//! identical nodes (same CPU, memory, healthy GPU models) and of
//! identical tasks. Variable `x[j][k] ≥ 0` is the number of tasks of
//! class `j` placed on nodes of class `k`; it exists only where a task of
//! `j` fits an empty node of `k` (CPU, memory, enough GPUs admitted by its
//! model rule). Maximise `Σ x[j][k] · gpu(j)` subject to:
//!
//! - per task class, `Σ_k x[j][k] ≤ arrived(j)`;
//! - per node class `k` of `N` nodes, CPU, memory and GPU compute:
//!   `Σ_j x[j][k] · need(j) ≤ N · capacity(k)`;
//! - per node class and `q` in 1..=[`CUTS`], *large items*: each GPU
//!   holds at most `q` shares of more than `1000 / (q + 1)` milli (whole
//!   GPUs included), and each node at most `q` tasks asking for more than
//!   `1 / (q + 1)` of its CPU, of its memory, or of its GPUs taken whole.
//!
//! Why it is a bound: whatever a policy does, its end state places some
//! of the arrived tasks, each whole on one node that it fits. Counting
//! them by task and node class gives integral `x` meeting every
//! constraint above (each holds node by node, or GPU by GPU, and summing
//! over the `N` nodes of a class gives the class's), with objective equal
//! to the GPU compute allocated. The LP's feasible set contains every
//! such end state, so its optimum is at least any policy's allocation
//! and `capacity − optimum` at most any policy's unallocated GPUs. Nodes
//! mixing GPU models are bounded by their GPU compute as a whole (a
//! relaxation: still a bound). An allocation is a whole number of
//! milli-GPU, so none exceeds the optimum's floor; the solver's value is
//! raised by a millionth before the floor is taken, far above its
//! floating-point error. CPU-only tasks allocate no GPU: the LP may leave
//! them out, which only relaxes it.
//!
//! The LP is solved by `microlp` (pure Rust simplex) through `good_lp`.

use std::collections::HashMap;

use good_lp::{Expression, ProblemVariables, Solution, SolverModel, Variable, microlp, variable};
use thiserror::Error;

use crate::placement::{Node, Task, WHOLE_GPU};

/// Large-item cuts per resource: `q` in `1..=CUTS`.
pub const CUTS: u32 = 4;

/// Why the bound could not be computed.
#[derive(Debug, Error)]
pub enum BoundError {
    /// The solver gave no optimum (it should always find one: the LP is
    /// feasible at zero and bounded by the arrived tasks).
    #[error("bound's linear programme over {tasks} task and {nodes} node classes has no optimum")]
    Solve {
        /// Task classes with a variable.
        tasks: usize,
        /// Node classes.
        nodes: usize,
        /// The solver's reason.
        #[source]
        source: good_lp::ResolutionError,
    },
    /// The arrived counts do not match the task classes.
    #[error("bound's arrivals name {counts} task classes, the workload has {classes}")]
    Arrivals {
        /// Counts given.
        counts: usize,
        /// Classes given.
        classes: usize,
    },
}

/// Nodes alike for the bound: how many, and one of them emptied.
#[derive(Debug, Clone)]
struct NodeClass {
    count: u64,
    node: Node,
}

/// Groups nodes by CPU and memory capacity and healthy GPU models.
fn node_classes(nodes: &[Node]) -> Vec<NodeClass> {
    type Key = (Option<u64>, Option<u64>, Vec<String>);
    let mut index: HashMap<Key, usize> = HashMap::new();
    let mut classes: Vec<NodeClass> = Vec::new();
    for n in nodes {
        let mut models: Vec<String> = n
            .gpus
            .iter()
            .filter(|g| g.healthy)
            .map(|g| g.model.to_string())
            .collect();
        models.sort();
        let key = (
            n.cpu_milli.map(|p| p.capacity),
            n.memory_mib.map(|p| p.capacity),
            models,
        );
        match index.get(&key) {
            Some(&i) => classes[i].count += 1,
            None => {
                index.insert(key, classes.len());
                classes.push(NodeClass {
                    count: 1,
                    node: n.emptied(),
                });
            }
        }
    }
    classes
}

/// Whether `task` (one GPU ask or none, as trace tasks are) fits the
/// empty `node`: CPU, memory, and for each ask enough admitted healthy
/// GPUs that could hold one GPU of it.
fn fits_empty(task: &Task, node: &Node) -> bool {
    node.cpu_milli.is_none_or(|p| p.capacity >= task.cpu_milli)
        && node
            .memory_mib
            .is_none_or(|p| p.capacity >= task.memory_mib)
        && task.gpus.iter().all(|ask| {
            let usable = node
                .gpus
                .iter()
                .filter(|g| task.admits(g) && g.has_room_at(0, 0, ask))
                .count();
            usable >= ask.count as usize
        })
}

/// A task's size in one node-level resource.
type Size = fn(&Task) -> u64;

/// GPUs a task takes whole (a share does not hold its GPU).
fn whole_gpus(task: &Task) -> u64 {
    task.gpus
        .iter()
        .filter(|a| a.milli >= WHOLE_GPU)
        .map(|a| u64::from(a.count))
        .sum()
}

/// Healthy GPUs of a node.
fn healthy(node: &Node) -> u64 {
    node.gpus.iter().filter(|g| g.healthy).count() as u64
}

/// Whether an item of `size` is larger than `1 / (q + 1)` of `capacity`.
fn large(size: u64, capacity: u64, q: u32) -> bool {
    size.saturating_mul(u64::from(q) + 1) > capacity
}

/// The most GPU compute, in milli-GPU, that placing at most `arrived[j]`
/// tasks of each class `tasks[j]` on `nodes` (all empty) can allocate,
/// by the LP of the module docs: the floor of its optimum (allocations
/// are whole milli), with room for the solver's rounding.
///
/// # Errors
/// [`BoundError`] when the counts do not match the classes or the solver
/// fails.
pub fn most_allocatable(
    nodes: &[Node],
    tasks: &[Task],
    arrived: &[u64],
) -> Result<u64, BoundError> {
    if tasks.len() != arrived.len() {
        return Err(BoundError::Arrivals {
            counts: arrived.len(),
            classes: tasks.len(),
        });
    }
    let classes = node_classes(nodes);
    let mut vars = ProblemVariables::new();
    // Per node class, its variables as (task index, variable).
    let mut on: Vec<Vec<(usize, Variable)>> = vec![Vec::new(); classes.len()];
    let mut objective = Expression::default();
    let mut per_task: Vec<Expression> = vec![Expression::default(); tasks.len()];
    let mut with_vars = 0;
    for (j, task) in tasks.iter().enumerate() {
        let gpu = task.gpu_milli();
        if gpu == 0 || arrived[j] == 0 {
            continue;
        }
        let mut any = false;
        for (k, class) in classes.iter().enumerate() {
            if !fits_empty(task, &class.node) {
                continue;
            }
            let x = vars.add(variable().min(0.0).max(arrived[j] as f64));
            objective += x * (gpu as f64 / f64::from(WHOLE_GPU));
            per_task[j] += x;
            on[k].push((j, x));
            any = true;
        }
        with_vars += usize::from(any);
    }
    let mut problem = vars.maximise(objective.clone()).using(microlp);
    for (j, expr) in per_task.into_iter().enumerate() {
        if arrived[j] > 0 && tasks[j].gpu_milli() > 0 {
            problem.add_constraint(expr.leq(arrived[j] as f64));
        }
    }
    for (class, vars) in classes.iter().zip(&on) {
        if vars.is_empty() {
            continue;
        }
        for constraint in class_constraints(class, tasks, vars) {
            problem.add_constraint(constraint);
        }
    }
    let solution = problem.solve().map_err(|source| BoundError::Solve {
        tasks: with_vars,
        nodes: classes.len(),
        source,
    })?;
    let milli = solution.eval(&objective).max(0.0) * f64::from(WHOLE_GPU);
    // Allocations are whole milli, so none exceeds the floor of the true
    // optimum; the solver's own error is far below a millionth.
    Ok((milli + 1e-6 * milli.max(1.0)).floor() as u64)
}

/// The capacity and large-item constraints of one node class (module
/// docs), each scaled to about 1 so the simplex stays well conditioned.
fn class_constraints(
    class: &NodeClass,
    tasks: &[Task],
    vars: &[(usize, Variable)],
) -> Vec<good_lp::Constraint> {
    let n = class.count as f64;
    let gpus = healthy(&class.node);
    let mut out = Vec::new();
    // Node-level sizes: GPUs held whole (shares do not hold a GPU), CPU,
    // memory.
    let mut sized: Vec<(u64, Size)> = vec![(gpus, whole_gpus)];
    if let Some(cpu) = class.node.cpu_milli {
        sized.push((cpu.capacity, |t| t.cpu_milli));
    }
    if let Some(memory) = class.node.memory_mib {
        sized.push((memory.capacity, |t| t.memory_mib));
    }
    for (capacity, size) in &sized {
        if *capacity == 0 {
            continue;
        }
        let mut total = Expression::default();
        for &(j, x) in vars {
            total += x * (size(&tasks[j]) as f64 / *capacity as f64);
        }
        out.push(total.leq(n));
        for q in 1..=CUTS {
            let mut large_ones = Expression::default();
            for &(j, x) in vars {
                if large(size(&tasks[j]), *capacity, q) {
                    large_ones += x;
                }
            }
            out.push(large_ones.leq(f64::from(q) * n));
        }
    }
    // GPU compute, and shares per GPU.
    if gpus > 0 {
        let g = gpus as f64 * n;
        let mut compute = Expression::default();
        for &(j, x) in vars {
            compute += x * (tasks[j].gpu_milli() as f64 / f64::from(WHOLE_GPU));
        }
        out.push(compute.leq(g));
        for q in 1..=CUTS {
            let mut shares = Expression::default();
            for &(j, x) in vars {
                let slots: u32 = tasks[j]
                    .gpus
                    .iter()
                    .filter(|a| large(u64::from(a.milli), u64::from(WHOLE_GPU), q))
                    .map(|a| a.count)
                    .sum();
                if slots > 0 {
                    shares += x * f64::from(slots);
                }
            }
            out.push(shares.leq(f64::from(q) * g));
        }
    }
    out
}

/// The bound on unallocated GPUs: `capacity_milli` less
/// [`most_allocatable`], in GPUs, never below 0.
///
/// # Errors
/// As [`most_allocatable`].
pub fn unallocated_gpus(
    nodes: &[Node],
    tasks: &[Task],
    arrived: &[u64],
    capacity_milli: u64,
) -> Result<f64, BoundError> {
    let most = most_allocatable(nodes, tasks, arrived)?;
    Ok(capacity_milli.saturating_sub(most) as f64 / f64::from(WHOLE_GPU))
}

#[cfg(test)]
mod tests;
