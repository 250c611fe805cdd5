//! Derived pod lists: a trace whose tasks constrain the GPU model more
//! often than any published one, to test placement where model-bound
//! demand is heavy (the published variants stop at 20 %).
//!
//! [`constrain_models`] takes a pod list (say `default`) and gives a
//! seeded, fixed share of its GPU tasks a `gpu_spec` drawn from the rules
//! of a source list (say `gpuspec20`), among the source's constrained
//! tasks of the same GPU count and kind (whole GPUs or a share), so every
//! rule drawn is one that tasks of that shape carry in the source. Tasks
//! of a shape the source never constrains stay unconstrained.
//! [`write_pods`] writes a pod list back in the trace format.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::trace::TraceTask;
use crate::placement::rng::Rng;
use crate::placement::{Models, Task, WHOLE_GPU};

/// A task's shape for drawing rules: GPU count and whether it takes
/// whole GPUs.
fn shape(task: &Task) -> Option<(u32, bool)> {
    task.gpus.first().map(|a| (a.count, a.milli >= WHOLE_GPU))
}

/// `tasks` with `share` (0.0..=1.0) of all its tasks, chosen with `seed`
/// among those asking for GPU, carrying a model rule drawn (with the same
/// seed) from `source`'s constrained tasks of the same shape. Tasks that
/// already carry a rule keep it and count towards the share.
pub fn constrain_models(
    tasks: &[TraceTask],
    source: &[TraceTask],
    share: f64,
    seed: u64,
) -> Vec<TraceTask> {
    let mut rules: HashMap<(u32, bool), Vec<&Models>> = HashMap::new();
    for t in source {
        if let Some(key) = shape(&t.task)
            && !t.task.is_open()
        {
            rules.entry(key).or_default().push(&t.task.models);
        }
    }
    let mut out = tasks.to_vec();
    let wanted = (share.clamp(0.0, 1.0) * tasks.len() as f64).round() as usize;
    let already = out.iter().filter(|t| !t.task.is_open()).count();
    let mut open: Vec<usize> = (0..out.len())
        .filter(|&i| {
            out[i].task.is_open() && shape(&out[i].task).is_some_and(|k| rules.contains_key(&k))
        })
        .collect();
    let mut rng = Rng::new(seed);
    // A seeded Fisher–Yates shuffle; the first ones get a rule.
    for i in (1..open.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        open.swap(i, j);
    }
    for &i in open.iter().take(wanted.saturating_sub(already)) {
        let Some(candidates) = shape(&out[i].task).and_then(|k| rules.get(&k)) else {
            continue;
        };
        let drawn = candidates[rng.below(candidates.len() as u64) as usize];
        out[i].task.models = drawn.clone();
    }
    out
}

/// A pod list in the trace format (`name,cpu_milli,memory_mib,num_gpu,
/// gpu_milli,gpu_spec`), readable by [`super::trace::read_pods`]. Tasks
/// with several GPU asks or include/exclude model selectors have no form
/// there; their first ask and no rule are written.
pub fn write_pods(tasks: &[TraceTask]) -> String {
    let mut out = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
    for t in tasks {
        let (count, milli) = t.task.gpus.first().map_or((0, 0), |a| (a.count, a.milli));
        let spec = match &t.task.models {
            Models::OneOf(names) => names.join("|"),
            Models::Matching(_) => String::new(),
        };
        let _ = writeln!(
            out,
            "{},{},{},{count},{milli},{spec}",
            t.name, t.task.cpu_milli, t.task.memory_mib
        );
    }
    out
}
