//! The `gpusim` CLI as a user runs it: the built binary
//! (`$TESSERA_ARTIFACTS/bin/gpusim`, from `cargo xtask build`) on a node
//! description and state file of each test's own.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use tessera_testkit::sim as support;

use std::path::Path;
use std::process::{Command, Output};

use gpusim::NodeDescription;
use support::{Gpu, Node, NodeSpec, artifact};

fn gpusim_bin() -> std::path::PathBuf {
    artifact("bin/gpusim")
}

fn show(node: &Node) -> serde_json::Value {
    serde_json::from_str(&node.gpusim(&["show", "--json"])).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An A100 NVLinked to `l40s`.
fn two_gpus_with(l40s: Gpu) -> NodeSpec {
    NodeSpec::new()
        .driver_version("550.54.15")
        .cuda_version(12040)
        .gpu(
            Gpu::new("NVIDIA A100-SXM4-40GB", 40960)
                .sms(108)
                .compute_capability(8, 0)
                .nvlink(&[1])
                .pci_bus_id("0000:3b:00.0"),
        )
        .gpu(l40s)
}

fn l40s() -> Gpu {
    Gpu::new("NVIDIA L40S", 46068)
        .sms(142)
        .compute_capability(8, 9)
        .uuid("GPU-abcdef01-2345-6789-abcd-ef0123456789")
}

fn two_gpus() -> NodeSpec {
    two_gpus_with(l40s())
}

#[test]
fn show_lists_the_gpus_and_the_processes_using_them() {
    let node = two_gpus().build();
    let sim = node.sim();
    let a = sim.attach(1).unwrap();
    sim.alloc(&a, 2048 << 20).unwrap();

    let text = node.gpusim(&["show"]);
    assert!(text.contains("Driver Version: 550.54.15"), "{text}");
    assert!(text.contains("CUDA Version: 12.4"), "{text}");
    assert!(text.contains("NVIDIA A100-SXM4-40GB"), "{text}");
    assert!(
        text.contains("GPU-abcdef01-2345-6789-abcd-ef0123456789"),
        "{text}"
    );
    assert!(text.contains("00000000:3B:00.0"), "{text}");
    assert!(text.contains("/ 46068"), "{text}");
    let me = std::process::id().to_string();
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(&me)),
        "{text}"
    );

    let json = show(&node);
    assert_eq!(json["driver_version"], "550.54.15");
    assert_eq!(json["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(json["gpus"][1]["name"], "NVIDIA L40S");
    assert_eq!(json["gpus"][1]["memory_total_mib"], 46068);
    let held_mib = (sim.context_overhead() >> 20) + 2048;
    assert_eq!(json["gpus"][1]["memory_used_mib"], held_mib);
    assert_eq!(json["gpus"][0]["memory_used_mib"], 0);
    let procs = json["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{json:#}");
    assert_eq!(procs[0]["gpu"], 1);
    assert_eq!(procs[0]["pid"], std::process::id());
    assert_eq!(procs[0]["memory_mib"], held_mib);
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(procs[0]["name"], comm.trim_end());
}

#[test]
fn xid_lost_and_reset_change_the_shared_state() {
    let node = two_gpus().build();
    assert!(
        node.gpusim(&["xid", "0", "13"])
            .contains("injected Xid 13 on GPU 0")
    );
    node.gpusim(&["xid", "0", "31"]);
    node.gpusim(&["lost", "1"]);
    let json = show(&node);
    assert_eq!(json["gpus"][0]["xids"], 2);
    assert_eq!(json["gpus"][0]["lost"], false);
    assert_eq!(json["gpus"][1]["lost"], true);
    assert_eq!(json["gpus"][1]["xids"], 1, "losing a GPU records Xid 79");
    assert!(node.gpusim(&["show"]).contains("LOST"));

    let sim = node.sim();
    assert_eq!(sim.xids_after(1, 0).unwrap()[0].xid, 79);

    node.gpusim(&["lost", "1", "--clear"]);
    assert_eq!(show(&node)["gpus"][1]["lost"], false);

    node.gpusim(&["lost", "1"]);
    assert!(
        node.gpusim(&["reset", "--gpu", "0"])
            .contains("reset GPU 0")
    );
    let json = show(&node);
    assert_eq!(json["gpus"][0]["xids"], 0);
    assert_eq!(json["gpus"][1]["lost"], true, "--gpu 0 leaves GPU 1 alone");

    let generation = sim.state().generation();
    assert!(node.gpusim(&["reset"]).contains("reset 2 GPUs"));
    assert_eq!(show(&node)["gpus"][1]["lost"], false);
    assert!(sim.state().generation() > generation);

    let out = node.gpusim_output(&["xid", "5", "13"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("there is no GPU 5 on the simulated node (2 GPUs)"),
        "{out:?}"
    );
    let out = node.gpusim_output(&["reset", "--gpu", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("there is no GPU 2"), "{out:?}");
}

#[test]
fn a_bad_node_description_is_reported_with_its_field() {
    let node = two_gpus_with(l40s().memory_mib(0)).build();
    let out = node.gpusim_output(&["show"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("gpusim: error: "), "{err}");
    assert!(err.contains(&node.node.display().to_string()), "{err}");
    assert!(
        err.contains("gpu[1].memory_mib is 0; accepted: 1 to 16777216"),
        "{err}"
    );
    assert!(!node.state.exists(), "nothing was created");

    // The flag overrides the environment.
    let good = node.dir.path().join("good.toml");
    std::fs::write(&good, two_gpus().toml()).unwrap();
    node.gpusim(&["--node", good.to_str().unwrap(), "show"]);
}

#[test]
fn a_state_file_of_another_version_is_explained_and_removable() {
    let node = two_gpus().build();
    let mut old = b"GPUSIMST".to_vec();
    old.extend(0u32.to_le_bytes()); // layout version 0
    old.resize(1 << 20, 0);
    std::fs::write(&node.state, &old).unwrap();

    let out = node.gpusim_output(&["show"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    assert!(err.contains(&node.state.display().to_string()), "{err}");
    assert!(err.contains("unusable: it has layout version 0"), "{err}");

    // Clearing one GPU in place is impossible: the hint says how to get out.
    let out = node.gpusim_output(&["reset", "--gpu", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("gpusim reset --remove"), "{out:?}");

    assert!(
        node.gpusim(&["reset", "--remove"])
            .contains("removed state file")
    );
    assert!(!node.state.exists());
    assert_eq!(show(&node)["gpus"].as_array().unwrap().len(), 2);
    assert!(
        node.gpusim(&["reset", "--remove"])
            .contains("removed state file")
    );
    assert!(
        node.gpusim(&["reset", "--remove"])
            .contains("no state file at")
    );

    // A plain reset replaces a file it cannot clear in place.
    std::fs::write(&node.state, b"garbage").unwrap();
    let text = node.gpusim(&["reset"]);
    assert!(text.contains("removed state file"), "{text}");
    assert!(text.contains("unusable"), "{text}");
    node.gpusim(&["show"]);
}

#[test]
fn node_prints_the_effective_description_as_toml() {
    let node = two_gpus().build();
    let text = node.gpusim(&["node"]);
    assert!(!node.state.exists(), "`node` creates no state file");
    let printed = NodeDescription::parse(&text, Path::new("<printed>")).unwrap();
    let given = NodeDescription::from_file(&node.node).unwrap();
    assert_eq!(printed, given);

    // Once a state file exists, its description is the effective one,
    // whatever GPUSIM_NODE says.
    node.gpusim(&["show"]);
    let out = Command::new(gpusim_bin())
        .env_remove("GPUSIM_NODE")
        .env("GPUSIM_STATE", &node.state)
        .arg("node")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed =
        NodeDescription::parse(&String::from_utf8(out.stdout).unwrap(), Path::new("<p>")).unwrap();
    assert_eq!(printed, given);

    // Without either, the default node.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(gpusim_bin())
        .env_remove("GPUSIM_NODE")
        .env("GPUSIM_STATE", empty.path().join("none.state"))
        .arg("node")
        .output()
        .unwrap();
    let printed =
        NodeDescription::parse(&String::from_utf8(out.stdout).unwrap(), Path::new("<p>")).unwrap();
    assert_eq!(printed, NodeDescription::default_node());
}

#[test]
fn bad_arguments_get_clap_errors() {
    let node = two_gpus().build();
    let out = node.gpusim_output(&["xid", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("<CODE>"), "{out:?}");
    let out = node.gpusim_output(&["lost", "zero"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid value 'zero'"), "{out:?}");
    let out = node.gpusim_output(&["reset", "--gpu", "0", "--remove"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot be used with"), "{out:?}");
    let out = node.gpusim_output(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}
