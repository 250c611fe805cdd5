//! Workload inflation (Weng et al., ATC '23): tasks drawn from the trace
//! with replacement, in a seeded order, are submitted one by one to the
//! whole cluster until the GPU compute they request reaches the cluster's
//! GPU capacity. A task that fits no node is dropped (never retried) and
//! still counts as requested; tasks are never removed.
//!
//! Each run draws the same task sequence for a seed whatever the policy,
//! so policies are compared on identical arrivals.

use std::collections::HashMap;

use crate::placement::rng::Rng;
use crate::placement::{Node, Policy, Score, Task, Workload, evaluate};

/// Distinct tasks of a trace and which one each trace task is.
#[derive(Debug, Clone)]
pub struct Classes {
    /// The distinct tasks.
    pub tasks: Vec<Task>,
    /// For each trace task, its index in `tasks`.
    pub of: Vec<usize>,
}

impl Classes {
    /// Groups identical tasks.
    pub fn new(tasks: &[Task]) -> Self {
        let mut index = std::collections::HashMap::<&Task, usize>::new();
        let mut distinct = Vec::new();
        let of = tasks
            .iter()
            .map(|t| {
                *index.entry(t).or_insert_with(|| {
                    distinct.push(t.clone());
                    distinct.len() - 1
                })
            })
            .collect();
        Self {
            tasks: distinct,
            of,
        }
    }
}

/// What one run ended with.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The policy.
    pub policy: Policy,
    /// The seed of the task sequence.
    pub seed: u64,
    /// Tasks submitted.
    pub arrived: u64,
    /// Tasks placed.
    pub placed: u64,
    /// Tasks submitted that asked for GPU.
    pub gpu_arrived: u64,
    /// Tasks placed that asked for GPU.
    pub gpu_placed: u64,
    /// GPU compute requested by the submitted tasks, milli-GPU.
    pub requested_milli: u64,
    /// GPU compute allocated at the end, milli-GPU.
    pub allocated_milli: u64,
    /// GPU capacity of the cluster, milli-GPU.
    pub capacity_milli: u64,
}

impl Run {
    /// Share of the requested GPU compute that was allocated, 0.0..=1.0.
    pub fn allocated_share(&self) -> f64 {
        if self.requested_milli == 0 {
            return 1.0;
        }
        self.allocated_milli as f64 / self.requested_milli as f64
    }

    /// GPU capacity not allocated at the end, in GPUs (1 GPU = 1000
    /// milli); at 100 % arrived workload this is what fragmentation (and
    /// CPU or memory shortage) left unallocatable.
    pub fn unallocated_gpus(&self) -> f64 {
        self.capacity_milli.saturating_sub(self.allocated_milli) as f64 / 1000.0
    }
}

/// A node's version and its cached score for one class (None: unfit).
type Cached = (u32, Option<Score>);

/// (class, node kind, CPU used, memory used, GPU compute used per GPU).
type StateKey = (usize, usize, u64, u64, Vec<u32>);

/// The cluster when the requested GPU first reached `fraction` of capacity.
pub type Snapshot = Vec<Node>;

/// One inflation run of `policy` with `seed`. `snapshot_at` (a fraction of
/// capacity) asks for a copy of the cluster when that much was requested.
///
/// # Panics
/// Never for valid input; callers ensure the trace has a GPU task (else
/// inflation would not end), see [`has_gpu_task`].
pub fn run(
    nodes: &[Node],
    tasks: &[Task],
    classes: &Classes,
    workload: &Workload,
    policy: Policy,
    seed: u64,
    snapshot_at: Option<f64>,
) -> (Run, Option<Snapshot>) {
    assert!(has_gpu_task(tasks), "inflation needs a task asking for GPU");
    let mut nodes = nodes.to_vec();
    let capacity_milli: u64 = nodes.iter().map(Node::free_gpu_milli).sum();
    let mut choices = Rng::new(seed ^ 0x5eed_0fc4_01ce);
    // Per node: a version bumped on every change, and per task class the
    // cached (version, score) of its trial placement (None: unfit).
    let mut version = vec![0u32; nodes.len()];
    let mut cache: Vec<Vec<Option<Cached>>> = vec![vec![None; classes.tasks.len()]; nodes.len()];
    let mut result = Run {
        policy,
        seed,
        arrived: 0,
        placed: 0,
        gpu_arrived: 0,
        gpu_placed: 0,
        requested_milli: 0,
        allocated_milli: 0,
        capacity_milli,
    };
    let mut snapshot = None;
    // Nodes alike in capacity and models, in the same state, score alike:
    // (class, kind, CPU used, memory used, GPU compute used) -> score.
    let kinds = node_kinds(&nodes);
    let mut memo: HashMap<StateKey, Option<Score>> = HashMap::new();
    for class in Arrivals::new(classes, capacity_milli, seed) {
        let task = &classes.tasks[class];
        let gpu = task.gpu_milli();
        result.arrived += 1;
        result.requested_milli += gpu;
        if gpu > 0 {
            result.gpu_arrived += 1;
        }
        let mut best: Option<(usize, Score)> = None;
        let mut fitting = 0u64;
        for (i, node) in nodes.iter().enumerate() {
            let score = match cache[i][class] {
                Some((v, score)) if v == version[i] => score,
                _ => {
                    let key = (
                        class,
                        kinds[i],
                        node.cpu_milli.map_or(0, |p| p.used),
                        node.memory_mib.map_or(0, |p| p.used),
                        node.gpus.iter().map(|g| g.used_milli).collect(),
                    );
                    let score = *memo.entry(key).or_insert_with(|| {
                        evaluate(policy, task, node, workload).ok().map(|s| s.score)
                    });
                    cache[i][class] = Some((version[i], score));
                    score
                }
            };
            let Some(score) = score else { continue };
            fitting += 1;
            if policy == Policy::Random {
                // Reservoir sampling: each fitting node kept with equal chance.
                if choices.below(fitting) == 0 {
                    best = Some((i, score));
                }
            } else if best.is_none_or(|(_, b)| score.cmp(&b).is_gt()) {
                best = Some((i, score));
            }
        }
        if let Some((i, _)) = best
            && let Ok(scored) = evaluate(policy, task, &nodes[i], workload)
        {
            nodes[i] = scored.placed.after;
            version[i] += 1;
            result.placed += 1;
            result.allocated_milli += gpu;
            if gpu > 0 {
                result.gpu_placed += 1;
            }
        }
        if let Some(fraction) = snapshot_at
            && snapshot.is_none()
            && result.requested_milli as f64 >= fraction * capacity_milli as f64
        {
            snapshot = Some(nodes.clone());
        }
    }
    (result, snapshot)
}

/// The task classes of one run's arrivals, in order: trace tasks drawn
/// with replacement by a generator seeded with the run's seed, until the
/// GPU compute they request reaches the capacity. The same for every
/// policy.
#[derive(Debug, Clone)]
pub struct Arrivals<'a> {
    classes: &'a Classes,
    draws: Rng,
    requested_milli: u64,
    capacity_milli: u64,
}

impl<'a> Arrivals<'a> {
    /// The arrivals of the run with `seed` on a cluster of `capacity_milli`.
    pub fn new(classes: &'a Classes, capacity_milli: u64, seed: u64) -> Self {
        Self {
            classes,
            draws: Rng::new(seed),
            requested_milli: 0,
            capacity_milli,
        }
    }

    /// How many tasks of each class arrive in all.
    ///
    /// # Panics
    /// As [`run`], when no class asks for GPU (the arrivals never end).
    pub fn counts(self) -> Vec<u64> {
        assert!(
            has_gpu_task(&self.classes.tasks),
            "inflation needs a task asking for GPU"
        );
        let mut counts = vec![0; self.classes.tasks.len()];
        for class in self {
            counts[class] += 1;
        }
        counts
    }
}

impl Iterator for Arrivals<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.requested_milli >= self.capacity_milli || self.classes.of.is_empty() {
            return None;
        }
        let pick = self.draws.below(self.classes.of.len() as u64) as usize;
        let class = self.classes.of[pick];
        self.requested_milli += self.classes.tasks[class].gpu_milli();
        Some(class)
    }
}

/// For each node, the index of its kind: nodes of one kind have the same
/// CPU and memory capacity and the same GPU models and health in order.
/// (Trace tasks carry no UUID rules and no GPU memory, so a node's kind
/// and its committed CPU, memory and GPU compute decide every score.)
fn node_kinds(nodes: &[Node]) -> Vec<usize> {
    type Kind = (Option<u64>, Option<u64>, Vec<(String, bool)>);
    let mut kinds: HashMap<Kind, usize> = HashMap::new();
    nodes
        .iter()
        .map(|n| {
            let kind = (
                n.cpu_milli.map(|p| p.capacity),
                n.memory_mib.map(|p| p.capacity),
                n.gpus
                    .iter()
                    .map(|g| (g.model.to_string(), g.healthy))
                    .collect(),
            );
            let next = kinds.len();
            *kinds.entry(kind).or_insert(next)
        })
        .collect()
}

/// Whether any task asks for GPU (inflation ends only then).
pub fn has_gpu_task(tasks: &[Task]) -> bool {
    tasks.iter().any(|t| t.gpu_milli() > 0)
}
