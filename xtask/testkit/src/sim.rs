//! Shared helpers for the simulator's integration tests: the built
//! artifacts, a private simulated node per test, and the C workload.

use std::collections::BTreeMap;
use std::fmt::Write as _;
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

/// A simulated node's description, written as the TOML `gpusim` reads
/// (`xtask/gpusim/src/node.rs`). What is not set is left to the
/// simulator's defaults, except what most tests write out: a 300 MiB
/// context overhead and the ioctl stand-ins `/dev/null` and `/dev/zero`.
///
/// ```no_run
/// use tessera_testkit::sim::{Gpu, NodeSpec};
/// let node = NodeSpec::new()
///     .gpu(Gpu::sim(4096))
///     .fixed_kernel("spin", 200_000)
///     .build();
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpec {
    driver_version: Option<String>,
    cuda_version: Option<i32>,
    gpus: Vec<Gpu>,
    context_overhead_mib: u64,
    /// Fixed kernel durations (ns), by name.
    fixed_kernels: BTreeMap<String, u64>,
    ioctl_xfer: bool,
    gpu_devices: Vec<PathBuf>,
}

/// One GPU of a [`NodeSpec`]; what is not set is the simulator's default
/// (compute capability 9.0, NUMA node 0, no NVLink, UUID and PCI bus id
/// derived from the index).
#[derive(Clone, Debug, PartialEq)]
pub struct Gpu {
    model: String,
    memory_mib: u64,
    sm_count: u32,
    compute_capability: Option<[u32; 2]>,
    numa_node: Option<i32>,
    nvlink_peers: Vec<u32>,
    uuid: Option<String>,
    pci_bus_id: Option<String>,
    pci_device_id: Option<u32>,
    reserved_mib: Option<u64>,
    mig_enabled: bool,
}

impl Gpu {
    /// A GPU named `model` with `memory_mib` of memory and 100 SMs.
    pub fn new(model: &str, memory_mib: u64) -> Self {
        Self {
            model: model.into(),
            memory_mib,
            sm_count: 100,
            compute_capability: None,
            numa_node: None,
            nvlink_peers: Vec::new(),
            uuid: None,
            pci_bus_id: None,
            pci_device_id: None,
            reserved_mib: None,
            mig_enabled: false,
        }
    }

    /// The tests' usual GPU: "Tessera Sim GPU", 100 SMs.
    pub fn sim(memory_mib: u64) -> Self {
        Self::new("Tessera Sim GPU", memory_mib)
    }

    /// An "NVIDIA H100 80GB HBM3": 81559 MiB, 132 SMs.
    pub fn h100() -> Self {
        Self::new("NVIDIA H100 80GB HBM3", 81_559).sms(132)
    }

    /// Its memory (MiB).
    pub fn memory_mib(mut self, mib: u64) -> Self {
        self.memory_mib = mib;
        self
    }

    /// Its streaming multiprocessors.
    pub fn sms(mut self, sm_count: u32) -> Self {
        self.sm_count = sm_count;
        self
    }

    /// Its compute capability.
    pub fn compute_capability(mut self, major: u32, minor: u32) -> Self {
        self.compute_capability = Some([major, minor]);
        self
    }

    /// The NUMA node of its PCIe root.
    pub fn numa(mut self, node: i32) -> Self {
        self.numa_node = Some(node);
        self
    }

    /// The GPUs (indices) it reaches over NVLink.
    pub fn nvlink(mut self, peers: &[u32]) -> Self {
        self.nvlink_peers = peers.to_vec();
        self
    }

    /// Its UUID (`GPU-…`).
    pub fn uuid(mut self, uuid: &str) -> Self {
        self.uuid = Some(uuid.into());
        self
    }

    /// Its PCI bus id, in any form the simulator accepts.
    pub fn pci_bus_id(mut self, id: &str) -> Self {
        self.pci_bus_id = Some(id.into());
        self
    }

    /// Its PCI device id (device in the upper 16 bits, vendor below).
    pub fn pci_device_id(mut self, id: u32) -> Self {
        self.pci_device_id = Some(id);
        self
    }

    /// Memory the driver keeps for itself (MiB).
    pub fn reserved_mib(mut self, mib: u64) -> Self {
        self.reserved_mib = Some(mib);
        self
    }

    /// MIG mode reported as enabled.
    pub fn mig_enabled(mut self) -> Self {
        self.mig_enabled = true;
        self
    }

    fn write_toml(&self, t: &mut String) {
        t.push_str("\n[[gpu]]\n");
        line(t, "model", &quote(&self.model));
        line(t, "memory_mib", &self.memory_mib.to_string());
        if let Some(mib) = self.reserved_mib {
            line(t, "reserved_mib", &mib.to_string());
        }
        line(t, "sm_count", &self.sm_count.to_string());
        if let Some([major, minor]) = self.compute_capability {
            line(t, "compute_capability", &format!("[{major}, {minor}]"));
        }
        if let Some(numa) = self.numa_node {
            line(t, "numa_node", &numa.to_string());
        }
        if !self.nvlink_peers.is_empty() {
            let peers: Vec<String> = self.nvlink_peers.iter().map(u32::to_string).collect();
            line(t, "nvlink_peers", &format!("[{}]", peers.join(", ")));
        }
        if let Some(uuid) = &self.uuid {
            line(t, "uuid", &quote(uuid));
        }
        if let Some(id) = &self.pci_bus_id {
            line(t, "pci_bus_id", &quote(id));
        }
        if let Some(id) = self.pci_device_id {
            line(t, "pci_device_id", &format!("{id:#010x}"));
        }
        if self.mig_enabled {
            line(t, "mig_enabled", "true");
        }
    }
}

impl Default for NodeSpec {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeSpec {
    /// A node without GPUs yet (add them with [`NodeSpec::gpu`]).
    pub fn new() -> Self {
        Self {
            driver_version: None,
            cuda_version: None,
            gpus: Vec::new(),
            context_overhead_mib: 300,
            fixed_kernels: BTreeMap::new(),
            ioctl_xfer: false,
            gpu_devices: Vec::new(),
        }
    }

    /// The default test node: one GPU of 4 GiB and 100 SMs, a 300 MiB
    /// context overhead, a fixed-duration `spin` kernel (200 µs) and a
    /// 5 ms `slow` one.
    pub fn small() -> Self {
        Self::small_with(Gpu::sim(4096))
    }

    /// [`NodeSpec::small`] with `gpu` instead of its GPU.
    pub fn small_with(gpu: Gpu) -> Self {
        Self::new()
            .gpu(gpu)
            .fixed_kernel("spin", 200_000)
            .fixed_kernel("slow", 5_000_000)
    }

    /// The driver version NVML reports (e.g. `"550.54.15"`).
    pub fn driver_version(mut self, version: &str) -> Self {
        self.driver_version = Some(version.into());
        self
    }

    /// The CUDA driver API version (e.g. 12040 for 12.4).
    pub fn cuda_version(mut self, version: i32) -> Self {
        self.cuda_version = Some(version);
        self
    }

    /// Adds a GPU (the next index).
    pub fn gpu(mut self, gpu: Gpu) -> Self {
        self.gpus.push(gpu);
        self
    }

    /// Memory a context costs on its GPU (MiB; 300 unless set).
    pub fn context_overhead_mib(mut self, mib: u64) -> Self {
        self.context_overhead_mib = mib;
        self
    }

    /// Kernel `name` takes `ns` whatever its grid.
    pub fn fixed_kernel(mut self, name: &str, ns: u64) -> Self {
        self.fixed_kernels.insert(name.into(), ns);
        self
    }

    /// Every frontend escape wrapped in `NV_ESC_IOCTL_XFER_CMD`.
    pub fn ioctl_xfer(mut self) -> Self {
        self.ioctl_xfer = true;
        self
    }

    /// Stand-ins for `/dev/nvidia<i>`, by GPU index.
    pub fn ioctl_devices(mut self, devices: &[&str]) -> Self {
        self.gpu_devices = devices.iter().map(PathBuf::from).collect();
        self
    }

    /// The description as TOML.
    pub fn toml(&self) -> String {
        let mut t = String::new();
        if let Some(v) = &self.driver_version {
            line(&mut t, "driver_version", &quote(v));
        }
        if let Some(v) = self.cuda_version {
            line(&mut t, "cuda_version", &v.to_string());
        }
        for gpu in &self.gpus {
            gpu.write_toml(&mut t);
        }
        t.push_str("\n[cost]\n");
        line(
            &mut t,
            "context_overhead_mib",
            &self.context_overhead_mib.to_string(),
        );
        for (name, ns) in &self.fixed_kernels {
            let _ = writeln!(t, "[cost.functions.{}]", key(name));
            line(&mut t, "fixed_ns", &ns.to_string());
        }
        t.push_str("\n[ioctl]\n");
        line(&mut t, "control", &quote("/dev/null"));
        line(&mut t, "uvm", &quote("/dev/zero"));
        if self.ioctl_xfer {
            line(&mut t, "xfer", "true");
        }
        if !self.gpu_devices.is_empty() {
            let devices: Vec<String> = self
                .gpu_devices
                .iter()
                .map(|p| quote(&p.to_string_lossy()))
                .collect();
            line(&mut t, "gpu_devices", &format!("[{}]", devices.join(", ")));
        }
        t
    }

    /// A node private to the calling test, described by this.
    pub fn build(&self) -> Node {
        Node::from_spec(self)
    }
}

fn line(t: &mut String, key: &str, value: &str) {
    let _ = writeln!(t, "{key} = {value}");
}

/// `name` as a TOML key: bare when it may be, else quoted.
fn key(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare { name.into() } else { quote(name) }
}

/// `s` as a TOML basic string.
fn quote(s: &str) -> String {
    let mut q = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(q, "\\u{:04X}", c as u32);
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// A simulated node private to one test.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub node: PathBuf,
    pub state: PathBuf,
}

impl Node {
    /// A node from description text.
    pub fn new(toml: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = dir.path().join("node.toml");
        std::fs::write(&node, toml).expect("write node description");
        let state = dir.path().join("state");
        Self { dir, node, state }
    }

    /// A node from a [`NodeSpec`].
    pub fn from_spec(spec: &NodeSpec) -> Self {
        Self::new(&spec.toml())
    }

    /// The default test node ([`NodeSpec::small`]).
    pub fn small() -> Self {
        NodeSpec::small().build()
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use gpusim::NodeDescription;

    use super::*;

    fn parse(text: &str) -> NodeDescription {
        NodeDescription::parse(text, Path::new("node.toml")).unwrap()
    }

    /// The small node as the tests wrote it by hand before the builder.
    const SMALL_NODE: &str = r#"
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

    #[test]
    fn the_small_node_is_the_hand_written_one() {
        assert_eq!(parse(&NodeSpec::small().toml()), parse(SMALL_NODE));
    }

    #[test]
    fn every_field_reaches_the_description() {
        let spec = NodeSpec::new()
            .driver_version("550.54.15")
            .cuda_version(12040)
            .gpu(
                Gpu::new("NVIDIA A100-SXM4-80GB", 81920)
                    .reserved_mib(512)
                    .sms(108)
                    .compute_capability(8, 0)
                    .numa(0)
                    .nvlink(&[1])
                    .uuid("GPU-11111111-2222-3333-4444-555555555555")
                    .pci_bus_id("0000:3b:00.0")
                    .pci_device_id(0x20b2_10de)
                    .mig_enabled(),
            )
            .gpu(Gpu::h100().numa(1).nvlink(&[0]))
            .context_overhead_mib(0)
            .fixed_kernel("tiny", 1000)
            .fixed_kernel("with space", 7)
            .ioctl_xfer()
            .ioctl_devices(&["/dev/full"]);
        let n = parse(&spec.toml());
        assert_eq!(n.driver_version, "550.54.15");
        assert_eq!(n.cuda_version, 12040);
        let g = &n.gpu[0];
        assert_eq!(g.model, "NVIDIA A100-SXM4-80GB");
        assert_eq!(
            (g.memory_mib, g.reserved_mib, g.sm_count),
            (81920, 512, 108)
        );
        assert_eq!(g.compute_capability, [8, 0]);
        assert_eq!((g.numa_node, g.nvlink_peers.as_slice()), (0, &[1][..]));
        assert_eq!(n.uuid(0), "GPU-11111111-2222-3333-4444-555555555555");
        assert_eq!(n.pci_address(0).to_string(), "0000:3b:00.0");
        assert_eq!(g.pci_device_id, 0x20b2_10de);
        assert!(g.mig_enabled);
        let h = &n.gpu[1];
        assert_eq!(
            (h.model.as_str(), h.memory_mib, h.sm_count),
            ("NVIDIA H100 80GB HBM3", 81559, 132)
        );
        assert_eq!((h.numa_node, h.nvlink_peers.as_slice()), (1, &[0][..]));
        assert!(!h.mig_enabled);
        assert_eq!(n.cost.context_overhead_mib, 0);
        assert_eq!(n.cost.functions["tiny"].fixed_ns, Some(1000));
        assert_eq!(n.cost.functions["with space"].fixed_ns, Some(7));
        assert!(n.ioctl.xfer);
        assert_eq!(n.ioctl.control, Path::new("/dev/null"));
        assert_eq!(n.ioctl.uvm, Path::new("/dev/zero"));
        assert_eq!(n.ioctl.gpu_devices, [PathBuf::from("/dev/full")]);
    }

    #[test]
    fn what_is_not_set_is_the_simulators_default() {
        let n = parse(&NodeSpec::new().gpu(Gpu::sim(1024)).toml());
        let mut expected = NodeDescription::default_node();
        expected.gpu.truncate(1);
        let g = &mut expected.gpu[0];
        g.model = "Tessera Sim GPU".into();
        g.memory_mib = 1024;
        g.sm_count = 100;
        g.nvlink_peers.clear();
        assert_eq!(n, expected);
    }

    #[test]
    fn strings_are_quoted() {
        let spec = NodeSpec::new().gpu(Gpu::new("a \"b\" \\ c\u{1}", 1024));
        assert_eq!(parse(&spec.toml()).gpu[0].model, "a \"b\" \\ c\u{1}");
    }
}
