//! Which of the fitting GPUs one ask takes.
//!
//! Rules, in order:
//! 1. NUMA binding ([`GpuAsk::numa_bind`]): all `count` GPUs on one NUMA
//!    node. An ask no NUMA node can hold is refused, naming the most GPUs
//!    with room that share one.
//! 2. An elastic ask ([`GpuAsk::elastic`]) takes GPUs whose measured SM
//!    use leaves it room ([`Gpu::live_headroom`]) when enough of them fit
//!    (rule 1 still holding); otherwise every fitting GPU is a candidate.
//!    Its committed share is guaranteed either way; the preference is for
//!    the idle SMs it may borrow.
//! 3. An ask for several GPUs on a node that reports topology takes the
//!    set with the most NVLink-connected pairs, then the most GPUs on one
//!    NUMA node, then the best ranks in the caller's [`GpuChoice`] order.
//!    Sets are grown greedily from each candidate as a seed (adding the
//!    GPU with the most links into the set, then one on the seed's NUMA
//!    node, then the best ranked), so the cost is `n² · count`, not every
//!    subset.
//! 4. Otherwise, and for one GPU, the caller's [`GpuChoice`] decides.
//!
//! A node without topology (no NUMA node and no NVLink on any candidate)
//! and without elastic or NUMA-bound asks goes straight to rule 4, so
//! such nodes are placed exactly as the choice alone would place them.

use std::cmp::Reverse;

use super::fit::{GpuAsk, GpuChoice, Node};

/// No set of the GPUs with room satisfies an ask's NUMA binding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "container {container:?} needs {count} GPU(s) on one NUMA node (tessera.dev/numa-bind); at most {largest} of the {fitting} GPU(s) with room share one"
)]
pub(super) struct NumaUnbound {
    container: String,
    count: u32,
    /// The most GPUs with room on one NUMA node.
    largest: usize,
    /// The GPUs with room.
    fitting: usize,
}

/// The GPUs (indices into `node.gpus`) `ask` takes among `fitting`, or
/// why no set of them satisfies its NUMA binding.
pub(super) fn pick(
    node: &Node,
    ask: &GpuAsk,
    fitting: &[usize],
    choice: &mut dyn GpuChoice,
) -> Result<Vec<usize>, NumaUnbound> {
    let count = ask.count as usize;
    let bound =
        |set: &[usize]| !ask.numa_bind || count <= 1 || largest_numa_group(node, set) >= count;
    if !bound(fitting) {
        return Err(NumaUnbound {
            container: ask.container.clone(),
            count: ask.count,
            largest: largest_numa_group(node, fitting),
            fitting: fitting.len(),
        });
    }
    let roomy: Vec<usize>;
    let mut candidates = fitting;
    if ask.elastic {
        roomy = fitting
            .iter()
            .copied()
            .filter(|&i| node.gpus[i].live_headroom() >= ask.milli)
            .collect();
        if roomy.len() >= count && bound(&roomy) {
            candidates = &roomy;
        }
    }
    if count <= 1 || !(ask.numa_bind || has_topology(node, candidates)) {
        return Ok(choice.choose(node, ask, candidates));
    }
    Ok(best_connected(node, ask, candidates, choice))
}

/// Whether any candidate reports a NUMA node or an NVLink.
fn has_topology(node: &Node, candidates: &[usize]) -> bool {
    candidates.iter().any(|&i| {
        let g = &node.gpus[i];
        g.numa.is_some() || !g.nvlink.is_empty()
    })
}

/// The most GPUs of `set` on one NUMA node; a GPU of unknown NUMA node
/// counts as a node of its own.
pub(super) fn largest_numa_group(node: &Node, set: &[usize]) -> usize {
    let mut counts: Vec<(u32, usize)> = Vec::new();
    let mut largest = usize::from(!set.is_empty());
    for &i in set {
        let Some(numa) = node.gpus[i].numa else {
            continue;
        };
        let n = match counts.iter_mut().find(|(k, _)| *k == numa) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                counts.push((numa, 1));
                1
            }
        };
        largest = largest.max(n);
    }
    largest
}

/// Whether GPUs `a` and `b` have an NVLink (either side reporting it).
fn linked(node: &Node, a: usize, b: usize) -> bool {
    node.gpus[a].nvlink.contains(&b) || node.gpus[b].nvlink.contains(&a)
}

/// NVLink-connected pairs within `set`.
fn pairs(node: &Node, set: &[usize]) -> usize {
    set.iter()
        .enumerate()
        .map(|(k, &a)| set[k + 1..].iter().filter(|&&b| linked(node, a, b)).count())
        .sum()
}

/// Rule 3 of the module docs.
fn best_connected(
    node: &Node,
    ask: &GpuAsk,
    candidates: &[usize],
    choice: &mut dyn GpuChoice,
) -> Vec<usize> {
    let count = ask.count as usize;
    let all = GpuAsk {
        count: u32::try_from(candidates.len()).unwrap_or(u32::MAX),
        ..ask.clone()
    };
    let order = choice.choose(node, &all, candidates);
    let rank = |i: usize| order.iter().position(|&j| j == i).unwrap_or(order.len());
    let same_numa = |a: usize, b: usize| {
        let numa = node.gpus[a].numa;
        numa.is_some() && numa == node.gpus[b].numa
    };
    type Key = (usize, usize, Reverse<usize>);
    let mut best: Option<(Key, Vec<usize>)> = None;
    for &seed in &order {
        let mut set = vec![seed];
        while set.len() < count {
            let next = order
                .iter()
                .copied()
                .filter(|i| !set.contains(i))
                .filter(|&i| !ask.numa_bind || same_numa(seed, i))
                .max_by_key(|&i| {
                    let links = set.iter().filter(|&&j| linked(node, i, j)).count();
                    (links, same_numa(seed, i), Reverse(rank(i)))
                });
            match next {
                Some(i) => set.push(i),
                None => break,
            }
        }
        if set.len() < count {
            continue;
        }
        set.sort_by_key(|&i| rank(i));
        let key = (
            pairs(node, &set),
            largest_numa_group(node, &set),
            Reverse(set.iter().map(|&i| rank(i)).sum()),
        );
        if best.as_ref().is_none_or(|(k, _)| key > *k) {
            best = Some((key, set));
        }
    }
    best.map_or_else(|| order.into_iter().take(count).collect(), |(_, set)| set)
}

#[cfg(test)]
mod tests;
