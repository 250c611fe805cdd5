//! NVIDIA's CUDA runtime, unmodified, on the simulated node: CuPy
//! (`cupy-cuda12x`, with libcudart and NVRTC from NVIDIA's PyPI wheels)
//! starts, allocates, compiles and launches kernels, uses streams, events,
//! `cudaMallocAsync` pools and graphs, alone and under `libtessera.so`.
//! Judged by the simulator's record (the memory it holds for the process,
//! its launch log, its timeline), not only by CuPy's answers.
//!
//! The Python environments are made once, by pip, in `target/pyenv-cuda`
//! (CUDA 12) and `target/pyenv-cuda13` (CUDA 13): virtual environments,
//! remade when the pinned versions change; where they cannot be made (no
//! Python, no PyPI) the tests are skipped.

use std::io::{BufRead, BufReader, Lines, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;

use tessera_testkit::or_skip;
use tessera_testkit::sim::{Gpu, Node, NodeSpec, artifact, workspace};

const MIB: u64 = 1 << 20;

/// A Python environment: its folder under `target/` and what pip puts in it.
struct Env {
    dir: &'static str,
    requirements: &'static [&'static str],
}

/// CuPy for CUDA 12 with NVIDIA's 12.9 runtime and NVRTC.
const CUDA12: Env = Env {
    dir: "pyenv-cuda",
    requirements: &[
        "cupy-cuda12x==14.2.0",
        "nvidia-cuda-runtime-cu12==12.9.79",
        "nvidia-cuda-nvrtc-cu12==12.9.86",
    ],
};

/// CuPy for CUDA 13 with NVIDIA's 13.5 runtime and NVRTC.
const CUDA13: Env = Env {
    dir: "pyenv-cuda13",
    requirements: &[
        "cupy-cuda13x==14.2.0",
        "nvidia-cuda-runtime==13.5.37",
        "nvidia-cuda-nvrtc==13.5.37",
    ],
};

/// The environment's Python, made on first use (see the module docs).
fn python(env: &'static Env) -> Result<PathBuf, String> {
    static MADE: [OnceLock<Result<PathBuf, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = if std::ptr::eq(env, &CUDA12) { 0 } else { 1 };
    MADE[slot].get_or_init(|| make_env(env)).clone()
}

fn make_env(env: &Env) -> Result<PathBuf, String> {
    let dir = workspace().join("target").join(env.dir);
    let stamp = env.requirements.join("\n");
    let python = dir.join("bin/python");
    if std::fs::read_to_string(dir.join("tessera-stamp"))
        .ok()
        .as_deref()
        == Some(&stamp)
        && python.is_file()
    {
        return Ok(python);
    }
    // Made beside its place and renamed into it, so that a run stopped
    // half-way leaves nothing that looks finished.
    let tmp = workspace().join(format!("target/{}.tmp-{}", env.dir, std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("python3").args(["-m", "venv"]).arg(&tmp))
        .map_err(|e| format!("no Python virtual environment for CuPy: {e}"))?;
    let started = std::time::Instant::now();
    let installed = run(Command::new(tmp.join("bin/python"))
        .args(["-m", "pip", "install", "--quiet"])
        .arg("--disable-pip-version-check")
        .args(env.requirements));
    if let Err(e) = installed {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(format!(
            "pip could not install CuPy and NVIDIA's runtime wheels: {e}"
        ));
    }
    eprintln!(
        "made {} in {:.0?} (pip: {})",
        dir.display(),
        started.elapsed(),
        env.requirements.join(", ")
    );
    std::fs::write(tmp.join("tessera-stamp"), &stamp).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(python)
}

fn run(c: &mut Command) -> Result<(), String> {
    let out = c.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        Err(format!(
            "{}: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ))
    }
}

/// `cupy_steps.py <scenario>` running on a node, stopped at each step.
struct Steps {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: PathBuf,
    scenario: String,
}

impl Steps {
    fn start(mut c: Command, node: &Node, scenario: &str) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/cupy_steps.py");
        let stderr = node.dir.path().join(format!("{scenario}.stderr"));
        let mut child = c
            .arg(script)
            .arg(scenario)
            // A cache of its own, so NVRTC compiles every kernel each run.
            .env("CUPY_CACHE_DIR", node.dir.path().join("cupy-cache"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start python");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Self {
            child,
            stdin,
            lines,
            stderr,
            scenario: scenario.into(),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for step `name` and returns its values (the process then
    /// waits until [`Steps::go_on`]).
    fn at(&mut self, name: &str) -> serde_json::Value {
        let line = self.lines.next().and_then(Result::ok);
        let Some(line) = line else {
            let status = self.child.wait();
            panic!(
                "{}: ended before step {name} ({status:?}); stderr:\n{}",
                self.scenario,
                self.stderr()
            );
        };
        let rest = line
            .strip_prefix("step ")
            .and_then(|r| r.strip_prefix(name))
            .unwrap_or_else(|| panic!("{}: expected step {name}, got {line:?}", self.scenario));
        serde_json::from_str(rest.trim()).expect("step values")
    }

    fn go_on(&mut self) {
        writeln!(self.stdin).expect("resume the script");
        self.stdin.flush().expect("flush");
    }

    /// Lets the script finish; checks it ended well and returns its stderr.
    fn finish(mut self) -> String {
        self.go_on();
        let end = self.lines.next().and_then(Result::ok);
        let status = self.child.wait().expect("wait");
        let stderr = self.stderr();
        assert!(
            status.success() && end.as_deref() == Some("end"),
            "{}: {status}, last line {end:?}; stderr:\n{stderr}",
            self.scenario
        );
        // The gaps the driver logged, for whoever reads the test's output.
        for l in stderr.lines().filter(|l| l.starts_with("gpusim:")) {
            println!("{}: {l}", self.scenario);
        }
        stderr
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let mut s = Steps::start(node.command(&python), &node, "basics");

    let v = s.at("counted");
    assert_eq!(u(&v, "count"), 1, "{v}");
    assert_eq!(v["name"], "Tessera Sim GPU", "{v}");
    assert_eq!(u(&v, "total_global"), 8192 * MIB, "{v}");
    assert_eq!(u(&v, "sms"), 100, "{v}");
    assert_eq!(v["cc"], serde_json::json!([9, 0]), "{v}");
    assert_eq!(held(&node, s.pid()), 0, "counting devices makes no context");
    s.go_on();

    let v = s.at("started");
    assert_eq!(u(&v, "total"), 8192 * MIB, "{v}");
    // cudart made the primary context: the node holds its overhead.
    let context = held(&node, s.pid());
    assert_eq!(context, 300 * MIB);
    s.go_on();

    let v = s.at("allocated");
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
    let mut s = Steps::start(node.command(&python), &node, "kernels");

    let before = held(&node, s.pid());
    s.at("async");
    assert!(
        held(&node, s.pid()) >= before + 64 * MIB,
        "a 64 MiB cudaMallocAsync is held on the node"
    );
    s.go_on();

    let v = s.at("done");
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
    s.finish();
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
    let mut s = Steps::start(c, &node, "limit");

    let v = s.at("started");
    assert_eq!(
        u(&v, "total"),
        2000 * MIB,
        "memGetInfo shows the limit: {v}"
    );
    s.go_on();

    let v = s.at("full");
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

    let v = s.at("async_full");
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
fn cupy_for_cuda_13_runs_on_a_cuda_13_node() {
    let python = or_skip!(python(&CUDA13));
    let node = NodeSpec::small_with(Gpu::sim(8192))
        .cuda_version(13050)
        .fixed_kernel("tessera_slow", 50_000_000)
        .build();
    let mut s = Steps::start(node.command(&python), &node, "basics");
    s.at("counted");
    assert_eq!(held(&node, s.pid()), 0, "counting devices makes no context");
    s.go_on();
    let v = s.at("started");
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

    let mut s = Steps::start(node.command(&python), &node, "kernels");
    s.at("async");
    s.go_on();
    let v = s.at("done");
    let slow_ms = v["slow_ms"].as_f64().expect("slow_ms");
    assert!((49.0..1000.0).contains(&slow_ms), "{v}");
    s.finish();
}

#[test]
fn cuda_13_runtime_refuses_a_cuda_12_driver() {
    let python = or_skip!(python(&CUDA13));
    // The default node's driver speaks CUDA 12.8: NVIDIA's 13.x runtime
    // refuses it, as it refuses a real 12.x driver.
    let node = NodeSpec::small_with(Gpu::sim(8192)).build();
    let mut s = Steps::start(node.command(&python), &node, "basics");
    let line = s.lines.next().and_then(Result::ok);
    let status = s.child.wait().expect("wait");
    assert!(!status.success() && line.is_none(), "{line:?}");
    assert!(
        s.stderr().contains("cudaErrorInsufficientDriver"),
        "{}",
        s.stderr()
    );
}
