//! A simulated node plus one container's region, and workloads run in that
//! container under `libtessera.so`.

#![allow(dead_code, clippy::unwrap_used)]

pub use tessera_testkit::sim;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tessera_region::control::{ControlSpec, GpuLimits};
use tessera_region::file::{Mapped, create_control, create_usage};
use tessera_region::layout::ControlRegion;
use tessera_region::reader::{UsageSnapshot, read_usage};

pub use sim::{Link, Node, field};

pub const MIB: u64 = 1 << 20;

/// Asserts a token bucket's bound on `log`, the warps the simulator ran in
/// each of consecutive milliseconds: any k whole milliseconds (which span
/// less than k ms) hold at most `rate` × k ms + `burst` warps, plus
/// `last` (one launch taken alone that may end a window, as in any GCRA).
/// `what` names the log in the failure.
pub fn assert_within_bucket(log: &[u64], rate: u64, burst: u64, last: u64, what: &str) {
    for i in 0..log.len() {
        let mut sum = 0;
        for (w, &n) in log[i..].iter().enumerate() {
            sum += n;
            let allowed = rate * (w as u64 + 1) / 1000 + burst + last;
            assert!(
                sum <= allowed,
                "{what}: {sum} warps in {} ms (allowed {allowed})",
                w + 1
            );
        }
    }
}

/// A container: a region directory on a simulated node.
pub struct Container {
    pub node: Node,
    pub region: PathBuf,
    pub control: Mapped<ControlRegion>,
    pub uuid: [u8; 16],
}

/// The library under test.
pub fn libtessera() -> PathBuf {
    let lib = sim::artifacts().join("lib/libtessera.so");
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo xtask build`",
        lib.display()
    );
    lib
}

/// Limits with a memory limit of `mib` MiB, the node's 300 MiB context
/// overhead and no launch limit.
pub fn memory_limit(uuid: [u8; 16], mib: u64) -> GpuLimits {
    GpuLimits {
        memory_limit: mib * MIB,
        context_overhead: 300 * MIB,
        ..GpuLimits::unlimited(uuid)
    }
}

impl Container {
    /// A container on the small test node with GPU 0 under `limits`.
    pub fn new(limits: impl FnOnce([u8; 16]) -> GpuLimits) -> Self {
        Self::on(Node::small(), limits)
    }

    /// A container on `node`.
    pub fn on(node: Node, limits: impl FnOnce([u8; 16]) -> GpuLimits) -> Self {
        let uuid = node.sim().uuid_bytes(0);
        let region = node.dir.path().join("region");
        std::fs::create_dir_all(&region).unwrap();
        let control = create_control(
            &region,
            &ControlSpec {
                flags: 0,
                gpus: vec![limits(uuid)],
            },
        )
        .unwrap();
        create_usage(&region).unwrap();
        Self {
            node,
            region,
            control,
            uuid,
        }
    }

    /// Publishes new limits (as the agent does).
    pub fn set(&self, limits: GpuLimits) {
        self.control
            .write(&ControlSpec {
                flags: 0,
                gpus: vec![limits],
            })
            .unwrap();
    }

    /// A command running in this container under the library.
    pub fn command(&self, program: &Path) -> Command {
        let mut c = self.node.command(program);
        c.env("LD_PRELOAD", libtessera())
            .env("TESSERA_REGION_DIR", &self.region);
        c
    }

    /// Runs the workload and returns its output (any exit status).
    pub fn output(&self, link: Link, ops: &str) -> Output {
        self.command(&sim::workload(link))
            .args(ops.split_whitespace())
            .output()
            .unwrap()
    }

    /// Runs the workload, expecting success; returns stdout.
    pub fn run(&self, link: Link, ops: &str) -> String {
        let out = self.output(link, ops);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "workload {ops} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Starts the workload under the library and waits for `ready`.
    pub fn spawn_ready(&self, link: Link, ops: &str) -> sim::Running {
        let mut c = self.command(&sim::workload(link));
        c.args(ops.split_whitespace());
        sim::spawn_command_ready(c, ops)
    }

    /// The usage region as the agent reads it.
    pub fn usage(&self) -> UsageSnapshot {
        read_usage(&std::fs::read(self.region.join("usage")).unwrap()).unwrap()
    }
}

/// Compiles `tests/c/<name>.c` into `dir`, linked against the stand-in
/// `libcuda` and `libnvidia-ml` (with an rpath) and pthreads.
pub fn linked_probe(dir: &Path, name: &str) -> PathBuf {
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let sim = sim::sim_dir();
    sim::cc(&[
        src.to_str().unwrap(),
        "-o",
        exe.to_str().unwrap(),
        &format!("-L{}", sim.display()),
        &format!("-Wl,-rpath,{}", sim.display()),
        "-lcuda",
        "-lnvidia-ml",
        "-lpthread",
    ]);
    exe
}

/// `tests/c/graph_probe.c` built for `link`, once per test binary.
pub fn graph_probe(link: Link) -> PathBuf {
    static BUILT: std::sync::OnceLock<(tempfile::TempDir, [PathBuf; 3])> =
        std::sync::OnceLock::new();
    let (_, bins) = BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/graph_probe.c");
        let sim = sim::sim_dir();
        let bin = |name: &str| dir.path().join(name);
        let (direct, dl, dlsym) = (bin("direct"), bin("dlopen"), bin("dlsym"));
        sim::cc(&[
            src,
            "-o",
            direct.to_str().unwrap(),
            &format!("-L{}", sim.display()),
            &format!("-Wl,-rpath,{}", sim.display()),
            "-lcuda",
            "-lpthread",
        ]);
        sim::cc(&[
            "-DUSE_DLOPEN",
            src,
            "-o",
            dl.to_str().unwrap(),
            "-ldl",
            "-lpthread",
        ]);
        sim::cc(&[
            "-DUSE_DLOPEN",
            "-DUSE_DLSYM",
            src,
            "-o",
            dlsym.to_str().unwrap(),
            "-ldl",
            "-lpthread",
        ]);
        (dir, [direct, dl, dlsym])
    });
    bins[link as usize].clone()
}

impl Container {
    /// Runs the graph probe under the library, expecting success; returns
    /// stdout.
    pub fn probe(&self, link: Link, ops: &str) -> String {
        let out = self
            .command(&graph_probe(link))
            .args(ops.split_whitespace())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "probe {ops} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Starts the graph probe under the library and waits for `ready`.
    pub fn spawn_probe(&self, link: Link, ops: &str) -> sim::Running {
        let mut c = self.command(&graph_probe(link));
        c.args(ops.split_whitespace());
        sim::spawn_command_ready(c, ops)
    }

    /// Bytes the simulator (the driver) holds for process `pid` on GPU 0.
    pub fn held(&self, pid: i32) -> u64 {
        self.node
            .sim()
            .processes(0)
            .unwrap()
            .iter()
            .filter(|x| x.pid == pid)
            .map(|x| x.bytes)
            .sum()
    }
}
