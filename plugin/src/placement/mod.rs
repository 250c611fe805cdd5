//! Fit and scoring, shared by the extender and the placement simulator.
//!
//! - [`fit`]: whether and where a task's GPU asks go on one node;
//! - [`pick`]: which fitting GPUs one ask takes (NUMA binding, live
//!   headroom for elastic asks, NVLink and NUMA locality, then the policy);
//! - [`fgd`]: a node's fragmentation with respect to a target workload;
//! - [`score`]: the policies (random, binpack, spread, FGD, Tessera's
//!   default) that rank trial placements;
//! - [`rng`]: the small seeded generator the random choices use.

pub mod fgd;
pub mod fit;
pub mod pick;
pub mod rng;
pub mod score;

pub use fgd::{Fragments, TaskClass, Weighting, Workload, class_fragment, fragmentation};
pub use fit::{Gpu, GpuAsk, Models, Node, Placed, Pool, Task, Unfit, WHOLE_GPU, place};
pub use score::{Policy, Score, Scored, evaluate, utilisation};

#[cfg(test)]
mod tests;
