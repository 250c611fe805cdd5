//! GPU discovery through nvml-wrapper against the simulated node: the
//! stand-in `libnvidia-ml.so.1` from `$TESSERA_ARTIFACTS/sim` (built by
//! `cargo xtask build`), a node description and state file per test.
//!
//! `usage_reports_processes_of_the_shared_state` runs this test binary
//! again as a child (`TESSERA_INVENTORY_CHILD` set) so that NVML reads the
//! test's GPUSIM_* environment at `nvmlInit` without this process
//! changing its own environment.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use tessera_testkit::sim;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use gpusim::layout::ItemKind;
use sim::{Gpu, Node, NodeSpec, artifact};
use tessera_agent::gpu::{GpuBackend, NvmlBackend};

const CHILD: &str = "TESSERA_INVENTORY_CHILD";

fn nvml_lib() -> PathBuf {
    artifact("sim/libnvidia-ml.so.1")
}

/// The agent's commands on a simulated [`Node`].
trait AgentOnNode {
    /// `tessera-agent` with `args` on this node, the NVML library not
    /// chosen by this process's environment.
    fn agent(&self, args: &[&str]) -> Output;
    /// `tessera-agent inventory --json` on this node.
    fn inventory(&self) -> serde_json::Value;
}

impl AgentOnNode for Node {
    fn agent(&self, args: &[&str]) -> Output {
        self.command(&artifact("bin/tessera-agent"))
            .env_remove("TESSERA_NVML_LIB")
            .args(args)
            .output()
            .unwrap()
    }

    fn inventory(&self) -> serde_json::Value {
        let lib = nvml_lib();
        let out = self.agent(&["inventory", "--json", "--nvml-lib", lib.to_str().unwrap()]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

fn node_spec() -> NodeSpec {
    let h100 = || Gpu::h100().compute_capability(9, 0).numa(0);
    NodeSpec::new()
        .driver_version("550.54.15")
        .cuda_version(12040)
        .gpu(
            h100()
                .nvlink(&[1])
                .uuid("GPU-0a0a0a0a-1111-2222-3333-444444444444")
                .pci_bus_id("0000:1b:00.0"),
        )
        .gpu(h100().nvlink(&[0]).mig_enabled())
        .gpu(
            Gpu::new("NVIDIA A100-PCIE-40GB", 40960)
                .sms(108)
                .compute_capability(8, 0)
                .numa(1),
        )
}

#[test]
fn inventory_json_matches_the_node_description() {
    let node = node_spec().build();
    let inv = node.inventory();
    assert_eq!(inv["driver_version"], "550.54.15");
    assert_eq!(inv["cuda_driver_version"], 12040);
    let gpus = inv["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 3, "{inv:#}");

    let g0 = &gpus[0];
    assert_eq!(g0["index"], 0);
    assert_eq!(g0["uuid"], "GPU-0a0a0a0a-1111-2222-3333-444444444444");
    assert_eq!(g0["name"], "NVIDIA H100 80GB HBM3");
    assert_eq!(g0["memory_total_mib"], 81559);
    assert_eq!(g0["pci_bus_id"], "00000000:1B:00.0");
    assert_eq!(g0["numa_node"], 0);
    assert_eq!(g0["sm_count"], 132);
    assert_eq!(g0["compute_capability"], "9.0");
    assert_eq!(g0["nvlink_peers"], serde_json::json!([1]));
    assert_eq!(g0["mig_enabled"], false);
    assert_eq!(g0["health"], "healthy");

    assert_eq!(gpus[1]["nvlink_peers"], serde_json::json!([0]));
    assert_eq!(gpus[1]["mig_enabled"], true);
    assert_eq!(gpus[1]["uuid"], "GPU-5e1a0000-0000-4000-8000-000051510001");

    let g2 = &gpus[2];
    assert_eq!(g2["name"], "NVIDIA A100-PCIE-40GB");
    assert_eq!(g2["memory_total_mib"], 40960);
    assert_eq!(g2["sm_count"], 108, "cores / 64 per SM on compute 8.0");
    assert_eq!(g2["numa_node"], 1);
    assert_eq!(g2["nvlink_peers"], serde_json::json!([]));
}

#[test]
fn inventory_table_and_library_from_the_environment() {
    let node = node_spec().build();
    let out = node
        .command(&artifact("bin/tessera-agent"))
        .env("TESSERA_NVML_LIB", nvml_lib())
        .arg("inventory")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("driver 550.54.15, CUDA 12.4, 3 GPUs"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(text.contains("NVIDIA A100-PCIE-40GB"), "{text}");
    assert!(text.contains("40960 MiB"), "{text}");
}

#[test]
fn a_lost_gpu_is_listed_as_lost() {
    let node = node_spec().build();
    node.sim().set_lost(1, true).unwrap();
    let inv = node.inventory();
    let g1 = &inv["gpus"][1];
    assert_eq!(g1["health"], "lost");
    assert_eq!(g1["uuid"], "GPU-5e1a0000-0000-4000-8000-000051510001");
    assert_eq!(g1["memory_total_mib"], serde_json::Value::Null);
    assert_eq!(inv["gpus"][0]["health"], "healthy");
    assert_eq!(inv["gpus"][0]["nvlink_peers"], serde_json::json!([1]));
}

#[test]
fn a_missing_or_failing_library_is_a_clear_error() {
    let node = node_spec().build();
    let out = node.agent(&["inventory", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("cannot initialise NVML from /nonexistent/libnvidia-ml.so.1"),
        "{err}"
    );

    // The simulator cannot open a foreign state file: nvmlInit fails with
    // DRIVER_NOT_LOADED and the stand-in says why.
    std::fs::write(&node.state, b"not a state file").unwrap();
    let lib = nvml_lib();
    let out = node.agent(&["inventory", "--nvml-lib", lib.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("cannot initialise NVML from"), "{err}");
    assert!(err.contains("is unusable"), "{err}");
}

#[test]
fn usage_reports_processes_of_the_shared_state() {
    if std::env::var_os(CHILD).is_some() {
        return child_usage();
    }
    let node = node_spec().build();
    let sim = node.sim();
    let a = sim.attach(2).unwrap();
    sim.alloc(&a, 512 << 20).unwrap();
    sim.submit(&a, ItemKind::Kernel, 10_000_000_000).unwrap();
    std::thread::sleep(Duration::from_millis(300));

    let out = node
        .command(&std::env::current_exe().unwrap())
        .env(CHILD, nvml_lib())
        .args([
            "--exact",
            "usage_reports_processes_of_the_shared_state",
            "--nocapture",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("usage="))
        .unwrap_or_else(|| panic!("no usage line in {stdout}"));
    let usage: serde_json::Value = serde_json::from_str(line).unwrap();
    let held = sim.context_overhead() + (512 << 20);
    assert_eq!(usage["memory_used_bytes"], held);
    let util = usage["utilization_gpu_percent"].as_u64().unwrap();
    assert!((20..=100).contains(&util), "{usage}");
    let procs = usage["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{usage}");
    assert_eq!(procs[0]["pid"], std::process::id());
    assert_eq!(procs[0]["used_memory_bytes"], held);
    assert!(procs[0]["sm_percent"].as_u64().unwrap() > 0, "{usage}");
}

/// In the child: GPU 2's usage as JSON, and GPU 0's (idle) as a check.
fn child_usage() {
    let lib = std::env::var_os(CHILD).unwrap();
    let backend = NvmlBackend::load(&lib).unwrap();
    let idle = backend.usage(0, 0).unwrap();
    assert!(idle.processes.is_empty());
    assert_eq!(idle.memory_used_bytes, 0);
    let usage = backend.usage(2, 0).unwrap();
    println!("usage={}", serde_json::to_string(&usage).unwrap());
}
