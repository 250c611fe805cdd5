//! GPU choice by topology, NUMA binding and live headroom, on hand-built
//! nodes whose right answer is worked out in each test.

use std::sync::Arc;

use crate::annotations::Selector;
use crate::placement::fit::{Emptiest, Fullest};
use crate::placement::{Gpu, GpuAsk, Models, Node, Policy, Task, Unfit, Workload, evaluate, place};
use crate::resources::Memory;

/// GPU `n` on NUMA node `numa` with NVLinks to `links`, `used` milli
/// committed and `live` milli measured.
fn gpu(n: usize, numa: Option<u32>, links: &[usize], used: u32, live: u32) -> Gpu {
    Gpu {
        uuid: format!("g{n}").into(),
        model: "H100".into(),
        memory_mib: 80_000,
        used_milli: used,
        healthy: true,
        numa,
        nvlink: Arc::from(links),
        live_milli: live,
        ..Gpu::default()
    }
}

fn node(gpus: Vec<Gpu>) -> Node {
    Node {
        name: "n".into(),
        cpu_milli: None,
        memory_mib: None,
        gpus,
    }
}

fn ask(count: u32, milli: u32) -> GpuAsk {
    GpuAsk {
        container: "c".into(),
        count,
        memory: Memory::Mib(1000),
        milli,
        numa_bind: false,
        elastic: false,
    }
}

fn task(ask: GpuAsk) -> Task {
    Task {
        cpu_milli: 0,
        memory_mib: 0,
        gpus: vec![ask],
        models: Models::default(),
        uuids: Selector::default(),
    }
}

fn taken(result: Result<crate::placement::Placed, Unfit>) -> Vec<usize> {
    let mut gpus = result.unwrap().containers.remove(0).1;
    gpus.sort_unstable();
    gpus
}

/// Eight GPUs as two NVLink islands {0,1,2,3} (NUMA 0) and {4,5,6,7}
/// (NUMA 1), all pairs linked within an island; GPUs 2 and 5 carry a
/// share, one in each island.
fn islands() -> Node {
    let island = |base: usize| -> Vec<usize> { (base..base + 4).collect() };
    node(
        (0..8)
            .map(|i| {
                let base = if i < 4 { 0 } else { 4 };
                let links: Vec<usize> = island(base).into_iter().filter(|&j| j != i).collect();
                let used = if i == 2 || i == 5 { 300 } else { 0 };
                gpu(i, Some(u32::from(i >= 4)), &links, used, 0)
            })
            .collect(),
    )
}

#[test]
fn a_multi_gpu_ask_takes_an_nvlink_island_not_the_fullest_cards() {
    let n = islands();
    // Without topology, best fit takes the two shared cards (2 and 5),
    // which have no NVLink between them and sit on two NUMA nodes.
    let mut flat = n.clone();
    for g in &mut flat.gpus {
        g.numa = None;
        g.nvlink = Arc::from(&[][..]);
    }
    assert_eq!(
        taken(place(&task(ask(2, 500)), &flat, &mut Fullest)),
        [2, 5]
    );
    // With it, both GPUs come from one island, and best fit still decides
    // within it: the shared card 2 (or 5) and its best-ranked peer.
    let got = taken(place(&task(ask(2, 500)), &n, &mut Fullest));
    assert!(got == [0, 2] || got == [4, 5], "{got:?}");
    // Four GPUs: a whole island (6 NVLink pairs), never a mix.
    let four = taken(place(&task(ask(4, 500)), &n, &mut Emptiest));
    assert!(four == [0, 1, 2, 3] || four == [4, 5, 6, 7], "{four:?}");
}

#[test]
fn without_nvlink_one_numa_node_is_preferred() {
    // NUMA 0: GPUs 0, 1; NUMA 1: GPUs 2, 3. Best fit's two fullest cards
    // (1 and 2) straddle the nodes.
    let used = [0, 600, 500, 0];
    let n = node(
        (0..4)
            .map(|i| gpu(i, Some(u32::from(i >= 2)), &[], used[i], 0))
            .collect(),
    );
    let got = taken(place(&task(ask(2, 300)), &n, &mut Fullest));
    assert!(got == [0, 1] || got == [2, 3], "{got:?}");
    // Best fit's order decides between the two NUMA nodes: GPU 1 (the
    // fullest) ranks first, so its node wins.
    assert_eq!(got, [0, 1]);
}

#[test]
fn numa_bind_refuses_a_straddling_set_and_says_why() {
    // Three GPUs with room: two on NUMA 0 but one of them is full.
    let n = node(vec![
        gpu(0, Some(0), &[], 0, 0),
        gpu(1, Some(0), &[], 1000, 0),
        gpu(2, Some(1), &[], 0, 0),
    ]);
    let mut bound = ask(2, 500);
    bound.numa_bind = true;
    match place(&task(bound.clone()), &n, &mut Fullest) {
        Err(Unfit::Busy(reason)) => assert!(
            reason.contains("needs 2 GPU(s) on one NUMA node (tessera.dev/numa-bind)")
                && reason.contains("at most 1 of the 2 GPU(s) with room"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    // Unbound, the same ask fits across the nodes.
    assert_eq!(taken(place(&task(ask(2, 500)), &n, &mut Fullest)), [0, 2]);
    // A node with one GPU per NUMA node can never hold it.
    let never = node(vec![gpu(0, Some(0), &[], 0, 0), gpu(1, Some(1), &[], 0, 0)]);
    assert!(matches!(
        place(&task(bound.clone()), &never, &mut Fullest),
        Err(Unfit::Never(_))
    ));
    // Unknown NUMA nodes never satisfy a binding of two GPUs.
    let unknown = node(vec![gpu(0, None, &[], 0, 0), gpu(1, None, &[], 0, 0)]);
    assert!(place(&task(bound.clone()), &unknown, &mut Fullest).is_err());
    // When it fits, both GPUs share the node.
    let roomy = node(vec![
        gpu(0, Some(0), &[], 0, 0),
        gpu(1, Some(1), &[], 400, 0),
        gpu(2, Some(1), &[], 0, 0),
    ]);
    assert_eq!(taken(place(&task(bound), &roomy, &mut Fullest)), [1, 2]);
}

#[test]
fn an_elastic_ask_prefers_gpus_with_idle_sms_and_scores_them_higher() {
    // Both cards have 300 milli committed; card 0 measures 950 in use
    // (its elastic tenants borrow the rest), card 1 measures 300.
    let n = node(vec![
        gpu(0, None, &[], 300, 950),
        gpu(1, None, &[], 300, 300),
    ]);
    let mut elastic = ask(1, 400);
    elastic.elastic = true;
    let workload = Workload::default();
    for policy in [Policy::Binpack, Policy::Tessera, Policy::Spread] {
        let scored = evaluate(policy, &task(elastic.clone()), &n, &workload).unwrap();
        assert_eq!(scored.placed.containers[0].1, [1], "{policy:?}");
        assert_eq!(scored.score.0[0], 1.0);
    }
    // A hard ask ignores live use (its share is guaranteed): best fit
    // ties on room and goes to the lower UUID.
    let hard = evaluate(Policy::Binpack, &task(ask(1, 400)), &n, &workload).unwrap();
    assert_eq!(hard.placed.containers[0].1, [0]);
    // A node whose only card is busy scores below one with room, whatever
    // the policy's own keys say.
    let busy = node(vec![gpu(0, None, &[], 300, 950)]);
    let idle = node(vec![gpu(0, None, &[], 0, 0)]);
    let b = evaluate(Policy::Binpack, &task(elastic.clone()), &busy, &workload).unwrap();
    let i = evaluate(Policy::Binpack, &task(elastic), &idle, &workload).unwrap();
    assert_eq!(b.score.0[0], 0.0);
    assert!(
        i.score > b.score,
        "binpack alone would take the fuller node"
    );
}

#[test]
fn a_node_without_topology_is_placed_as_the_choice_alone_places_it() {
    let used = [100, 700, 400, 0, 700];
    let n = node((0..5).map(|i| gpu(i, None, &[], used[i], 0)).collect());
    // Best fit: the fullest three, then the lower UUID among equals.
    assert_eq!(
        taken(place(&task(ask(3, 200)), &n, &mut Fullest)),
        [1, 2, 4]
    );
    assert_eq!(taken(place(&task(ask(2, 200)), &n, &mut Emptiest)), [0, 3]);
}
