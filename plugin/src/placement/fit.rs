//! Trial placement of one task on one node.
//!
//! A task fits a node when the node has its CPU and memory free (where the
//! node's view tracks them) and every GPU ask can be placed on `count`
//! distinct GPUs that are healthy, admitted by the task's model and UUID
//! rules, and have the ask's memory and compute still free, counting what
//! earlier asks of the same task took. An ask for a whole GPU
//! ([`WHOLE_GPU`] milli) is only placed on an idle GPU: one without any
//! share, memory-only shares included. Which of the fitting GPUs an ask
//! takes is decided in [`super::pick`]'s order: NUMA binding (a hard rule), live
//! SM headroom for elastic asks, the links between the GPUs of a
//! multi-GPU ask, and last the caller's [`GpuChoice`].

use std::sync::Arc;

use super::pick::{NumaUnbound, pick};
use crate::annotations::Selector;
use crate::resources::Memory;

/// Compute of one whole GPU, in milli-GPU (1000 = all its SMs).
pub const WHOLE_GPU: u32 = 1000;

/// One GPU: what it has and what is committed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gpu {
    /// Identifier (a `GPU-…` UUID in the extender); shared, so trial
    /// placements copy nodes cheaply.
    pub uuid: Arc<str>,
    /// Model name.
    pub model: Arc<str>,
    /// Total memory, MiB (0 where memory is not tracked: only asks of 0 MiB fit).
    pub memory_mib: u64,
    /// Memory committed, MiB.
    pub used_mib: u64,
    /// Compute committed, milli-GPU; more than [`WHOLE_GPU`] reads as full.
    pub used_milli: u32,
    /// False for a device that must not take new shares.
    pub healthy: bool,
    /// NUMA node of the card's PCI device, where known.
    pub numa: Option<u32>,
    /// Indices (in the node's `gpus`) of the GPUs this one has an NVLink
    /// to; shared, so trial placements copy it cheaply.
    pub nvlink: Arc<[usize]>,
    /// SM use measured on the card, milli-GPU (0 where not measured):
    /// what elastic shares could borrow is what neither the committed
    /// shares nor this use take.
    pub live_milli: u32,
}

impl Gpu {
    /// Memory not yet committed, MiB.
    pub fn free_mib(&self) -> u64 {
        self.memory_mib.saturating_sub(self.used_mib)
    }

    /// Compute not yet committed, milli-GPU.
    pub fn free_milli(&self) -> u32 {
        WHOLE_GPU.saturating_sub(self.used_milli)
    }

    /// Compute neither committed nor measured in use, milli-GPU.
    pub fn live_headroom(&self) -> u32 {
        WHOLE_GPU.saturating_sub(self.used_milli.max(self.live_milli))
    }

    /// Whether no share holds any of it.
    pub fn is_idle(&self) -> bool {
        self.used_mib == 0 && self.used_milli == 0
    }

    /// Whether one GPU of `ask` fits here now (health and selectors aside).
    pub fn has_room_for(&self, ask: &GpuAsk) -> bool {
        self.has_room_at(self.used_mib, self.used_milli, ask)
    }

    /// Whether one GPU of `ask` would fit with `used_mib` and `used_milli`
    /// committed instead of what is (health and selectors aside).
    pub fn has_room_at(&self, used_mib: u64, used_milli: u32, ask: &GpuAsk) -> bool {
        WHOLE_GPU.saturating_sub(used_milli) >= ask.milli
            && self.memory_mib.saturating_sub(used_mib) >= ask.memory.mib_on(self.memory_mib)
            && (ask.milli < WHOLE_GPU || (used_mib == 0 && used_milli == 0))
    }
}

/// A node-level resource: capacity and what is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pool {
    /// Capacity.
    pub capacity: u64,
    /// Committed.
    pub used: u64,
}

impl Pool {
    /// Not yet committed.
    pub fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.used)
    }
}

/// One node. CPU and memory are `None` where the caller does not track them
/// (the extender leaves them to kube-scheduler's own filters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Node name.
    pub name: Arc<str>,
    /// CPU, milli-cores.
    pub cpu_milli: Option<Pool>,
    /// Memory, MiB.
    pub memory_mib: Option<Pool>,
    /// Its GPUs.
    pub gpus: Vec<Gpu>,
}

impl Node {
    /// Healthy GPU compute not committed, milli-GPU.
    pub fn free_gpu_milli(&self) -> u64 {
        self.gpus
            .iter()
            .filter(|g| g.healthy)
            .map(|g| u64::from(g.free_milli()))
            .sum()
    }

    /// The node with nothing committed.
    pub fn emptied(&self) -> Self {
        let empty = |p: Option<Pool>| p.map(|p| Pool { used: 0, ..p });
        Self {
            name: self.name.clone(),
            cpu_milli: empty(self.cpu_milli),
            memory_mib: empty(self.memory_mib),
            gpus: self
                .gpus
                .iter()
                .map(|g| Gpu {
                    used_mib: 0,
                    used_milli: 0,
                    ..g.clone()
                })
                .collect(),
        }
    }
}

/// One container's GPU request: `count` distinct GPUs, each with `memory`
/// and `milli` compute.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuAsk {
    /// Container (or task) name, for reasons and results.
    pub container: String,
    /// Number of distinct GPUs, at least 1.
    pub count: u32,
    /// Memory on each.
    pub memory: Memory,
    /// Compute on each, milli-GPU (1..=1000; 1000 = a whole, idle GPU).
    pub milli: u32,
    /// All `count` GPUs on one NUMA node (a hard rule; GPUs of unknown
    /// NUMA node never satisfy it for more than one GPU).
    pub numa_bind: bool,
    /// The share is elastic: it may borrow idle SMs, so GPUs whose
    /// measured use leaves it [`Gpu::live_headroom`] are preferred.
    pub elastic: bool,
}

/// Which GPU models a task accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Models {
    /// Include/exclude lists matched as case-insensitive substrings (the
    /// `tessera.dev/gpu-model*` annotations).
    Matching(Selector),
    /// Exactly one of these names (a trace's `gpu_spec`); empty = any.
    OneOf(Vec<String>),
}

impl Default for Models {
    fn default() -> Self {
        Models::OneOf(Vec::new())
    }
}

/// What a task asks of one node.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Task {
    /// CPU, milli-cores (checked only where the node tracks CPU).
    pub cpu_milli: u64,
    /// Memory, MiB (checked only where the node tracks memory).
    pub memory_mib: u64,
    /// GPU asks, placed in order; empty for a CPU-only task.
    pub gpus: Vec<GpuAsk>,
    /// Accepted models.
    pub models: Models,
    /// Accepted GPU UUIDs.
    pub uuids: Selector,
}

impl Task {
    /// GPU compute the task asks for in all, milli-GPU.
    pub fn gpu_milli(&self) -> u64 {
        self.gpus
            .iter()
            .map(|a| u64::from(a.count) * u64::from(a.milli))
            .sum()
    }

    /// Whether the task has no model or UUID rule (every healthy GPU
    /// admits it).
    pub fn is_open(&self) -> bool {
        let models = match &self.models {
            Models::Matching(s) => s.include.is_empty() && s.exclude.is_empty(),
            Models::OneOf(names) => names.is_empty(),
        };
        models && self.uuids.include.is_empty() && self.uuids.exclude.is_empty()
    }

    /// Whether this GPU may take the task's shares at all.
    pub fn admits(&self, gpu: &Gpu) -> bool {
        gpu.healthy && admits(&self.models, &self.uuids, &gpu.uuid, &gpu.model)
    }
}

/// Whether a GPU with this UUID and model passes the model and UUID rules.
pub fn admits(models: &Models, uuids: &Selector, uuid: &str, model: &str) -> bool {
    let model_ok = match models {
        Models::Matching(selector)
            if selector.include.is_empty() && selector.exclude.is_empty() =>
        {
            true
        }
        Models::Matching(selector) => {
            let model = model.to_ascii_lowercase();
            let hit = |m: &String| model.contains(&m.to_ascii_lowercase());
            (selector.include.is_empty() || selector.include.iter().any(hit))
                && !selector.exclude.iter().any(hit)
        }
        Models::OneOf(names) => names.is_empty() || names.iter().any(|n| n.as_str() == model),
    };
    if !model_ok {
        return false;
    }
    let uuid_hit = |u: &String| u.eq_ignore_ascii_case(uuid);
    model_ok
        && (uuids.include.is_empty() || uuids.include.iter().any(uuid_hit))
        && !uuids.exclude.iter().any(uuid_hit)
}

/// Where a task's GPU asks went, and the node after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// (container, indices into the node's GPUs) in ask order.
    pub containers: Vec<(String, Vec<usize>)>,
    /// The node with the task's resources committed.
    pub after: Node,
}

/// Why a task does not fit a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// Not now, but it would on the same node without other tasks.
    Busy(String),
    /// Not even on the empty node.
    Never(String),
}

/// Picks which of the fitting GPUs an ask takes.
pub trait GpuChoice {
    /// Returns `ask.count` distinct indices from `fitting` (which holds at
    /// least that many), given the node as it stands before this ask.
    fn choose(&mut self, node: &Node, ask: &GpuAsk, fitting: &[usize]) -> Vec<usize>;
}

/// Fullest fitting GPUs first (least room left after), then lower UUID.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fullest;

/// Emptiest fitting GPUs first (most room left after), then lower UUID.
#[derive(Debug, Clone, Copy, Default)]
pub struct Emptiest;

fn room(g: &Gpu, ask: &GpuAsk) -> (u64, u32) {
    (
        g.free_mib().saturating_sub(ask.memory.mib_on(g.memory_mib)),
        g.free_milli().saturating_sub(ask.milli),
    )
}

impl GpuChoice for Fullest {
    fn choose(&mut self, node: &Node, ask: &GpuAsk, fitting: &[usize]) -> Vec<usize> {
        let mut order = fitting.to_vec();
        let g = &node.gpus;
        order.sort_by(|&a, &b| (room(&g[a], ask), &g[a].uuid).cmp(&(room(&g[b], ask), &g[b].uuid)));
        order.truncate(ask.count as usize);
        order
    }
}

impl GpuChoice for Emptiest {
    fn choose(&mut self, node: &Node, ask: &GpuAsk, fitting: &[usize]) -> Vec<usize> {
        let mut order = fitting.to_vec();
        let g = &node.gpus;
        order.sort_by(|&a, &b| {
            (std::cmp::Reverse(room(&g[a], ask)), &g[a].uuid)
                .cmp(&(std::cmp::Reverse(room(&g[b], ask)), &g[b].uuid))
        });
        order.truncate(ask.count as usize);
        order
    }
}

/// Places `task` on `node` with `choice` picking GPUs, or says why not
/// ([`Unfit::Busy`] when the emptied node would take it).
pub fn place(task: &Task, node: &Node, choice: &mut dyn GpuChoice) -> Result<Placed, Unfit> {
    match try_place(task, node, choice) {
        Ok(placed) => Ok(placed),
        Err(reason) => match try_place(task, &node.emptied(), choice) {
            Ok(_) => Err(Unfit::Busy(reason.to_string())),
            Err(never) => Err(Unfit::Never(never.to_string())),
        },
    }
}

/// Whether `task` fits `node` now, without building the placement: the
/// node-level check and, per ask, enough GPUs with room. Exact for tasks
/// with one GPU ask (every trace task); for several asks it ignores that
/// earlier asks take room from later ones.
pub fn fits_quickly(task: &Task, node: &Node) -> bool {
    node_level_room(task, node).is_ok()
        && task.gpus.iter().all(|ask| {
            node.gpus
                .iter()
                .filter(|g| task.admits(g) && g.has_room_for(ask))
                .count()
                >= ask.count as usize
        })
}

/// Why a task does not fit a node as it stands: the reason an [`Unfit`]
/// carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum NoRoom {
    /// Not enough CPU free.
    #[error("needs {needs} milli-CPU, {free} of {capacity} free")]
    Cpu {
        needs: u64,
        free: u64,
        capacity: u64,
    },
    /// Not enough memory free.
    #[error("needs {needs} MiB of memory, {free} of {capacity} MiB free")]
    Memory {
        needs: u64,
        free: u64,
        capacity: u64,
    },
    /// Too few GPUs with room for an ask.
    #[error(
        "container {container:?} needs {count} GPU(s) with {} and {} free; {fitting} of {usable} usable GPUs have room ({unusable} unhealthy or outside the pod's tessera.dev/gpu-* selectors)",
        describe(*.memory),
        describe_compute(*.milli)
    )]
    Gpus {
        container: String,
        count: u32,
        memory: Memory,
        milli: u32,
        fitting: usize,
        usable: usize,
        unusable: usize,
    },
    /// No set of the GPUs with room satisfies the ask's NUMA binding
    /// ([`pick`]'s reason).
    #[error(transparent)]
    Numa(#[from] NumaUnbound),
}

fn node_level_room(task: &Task, node: &Node) -> Result<(), NoRoom> {
    if let Some(cpu) = node.cpu_milli
        && cpu.free() < task.cpu_milli
    {
        return Err(NoRoom::Cpu {
            needs: task.cpu_milli,
            free: cpu.free(),
            capacity: cpu.capacity,
        });
    }
    if let Some(memory) = node.memory_mib
        && memory.free() < task.memory_mib
    {
        return Err(NoRoom::Memory {
            needs: task.memory_mib,
            free: memory.free(),
            capacity: memory.capacity,
        });
    }
    Ok(())
}

fn try_place(task: &Task, node: &Node, choice: &mut dyn GpuChoice) -> Result<Placed, NoRoom> {
    node_level_room(task, node)?;
    let mut after = node.clone();
    let mut containers = Vec::with_capacity(task.gpus.len());
    for ask in &task.gpus {
        let fitting: Vec<usize> = (0..after.gpus.len())
            .filter(|&i| task.admits(&after.gpus[i]) && after.gpus[i].has_room_for(ask))
            .collect();
        let wanted = ask.count as usize;
        if fitting.len() < wanted {
            let usable = after.gpus.iter().filter(|g| task.admits(g)).count();
            return Err(NoRoom::Gpus {
                container: ask.container.clone(),
                count: ask.count,
                memory: ask.memory,
                milli: ask.milli,
                fitting: fitting.len(),
                usable,
                unusable: after.gpus.len() - usable,
            });
        }
        let chosen = pick(&after, ask, &fitting, choice)?;
        debug_assert_eq!(chosen.len(), wanted);
        for &i in &chosen {
            let g = &mut after.gpus[i];
            g.used_mib += ask.memory.mib_on(g.memory_mib);
            g.used_milli += ask.milli;
        }
        containers.push((ask.container.clone(), chosen));
    }
    if let Some(cpu) = &mut after.cpu_milli {
        cpu.used += task.cpu_milli;
    }
    if let Some(memory) = &mut after.memory_mib {
        memory.used += task.memory_mib;
    }
    Ok(Placed { containers, after })
}

fn describe(memory: Memory) -> String {
    match memory {
        Memory::Mib(mib) => format!("{mib} MiB"),
        // No '%': kube-scheduler passes an extender's reasons through a
        // format string ("30% SMs" reached users as "30%!S(MISSING)Ms").
        Memory::Percent(p) => format!("{p} percent of memory"),
    }
}

/// Compute in the extender's words: whole percent of SMs where exact.
/// Never a '%' sign (see [`describe`]).
fn describe_compute(milli: u32) -> String {
    if milli.is_multiple_of(10) {
        format!("{} percent of SMs", milli / 10)
    } else {
        format!("{milli} milli-GPU")
    }
}
