//! The real-GPU bundle's Python region writer (`xtask/gpu-bundle/`) speaks
//! the same ABI as the library: regions it writes are enforced, and its
//! `show` reads what processes recorded.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
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

#[test]
fn the_driver_page_measurement_matches_the_model_on_the_simulator() {
    // `driver_pages.py measure` reads what the driver holds per size class;
    // on the simulator (which holds what the model says) the driver's
    // figures, libtessera.so's charge for the same pointers and the
    // model's must all agree, after allocating, thinning and freeing.
    if Command::new("python3").arg("--version").output().is_err() {
        println!("skipped: python3 is not installed");
        return;
    }
    let script = common::sim::workspace().join("xtask/gpu-bundle/driver_pages.py");
    let node = Node::small();
    let out = node
        .command(Path::new("python3"))
        .arg(&script)
        .arg("measure")
        .env("PAGES", "8")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let classes: Vec<Vec<i64>> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("class "))
        .map(|l| l.split_whitespace().map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(classes.len(), 12, "{stdout}");
    for c in &classes {
        let [size, _n, held, charged, model, thinned, thin_charged, freed] = c[..] else {
            panic!("{c:?}");
        };
        if model >= 0 {
            assert_eq!(held, 8 * 2 * MIB as i64, "{size} B: {stdout}");
            assert_eq!(model, held, "{size} B");
        }
        assert_eq!(charged, held, "{size} B: {stdout}");
        assert_eq!(thinned, thin_charged, "{size} B: thinned");
        assert_eq!(freed, 0, "{size} B: freed");
    }
    assert!(stdout.contains("in the 7 MiB tail page"), "{stdout}");
}
