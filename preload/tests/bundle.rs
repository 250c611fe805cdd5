//! The real-GPU bundle's Python region writer (`xtask/gpu-bundle/`) speaks
//! the same ABI as the library: regions it writes are enforced, and its
//! `show` reads what processes recorded.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{Link, MIB, Node, field};

#[test]
fn python_written_regions_are_enforced() {
    if Command::new("python3").arg("--version").output().is_err() {
        println!("skipped: python3 is not installed");
        return;
    }
    let script = common::sim::workspace().join("xtask/gpu-bundle/tessera_region.py");
    let node = Node::small();
    let u = node.sim().node().uuid(0);
    let region = node.dir.path().join("py-region");
    let out = Command::new("python3")
        .arg(&script)
        .args([
            "create",
            region.to_str().unwrap(),
            "--gpu",
            &u,
            "--memory",
            "1000",
            "--overhead",
            "300",
            "--rate",
            "5000",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The Rust side reads what Python wrote.
    let c = tessera_region::file::open_control(&region.join("control")).unwrap();
    c.validate(c.mapped_len()).unwrap();
    let g = c.snapshot().gpus[0];
    assert_eq!(
        (
            g.memory_limit,
            g.context_overhead,
            g.launch_rate,
            g.launch_burst
        ),
        (1000 * MIB, 300 * MIB, 5000, 50)
    );
    // And the library enforces it.
    let run = node
        .command(&common::sim::workload(Link::Direct))
        .args("dev 0 alloc-until-oom 100 launch spin 1 32 10".split_whitespace())
        .env("LD_PRELOAD", common::libtessera())
        .env("TESSERA_REGION_DIR", &region)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        field(&stdout, "allocs"),
        ["7", "CUDA_ERROR_OUT_OF_MEMORY"],
        "{stdout}"
    );
    let show = Command::new("python3")
        .arg(&script)
        .args(["show", region.to_str().unwrap()])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(json["launches"], 10);
    assert_eq!(
        json["used"],
        1000 * MIB,
        "the exited process is charged until seen dead"
    );
    assert_eq!(json["uuid"], u);
    // A bad UUID is a clear error.
    let bad = Command::new("python3")
        .arg(&script)
        .args(["create", "/tmp/x", "--gpu", "nope"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("'nope' is not a GPU UUID"));
}
