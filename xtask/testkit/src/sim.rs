//! Shared helpers for the simulator's integration tests: the built
//! artifacts, a private simulated node per test, and the C workload.

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;

use gpusim::Sim;
use gpusim::state::Config;

/// The workspace root (the folder holding `Cargo.lock`).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .expect("workspace root")
        .to_path_buf()
}

/// The artifacts folder (`TESSERA_ARTIFACTS`, default
/// `target/tessera/debug`), checked for the simulator libraries.
pub fn artifacts() -> PathBuf {
    let dir = std::env::var_os("TESSERA_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/tessera/debug"));
    let lib = dir.join("sim/libcuda.so.1");
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo xtask build` first (or `cargo xtask test`)",
        lib.display()
    );
    dir
}

/// The folder holding `libcuda.so.1` and `libnvidia-ml.so.1`.
pub fn sim_dir() -> PathBuf {
    artifacts().join("sim")
}

/// `rel` in the artifacts folder, checked to exist.
pub fn artifact(rel: &str) -> PathBuf {
    let p = artifacts().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask build` first (or `cargo xtask test`)",
        p.display()
    );
    p
}

/// A simulated node private to one test.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub node: PathBuf,
    pub state: PathBuf,
}

/// One GPU of 4 GiB, 100 SMs, a 300 MiB context overhead, a fixed-duration
/// `spin` kernel (200 µs) and a 5 ms `slow` one.
pub const SMALL_NODE: &str = r#"
[[gpu]]
model = "Tessera Sim GPU"
memory_mib = 4096
sm_count = 100

[cost]
context_overhead_mib = 300
[cost.functions.spin]
fixed_ns = 200000
[cost.functions.slow]
fixed_ns = 5000000

[ioctl]
control = "/dev/null"
uvm = "/dev/zero"
"#;

impl Node {
    /// A node from description text.
    pub fn new(toml: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = dir.path().join("node.toml");
        std::fs::write(&node, toml).expect("write node description");
        let state = dir.path().join("state");
        Self { dir, node, state }
    }

    /// The default test node.
    pub fn small() -> Self {
        Self::new(SMALL_NODE)
    }

    /// A command with this node's environment and the simulator libraries
    /// on the library path.
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        c.env("GPUSIM_NODE", &self.node)
            .env("GPUSIM_STATE", &self.state)
            .env("LD_LIBRARY_PATH", sim_dir());
        c
    }

    /// Runs the `gpusim` CLI on this node.
    pub fn gpusim_output(&self, args: &[&str]) -> std::process::Output {
        self.command(&artifact("bin/gpusim"))
            .args(args)
            .output()
            .expect("run gpusim")
    }

    /// Runs the `gpusim` CLI on this node and returns its stdout; panics if
    /// it fails.
    pub fn gpusim(&self, args: &[&str]) -> String {
        let out = self.gpusim_output(args);
        assert!(out.status.success(), "gpusim {args:?}: {out:?}");
        String::from_utf8(out.stdout).expect("utf-8 from gpusim")
    }

    /// This test's own view of the node (as NVML and the CLI see it).
    pub fn sim(&self) -> Sim {
        Sim::open(&Config {
            node_path: Some(self.node.clone()),
            state_path: self.state.clone(),
        })
        .expect("open simulated node")
    }

    /// Runs the workload with `ops` and returns its stdout.
    pub fn run(&self, link: Link, ops: &str) -> String {
        let out = self
            .command(&workload(link))
            .args(ops.split_whitespace())
            .output()
            .expect("run workload");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "workload {ops} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Starts the workload and waits until it prints `ready`.
    pub fn spawn_ready(&self, link: Link, ops: &str) -> Running {
        let mut c = self.command(&workload(link));
        c.args(ops.split_whitespace());
        spawn_command_ready(c, ops)
    }
}

/// Starts `c` (a workload with `ops`) and waits until it prints `ready`.
pub fn spawn_command_ready(mut c: Command, ops: &str) -> Running {
    let child = c.stdout(Stdio::piped()).spawn().expect("spawn workload");
    // Dropping `running` (also on panic) kills and reaps the child.
    let mut running = Running {
        child,
        seen: Vec::new(),
        lines: None,
    };
    let stdout = running.child.stdout.take().expect("stdout");
    running.lines = Some(BufReader::new(stdout).lines());
    while let Some(line) = running.next_line() {
        if line == "ready" {
            return running;
        }
        assert!(!line.starts_with("error"), "workload {ops}: {line}");
        running.seen.push(line);
    }
    panic!("workload {ops} ended before ready: {:?}", running.seen);
}

/// A workload process that is running.
pub struct Running {
    pub child: Child,
    pub seen: Vec<String>,
    lines: Option<Lines<BufReader<ChildStdout>>>,
}

impl Running {
    /// The next line the workload prints (blocks; `None` at its end).
    pub fn next_line(&mut self) -> Option<String> {
        self.lines.as_mut()?.next()?.ok()
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How the workload reaches libcuda.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// `-lcuda`.
    Direct,
    /// `dlopen` + `cuGetProcAddress_v2`.
    Dlopen,
    /// `dlopen` + `dlsym` of versioned names.
    Dlsym,
}

/// The C workload, compiled once per test binary.
pub fn workload(link: Link) -> PathBuf {
    static BUILT: OnceLock<(tempfile::TempDir, PathBuf, PathBuf, PathBuf)> = OnceLock::new();
    let (_, direct, dl, dlsym) = BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = workspace().join("xtask/gpusim/tests/c/workload.c");
        let sim = sim_dir();
        let direct = dir.path().join("workload");
        let dl = dir.path().join("workload-dlopen");
        let dlsym = dir.path().join("workload-dlsym");
        cc(&[
            src.to_str().expect("utf-8 path"),
            "-o",
            direct.to_str().expect("utf-8 path"),
            &format!("-L{}", sim.display()),
            &format!("-Wl,-rpath,{}", sim.display()),
            "-lcuda",
        ]);
        cc(&[
            "-DUSE_DLOPEN",
            src.to_str().expect("utf-8 path"),
            "-o",
            dl.to_str().expect("utf-8 path"),
            "-ldl",
        ]);
        cc(&[
            "-DUSE_DLOPEN",
            "-DUSE_DLSYM",
            src.to_str().expect("utf-8 path"),
            "-o",
            dlsym.to_str().expect("utf-8 path"),
            "-ldl",
        ]);
        (dir, direct, dl, dlsym)
    });
    match link {
        Link::Direct => direct.clone(),
        Link::Dlopen => dl.clone(),
        Link::Dlsym => dlsym.clone(),
    }
}

/// Compiles with the C compiler (`CC`, default `cc`), warnings as errors.
pub fn cc(args: &[&str]) {
    let out = Command::new(std::env::var_os("CC").unwrap_or("cc".into()))
        .args(["-O1", "-Wall", "-Werror", "-Wno-unused-function"])
        .args(args)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value after `key` on the line starting with `key`.
pub fn field<'a>(out: &'a str, key: &str) -> Vec<&'a str> {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no {key} line in {out}"))
        .split_whitespace()
        .skip(1)
        .collect()
}
