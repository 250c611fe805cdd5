//! A graph launch is charged what the simulator really runs for it, however
//! the graph was built or changed after instantiation: kernel and
//! child-graph nodes added through `cuGraphAddNode`, kernel nodes changed
//! through `cuGraphExecNodeSetParams` or `cuGraphExecKernelNodeSetParams`,
//! child graphs replaced through `cuGraphExecChildGraphNodeSetParams`, and
//! whole executables updated through `cuGraphExecUpdate`, and graphs
//! instantiated through the CUDA 10 `cuGraphInstantiate`. The judge is the
//! simulator's record of the warps it ran (`gpusimExecutedWork`), against
//! the launch rate the container is given. Under a launch floor each of
//! the graph's kernels is charged at least the floor.

mod common;

use common::sim::NodeSpec;
use common::{Container, Link, Node};
use tessera_region::control::GpuLimits;

/// Warps per second the container may launch.
const RATE: u64 = 2_000;
/// Warps it may launch at once after idling.
const BURST: u64 = 20;

fn node() -> Node {
    NodeSpec::small().fixed_kernel("tiny", 1000).build()
}

/// The limits a check runs under.
#[derive(Clone, Copy)]
struct Limits {
    rate: u64,
    burst: u64,
    /// Launch floor: 0, or more than the warps of any kernel of the
    /// graphs `gcost` builds (at most 29), so that each kernel is charged
    /// exactly the floor.
    floor: u64,
}

const PLAIN: Limits = Limits {
    rate: RATE,
    burst: BURST,
    floor: 0,
};

/// Launches the graph built by `how` for 800 ms under `l` and checks what
/// the simulator ran against the rate: its warps, or under a floor its
/// kernels at the floor each.
fn check(c: &Container, link: Link, how: &str, l: Limits) {
    let out = c.probe(link, &format!("dev 0 gcost {how} 800"));
    let f: Vec<f64> = common::field(&out, "gcost")
        .iter()
        .map(|x| x.parse().expect("a number"))
        .collect();
    let (launches, elapsed_s, per_launch, kernels_run, warps_run) =
        (f[0], f[1] / 1e3, f[2], f[3], f[4]);
    // The simulator ran the graph as built (its record is the judge).
    assert_eq!(warps_run, launches * per_launch, "{how} {link:?}: {out}");
    let (run, per_launch) = if l.floor == 0 {
        (warps_run, per_launch)
    } else {
        let kernels = kernels_run / launches.max(1.0);
        (kernels_run * l.floor as f64, kernels * l.floor as f64)
    };
    let allowed = l.rate as f64 * elapsed_s;
    println!(
        "{how} {link:?}: {:.0} warps/s charged at a rate of {} ({per_launch} per launch, floor {})",
        run / elapsed_s,
        l.rate,
        l.floor
    );
    assert!(
        run <= allowed * 1.02 + (l.burst as f64 + per_launch),
        "{how} {link:?}: {run} warps' worth ran in {elapsed_s:.3} s at {} warps/s \
         ({per_launch} per launch, floor {}): the graph was undercharged",
        l.rate,
        l.floor
    );
    assert!(
        run >= allowed * 0.8,
        "{how} {link:?}: only {run} warps' worth ran in {elapsed_s:.3} s at {} warps/s \
         ({per_launch} per launch, floor {}): the graph was overcharged",
        l.rate,
        l.floor
    );
}

/// Every way `gcost` builds or changes a graph.
const ALL_WAYS: [&str; 6] = [
    "addnode",
    "setparams",
    "kernelset",
    "childset",
    "update",
    "v1inst",
];

/// A container on the test node under `l`.
fn container(l: Limits) -> Container {
    Container::on(node(), |u| GpuLimits {
        launch_rate: l.rate,
        launch_burst: l.burst,
        launch_floor: l.floor,
        ..GpuLimits::unlimited(u)
    })
}

#[test]
fn a_graph_launch_is_charged_the_warps_the_simulator_runs() {
    let c = container(PLAIN);
    for how in ALL_WAYS {
        check(&c, Link::Direct, how, PLAIN);
    }
    // The new entry points are hooked through dlsym and cuGetProcAddress.
    for link in [Link::Dlopen, Link::Dlsym] {
        for how in ["addnode", "setparams", "childset", "v1inst"] {
            check(&c, link, how, PLAIN);
        }
    }
}

/// Under a launch floor every kernel of a graph costs at least the floor,
/// also kernels changed after instantiation and those of child graphs: a
/// graph of many small kernels is charged per kernel, not once.
#[test]
fn each_kernel_of_a_graph_is_charged_at_least_the_floor() {
    let l = Limits {
        rate: 64_000,
        burst: 640,
        floor: 64,
    };
    let c = container(l);
    for how in ALL_WAYS {
        check(&c, Link::Direct, how, l);
    }
}
