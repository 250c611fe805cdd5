//! NVML clients written against NVIDIA's own bindings: `nvidia-ml-py`
//! (`import pynvml`) lists the simulated node's GPUs, their memory and
//! the processes holding it as `nvidia-smi` would, and inside a limited
//! container (under `libtessera.so`) shows the container's limit. Judged
//! by the simulator's record: the node description, the memory it holds
//! for each process, its memory totals.
//!
//! The environment is made once, by pip, in `target/pyenv-nvml`
//! ([`tessera_testkit::python`]); the container case also needs CuPy's
//! (`target/pyenv-cuda`). Where they cannot be made the tests are skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tessera_testkit::or_skip;
use tessera_testkit::python::{CUPY_CUDA12, NVML, Steps, python};
use tessera_testkit::sim::{Gpu, Link, Node, NodeSpec, artifact};

const MIB: u64 = 1 << 20;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

/// `nvml_smi.py` run by `c`: its `smi` values.
fn smi(mut c: Command) -> Value {
    let out = c
        .arg(script("nvml_smi.py"))
        .output()
        .expect("run nvml_smi.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.lines().last() == Some("end"),
        "nvml_smi.py: {}\n{stdout}\n{stderr}",
        out.status
    );
    // nvidia-smi's table, for whoever reads the test's output.
    println!("{stderr}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("smi "))
        .expect("an smi line");
    serde_json::from_str(line).expect("smi values")
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// The (pid, bytes) pynvml lists for GPU `g`, sorted.
fn listed(smi: &Value, g: usize) -> Vec<(i32, u64)> {
    let mut l: Vec<(i32, u64)> = smi["gpus"][g]["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| (u(p, "pid") as i32, u(p, "used")))
        .collect();
    l.sort_unstable();
    l
}

/// The (pid, bytes) the simulator holds on GPU `g`, sorted.
fn held(node: &Node, g: usize) -> Vec<(i32, u64)> {
    let mut l: Vec<(i32, u64)> = node
        .sim()
        .processes(g)
        .expect("processes")
        .iter()
        .map(|p| (p.pid, p.bytes))
        .collect();
    l.sort_unstable();
    l
}

#[test]
fn pynvml_lists_devices_memory_and_processes_as_the_node_holds_them() {
    let py = or_skip!(python(&NVML));
    let node = NodeSpec::new()
        .driver_version("550.54.15")
        .cuda_version(12040)
        .gpu(Gpu::sim(8192).uuid("GPU-7e55e4a0-0000-4000-8000-0000000000a0"))
        .gpu(Gpu::h100().reserved_mib(512))
        .build();
    // Two processes on GPU 0, one on GPU 1, as the C workload holds them.
    let a = node.spawn_ready(Link::Direct, "dev 0 alloc 1000 ready hold");
    let b = node.spawn_ready(Link::Direct, "dev 0 alloc 250 ready hold");
    let c = node.spawn_ready(Link::Direct, "dev 1 alloc 3000 ready hold");
    let v = smi(node.command(&py));

    let sim = node.sim();
    let desc = sim.node();
    assert_eq!(v["driver_version"], "550.54.15", "{v}");
    assert_eq!(u(&v, "cuda_version"), 12040, "{v}");
    let gpus = v["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 2, "{v}");
    for (g, d) in gpus.iter().enumerate() {
        assert_eq!(u(d, "index"), g as u64);
        assert_eq!(d["name"], desc.gpu[g].model.as_str(), "{d}");
        assert_eq!(d["uuid"], desc.uuid(g).as_str(), "{d}");
        assert_eq!(d["bus_id"], sim.pci_address(g).nvml().as_str(), "{d}");
        let m = sim.memory_info(g).expect("memory info");
        assert_eq!(u(d, "total"), m.total, "{d}");
        assert_eq!(u(&d["v2"], "total"), m.total, "{d}");
        assert_eq!(u(&d["v2"], "reserved"), m.reserved, "{d}");
        assert_eq!(u(&d["v2"], "used"), m.used, "{d}");
        assert_eq!(u(&d["v2"], "free"), m.free, "{d}");
        // nvidia-smi's "used" (v1) counts the driver's reserve.
        assert_eq!(u(d, "used"), m.used + m.reserved, "{d}");
        assert_eq!(u(d, "free"), m.free, "{d}");
        assert_eq!(listed(&v, g), held(&node, g), "GPU {g}: {d}");
        for p in d["processes"].as_array().expect("processes") {
            assert!(
                p["name"].as_str().is_some_and(|n| n.contains("workload")),
                "{p}"
            );
        }
        assert_eq!(d["fan"], Value::Null, "no fan to read: {d}");
        assert_eq!(u(d, "persistence"), 1, "{d}");
        assert_eq!(u(d, "ecc_uncorrected"), 0, "{d}");
    }
    // The memory held is what the workloads asked for and their contexts.
    let context = sim.context_overhead();
    let want = |p: &tessera_testkit::sim::Running, mib: u64| (p.pid(), context + mib * MIB);
    let mut on0 = vec![want(&a, 1000), want(&b, 250)];
    on0.sort_unstable();
    assert_eq!(listed(&v, 0), on0);
    assert_eq!(listed(&v, 1), vec![want(&c, 3000)]);
    assert_eq!(u(&gpus[1], "total"), 81_559 * MIB);

    // A process that ends is gone from the list and its memory freed.
    b.kill();
    let v = smi(node.command(&py));
    assert_eq!(listed(&v, 0), vec![want(&a, 1000)]);
    assert_eq!(listed(&v, 0), held(&node, 0));
    assert_eq!(
        u(&v["gpus"][0]["v2"], "used"),
        node.sim().memory_info(0).expect("memory info").used
    );
}

#[test]
fn pynvml_in_a_limited_container_shows_the_limit() {
    let py = or_skip!(python(&NVML));
    let cupy = or_skip!(python(&CUPY_CUDA12));
    const UUID: &str = "GPU-7e55e4a0-0000-4000-8000-0000000000a1";
    let node = NodeSpec::small_with(Gpu::sim(8192).uuid(UUID)).build();
    let region = node.dir.path().join("region");
    let out = Command::new(artifact("bin/tessera-agent"))
        .args(["region", "create", "--dir"])
        .arg(&region)
        .args(["--gpu", &format!("{UUID},memory=2000,overhead=300")])
        .output()
        .expect("tessera-agent region create");
    assert!(out.status.success(), "{out:?}");
    let contained = |program: &Path| {
        let mut c = node.command(program);
        c.env("TESSERA_REGION_DIR", &region)
            .env("LD_PRELOAD", artifact("lib/libtessera.so"))
            .env("CUPY_CACHE_DIR", node.dir.path().join("cupy-cache"));
        c
    };
    // CuPy in the container holds a 256 MiB array; a process outside it
    // holds 1000 MiB on the same GPU.
    let mut s = Steps::start(
        contained(&cupy),
        node.dir.path(),
        &script("cupy_steps.py"),
        "basics",
    );
    s.at("counted");
    s.go_on();
    s.at("started");
    s.go_on();
    s.at("allocated");
    let outside = node.spawn_ready(Link::Direct, "dev 0 alloc 1000 ready hold");
    let inner = held(&node, 0)
        .into_iter()
        .find(|(pid, _)| *pid == s.pid())
        .map(|(_, b)| b)
        .expect("the node holds the container's memory");
    assert!(inner >= 556 * MIB, "{} MiB", inner / MIB);

    let v = smi(contained(&py));
    let d = &v["gpus"][0];
    assert_eq!(u(d, "total"), 2000 * MIB, "the container's limit: {d}");
    assert_eq!(
        u(d, "used"),
        inner,
        "what the node holds for the container: {d}"
    );
    assert_eq!(u(d, "free"), 2000 * MIB - inner, "{d}");
    assert_eq!(u(&d["v2"], "total"), 2000 * MIB, "{d}");
    assert_eq!(u(&d["v2"], "used"), inner, "{d}");
    assert_eq!(u(&d["v2"], "free"), 2000 * MIB - inner, "{d}");

    // Outside the container the same client sees the whole GPU and both.
    let v = smi(node.command(&py));
    let d = &v["gpus"][0];
    let m = node.sim().memory_info(0).expect("memory info");
    assert_eq!(u(d, "total"), 8192 * MIB, "{d}");
    assert_eq!(u(&d["v2"], "used"), m.used, "{d}");
    assert_eq!(m.used, inner + 1300 * MIB);
    assert_eq!(listed(&v, 0), held(&node, 0));
    drop(outside);
    s.go_on();
    s.at("freed");
    s.finish();
}
