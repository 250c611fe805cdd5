//! The bound against an independent oracle: on small random clusters and
//! arrivals, the best placement found by exhaustive search (every task
//! dropped or on any set of GPUs of any node, shares packed GPU by GPU)
//! allocates no more than the LP says, and on instances whose optimum is
//! worked out by hand the bound is that optimum.

use super::*;
use crate::annotations::Selector;
use crate::placement::rng::Rng;
use crate::placement::{Gpu, GpuAsk, Models, Pool};
use crate::resources::Memory;

fn node(name: &str, cpu: u64, model: &str, gpus: usize) -> Node {
    Node {
        name: name.into(),
        cpu_milli: Some(Pool {
            capacity: cpu,
            used: 0,
        }),
        memory_mib: Some(Pool {
            capacity: 1 << 20,
            used: 0,
        }),
        gpus: (0..gpus)
            .map(|i| Gpu {
                uuid: format!("{name}/{i}").into(),
                model: model.into(),
                healthy: true,
                ..Gpu::default()
            })
            .collect(),
    }
}

fn task(cpu: u64, count: u32, milli: u32, models: &[&str]) -> Task {
    Task {
        cpu_milli: cpu,
        memory_mib: 0,
        gpus: vec![GpuAsk {
            container: String::new(),
            count,
            memory: Memory::Mib(0),
            milli,
            numa_bind: false,
            elastic: false,
        }],
        models: Models::OneOf(models.iter().map(|m| (*m).to_owned()).collect()),
        uuids: Selector::default(),
    }
}

/// The most GPU milli any placement of the tasks (each dropped or placed
/// whole) allocates, by trying every placement.
fn brute_force(nodes: &[Node], tasks: &[&Task]) -> u64 {
    fn go(nodes: &mut Vec<Node>, tasks: &[&Task], allocated: u64, best: &mut u64) {
        *best = (*best).max(allocated);
        let Some((task, rest)) = tasks.split_first() else {
            return;
        };
        go(nodes, rest, allocated, best);
        let ask = &task.gpus[0];
        for n in 0..nodes.len() {
            let cpu = nodes[n].cpu_milli.unwrap_or_default();
            if cpu.free() < task.cpu_milli {
                continue;
            }
            let gpus = nodes[n].gpus.len();
            // Every set of `count` distinct GPUs, as a bit mask.
            for mask in 0u32..(1 << gpus) {
                if mask.count_ones() != ask.count {
                    continue;
                }
                let chosen: Vec<usize> = (0..gpus).filter(|i| mask & (1 << i) != 0).collect();
                let node = &nodes[n];
                if !chosen
                    .iter()
                    .all(|&i| task.admits(&node.gpus[i]) && node.gpus[i].has_room_for(ask))
                {
                    continue;
                }
                for &i in &chosen {
                    nodes[n].gpus[i].used_milli += ask.milli;
                }
                if let Some(p) = &mut nodes[n].cpu_milli {
                    p.used += task.cpu_milli;
                }
                go(nodes, rest, allocated + task.gpu_milli(), best);
                for &i in &chosen {
                    nodes[n].gpus[i].used_milli -= ask.milli;
                }
                if let Some(p) = &mut nodes[n].cpu_milli {
                    p.used -= task.cpu_milli;
                }
            }
        }
    }
    let mut best = 0;
    go(&mut nodes.to_vec(), tasks, 0, &mut best);
    best
}

/// Classes and counts of a list of tasks, as the bound takes them.
fn classes(tasks: &[&Task]) -> (Vec<Task>, Vec<u64>) {
    let mut distinct: Vec<Task> = Vec::new();
    let mut counts = Vec::new();
    for t in tasks {
        match distinct.iter().position(|d| d == *t) {
            Some(i) => counts[i] += 1,
            None => {
                distinct.push((*t).clone());
                counts.push(1);
            }
        }
    }
    (distinct, counts)
}

fn capacity(nodes: &[Node]) -> u64 {
    nodes.iter().map(Node::free_gpu_milli).sum()
}

/// Worked by hand: a node of two T4s and a node of one G2; three whole-GPU
/// tasks that accept only T4. Two are placed at most: one GPU (the G2)
/// stays unallocated whatever the policy, and the LP says exactly that.
#[test]
fn model_bound_demand_leaves_the_other_model_unallocated() {
    let nodes = [node("t", 64_000, "T4", 2), node("g", 64_000, "G2", 1)];
    let t4 = task(1000, 1, 1000, &["T4"]);
    let tasks = [&t4, &t4, &t4];
    assert_eq!(brute_force(&nodes, &tasks), 2000);
    let (distinct, counts) = classes(&tasks);
    let bound = unallocated_gpus(&nodes, &distinct, &counts, capacity(&nodes)).unwrap();
    assert_eq!(bound, 1.0);
}

/// Worked by hand: one GPU, three 600-milli shares: one fits (two would
/// need 1200). The share cut (at most one share above 500 per GPU) makes
/// the LP see it: 400 milli stay unallocated, where GPU compute alone
/// would have allowed the whole GPU.
#[test]
fn shares_above_half_a_gpu_take_one_gpu_each() {
    let nodes = [node("n", 64_000, "T4", 1)];
    let big = task(1000, 1, 600, &[]);
    let tasks = [&big, &big, &big];
    assert_eq!(brute_force(&nodes, &tasks), 600);
    let (distinct, counts) = classes(&tasks);
    let bound = unallocated_gpus(&nodes, &distinct, &counts, capacity(&nodes)).unwrap();
    assert_eq!(bound, 0.4);
}

/// Worked by hand: a node of 8 cores and two GPUs, tasks of 6 cores and a
/// whole GPU: only one fits (CPU), and the large-item cut on CPU (at most
/// one task above half the node's CPU) gives exactly one GPU unallocated.
#[test]
fn cpu_heavy_tasks_leave_gpus_unallocated() {
    let nodes = [node("n", 8_000, "T4", 2)];
    let heavy = task(6_000, 1, 1000, &[]);
    let tasks = [&heavy, &heavy];
    assert_eq!(brute_force(&nodes, &tasks), 1000);
    let (distinct, counts) = classes(&tasks);
    let bound = unallocated_gpus(&nodes, &distinct, &counts, capacity(&nodes)).unwrap();
    assert_eq!(bound, 1.0);
}

/// Over random small clusters and arrivals (models, CPU, multi-GPU, whole
/// and shared GPUs), the LP never allocates less than the best placement
/// found by exhaustive search: the bound never exceeds the true least
/// unallocated.
#[test]
fn the_bound_never_exceeds_the_exhaustive_optimum() {
    let mut rng = Rng::new(28);
    let mut below = |n: u64| rng.below(n);
    let models = ["T4", "G2"];
    for round in 0..150 {
        let nodes: Vec<Node> = (0..1 + below(3))
            .map(|i| {
                node(
                    &format!("n{i}"),
                    [4_000, 8_000, 16_000][below(3) as usize],
                    models[below(2) as usize],
                    1 + below(3) as usize,
                )
            })
            .collect();
        let pool: Vec<Task> = (0..1 + below(3))
            .map(|_| {
                let spec: &[&str] = match below(4) {
                    0 => &["T4"],
                    1 => &["G2"],
                    _ => &[],
                };
                let count = if below(4) == 0 { 2 } else { 1 };
                let milli = if count > 1 {
                    1000
                } else {
                    [200, 300, 450, 600, 1000][below(5) as usize]
                };
                task([1_000, 3_000, 5_000][below(3) as usize], count, milli, spec)
            })
            .collect();
        let tasks: Vec<&Task> = (0..2 + below(4))
            .map(|_| &pool[below(pool.len() as u64) as usize])
            .collect();
        let best = brute_force(&nodes, &tasks);
        let (distinct, counts) = classes(&tasks);
        let most = most_allocatable(&nodes, &distinct, &counts).unwrap();
        assert!(
            most >= best,
            "round {round}: LP {most} < exhaustive {best} for {nodes:?} {tasks:?}"
        );
        let bound = unallocated_gpus(&nodes, &distinct, &counts, capacity(&nodes)).unwrap();
        let least = (capacity(&nodes) - best) as f64 / 1000.0;
        assert!(bound <= least + 1e-12, "round {round}: {bound} > {least}");
    }
}

#[test]
fn arrivals_must_match_the_classes() {
    let nodes = [node("n", 8_000, "T4", 1)];
    let e = most_allocatable(&nodes, &[task(1, 1, 100, &[])], &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bound's arrivals name 0 task classes, the workload has 1"
    );
}
