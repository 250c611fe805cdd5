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
//! | `tessera` | least fragmentation growth, then fullest | −ΔF_n(M) (to 10⁻⁶ milli-GPU), then least free GPU compute left on the node |
//!
//! Tessera's default is FGD with its ties broken by best fit at both
//! levels: among GPUs of equal fragmentation growth the fullest, among nodes
//! of equal growth the one left with the least free GPU compute. FGD alone
//! leaves ties to the first node in order, which scatters small tasks over
//! empty nodes whose fragmentation they grow alike; packing them keeps
//! whole nodes free for the multi-GPU tasks. Measured on every openb trace
//! (README): fewer unallocated GPUs than FGD and than best fit.
//!
//! Utilisation is the mean, over the dimensions the node tracks, of the
//! committed share: GPU compute of its healthy GPUs, CPU, memory.

use std::cmp::Ordering;

use super::fgd::{Workload, fragmentation};
use super::fit::{Emptiest, Fullest, GpuAsk, GpuChoice, Node, Placed, Task, Unfit, place};

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
/// higher is better.
#[derive(Debug, Clone, Copy)]
pub struct Score(pub [f64; 2]);

impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0[0]
            .total_cmp(&other.0[0])
            .then(self.0[1].total_cmp(&other.0[1]))
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
        let used: u64 = healthy.map(|g| u64::from(g.used_milli.min(1000))).sum();
        shares.push(used as f64 / capacity as f64);
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
    match policy {
        Policy::Random => {
            let placed = place(task, node, &mut Fullest)?;
            Ok(Scored {
                placed,
                score: Score([0.0, 0.0]),
            })
        }
        Policy::Binpack => {
            let placed = place(task, node, &mut Fullest)?;
            let u = utilisation(&placed.after);
            Ok(Scored {
                placed,
                score: Score([u, 0.0]),
            })
        }
        Policy::Spread => {
            let placed = place(task, node, &mut Emptiest)?;
            let u = utilisation(&placed.after);
            Ok(Scored {
                placed,
                score: Score([1.0 - u, 0.0]),
            })
        }
        Policy::Fgd | Policy::Tessera => {
            let before = fragmentation(node, workload);
            let mut choice = LeastFragment {
                workload,
                fullest_on_ties: policy == Policy::Tessera,
            };
            let placed = place(task, node, &mut choice)?;
            let growth = fragmentation(&placed.after, workload) - before;
            let (growth, second) = if policy == Policy::Tessera {
                // Fragmentation is a sum of products of popularities and
                // milli: equal growths may differ in the last bits, so
                // compare them to a millionth of a milli-GPU.
                let growth = (growth * 1e6).round() / 1e6;
                (growth, -(placed.after.free_gpu_milli() as f64))
            } else {
                (growth, 0.0)
            };
            Ok(Scored {
                placed,
                score: Score([-growth, second]),
            })
        }
    }
}

/// GPU choice of FGD: one GPU at a time, the one whose use grows the
/// node's fragmentation least; ties to the fullest (Tessera) or the first.
struct LeastFragment<'a> {
    workload: &'a Workload,
    fullest_on_ties: bool,
}

impl GpuChoice for LeastFragment<'_> {
    fn choose(&mut self, node: &Node, ask: &GpuAsk, fitting: &[usize]) -> Vec<usize> {
        let mut trial = node.clone();
        let mut left: Vec<usize> = fitting.to_vec();
        let mut chosen = Vec::with_capacity(ask.count as usize);
        for _ in 0..ask.count {
            let mut best: Option<(usize, f64, u32)> = None;
            let mut seen: Vec<(u32, u64, &str)> = Vec::new();
            for (k, &i) in left.iter().enumerate() {
                let g = &trial.gpus[i];
                // GPUs alike in what matters give the same result.
                let key = (g.used_milli, g.used_mib, &*g.model);
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                let mut after = trial.clone();
                let a = &mut after.gpus[i];
                a.used_mib += ask.memory.mib_on(a.memory_mib);
                a.used_milli += ask.milli;
                let f = fragmentation(&after, self.workload);
                let free = trial.gpus[i].free_milli();
                let better = match best {
                    None => true,
                    Some((_, bf, bfree)) => {
                        f < bf - 1e-9
                            || (self.fullest_on_ties && (f - bf).abs() <= 1e-9 && free < bfree)
                    }
                };
                if better {
                    best = Some((k, f, free));
                }
            }
            let Some((k, _, _)) = best else { break };
            let i = left.remove(k);
            let g = &mut trial.gpus[i];
            g.used_mib += ask.memory.mib_on(g.memory_mib);
            g.used_milli += ask.milli;
            chosen.push(i);
        }
        chosen
    }
}
