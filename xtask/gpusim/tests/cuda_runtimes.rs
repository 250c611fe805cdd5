//! NVIDIA's CUDA runtime, unmodified, on the simulated node: CuPy
//! (`cupy-cuda12x`, with libcudart and NVRTC from NVIDIA's PyPI wheels)
//! starts, allocates, compiles and launches kernels, uses streams, events,
//! `cudaMallocAsync` pools and graphs, alone and under `libtessera.so`.
//! Judged by the simulator's record (the memory it holds for the process,
//! its launch log, its timeline), not only by CuPy's answers.
//!
//! The Python environments are made once, by pip, in `target/pyenv-cuda`
//! (CUDA 12) and `target/pyenv-cuda13` (CUDA 13)
//! ([`tessera_testkit::python`]); where they cannot be made (no Python,
//! no PyPI) the tests are skipped.

use std::path::Path;
use std::process::Command;

use tessera_testkit::or_skip;
use tessera_testkit::python::{CUPY_CUDA12 as CUDA12, CUPY_CUDA13 as CUDA13, Steps, python};
use tessera_testkit::sim::{Gpu, Node, NodeSpec, artifact};

const MIB: u64 = 1 << 20;

/// `cupy_steps.py <scenario>` under `c` (a Python with CuPy) on `node`.
fn steps(mut c: Command, node: &Node, scenario: &str) -> Steps {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/cupy_steps.py");
    // A cache of its own, so NVRTC compiles every kernel each run.
    c.env("CUPY_CACHE_DIR", node.dir.path().join("cupy-cache"));
    Steps::start(c, node.dir.path(), &script, scenario)
}

/// The values of a step.
fn at(s: &mut Steps, name: &str) -> serde_json::Value {
    serde_json::from_str(&s.at(name)).expect("step values")
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

fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

#[test]
fn cupy_starts_and_its_memory_is_the_simulators() {
    let python = or_skip!(python(&CUDA12));
    let node = NodeSpec::small_with(Gpu::sim(8192)).build();
    let mut s = steps(node.command(&python), &node, "basics");

    let v = at(&mut s, "counted");
    assert_eq!(u(&v, "count"), 1, "{v}");
    assert_eq!(v["name"], "Tessera Sim GPU", "{v}");
    assert_eq!(u(&v, "total_global"), 8192 * MIB, "{v}");
    assert_eq!(u(&v, "sms"), 100, "{v}");
    assert_eq!(v["cc"], serde_json::json!([9, 0]), "{v}");
    assert_eq!(held(&node, s.pid()), 0, "counting devices makes no context");
    s.go_on();

    let v = at(&mut s, "started");
    assert_eq!(u(&v, "total"), 8192 * MIB, "{v}");
    // cudart made the primary context: the node holds its overhead.
    let context = held(&node, s.pid());
    assert_eq!(context, 300 * MIB);
    s.go_on();

    let v = at(&mut s, "allocated");
    let with_array = held(&node, s.pid());
    assert!(
        (context + 256 * MIB..=context + 258 * MIB).contains(&with_array),
        "the node holds {} MiB for a 256 MiB array",
        with_array / MIB
    );
    assert_ne!(u(&v, "ptr"), 0);
    s.go_on();

    s.at("freed");
    assert_eq!(held(&node, s.pid()), context, "freed back to the context");
    let stderr = s.finish();
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn cupy_kernels_streams_pools_and_graphs_run_on_the_timeline() {
    let python = or_skip!(python(&CUDA12));
    // The kernel CuPy names `tessera_slow` takes 50 ms of GPU time.
    let node = NodeSpec::small_with(Gpu::sim(8192))
        .fixed_kernel("tessera_slow", 50_000_000)
        .build();
    let mut s = steps(node.command(&python), &node, "kernels");

    let before = held(&node, s.pid());
    s.at("async");
    assert!(
        held(&node, s.pid()) >= before + 64 * MIB,
        "a 64 MiB cudaMallocAsync is held on the node"
    );
    s.go_on();

    let v = at(&mut s, "done");
    let slow_ms = v["slow_ms"].as_f64().expect("slow_ms");
    assert!(
        (49.0..1000.0).contains(&slow_ms),
        "events around tessera_slow measured {slow_ms} ms of the timeline"
    );
    let launches = node.sim().launches(0).expect("launch log");
    let mine = launches
        .iter()
        .find(|l| l.pid == s.pid())
        .expect("the process's launches");
    // arange, multiply, sum, tessera_slow twice, tessera_raw, tessera_sum,
    // and the graph's multiply.
    assert!(mine.kernels >= 7, "{mine:?}");
    s.go_on();

    let v = at(&mut s, "forked");
    assert_eq!(v["capturing"], serde_json::json!([false, false]), "{v}");
    let before = kernels(&node, s.pid());
    s.go_on();
    let v = at(&mut s, "launched");
    assert_eq!(
        kernels(&node, s.pid()),
        before + 4,
        "the forked graph ran the kernels of both streams, the hosted one its kernel twice"
    );
    assert_eq!(
        u(&v, "host_calls"),
        2,
        "a captured host function runs each launch: {v}"
    );
    assert_eq!(v["dot_names_kernel"], true, "cuGraphDebugDotPrint: {v}");
    // cudaPointerGetAttributes: device memory on device 0.
    assert_eq!(u(&v, "type"), 2, "{v}");
    assert_eq!(u(&v, "device"), 0, "{v}");
    s.finish();
}

/// Kernels the launch log holds for `pid` on GPU 0.
fn kernels(node: &Node, pid: i32) -> u64 {
    node.sim()
        .launches(0)
        .expect("launch log")
        .iter()
        .find(|l| l.pid == pid)
        .map_or(0, |l| l.kernels)
}

#[test]
fn cupy_under_tessera_stops_at_the_containers_limit() {
    let python = or_skip!(python(&CUDA12));
    const UUID: &str = "GPU-7e55e4a0-0000-4000-8000-000000000025";
    let node = NodeSpec::small_with(Gpu::sim(8192).uuid(UUID)).build();
    let region = node.dir.path().join("region");
    let out = Command::new(artifact("bin/tessera-agent"))
        .args(["region", "create", "--dir"])
        .arg(&region)
        .args(["--gpu", &format!("{UUID},memory=2000,overhead=300")])
        .output()
        .expect("tessera-agent region create");
    assert!(out.status.success(), "{out:?}");
    let mut c = node.command(&python);
    c.env("TESSERA_REGION_DIR", &region)
        .env("LD_PRELOAD", artifact("lib/libtessera.so"));
    let mut s = steps(c, &node, "limit");

    let v = at(&mut s, "started");
    assert_eq!(
        u(&v, "total"),
        2000 * MIB,
        "memGetInfo shows the limit: {v}"
    );
    s.go_on();

    let v = at(&mut s, "full");
    let full = held(&node, s.pid());
    assert!(
        full <= 2000 * MIB,
        "the node holds {} MiB for a container limited to 2000",
        full / MIB
    );
    assert!(
        full > (2000 - 128) * MIB,
        "CuPy's pool filled the limit: {} MiB",
        full / MIB
    );
    assert!(u(&v, "chunks") >= 12, "{v}");
    s.go_on();

    let v = at(&mut s, "async_full");
    let full = held(&node, s.pid());
    assert!(
        full <= 2000 * MIB,
        "with MemoryAsyncPool the node holds {} MiB (limit 2000)",
        full / MIB
    );
    assert!(u(&v, "chunks") >= 10, "{v}");
    s.finish();
}

#[test]
fn cupy_async_pool_gives_back_its_cache_when_the_device_is_full() {
    let python = or_skip!(python(&CUDA12));
    let node = NodeSpec::small_with(Gpu::sim(8192)).build();
    let mut s = steps(node.command(&python), &node, "pool_trim");
    s.at("big");
    let context = 300 * MIB;
    let big = held(&node, s.pid()) - context;
    assert!(big >= 8192 * MIB * 7 / 10, "{} MiB", big / MIB);
    s.go_on();
    s.at("cached");
    // CuPy keeps its pool's freed memory: the node still holds it.
    assert_eq!(held(&node, s.pid()) - context, big, "cached in the pool");
    s.go_on();
    s.at("small");
    let small = held(&node, s.pid()) - context;
    assert!(
        (8192 * MIB * 4 / 10..big).contains(&small),
        "the pool gave back its cache for a 40 % allocation: the node holds {} MiB",
        small / MIB
    );
    s.finish();
}

#[test]
fn cupy_for_cuda_13_runs_on_a_cuda_13_node() {
    let python = or_skip!(python(&CUDA13));
    let node = NodeSpec::small_with(Gpu::sim(8192))
        .cuda_version(13050)
        .fixed_kernel("tessera_slow", 50_000_000)
        .build();
    let mut s = steps(node.command(&python), &node, "basics");
    s.at("counted");
    assert_eq!(held(&node, s.pid()), 0, "counting devices makes no context");
    s.go_on();
    let v = at(&mut s, "started");
    assert_eq!(u(&v, "total"), 8192 * MIB, "{v}");
    let context = held(&node, s.pid());
    assert_eq!(context, 300 * MIB);
    s.go_on();
    s.at("allocated");
    assert!(held(&node, s.pid()) >= context + 256 * MIB);
    s.go_on();
    s.at("freed");
    assert_eq!(held(&node, s.pid()), context);
    s.finish();

    let mut s = steps(node.command(&python), &node, "kernels");
    s.at("async");
    s.go_on();
    let v = at(&mut s, "done");
    let slow_ms = v["slow_ms"].as_f64().expect("slow_ms");
    assert!((49.0..1000.0).contains(&slow_ms), "{v}");
    s.go_on();
    at(&mut s, "forked");
    let before = kernels(&node, s.pid());
    s.go_on();
    at(&mut s, "launched");
    assert_eq!(kernels(&node, s.pid()), before + 4);
    s.finish();
}

#[test]
fn cuda_13_runtime_refuses_a_cuda_12_driver() {
    let python = or_skip!(python(&CUDA13));
    // The default node's driver speaks CUDA 12.8: NVIDIA's 13.x runtime
    // refuses it, as it refuses a real 12.x driver.
    let node = NodeSpec::small_with(Gpu::sim(8192)).build();
    let mut s = steps(node.command(&python), &node, "basics");
    let line = s.next_line();
    let status = s.child.wait().expect("wait");
    assert!(!status.success() && line.is_none(), "{line:?}");
    assert!(
        s.stderr().contains("cudaErrorInsufficientDriver"),
        "{}",
        s.stderr()
    );
}
