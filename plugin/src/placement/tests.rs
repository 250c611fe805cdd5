//! Fit and scoring on hand-built nodes whose right answer is worked out
//! by hand in each test.

use super::fit::{Emptiest, Fullest};
use super::*;
use crate::annotations::Selector;
use crate::resources::Memory;

fn gpu(n: usize, model: &str, used_milli: u32) -> Gpu {
    Gpu {
        uuid: format!("g{n}").into(),
        model: model.into(),
        memory_mib: 0,
        used_mib: 0,
        used_milli,
        healthy: true,
        ..Gpu::default()
    }
}

/// A node with 64 cores and 256 GiB and GPUs committed as given.
fn node(name: &str, model: &str, used: &[u32]) -> Node {
    Node {
        name: name.into(),
        cpu_milli: Some(Pool {
            capacity: 64_000,
            used: 0,
        }),
        memory_mib: Some(Pool {
            capacity: 262_144,
            used: 0,
        }),
        gpus: used
            .iter()
            .enumerate()
            .map(|(i, &u)| gpu(i, model, u))
            .collect(),
    }
}

fn task(cpu: u64, count: u32, milli: u32) -> Task {
    Task {
        cpu_milli: cpu,
        memory_mib: 1024,
        gpus: if count == 0 {
            vec![]
        } else {
            vec![GpuAsk {
                container: "c".into(),
                count,
                memory: Memory::Mib(0),
                milli,
                numa_bind: false,
                elastic: false,
            }]
        },
        models: Models::default(),
        uuids: Selector::default(),
    }
}

fn gpus_of(placed: &Placed) -> &[usize] {
    &placed.containers[0].1
}

#[test]
fn cpu_shortage_is_busy_when_used_and_never_when_too_small() {
    let mut n = node("n", "T4", &[0, 0]);
    n.cpu_milli = Some(Pool {
        capacity: 8000,
        used: 6000,
    });
    match place(&task(4000, 1, 500), &n, &mut Fullest) {
        Err(Unfit::Busy(reason)) => assert!(
            reason.contains("4000 milli-CPU, 2000 of 8000 free"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        place(&task(9000, 1, 500), &n, &mut Fullest),
        Err(Unfit::Never(_))
    ));
    let placed = place(&task(2000, 1, 500), &n, &mut Fullest).unwrap();
    assert_eq!(placed.after.cpu_milli.unwrap().used, 8000);
    assert_eq!(placed.after.memory_mib.unwrap().used, 1024);
}

#[test]
fn multi_gpu_tasks_take_distinct_idle_gpus_only() {
    // GPU 1 holds a 10 % share: a 2 x whole-GPU task must take 0 and 2.
    let n = node("n", "V100M16", &[0, 100, 0, 0]);
    let placed = place(&task(0, 2, 1000), &n, &mut Fullest).unwrap();
    let mut got = gpus_of(&placed).to_vec();
    got.sort();
    assert_eq!(got, [0, 2]);
    assert_eq!(placed.after.gpus[0].used_milli, 1000);
    assert_eq!(placed.after.gpus[1].used_milli, 100);
    // Four whole GPUs: only three are idle.
    assert!(matches!(
        place(&task(0, 4, 1000), &n, &mut Fullest),
        Err(Unfit::Busy(_))
    ));
    // A memory-only share (0 compute) still makes a GPU non-idle.
    let mut m = node("m", "T4", &[0]);
    m.gpus[0].memory_mib = 16_000;
    m.gpus[0].used_mib = 1;
    let mut whole = task(0, 1, 1000);
    whole.gpus[0].memory = Memory::Mib(100);
    assert!(matches!(
        place(&whole, &m, &mut Fullest),
        Err(Unfit::Busy(_))
    ));
}

#[test]
fn gpu_spec_models_are_matched_exactly() {
    let n = node("n", "A100", &[0]);
    let mut t = task(0, 1, 500);
    t.models = Models::OneOf(vec!["A10".into(), "T4".into()]);
    // "A10" is a substring of "A100" but not the same model.
    assert!(matches!(place(&t, &n, &mut Fullest), Err(Unfit::Never(_))));
    t.models = Models::OneOf(vec!["T4".into(), "A100".into()]);
    assert!(place(&t, &n, &mut Fullest).is_ok());
}

#[test]
fn fullest_and_emptiest_pick_the_gpu_with_least_and_most_room() {
    let n = node("n", "T4", &[300, 700, 0]);
    assert_eq!(
        gpus_of(&place(&task(0, 1, 300), &n, &mut Fullest).unwrap()),
        [1]
    );
    assert_eq!(
        gpus_of(&place(&task(0, 1, 300), &n, &mut Emptiest).unwrap()),
        [2]
    );
    // 800 fits only the idle GPU.
    assert_eq!(
        gpus_of(&place(&task(0, 1, 800), &n, &mut Fullest).unwrap()),
        [2]
    );
}

/// Worked by hand: GPUs free 1000, 1000, 500, 200 (2700 in all).
/// - A (1 x 1000, p 0.4) fits on an idle GPU; the 500 and 200 cannot take
///   it: F = 700.
/// - B (1 x 400, p 0.3) fits; only the 200 cannot take it: F = 200.
/// - C (4 x 1000, p 0.2) needs four idle GPUs, there are two: F = 2700.
/// - D (no GPU, p 0.1): every free GPU is a fragment: F = 2700.
///
/// F_n(M) = 0.4*700 + 0.3*200 + 0.2*2700 + 0.1*2700 = 1150.
#[test]
fn fragmentation_matches_the_hand_computed_example() {
    let n = node("n", "G2", &[0, 0, 500, 800]);
    let a = task(1000, 1, 1000);
    let b = task(1000, 1, 400);
    let c = task(1000, 4, 1000);
    let d = task(1000, 0, 0);
    assert_eq!(class_fragment(&n, &a), 700);
    assert_eq!(class_fragment(&n, &b), 200);
    assert_eq!(class_fragment(&n, &c), 2700);
    assert_eq!(class_fragment(&n, &d), 2700);
    let tasks = [&a, &a, &a, &a, &b, &b, &b, &c, &c, &d];
    let workload = Workload::from_tasks(tasks);
    assert_eq!(workload.classes().len(), 4);
    assert!((fragmentation(&n, &workload, Weighting::Popularity) - 1150.0).abs() < 1e-9);
    // A CPU-starved node cannot take B: all its free GPU is B's fragment.
    let mut starved = n.clone();
    starved.cpu_milli = Some(Pool {
        capacity: 64_000,
        used: 63_500,
    });
    assert_eq!(class_fragment(&starved, &b), 2700);
}

/// Nodes "wide" (one GPU, 600 free) and "tight" (one GPU, 550 free); a
/// 100-milli task arrives; the workload is all 500-milli tasks.
/// - Best fit takes "tight" (450 left < 500 left).
/// - FGD: on "wide" 500 are left and still fit a 500 task: growth 0; on
///   "tight" 450 are left, which no 500 task can use: growth 0 -> 450.
///   FGD takes "wide", keeping room for the workload.
#[test]
fn fgd_keeps_room_for_the_workload_where_best_fit_does_not() {
    let wide = node("wide", "T4", &[400]);
    let tight = node("tight", "T4", &[450]);
    let small = task(1000, 1, 100);
    let common = task(1000, 1, 500);
    let workload = Workload::from_tasks([&common]);
    let pick = |policy| {
        let w = evaluate(policy, &small, &wide, &workload).unwrap().score;
        let t = evaluate(policy, &small, &tight, &workload).unwrap().score;
        if w.cmp(&t).is_gt() { "wide" } else { "tight" }
    };
    assert_eq!(pick(Policy::Binpack), "tight");
    assert_eq!(pick(Policy::Spread), "wide");
    assert_eq!(pick(Policy::Fgd), "wide");
    assert_eq!(pick(Policy::Tessera), "wide");
    let growth = evaluate(Policy::Fgd, &small, &tight, &workload)
        .unwrap()
        .score
        .0[1];
    assert!((growth + 450.0).abs() < 1e-9, "{growth}");
}

/// Two empty 8-GPU nodes and one with 7 GPUs taken: a 1 x 1000 task grows
/// fragmentation alike on the 8-GPU nodes when the workload has no
/// multi-GPU class. FGD leaves the tie to the first node; Tessera packs
/// it onto the node left with the least free GPU.
#[test]
fn tessera_breaks_fragmentation_ties_by_best_fit() {
    let empty = node("empty", "G2", &[0; 8]);
    let busy = node("busy", "G2", &[1000, 1000, 1000, 1000, 1000, 1000, 1000, 0]);
    let whole = task(1000, 1, 1000);
    let workload = Workload::from_tasks([&whole]);
    let e = evaluate(Policy::Tessera, &whole, &empty, &workload).unwrap();
    let b = evaluate(Policy::Tessera, &whole, &busy, &workload).unwrap();
    assert_eq!(e.score.0[1], b.score.0[1], "equal growth (0)");
    assert!(b.score.cmp(&e.score).is_gt());
    let fe = evaluate(Policy::Fgd, &whole, &empty, &workload).unwrap();
    let fb = evaluate(Policy::Fgd, &whole, &busy, &workload).unwrap();
    assert!(fe.score.cmp(&fb.score).is_eq());
}

/// Within a node, FGD takes the GPU whose remainder the workload can use.
/// GPUs free 600 and 1000; a 400 task; workload: 1 x 1000 tasks.
/// On the 600 GPU: 200 left, both idle-GPU counts stay 1: fragment 200
/// (from 600 before) -> growth -400. On the idle GPU: 600 + 600 left,
/// no idle GPU: all 1200 fragments -> growth +600.
#[test]
fn fgd_chooses_the_gpu_that_keeps_an_idle_one() {
    let n = node("n", "T4", &[400, 0]);
    let t = task(1000, 1, 400);
    let w = Workload::from_tasks([&task(1000, 1, 1000)]);
    let placed = evaluate(Policy::Fgd, &t, &n, &w).unwrap();
    assert_eq!(placed.placed.containers[0].1, [0]);
    assert!((placed.score.0[1] - 400.0).abs() < 1e-9);
}

/// The per-class breakdown gives, to the bit, what recomputing the whole
/// node gives, before and after any one GPU changes, over random nodes
/// (health, models, memory) and random workloads (multi-GPU, whole-GPU,
/// memory-only and CPU-heavy classes).
#[test]
fn fragments_match_a_full_recount_after_every_change() {
    let mut rng = super::rng::Rng::new(7);
    let mut below = |n: u64| rng.below(n);
    for _ in 0..300 {
        let models = ["A", "B"];
        let mut n = node("n", "A", &[]);
        n.cpu_milli = Some(Pool {
            capacity: 16_000,
            used: below(16_001),
        });
        for i in 0..(1 + below(8) as usize) {
            let memory_mib = [0, 16_000, 80_000][below(3) as usize];
            n.gpus.push(Gpu {
                memory_mib,
                used_mib: below(memory_mib + 1),
                used_milli: [0, 250, 500, 1000][below(4) as usize],
                healthy: below(10) > 0,
                ..gpu(i, models[below(2) as usize], 0)
            });
        }
        let tasks: Vec<Task> = (0..(1 + below(6)))
            .map(|_| {
                let mut t = task(below(8) * 1000, 1 + below(3) as u32, 0);
                t.gpus[0].milli = [0, 100, 500, 1000][below(4) as usize];
                t.gpus[0].memory = Memory::Mib([0, 8000, 40_000][below(3) as usize]);
                if below(3) == 0 {
                    t.models = Models::OneOf(vec!["B".into()]);
                }
                t
            })
            .collect();
        // Supply from this node and a node of the other model, weighed
        // either way.
        let workload = Workload::from_tasks(&tasks).with_supply([&n, &node("m", "A", &[0; 3])]);
        let weighting = [Weighting::Popularity, Weighting::Scarcity][below(2) as usize];
        let mut fragments = Fragments::new(&n, &workload, weighting);
        assert_eq!(fragments.total(), fragmentation(&n, &workload, weighting));
        for _ in 0..4 {
            let i = below(n.gpus.len() as u64) as usize;
            let before = (n.gpus[i].used_mib, n.gpus[i].used_milli);
            let after = (
                below(n.gpus[i].memory_mib + 1),
                [0, 100, 600, 1000][below(4) as usize],
            );
            let mut changed = n.clone();
            (changed.gpus[i].used_mib, changed.gpus[i].used_milli) = after;
            let full = fragmentation(&changed, &workload, weighting);
            assert_eq!(fragments.total_with(&n.gpus[i], before, after), full);
            fragments.apply(i, &n.gpus[i], before, after);
            assert_eq!(fragments.total(), full);
            assert!(fragments.describes(&changed) && !fragments.describes(&n) || before == after);
            n = changed;
        }
    }
}

/// Worked by hand: a cluster of one T4 GPU and nine G2 GPUs (10). Classes,
/// each a quarter of the tasks: open (weight 1/4), T4-only (one GPU of
/// ten usable: 10/4), 90 cores (fits no node: 0), 40 cores (fits only the
/// G2 node, 64 cores, nine GPUs: 10/9 · 1/4).
#[test]
fn scarcity_weighs_a_class_by_the_capacity_it_can_use() {
    let mut small = node("t4", "T4", &[0]);
    small.cpu_milli = Some(Pool {
        capacity: 32_000,
        used: 0,
    });
    let big = node("g2", "G2", &[0; 9]);
    let open = task(1000, 1, 500);
    let mut t4 = task(1000, 1, 500);
    t4.models = Models::OneOf(vec!["T4".into()]);
    let huge = task(90_000, 1, 500);
    let wide = task(40_000, 1, 500);
    let workload = Workload::from_tasks([&open, &t4, &huge, &wide]).with_supply([&small, &big]);
    assert_eq!(workload.weights(Weighting::Popularity), [0.25; 4]);
    let w = workload.weights(Weighting::Scarcity);
    let expected = [0.25, 2.5, 0.0, 0.25 * 10.0 / 9.0];
    for (got, want) in w.iter().zip(expected) {
        assert!((got - want).abs() < 1e-12, "{w:?}");
    }
}

/// Worked by hand: nodes "t4" (one idle T4) and "g2" (one G2 with 300
/// committed), plus a full G2 node of eight GPUs: 10 GPUs, one of them T4.
/// The workload: whole-GPU tasks that accept only T4 (p 0.1) and open
/// 500-milli tasks (p 0.9). An open 500-milli task arrives.
/// - FGD (by popularity): on "g2" the 200 left cannot take a 500 task
///   (+200 · 0.9) and the T4 class's fragment falls by 500 (−500 · 0.1):
///   +130; on "t4" the idle T4 is lost to the T4 class (+500 · 0.1): +50.
///   FGD takes the T4.
/// - Tessera (by scarcity): the T4 class weighs 0.1 · 10 / 1 = 1.0:
///   "g2" 180 − 500 = −320, "t4" +500. Tessera leaves the T4 to the
///   pods that can only use it.
#[test]
fn tessera_keeps_general_demand_off_the_scarce_model() {
    let t4_node = node("t4", "T4", &[0]);
    let g2_node = node("g2", "G2", &[300]);
    let full = node("full", "G2", &[1000; 8]);
    let mut t4_only = task(1000, 1, 1000);
    t4_only.models = Models::OneOf(vec!["T4".into()]);
    let open = task(1000, 1, 500);
    let mut tasks = vec![&t4_only];
    tasks.extend(std::iter::repeat_n(&open, 9));
    let workload = Workload::from_tasks(tasks).with_supply([&t4_node, &g2_node, &full]);
    let best = |policy| {
        [&t4_node, &g2_node]
            .into_iter()
            .max_by_key(|n| evaluate(policy, &open, n, &workload).unwrap().score)
            .map(|n| n.name.to_string())
            .unwrap()
    };
    assert_eq!(best(Policy::Fgd), "t4");
    assert_eq!(best(Policy::Tessera), "g2");
    let growth = |policy, n: &Node| -evaluate(policy, &open, n, &workload).unwrap().score.0[1];
    assert!((growth(Policy::Fgd, &g2_node) - 130.0).abs() < 1e-9);
    assert!((growth(Policy::Fgd, &t4_node) - 50.0).abs() < 1e-9);
    assert!((growth(Policy::Tessera, &g2_node) + 320.0).abs() < 1e-6);
    assert!((growth(Policy::Tessera, &t4_node) - 500.0).abs() < 1e-6);
}
