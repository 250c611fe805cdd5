//! The gpu bundle's `controller.sh` (`xtask/gpu-bundle/`), run as shipped
//! on the simulated node: the script starts `tessera-agent run`, adds the
//! containers, runs a workload in each under `libtessera.so`, samples the
//! agent's view and prints target vs achieved. Only PyTorch is replaced:
//! `torch_limits.py` is a stand-in (`tests/bundle/torch_limits.py`) that
//! drives the simulator's C workload and prints the same JSON lines.
//!
//! Judged by the script's independent column, each workload's throughput
//! as a share of the same workload alone (the workloads' own counts of
//! finished kernels), and by the simulator's per-process record, besides
//! the NVML column the script prints from the agent's view.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use daemon_support::sim::{Gpu, NodeSpec, workspace};
use daemon_support::{Link, agent_bin, libtessera, uuid, workload};

/// One GPU of 100 SMs with a 200 µs `spin` kernel, as the daemon's
/// control tests use.
fn node_spec() -> NodeSpec {
    NodeSpec::new()
        .gpu(Gpu::sim(16384))
        .fixed_kernel("spin", 200_000)
}

/// A row of the script's table: container, target, NVML SM %, throughput
/// share %.
#[derive(Debug)]
struct Row {
    name: String,
    target: f64,
    nvml: f64,
    share: f64,
}

fn rows(out: &str, mode: &str) -> Vec<Row> {
    out.lines()
        .filter(|l| l.starts_with(mode))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [name, target, nvml, share, _rate] = f[..] else {
                return None;
            };
            Some(Row {
                name: name.to_owned(),
                target: target.parse().ok()?,
                nvml: nvml.parse().ok()?,
                share: share.parse().ok()?,
            })
        })
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn the_bundles_controller_script_holds_targets_on_the_simulator() {
    for tool in ["python3", "curl"] {
        if Command::new(tool).arg("--version").output().is_err() {
            println!("skipped: {tool} is not installed (cargo xtask setup installs it)");
            return;
        }
    }
    let node = node_spec().build();
    // The bundle as `cargo xtask gpu-bundle` lays it out, with the
    // stand-in for the PyTorch script.
    let bundle = node.dir.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    let scripts = workspace().join("xtask/gpu-bundle");
    symlink(scripts.join("controller.sh"), bundle.join("controller.sh")).unwrap();
    symlink(agent_bin(), bundle.join("tessera-agent")).unwrap();
    symlink(libtessera(), bundle.join("libtessera.so")).unwrap();
    symlink(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bundle/torch_limits.py"),
        bundle.join("torch_limits.py"),
    )
    .unwrap();
    let out_dir = node.dir.path().join("out");
    let out = node
        .command(Path::new("sh"))
        .arg(bundle.join("controller.sh"))
        .env("GPU_UUID", uuid(&node, 0))
        .env("TARGETS", "30 50")
        .env("ELASTIC_TARGETS", "30 20")
        .env("SECONDS_PER_RUN", "10")
        .env("PORT", free_port().to_string())
        .env("OUT", &out_dir)
        .env("BUNDLE_WORKLOAD", workload(Link::Direct))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(out_dir.join("agent.log")).unwrap_or_default();
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "controller.sh failed: {stdout}{stderr}\nagent log:\n{log}"
    );
    // What every judgement below prints with the script's output: the
    // agent's warnings and errors.
    let warned: String = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .map(|l| format!("{l}\n"))
        .collect();
    let stdout = format!("{stdout}agent warnings and errors:\n{warned}");

    // Hard: each container near its target by both measures.
    let hard = rows(&stdout, "hard");
    assert_eq!(
        hard.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["hard1", "hard2"],
        "{stdout}"
    );
    for r in &hard {
        assert!(
            (r.nvml - r.target).abs() <= 3.0,
            "NVML share: {r:?}\n{stdout}"
        );
        assert!(
            (r.share - r.target).abs() <= 5.0,
            "throughput share: {r:?}\n{stdout}"
        );
    }
    // Elastic: together they fill the GPU, split by their targets (30:20).
    let elastic = rows(&stdout, "elastic");
    assert_eq!(elastic.len(), 2, "{stdout}");
    let total: f64 = elastic.iter().map(|r| r.share).sum();
    assert!(total >= 95.0, "elastic throughput {total} %:\n{stdout}");
    let ratio = elastic[0].share / elastic[1].share;
    assert!(
        (ratio - 1.5).abs() <= 0.3,
        "elastic split {ratio:.2} (30:20 is 1.5):\n{stdout}"
    );
    // The GPU's busy share, per run: hard leaves the rest idle (30 + 50),
    // elastic fills it.
    let busy: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("GPU busy (NVML, second half): "))
        .filter_map(|v| v.trim_end_matches(" %").parse().ok())
        .collect();
    let [hard_busy, elastic_busy] = busy[..] else {
        panic!("not two GPU busy lines:\n{stdout}");
    };
    assert!(
        (hard_busy - 80.0).abs() <= 3.0,
        "hard: GPU busy {hard_busy} %:\n{stdout}"
    );
    assert!(
        elastic_busy >= 95.0,
        "elastic: GPU busy {elastic_busy} %:\n{stdout}"
    );

    // The simulator's own record: no process of the run is left, and the
    // script removed its containers (the
    // root keeps only the store's lock file).
    assert!(
        node.sim().processes(0).unwrap().is_empty(),
        "processes left on the GPU"
    );
    let left: Vec<_> = std::fs::read_dir(out_dir.join("containers"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "containers left: {left:?}");
}
