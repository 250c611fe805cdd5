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
//! The node's fragmentation is the weighted sum `F_n(M) = Σ_m w_m F_n(m)`,
//! in milli-GPU. FGD weighs each class by its popularity (`w_m = p_m`) and
//! places a task where `F_n(M)` grows least (the steepest descent of
//! fragmentation). Unhealthy GPUs are no capacity and never count.
//!
//! [`Weighting::Scarcity`] weighs each class by its popularity per unit of
//! the GPU capacity it can use: `w_m = p_m · S / S_m`, where `S` is the
//! cluster's healthy GPUs and `S_m` those on nodes that an empty `m` fits
//! (CPU, memory, GPU count) and that `m`'s model rule admits
//! ([`Workload::with_supply`]). A class free to go anywhere keeps `p_m`;
//! one that only a tenth of the GPUs can take weighs ten times its
//! popularity, as its arrivals fall on a tenth of the capacity. The
//! effect: a task that could go anywhere, placed on a GPU a scarce class
//! cannot use, lowers that class's fragment (all of such a node's free
//! compute is fragment to it) by `w_m` per milli, and on a GPU it can use
//! leaves the fragment as is or grows it; so general demand is steered off
//! the capacity that constrained demand depends on, as much as that
//! demand weighs on it. Without model rules or scarce shapes every `S_m =
//! S` and the weighting is FGD's, scaled.

use super::fit::{Gpu, Node, Task, WHOLE_GPU, fits_quickly};

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
    /// Per class, [`Weighting::Popularity`]'s weights.
    popularity: Vec<f64>,
    /// Per class, [`Weighting::Scarcity`]'s weights (the popularities
    /// until [`Workload::with_supply`]).
    scarcity: Vec<f64>,
}

/// How a fragmentation sum weighs the workload's classes (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weighting {
    /// By popularity, as FGD.
    Popularity,
    /// By popularity per unit of the GPU capacity the class can use.
    Scarcity,
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
        Self::of(classes)
    }

    /// A workload of these classes, weighed by popularity alone.
    fn of(classes: Vec<TaskClass>) -> Self {
        let popularity: Vec<f64> = classes.iter().map(|c| c.popularity).collect();
        Self {
            scarcity: popularity.clone(),
            popularity,
            classes,
        }
    }

    /// This workload with its [`Weighting::Scarcity`] weights set for the
    /// cluster `nodes` (module docs). A class no node can take weighs 0:
    /// its fragment is every free milli of every node, which no placement
    /// changes differently from another.
    pub fn with_supply<'n>(mut self, nodes: impl IntoIterator<Item = &'n Node>) -> Self {
        let nodes: Vec<&Node> = nodes.into_iter().collect();
        let total: u64 = nodes
            .iter()
            .map(|n| n.gpus.iter().filter(|g| g.healthy).count() as u64)
            .sum();
        self.scarcity = self
            .classes
            .iter()
            .map(|c| {
                let usable: u64 = nodes.iter().map(|n| usable_gpus(&c.task, n)).sum();
                if usable == 0 || c.task.gpus.is_empty() {
                    0.0
                } else {
                    c.popularity * total as f64 / usable as f64
                }
            })
            .collect();
        self
    }

    /// The classes' weights under `weighting`, in class order.
    pub fn weights(&self, weighting: Weighting) -> &[f64] {
        match weighting {
            Weighting::Popularity => &self.popularity,
            Weighting::Scarcity => &self.scarcity,
        }
    }

    /// The `k` most popular classes (earlier ones first among equals),
    /// their popularities scaled to sum to 1 again.
    pub fn most_popular(mut self, k: usize) -> Self {
        if self.classes.len() > k {
            self.classes
                .sort_by(|a, b| b.popularity.total_cmp(&a.popularity));
            self.classes.truncate(k);
            let total: f64 = self.classes.iter().map(|c| c.popularity).sum();
            if total > 0.0 {
                for c in &mut self.classes {
                    c.popularity /= total;
                }
            }
            return Self::of(self.classes);
        }
        self
    }

    /// Its classes.
    pub fn classes(&self) -> &[TaskClass] {
        &self.classes
    }
}

/// Healthy GPUs of `node` that `task` could use were the node empty: all
/// it admits if the empty node takes the task (CPU, memory, enough
/// admitted GPUs for every ask), else none.
fn usable_gpus(task: &Task, node: &Node) -> u64 {
    let takes = node.cpu_milli.is_none_or(|p| p.capacity >= task.cpu_milli)
        && node
            .memory_mib
            .is_none_or(|p| p.capacity >= task.memory_mib);
    if !takes {
        return 0;
    }
    let open = task.is_open();
    let admitted = |g: &&Gpu| if open { g.healthy } else { task.admits(g) };
    let enough = task.gpus.iter().all(|ask| {
        node.gpus
            .iter()
            .filter(admitted)
            .filter(|g| g.has_room_at(0, 0, ask))
            .count()
            >= ask.count as usize
    });
    if enough {
        node.gpus.iter().filter(admitted).count() as u64
    } else {
        0
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

/// `F_n(M)`: the node's fragmentation for the workload weighed by
/// `weighting`, milli-GPU. This is the definition, recounted over every
/// class and GPU; placement uses [`Fragments`], which is tested to give
/// the same to the bit.
pub fn fragmentation(node: &Node, workload: &Workload, weighting: Weighting) -> f64 {
    workload
        .classes
        .iter()
        .zip(workload.weights(weighting))
        .map(|(c, w)| w * class_fragment(node, &c.task) as f64)
        .sum()
}

/// A node's fragmentation broken down per class, so that the effect of a
/// change to one GPU costs one pass over the classes instead of one over
/// classes × GPUs, without allocating. [`Fragments::total`] equals
/// [`fragmentation`] of the node it describes, to the bit (same terms,
/// same order).
///
/// Per class it keeps whether the node takes the class at all apart from
/// GPU room (CPU, memory: unchanged by a GPU change), how many admitted
/// GPUs have room for each of the class's asks, and the free milli of the
/// admitted GPUs that can take one GPU of some ask. `F_n(m)` is the
/// node's healthy free milli minus the latter when every ask finds
/// `count` GPUs with room, else all of it.
#[derive(Debug, Clone)]
pub struct Fragments<'w> {
    workload: &'w Workload,
    /// The classes' weights.
    weights: &'w [f64],
    /// Healthy free milli of the node.
    free: u64,
    /// Per class, in the workload's order.
    classes: Vec<ClassState>,
    /// Per class and ask (flattened; class `k`'s asks start at
    /// `classes[k].first`): admitted GPUs with room for one GPU of it.
    rooms: Vec<u32>,
    /// What the breakdown was built from, to tell whether it describes a
    /// given node.
    built_from: Fingerprint,
}

#[derive(Debug, Clone)]
struct ClassState {
    /// The node-level check (CPU, memory) passes and the class asks for
    /// GPUs.
    takes: bool,
    /// The class has no model or UUID rule: every healthy GPU admits it.
    open: bool,
    /// Index of its first ask in `rooms`.
    first: usize,
    /// Free milli of the admitted GPUs with room for one GPU of some ask.
    useful: u64,
}

/// A GPU's commitments: `(used_mib, used_milli)`.
pub type Load = (u64, u32);

/// The parts of a node a breakdown reads.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    pools: [Option<(u64, u64)>; 2],
    gpus: Vec<(Load, bool)>,
}

impl Fingerprint {
    fn of(node: &Node) -> Self {
        let pool = |p: Option<super::fit::Pool>| p.map(|p| (p.capacity, p.used));
        Self {
            pools: [pool(node.cpu_milli), pool(node.memory_mib)],
            gpus: node
                .gpus
                .iter()
                .map(|g| ((g.used_mib, g.used_milli), g.healthy))
                .collect(),
        }
    }
}

impl<'w> Fragments<'w> {
    /// The breakdown of `node` for `workload` weighed by `weighting`.
    pub fn new(node: &Node, workload: &'w Workload, weighting: Weighting) -> Self {
        let mut rooms = Vec::new();
        let mut classes: Vec<ClassState> = workload
            .classes
            .iter()
            .map(|c| {
                let first = rooms.len();
                rooms.resize(first + c.task.gpus.len(), 0);
                ClassState {
                    takes: !c.task.gpus.is_empty() && node_level_takes(node, &c.task),
                    open: c.task.is_open(),
                    first,
                    useful: 0,
                }
            })
            .collect();
        let mut free = 0;
        for g in node.gpus.iter().filter(|g| g.healthy) {
            let load = (g.used_mib, g.used_milli);
            free += u64::from(g.free_milli());
            for (state, class) in classes.iter_mut().zip(&workload.classes) {
                let task = &class.task;
                if !state.admits(task, g) {
                    continue;
                }
                let asks = &mut rooms[state.first..state.first + task.gpus.len()];
                let mut useful = false;
                for (r, ask) in asks.iter_mut().zip(&task.gpus) {
                    if g.has_room_at(load.0, load.1, ask) {
                        *r += 1;
                        useful = true;
                    }
                }
                if useful {
                    state.useful += u64::from(WHOLE_GPU.saturating_sub(load.1));
                }
            }
        }
        Self {
            workload,
            weights: workload.weights(weighting),
            free,
            classes,
            rooms,
            built_from: Fingerprint::of(node),
        }
    }

    /// Whether this breakdown describes `node` as it stands.
    pub fn describes(&self, node: &Node) -> bool {
        self.built_from == Fingerprint::of(node)
    }

    /// `F_n(M)` of the node described.
    pub fn total(&self) -> f64 {
        self.workload
            .classes
            .iter()
            .zip(&self.classes)
            .zip(self.weights)
            .map(|((c, s), w)| {
                let rooms = &self.rooms[s.first..s.first + c.task.gpus.len()];
                let fits = s.takes && rooms.iter().zip(&c.task.gpus).all(|(&r, a)| r >= a.count);
                w * fragment(self.free, fits, s.useful) as f64
            })
            .sum()
    }

    /// `F_n(M)` if `gpu` (one of the node's) went from `before` to `after`
    /// committed.
    pub fn total_with(&self, gpu: &Gpu, before: Load, after: Load) -> f64 {
        if !gpu.healthy {
            return self.total();
        }
        let free = changed_free(self.free, before, after);
        let mut sum = 0.0;
        let classes = self.workload.classes.iter().zip(&self.classes);
        for ((class, state), w) in classes.zip(self.weights) {
            let task = &class.task;
            let rooms = &self.rooms[state.first..state.first + task.gpus.len()];
            let (fits, useful) = if state.admits(task, gpu) {
                let (mut had, mut has) = (false, false);
                let mut fits = state.takes;
                for (&r, ask) in rooms.iter().zip(&task.gpus) {
                    let was = gpu.has_room_at(before.0, before.1, ask);
                    let is = gpu.has_room_at(after.0, after.1, ask);
                    (had, has) = (had || was, has || is);
                    fits &= r - u32::from(was) + u32::from(is) >= ask.count;
                }
                let useful = state.useful - if had { free_of(before) } else { 0 }
                    + if has { free_of(after) } else { 0 };
                (fits, useful)
            } else {
                let fits = state.takes && rooms.iter().zip(&task.gpus).all(|(&r, a)| r >= a.count);
                (fits, state.useful)
            };
            sum += w * fragment(free, fits, useful) as f64;
        }
        sum
    }

    /// Records that GPU `index` of the node went from `before` to `after`
    /// committed.
    pub fn apply(&mut self, index: usize, gpu: &Gpu, before: Load, after: Load) {
        if let Some(entry) = self.built_from.gpus.get_mut(index) {
            entry.0 = after;
        }
        if !gpu.healthy {
            return;
        }
        self.free = changed_free(self.free, before, after);
        for (state, class) in self.classes.iter_mut().zip(&self.workload.classes) {
            let task = &class.task;
            if !state.admits(task, gpu) {
                continue;
            }
            let rooms = &mut self.rooms[state.first..state.first + task.gpus.len()];
            let (mut had, mut has) = (false, false);
            for (r, ask) in rooms.iter_mut().zip(&task.gpus) {
                let was = gpu.has_room_at(before.0, before.1, ask);
                let is = gpu.has_room_at(after.0, after.1, ask);
                (had, has) = (had || was, has || is);
                *r = *r - u32::from(was) + u32::from(is);
            }
            if had {
                state.useful -= free_of(before);
            }
            if has {
                state.useful += free_of(after);
            }
        }
    }
}

impl ClassState {
    /// Whether healthy GPU `g` admits the class.
    fn admits(&self, task: &Task, g: &Gpu) -> bool {
        if self.open { g.healthy } else { task.admits(g) }
    }
}

/// Free milli of a GPU at `load`.
fn free_of(load: Load) -> u64 {
    u64::from(WHOLE_GPU.saturating_sub(load.1))
}

/// The node's healthy free milli after one healthy GPU's change.
fn changed_free(free: u64, before: Load, after: Load) -> u64 {
    free - free_of(before) + free_of(after)
}

/// `F_n(m)`: all free milli unless the class fits, else what the GPUs
/// useful to it do not offer.
fn fragment(free: u64, fits: bool, useful: u64) -> u64 {
    if fits { free - useful } else { free }
}

/// Whether the node-level resources (CPU, memory) take `task`.
fn node_level_takes(node: &Node, task: &Task) -> bool {
    node.cpu_milli.is_none_or(|p| p.free() >= task.cpu_milli)
        && node.memory_mib.is_none_or(|p| p.free() >= task.memory_mib)
}
