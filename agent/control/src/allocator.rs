//! Splitting one GPU's capacity among its containers.
//!
//! Each container makes a *claim*: everything while it is hungry (its
//! bucket bound recently: it wants more than it gets), else its measured
//! use plus a small headroom. Then:
//!
//! 1. **guarantees**: every container gets up to `min(target, claim)`; if
//!    these do not fit (targets over-committed), higher priority first,
//!    then in proportion to targets;
//! 2. **lending**: what is left goes to elastic containers whose claim is
//!    not met, higher priority first, then in proportion to targets.
//!
//! A hard container's cap is its target, whatever is free. Only when the
//! guarantees do not fit and its own is cut below its claim is it capped
//! at that guarantee: targets that over-commit a GPU (outside Kubernetes
//! nothing stops an operator from setting them) are then split by
//! priority and target, not by the GPU's time slicing. The claim is NVML's
//! measured use unless the container is hungry, so a container that hides
//! its throttling is cut all the same. An elastic container's cap is its
//! allocation; while it is not hungry, at least its target too (a
//! container waking up is never held below its target: the next period's
//! split makes room for it).
//!
//! Invariants: the allocations sum to at most the capacity, and no
//! allocation exceeds its claim or the capacity; a hard cap never exceeds
//! the target.

use super::{CAPACITY_PERCENT, Mode};

/// One container, as the allocator sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Claim {
    /// Hard or elastic.
    pub mode: Mode,
    /// Higher first.
    pub priority: i32,
    /// The SM target (percent).
    pub target: f64,
    /// What it wants now (percent; `CAPACITY_PERCENT` while hungry).
    pub claim: f64,
    /// Whether it wants more than it gets.
    pub hungry: bool,
}

/// What a container may use (percent).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Allocation {
    /// Its share of the split.
    pub share: f64,
    /// The SM percent its rate aims at.
    pub cap: f64,
}

/// A demand in one water-filling round.
#[derive(Clone, Copy, Debug)]
struct Want {
    priority: i32,
    weight: f64,
    demand: f64,
}

/// Splits `capacity` among `wants`: higher priority first; within one
/// priority in proportion to weight (water-filling: no one gets more than
/// its demand, what it leaves goes to the others).
fn water_fill(capacity: f64, wants: &[Want]) -> Vec<f64> {
    let mut got = vec![0.0; wants.len()];
    let mut left = capacity.max(0.0);
    let mut priorities: Vec<i32> = wants.iter().map(|w| w.priority).collect();
    priorities.sort_unstable_by(|a, b| b.cmp(a));
    priorities.dedup();
    for p in priorities {
        let mut open: Vec<usize> = (0..wants.len())
            .filter(|&i| wants[i].priority == p && wants[i].demand > 0.0)
            .collect();
        // Each round either satisfies someone (who leaves) or hands out
        // everything left: at most `open.len()` rounds.
        while !open.is_empty() && left > 1e-9 {
            let total: f64 = open.iter().map(|&i| wants[i].weight.max(1e-6)).sum();
            let unit = left / total;
            let (full, rest): (Vec<usize>, Vec<usize>) = open
                .iter()
                .partition(|&&i| wants[i].demand - got[i] <= unit * wants[i].weight.max(1e-6));
            if full.is_empty() {
                for &i in &open {
                    got[i] += unit * wants[i].weight.max(1e-6);
                }
                left = 0.0;
                break;
            }
            for &i in &full {
                left -= wants[i].demand - got[i];
                got[i] = wants[i].demand;
            }
            left = left.max(0.0);
            open = rest;
        }
    }
    got
}

/// How far (percent) below its demand a guarantee must fall to count as
/// cut by over-committed targets, above the water-filling's rounding.
const CUT_TOLERANCE: f64 = 1e-6;

/// Splits [`CAPACITY_PERCENT`] among `claims` (see the module docs).
pub fn allocate(claims: &[Claim]) -> Vec<Allocation> {
    let clean = |v: f64| {
        if v.is_finite() {
            v.clamp(0.0, CAPACITY_PERCENT)
        } else {
            0.0
        }
    };
    let guarantees: Vec<Want> = claims
        .iter()
        .map(|c| Want {
            priority: c.priority,
            weight: clean(c.target),
            demand: clean(c.target).min(clean(c.claim)),
        })
        .collect();
    let first = water_fill(CAPACITY_PERCENT, &guarantees);
    let left = CAPACITY_PERCENT - first.iter().sum::<f64>();
    let lending: Vec<Want> = claims
        .iter()
        .zip(&first)
        .map(|(c, &g)| Want {
            priority: c.priority,
            weight: clean(c.target),
            demand: match c.mode {
                Mode::Hard => 0.0,
                Mode::Elastic => (clean(c.claim) - g).max(0.0),
            },
        })
        .collect();
    let second = water_fill(left, &lending);
    claims
        .iter()
        .zip(&guarantees)
        .zip(first.iter().zip(&second))
        .map(|((c, want), (&g, &l))| {
            let share = g + l;
            let cap = match c.mode {
                Mode::Hard if g < want.demand - CUT_TOLERANCE => g,
                Mode::Hard => clean(c.target),
                Mode::Elastic if c.hungry => share,
                Mode::Elastic => share.max(clean(c.target)),
            };
            Allocation { share, cap }
        })
        .collect()
}
