//! Scoring policies: which node (and which GPUs on it) a task should take.
//!
//! Every policy scores a trial placement on one node from that node alone,
//! so a caller may cache a node's score until the node changes. Higher
//! scores are better; [`Score`] compares lexicographically.
//!
//! | policy | GPUs on the node | node score |
//! |---|---|---|
//! | `random` | fullest first | none: the caller draws a fitting node uniformly (seeded) |
//! | `binpack` | fullest first | utilisation after placement (best fit) |
//! | `spread` | emptiest first | 1 − utilisation after placement |
//! | `fgd` | least fragmentation growth | −ΔF_n(M) |
//! | `tessera` | least fragmentation growth, then fullest | −ΔF_n(M) weighed by scarcity (to 10⁻⁶ milli-GPU), then least free GPU compute left on the node |
//!
//! Tessera's default is FGD with two changes. Its fragmentation weighs each
//! class by its popularity per unit of the GPU capacity it can use
//! ([`super::fgd::Weighting::Scarcity`]), so demand bound to a model (or
//! to the few nodes its CPU, memory or GPU count fits) keeps the GPUs only
//! it can use from being taken by demand that could go anywhere. And its
//! ties are broken by best fit at both levels: among GPUs of equal
//! fragmentation growth the fullest, among nodes of equal growth the one
//! left with the least free GPU compute. FGD alone leaves ties to the
//! first node in order, which scatters small tasks over empty nodes whose
//! fragmentation they grow alike; packing them keeps whole nodes free for
//! the multi-GPU tasks. Measured on every openb trace (README): fewer
//! unallocated GPUs than FGD and than best fit.
//!
//! Utilisation is the mean, over the dimensions the node tracks, of the
//! committed share: GPU compute of its healthy GPUs, their memory (where
//! the GPUs report it), CPU, memory.

use std::cmp::Ordering;

use super::fgd::{Fragments, Load, Weighting, Workload};
use super::fit::{
    Emptiest, Fullest, GpuAsk, GpuChoice, Node, Placed, Task, Unfit, WHOLE_GPU, place,
};

/// A scoring policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Uniformly random fitting node.
    Random,
    /// Best fit: the node left fullest.
    Binpack,
    /// The node left emptiest.
    Spread,
    /// Fragmentation gradient descent.
    Fgd,
    /// Tessera's default (see the module table).
    Tessera,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 5] = [
        Policy::Random,
        Policy::Binpack,
        Policy::Spread,
        Policy::Fgd,
        Policy::Tessera,
    ];

    /// The policy's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
            Policy::Fgd => "fgd",
            Policy::Tessera => "tessera",
        }
    }

    /// The policy of this name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether its score reads the target workload.
    pub fn needs_workload(self) -> bool {
        matches!(self, Policy::Fgd | Policy::Tessera)
    }
}

/// A node's score; compared lexicographically by `f64::total_cmp`,
/// higher is better. The first key, for every policy, is the share of the
/// GPUs taken by elastic asks whose measured SM use leaves the ask room
/// ([`super::Gpu::live_headroom`]; 1.0 without elastic asks), so an
/// elastic pod goes where it can borrow idle SMs before the policy's own
/// keys are compared.
#[derive(Debug, Clone, Copy)]
pub struct Score(pub [f64; 3]);

impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .iter()
            .zip(&other.0)
            .map(|(a, b)| a.total_cmp(b))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Score {}

/// A trial placement with its score.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// Where the task would go.
    pub placed: Placed,
    /// How good that is.
    pub score: Score,
}

/// Committed share of the node, 0.0..=1.0 (see the module docs); a node
/// tracking nothing reads as full.
pub fn utilisation(node: &Node) -> f64 {
    let mut shares = Vec::with_capacity(3);
    let healthy = node.gpus.iter().filter(|g| g.healthy);
    let capacity: u64 = healthy.clone().map(|_| 1000u64).sum();
    if capacity > 0 {
        let used: u64 = healthy
            .clone()
            .map(|g| u64::from(g.used_milli.min(1000)))
            .sum();
        shares.push(used as f64 / capacity as f64);
    }
    let memory: u64 = healthy.clone().map(|g| g.memory_mib).sum();
    if memory > 0 {
        let used: u64 = healthy.map(|g| g.used_mib.min(g.memory_mib)).sum();
        shares.push(used as f64 / memory as f64);
    }
    for pool in [node.cpu_milli, node.memory_mib].into_iter().flatten() {
        if pool.capacity > 0 {
            shares.push((pool.used.min(pool.capacity)) as f64 / pool.capacity as f64);
        }
    }
    if shares.is_empty() {
        return 1.0;
    }
    shares.iter().sum::<f64>() / shares.len() as f64
}

/// Places `task` on `node` under `policy` and scores the result. `workload`
/// is read by the fragmentation-aware policies only.
pub fn evaluate(
    policy: Policy,
    task: &Task,
    node: &Node,
    workload: &Workload,
) -> Result<Scored, Unfit> {
    let (placed, keys) = match policy {
        Policy::Random => (place(task, node, &mut Fullest)?, [0.0, 0.0]),
        Policy::Binpack => {
            let placed = place(task, node, &mut Fullest)?;
            let u = utilisation(&placed.after);
            (placed, [u, 0.0])
        }
        Policy::Spread => {
            let placed = place(task, node, &mut Emptiest)?;
            let u = utilisation(&placed.after);
            (placed, [1.0 - u, 0.0])
        }
        Policy::Fgd | Policy::Tessera => {
            let weighting = if policy == Policy::Tessera {
                Weighting::Scarcity
            } else {
                Weighting::Popularity
            };
            let prepared = Fragments::new(node, workload, weighting);
            let before = prepared.total();
            let mut choice = LeastFragment {
                workload,
                weighting,
                fullest_on_ties: policy == Policy::Tessera,
                fragments: Some(prepared),
            };
            let placed = place(task, node, &mut choice)?;
            // The choice's breakdown, updated GPU by GPU, describes the
            // node after placement unless the task also took CPU or memory
            // (or had several asks placed on a changed node).
            let after = match choice.fragments.take() {
                Some(f) if f.describes(&placed.after) => f.total(),
                _ => Fragments::new(&placed.after, workload, weighting).total(),
            };
            let growth = after - before;
            let keys = if policy == Policy::Tessera {
                // Fragmentation is a sum of products of popularities and
                // milli: equal growths may differ in the last bits, so
                // compare them to a millionth of a milli-GPU.
                let growth = (growth * 1e6).round() / 1e6;
                [-growth, -(placed.after.free_gpu_milli() as f64)]
            } else {
                [-growth, 0.0]
            };
            (placed, keys)
        }
    };
    let room = live_room(task, node, &placed);
    Ok(Scored {
        placed,
        score: Score([room, keys[0], keys[1]]),
    })
}

/// Share of the GPUs taken by `task`'s elastic asks whose measured use on
/// `node` (before the placement) leaves the ask room; 1.0 when the task
/// has no elastic ask.
fn live_room(task: &Task, node: &Node, placed: &Placed) -> f64 {
    let (mut taken, mut roomy) = (0u32, 0u32);
    for (ask, (_, gpus)) in task.gpus.iter().zip(&placed.containers) {
        if !ask.elastic {
            continue;
        }
        for &i in gpus {
            taken += 1;
            roomy += u32::from(node.gpus[i].live_headroom() >= ask.milli);
        }
    }
    if taken == 0 {
        1.0
    } else {
        f64::from(roomy) / f64::from(taken)
    }
}

/// GPU choice of FGD: one GPU at a time, the one whose use grows the
/// node's fragmentation least; ties to the fullest (Tessera) or the first.
struct LeastFragment<'a> {
    workload: &'a Workload,
    weighting: Weighting,
    fullest_on_ties: bool,
    /// The breakdown of the node last chosen on, kept up to date with what
    /// was taken; reused when it describes the next node asked about.
    fragments: Option<Fragments<'a>>,
}

impl GpuChoice for LeastFragment<'_> {
    fn choose(&mut self, node: &Node, ask: &GpuAsk, fitting: &[usize]) -> Vec<usize> {
        // The node's fragmentation per class, updated as GPUs are taken,
        // so each candidate costs one pass over the classes.
        let mut fragments = match self.fragments.take() {
            Some(f) if f.describes(node) => f,
            _ => Fragments::new(node, self.workload, self.weighting),
        };
        let mut loads: Vec<Load> = node
            .gpus
            .iter()
            .map(|g| (g.used_mib, g.used_milli))
            .collect();
        let mut left: Vec<usize> = fitting.to_vec();
        let mut chosen = Vec::with_capacity(ask.count as usize);
        for _ in 0..ask.count {
            let mut best: Option<(usize, f64, u32, Load)> = None;
            let mut seen: Vec<(Load, u64, &str)> = Vec::new();
            for (k, &i) in left.iter().enumerate() {
                let g = &node.gpus[i];
                // GPUs alike in what the classes look at give the same
                // result (the workload's classes carry no UUID rules).
                let key = (loads[i], g.memory_mib, &*g.model);
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                let before = loads[i];
                let after = (
                    before.0 + ask.memory.mib_on(g.memory_mib),
                    before.1 + ask.milli,
                );
                let f = fragments.total_with(g, before, after);
                let free = WHOLE_GPU.saturating_sub(before.1);
                let better = match best {
                    None => true,
                    Some((_, bf, bfree, _)) => {
                        f < bf - 1e-9
                            || (self.fullest_on_ties && (f - bf).abs() <= 1e-9 && free < bfree)
                    }
                };
                if better {
                    best = Some((k, f, free, after));
                }
            }
            let Some((k, _, _, after)) = best else { break };
            let i = left.remove(k);
            fragments.apply(i, &node.gpus[i], loads[i], after);
            loads[i] = after;
            chosen.push(i);
        }
        self.fragments = Some(fragments);
        chosen
    }
}
