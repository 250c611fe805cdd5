//! A graph launch is charged what the simulator really runs for it, however
//! the graph was built or changed after instantiation: kernel and
//! child-graph nodes added through `cuGraphAddNode`, kernel nodes changed
//! through `cuGraphExecNodeSetParams` or `cuGraphExecKernelNodeSetParams`,
//! child graphs replaced through `cuGraphExecChildGraphNodeSetParams`, and
//! whole executables updated through `cuGraphExecUpdate`, and graphs
//! instantiated through the CUDA 10 `cuGraphInstantiate`. The judge is the
//! simulator's record of the warps it ran (`gpusimExecutedWork`), against
//! the launch rate the container is given.

mod common;

use common::{Container, Link, Node};
use tessera_region::control::GpuLimits;

/// Warps per second the container may launch.
const RATE: u64 = 2_000;
/// Warps it may launch at once after idling.
const BURST: u64 = 20;

fn node() -> Node {
    Node::new(&format!(
        "{}\n[cost.functions.tiny]\nfixed_ns = 1000\n",
        common::sim::SMALL_NODE
    ))
}

/// Launches the graph built by `how` for 800 ms under the rate limit and
/// checks the warps the simulator ran against the rate.
fn check(c: &Container, link: Link, how: &str) {
    let out = c.probe(link, &format!("dev 0 gcost {how} 800"));
    let f: Vec<f64> = common::field(&out, "gcost")
        .iter()
        .map(|x| x.parse().expect("a number"))
        .collect();
    let (launches, elapsed_s, per_launch, warps_run) = (f[0], f[1] / 1e3, f[2], f[4]);
    // The simulator ran the graph as built (its record is the judge).
    assert_eq!(warps_run, launches * per_launch, "{how} {link:?}: {out}");
    let allowed = RATE as f64 * elapsed_s;
    println!(
        "{how} {link:?}: {:.0} warps/s run at a rate of {RATE} ({per_launch} per launch)",
        warps_run / elapsed_s
    );
    assert!(
        warps_run <= allowed * 1.02 + (BURST as f64 + per_launch),
        "{how} {link:?}: {warps_run} warps ran in {elapsed_s:.3} s at {RATE} warps/s \
         ({per_launch} per launch): the graph was undercharged"
    );
    assert!(
        warps_run >= allowed * 0.8,
        "{how} {link:?}: only {warps_run} warps ran in {elapsed_s:.3} s at {RATE} warps/s \
         ({per_launch} per launch): the graph was overcharged"
    );
}

#[test]
fn a_graph_launch_is_charged_the_warps_the_simulator_runs() {
    let c = Container::on(node(), |u| GpuLimits {
        launch_rate: RATE,
        launch_burst: BURST,
        ..GpuLimits::unlimited(u)
    });
    for how in [
        "addnode",
        "setparams",
        "kernelset",
        "childset",
        "update",
        "v1inst",
    ] {
        check(&c, Link::Direct, how);
    }
    // The new entry points are hooked through dlsym and cuGetProcAddress.
    for link in [Link::Dlopen, Link::Dlsym] {
        for how in ["addnode", "setparams", "childset", "v1inst"] {
            check(&c, link, how);
        }
    }
}
