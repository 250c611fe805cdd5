//! What the interposer cannot bound it refuses, on every path a program
//! reaches the driver by: graph memory nodes, pool allocations recorded
//! during stream capture, and the CUDA 2.x 32-bit entry points. Each test
//! first runs the same calls without the interposer, to show that the
//! simulator really allocates (or launches) for them: a refusal that let
//! the call through would show up in the simulator's own accounting.

mod common;

use common::{Container, Link, MIB, field, graph_probe, memory_limit};

const LINKS: [Link; 3] = [Link::Direct, Link::Dlopen, Link::Dlsym];

/// Runs the probe on the container's node *without* the interposer until
/// `ready`; returns what the simulator then holds for it and its output.
fn unlimited(c: &Container, ops: &str) -> (u64, Vec<String>) {
    let mut cmd = c.node.command(&graph_probe(Link::Direct));
    cmd.args(ops.split_whitespace());
    let p = common::sim::spawn_command_ready(cmd, ops);
    (c.held(p.pid()), p.seen.clone())
}

/// The words after `key` on its line of a probe's output.
fn line(seen: &[String], key: &str) -> Vec<String> {
    field(&seen.join("\n"), key)
        .iter()
        .map(|w| w.to_string())
        .collect()
}

#[test]
fn graph_memory_nodes_are_refused_on_every_path() {
    let c = Container::new(|u| memory_limit(u, 1000));
    // The simulator allocates graph memory when the graph runs.
    let (held, seen) = unlimited(
        &c,
        "dev 0 memnode 600 addnode-mem 1 100 addnode-mem 2 100 ready hold",
    );
    assert_eq!(held, (300 + 800) * MIB, "{seen:?}");

    for link in LINKS {
        let p = c.spawn_probe(
            link,
            "dev 0 memnode 600 addnode-mem 1 600 addnode-mem 2 600 fill 100 ready hold",
        );
        let refused = ["CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_NOT_SUPPORTED"];
        assert_eq!(line(&p.seen, "memnode"), refused, "{link:?}");
        let kinds: Vec<_> = p
            .seen
            .iter()
            .filter(|l| l.starts_with("addnode-mem"))
            .collect();
        assert_eq!(kinds.len(), 2, "{link:?}: {:?}", p.seen);
        for k in kinds {
            assert_eq!(
                k, "addnode-mem CUDA_ERROR_NOT_SUPPORTED CUDA_ERROR_NOT_SUPPORTED",
                "{link:?}"
            );
        }
        // The whole limit is still there, and the driver holds no more.
        assert_eq!(
            line(&p.seen, "filled"),
            ["7", "CUDA_ERROR_OUT_OF_MEMORY"],
            "{link:?}"
        );
        assert_eq!(c.held(p.pid()), 1000 * MIB, "{link:?}");
    }
}

#[test]
fn pool_allocations_during_capture_are_refused() {
    let c = Container::new(|u| memory_limit(u, 1000));
    // Captured, the allocation is a graph memory node: allocated by each
    // launch, whatever was booked when it was captured.
    let (held, seen) = unlimited(&c, "dev 0 capture-alloc 600 ready hold");
    assert_eq!(line(&seen, "capture-alloc"), ["CUDA_SUCCESS", "2"]);
    assert_eq!(held, (300 + 600) * MIB);

    for link in LINKS {
        let p = c.spawn_probe(link, "dev 0 capture-alloc 600 fill 100 ready hold");
        assert_eq!(
            line(&p.seen, "capture-alloc"),
            ["CUDA_ERROR_NOT_SUPPORTED", "0"],
            "{link:?}"
        );
        assert_eq!(
            line(&p.seen, "filled"),
            ["7", "CUDA_ERROR_OUT_OF_MEMORY"],
            "{link:?}"
        );
        assert_eq!(c.held(p.pid()), 1000 * MIB, "{link:?}");
    }
}

#[test]
fn the_32_bit_entry_points_are_refused() {
    let c = Container::new(|u| memory_limit(u, 1000));
    let calls = "v1 alloc 600 v1 pitch 600 v1 array 600 v1 array3d 600 v1 meminfo 0 \
                 v1 launch 0 v1 grid 0 v1 grid-async 0 work";
    let names = [
        "alloc",
        "pitch",
        "array",
        "array3d",
        "meminfo",
        "launch",
        "grid",
        "grid-async",
    ];
    // The simulator implements them all: memory and kernels.
    let (held, seen) = unlimited(&c, &format!("dev 0 {calls} ready hold"));
    for (l, name) in seen.iter().filter(|l| l.starts_with("v1 ")).zip(names) {
        assert_eq!(l, &format!("v1 {name} CUDA_SUCCESS"));
    }
    assert_eq!(held, (300 + 4 * 600) * MIB);
    assert_eq!(line(&seen, "work"), ["3", "66"], "kernels and warps run");

    for link in LINKS {
        let p = c.spawn_probe(link, &format!("dev 0 {calls} fill 100 ready hold"));
        let v1: Vec<_> = p.seen.iter().filter(|l| l.starts_with("v1 ")).collect();
        assert_eq!(v1.len(), names.len(), "{link:?}: {:?}", p.seen);
        for (l, name) in v1.iter().zip(names) {
            assert_eq!(
                *l,
                &format!("v1 {name} CUDA_ERROR_NOT_SUPPORTED"),
                "{link:?}"
            );
        }
        // Nothing ran, nothing was allocated behind the limit's back.
        assert_eq!(line(&p.seen, "work"), ["0", "0"], "{link:?}");
        assert_eq!(
            line(&p.seen, "filled"),
            ["7", "CUDA_ERROR_OUT_OF_MEMORY"],
            "{link:?}"
        );
        assert_eq!(c.held(p.pid()), 1000 * MIB, "{link:?}");
    }
}

#[test]
fn a_capture_beginning_during_a_pool_allocation_is_spoilt() {
    let c = Container::new(|u| memory_limit(u, 1000));
    // The simulator answers cuStreamIsCapturing 100 ms late, so another
    // thread's capture begins after the interposer looked and before the
    // allocation reaches the driver: it lands in the graph.
    let ops = "dev 0 capture-race 600 fill 100 ready hold";
    let mut cmd = c.command(&graph_probe(Link::Direct));
    cmd.env("GPUSIM_IS_CAPTURING_DELAY_MS", "100")
        .args(ops.split_whitespace());
    let p = common::sim::spawn_command_ready(cmd, ops);
    // The capture is invalidated: no graph to run the allocation again.
    assert_eq!(
        line(&p.seen, "capture-race"),
        ["CUDA_SUCCESS", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "0"]
    );
    // The driver never holds more than the limit, nor more than the
    // container's account says.
    let held = c.held(p.pid());
    assert!(held <= 1000 * MIB, "{} MiB held", held / MIB);
    let charged: u64 = c
        .usage()
        .slots
        .iter()
        .filter(|s| s.pid == p.pid() as u32)
        .map(|s| s.used[0])
        .sum();
    assert!(charged >= held, "{charged} charged < {held} held");
}
