//! PyTorch's CUDA build (`torch` from PyPI with the NVIDIA wheels it
//! pulls: libcudart 13.2, cuBLAS, cuDNN, …) on the simulated node, as far
//! as it goes without real kernels: `torch.cuda.is_available()`, device
//! properties, tensors on the device and PyTorch's own kernels, the
//! caching allocator (also with `expandable_segments:True`, its
//! `cuMemCreate`/`cuMemMap` path), `mem_get_info`, `memory_stats`; under
//! `libtessera.so` the allocator stops at the container's limit with
//! `torch.cuda.OutOfMemoryError` and `mem_get_info` shows the limit.
//! Judged by the simulator's record (the memory it holds for the process,
//! its launch log, the driver's own trace of the calls it served).
//!
//! Opt-in: the environment is about 5.3 GiB (`target/pyenv-torch`, made
//! by pip on first use, about 2 minutes on a fast link), too much for
//! every checkout CI makes. `TESSERA_TORCH=1 cargo test -p gpusim --test
//! torch_runtime` runs these tests; without it they return at once,
//! saying so (not a skip: nothing is missing).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tessera_testkit::or_skip;
use tessera_testkit::python::{Steps, TORCH, python};
use tessera_testkit::sim::{Gpu, Node, NodeSpec, artifact};

const MIB: u64 = 1 << 20;

/// PyTorch's Python where `TESSERA_TORCH=1` asks for these tests.
fn torch() -> Option<Result<PathBuf, String>> {
    if std::env::var_os("TESSERA_TORCH").is_none_or(|v| v != "1") {
        println!(
            "PyTorch tests not asked for: TESSERA_TORCH=1 runs them (about 5.3 GiB in target/pyenv-torch)"
        );
        return None;
    }
    Some(python(&TORCH))
}

/// A node whose driver speaks CUDA 13.5 (PyTorch's runtime is 13.2).
fn node(gpu: Gpu) -> Node {
    NodeSpec::small_with(gpu).cuda_version(13050).build()
}

fn steps(c: Command, node: &Node, scenario: &str) -> Steps {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/torch_steps.py");
    Steps::start(c, node.dir.path(), &script, scenario)
}

fn at(s: &mut Steps, name: &str) -> Value {
    serde_json::from_str(&s.at(name)).expect("step values")
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// Device memory the simulator holds for `pid` on GPU 0.
fn held(node: &Node, pid: i32) -> u64 {
    node.sim()
        .processes(0)
        .expect("processes")
        .iter()
        .find(|p| p.pid == pid)
        .map_or(0, |p| p.bytes)
}

/// `basics` with the allocator configured by `conf` (if any); returns
/// the script's stderr.
fn basics(py: &Path, conf: Option<&str>) -> String {
    let node = node(Gpu::sim(8192));
    let mut c = node.command(py);
    c.env("GPUSIM_TRACE", "1");
    if let Some(conf) = conf {
        c.env("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
    let mut s = steps(c, &node, "basics");

    let v = at(&mut s, "counted");
    assert_eq!(v["available"], true, "{v}");
    assert_eq!(u(&v, "count"), 1, "{v}");
    assert_eq!(v["name"], "Tessera Sim GPU", "{v}");
    assert_eq!(u(&v, "total"), 8192 * MIB, "{v}");
    assert_eq!(u(&v, "sms"), 100, "{v}");
    assert_eq!(v["cc"], serde_json::json!([9, 0]), "{v}");
    s.go_on();

    let v = at(&mut s, "started");
    let context = held(&node, s.pid());
    assert_eq!(context, 300 * MIB, "the primary context's overhead");
    assert_eq!(u(&v, "total"), 8192 * MIB, "{v}");
    let m = node.sim().memory_info(0).expect("memory info");
    assert_eq!(u(&v, "free"), m.free, "mem_get_info is the node's: {v}");
    s.go_on();

    let v = at(&mut s, "allocated");
    let with = held(&node, s.pid()) - context;
    // The allocator's reserve is what the node holds beyond the context
    // (segments of 2 MiB pages; expandable ones grow by 20 MiB).
    assert_eq!(u(&v, "reserved"), with, "{v}");
    assert!(
        (256 * MIB..=280 * MIB).contains(&with),
        "the node holds {} MiB for a 256 MiB tensor: {v}",
        with / MIB
    );
    assert_eq!(
        u(&v, "free"),
        node.sim().memory_info(0).expect("memory info").free,
        "{v}"
    );
    let launches = node.sim().launches(0).expect("launch log");
    let mine = launches
        .iter()
        .find(|l| l.pid == s.pid())
        .expect("the process's launches");
    // add, multiply, sum (zeros is a memset).
    assert!(mine.kernels >= 3, "{mine:?}");
    s.go_on();

    let v = at(&mut s, "freed");
    assert_eq!(held(&node, s.pid()), context, "empty_cache gave it back");
    assert_eq!(u(&v, "reserved"), 0, "{v}");
    s.finish()
}

#[test]
fn torch_tensors_and_its_caching_allocator_are_the_simulators() {
    let Some(py) = torch() else { return };
    let py = or_skip!(py);
    let stderr = basics(&py, None);
    assert!(
        !stderr.contains("gpusim-trace: cuMemMap"),
        "no VMM without expandable segments"
    );
    let stderr = basics(&py, Some("expandable_segments:True"));
    for call in [
        "cuMemAddressReserve",
        "cuMemCreate",
        "cuMemMap",
        "cuMemSetAccess",
        "cuMemUnmap",
        "cuMemRelease",
    ] {
        assert!(
            stderr.contains(&format!("gpusim-trace: {call} -> CUDA_SUCCESS")),
            "expandable segments call {call} on the node"
        );
    }
}

/// `limit` under `libtessera.so` in a container of 2000 MiB.
fn limited(py: &Path, conf: Option<&str>) -> String {
    const UUID: &str = "GPU-7e55e4a0-0000-4000-8000-0000000000a2";
    let node = node(Gpu::sim(8192).uuid(UUID));
    let region = node.dir.path().join("region");
    let out = Command::new(artifact("bin/tessera-agent"))
        .args(["region", "create", "--dir"])
        .arg(&region)
        .args(["--gpu", &format!("{UUID},memory=2000,overhead=300")])
        .output()
        .expect("tessera-agent region create");
    assert!(out.status.success(), "{out:?}");
    let mut c = node.command(py);
    c.env("TESSERA_REGION_DIR", &region)
        .env("LD_PRELOAD", artifact("lib/libtessera.so"))
        .env("GPUSIM_TRACE", "1");
    if let Some(conf) = conf {
        c.env("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
    let mut s = steps(c, &node, "limit");
    let v = at(&mut s, "started");
    let context = held(&node, s.pid());
    assert_eq!(
        u(&v, "total"),
        2000 * MIB,
        "mem_get_info shows the limit: {v}"
    );
    assert_eq!(u(&v, "free"), 2000 * MIB - context, "{v}");
    s.go_on();

    let v = at(&mut s, "full");
    let full = held(&node, s.pid());
    assert!(
        full <= 2000 * MIB,
        "the node holds {} MiB for a container limited to 2000 ({conf:?})",
        full / MIB
    );
    assert!(
        full > (2000 - 128 - 20) * MIB,
        "the allocator filled the limit: {} MiB ({conf:?})",
        full / MIB
    );
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("CUDA out of memory")),
        "torch.cuda.OutOfMemoryError: {v}"
    );
    assert_eq!(u(&v, "total"), 2000 * MIB, "{v}");
    assert_eq!(u(&v, "free"), 2000 * MIB - full, "{v}");
    assert_eq!(u(&v, "chunks"), (full - context) / (128 * MIB), "{v}");
    s.go_on();

    at(&mut s, "emptied");
    assert_eq!(held(&node, s.pid()), context, "empty_cache gave it back");
    s.finish()
}

#[test]
fn torch_under_tessera_stops_at_the_containers_limit() {
    let Some(py) = torch() else { return };
    let py = or_skip!(py);
    limited(&py, None);
    let stderr = limited(&py, Some("expandable_segments:True"));
    assert!(
        stderr.contains("gpusim-trace: cuMemMap -> CUDA_SUCCESS"),
        "expandable segments map on the node"
    );
}
