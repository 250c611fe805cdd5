//! The running agent holds SM targets: containers made with `container
//! add`, unmodified workloads under libtessera.so, the agent's loop on the
//! simulator's NVML. Judged by the simulator's own per-process record of
//! kernel time, not by the agent's numbers.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use daemon_support::sim::{Gpu, NodeSpec, Running, spawn_command_ready};
use daemon_support::{Agent, Link, Node, container_ok, libtessera, uuid, workload};

/// One GPU of 100 SMs with a 200 µs `spin` kernel (as the controller's
/// own tests use).
fn node_spec() -> NodeSpec {
    NodeSpec::new()
        .gpu(Gpu::sim(16384))
        .fixed_kernel("spin", 200_000)
}

fn spawn(node: &Node, dir: &Path, ops: &str) -> Running {
    let mut c = node.command(&workload(Link::Direct));
    c.env("LD_PRELOAD", libtessera())
        .env("TESSERA_REGION_DIR", dir)
        .args(ops.split_whitespace());
    spawn_command_ready(c, ops)
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Each pid's SM percent over the last `window`, from the simulator.
fn shares(node: &Node, pids: &[i32], window: Duration) -> Vec<f64> {
    let since = unix_us() - window.as_micros() as u64;
    let s = node.sim().process_samples(0, since).unwrap();
    pids.iter()
        .map(|pid| {
            s.iter()
                .filter(|p| p.pid == *pid)
                .map(|p| f64::from(p.sm_percent))
                .sum()
        })
        .collect()
}

#[test]
fn two_hard_containers_hold_their_targets_and_follow_a_live_change() {
    let node = node_spec().build();
    let root = node.dir.path().join("containers");
    let gpu = uuid(&node, 0);
    let add = |id: &str, target: &str| {
        let dir = container_ok(
            &root,
            &[
                "add",
                "--id",
                id,
                "--gpu",
                &gpu,
                "--sm-target",
                target,
                "--mode",
                "hard",
            ],
        );
        dir.trim().to_owned()
    };
    let (a, b) = (add("a", "30"), add("b", "50"));
    let agent = Agent::start(&node, &root, &[]);
    agent.wait_ready();
    let ops = "dev 0 ready run spin 1 256 16000";
    let wa = spawn(&node, Path::new(&a), ops);
    let wb = spawn(&node, Path::new(&b), ops);
    let pids = [wa.pid(), wb.pid()];

    // Settle (the controller's figure is ≤ 3 s), then judge 2 s.
    std::thread::sleep(Duration::from_secs(4));
    let s = shares(&node, &pids, Duration::from_secs(2));
    eprintln!("shares at 30/50: {s:?}");
    assert!(
        (s[0] - 30.0).abs() <= 3.0 && (s[1] - 50.0).abs() <= 3.0,
        "{s:?}"
    );
    let view = agent.view();
    let c = Agent::container(&view, "a").unwrap();
    assert!(c["gpus"][0]["launch_rate"].as_u64().is_some(), "{c:#}");
    assert_eq!(c["gpus"][0]["cap_percent"], 30.0);
    // The launch floor the interposer reads: one wave of the node's GPU
    // (100 SMs at compute 9.0, 64 resident warps each).
    let region = tessera_region::file::open_control(&Path::new(&a).join("control")).unwrap();
    assert_eq!(region.snapshot().gpus[0].launch_floor, 100 * 64);

    // A live target change: a 30 -> 20 without restarting anything.
    container_ok(&root, &["set", "--id", "a", "--sm-target", "20"]);
    std::thread::sleep(Duration::from_secs(4));
    let s = shares(&node, &pids, Duration::from_secs(2));
    eprintln!("shares at 20/50: {s:?}");
    assert!(
        (s[0] - 20.0).abs() <= 3.0 && (s[1] - 50.0).abs() <= 3.0,
        "{s:?}"
    );
}
