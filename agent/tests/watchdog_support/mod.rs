//! Shared by the watchdog tests: a simulated node whose GPU has a device
//! node stand-in (`/dev/full`, what the deny action guards), real test
//! cgroups under the detected cgroup v2 root, hostile tenants started
//! inside them, and the simulator's record of their memory.

#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use tessera_agent::cgroup::cgroup2_root;
use tessera_testkit::sim::{self, Gpu, Node, NodeSpec};

pub const MIB: u64 = 1 << 20;
/// The simulator's context overhead (see the node below).
pub const CONTEXT_MIB: u64 = 300;

/// One 4 GiB GPU, 300 MiB per context, a 200 µs `spin` kernel; its device
/// node stand-in is `/dev/full` (opened when a context is created).
pub fn node_spec() -> NodeSpec {
    NodeSpec::new()
        .gpu(Gpu::sim(4096))
        .context_overhead_mib(CONTEXT_MIB)
        .fixed_kernel("spin", 200_000)
        .ioctl_devices(&["/dev/full"])
}

/// The devices the agent guards and watches on that node.
pub const DEVICES: &str = r#"["control=/dev/null", "uvm=/dev/zero", "gpu=/dev/full"]"#;

/// Why this machine cannot run the watchdog tests, if it cannot.
pub fn skip_reason() -> Option<String> {
    let euid = rustix::process::geteuid();
    if !euid.is_root() {
        return Some("not root".into());
    }
    cgroup2_root().err().map(|e| e.to_string())
}

/// A cgroup made for one test, under the detected v2 root; on drop its
/// processes are killed (thawed first) and it is removed.
pub struct TestCgroup {
    pub dir: PathBuf,
}

impl TestCgroup {
    pub fn new(name: &str) -> Self {
        let root = cgroup2_root().unwrap();
        let dir = root.join(format!("tessera-wd-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Self { dir }
    }

    /// `frozen 1` in cgroup.events (the kernel's word).
    pub fn frozen(&self) -> bool {
        std::fs::read_to_string(self.dir.join("cgroup.events"))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == "frozen 1"))
    }

    /// Whether a new process in this cgroup may open `/dev/full` (the
    /// GPU's device node stand-in): `Ok` or the shell's error text.
    pub fn probe_open(&self) -> Result<(), String> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {} && exec 3</dev/full && echo opened",
                self.dir.join("cgroup.procs").display()
            ))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if stdout.contains("opened") {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("cgroup.freeze"), "0");
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        let _ = wait_for(Duration::from_secs(5), || {
            std::fs::remove_dir(&self.dir).is_ok().then_some(())
        });
    }
}

/// Polls `f` every 5 ms (the detection times are measured with it) until
/// it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    tessera_testkit::poll::wait_for_every(Duration::from_millis(5), timeout, f)
}

/// A process of the hostile tenant, started inside a test cgroup.
pub struct Tenant {
    pub child: Child,
    pub stdin: ChildStdin,
    lines: Receiver<String>,
    pub seen: Vec<String>,
}

impl Tenant {
    /// Runs `program args` on `node` inside `cg` (moved in before it
    /// execs), with `env`; waits until it prints `ready`.
    pub fn start(
        node: &Node,
        cg: &TestCgroup,
        program: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> Self {
        let mut c = node.command(Path::new("sh"));
        c.arg("-c")
            .arg(format!(
                "echo $$ > {} && exec \"$0\" \"$@\"",
                cg.dir.join("cgroup.procs").display()
            ))
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut t = Self {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        };
        t.expect("ready");
        t
    }

    /// Reads lines until `want` (30 s at most); panics on an error line.
    pub fn expect(&mut self, want: &str) {
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) if line == want => return,
                Ok(line) => {
                    assert!(
                        !line.starts_with("error"),
                        "tenant: {line} ({:?})",
                        self.seen
                    );
                    self.seen.push(line);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(_) => break,
            }
        }
        panic!("tenant never printed {want:?}: {:?}", self.seen);
    }

    /// Sends one line (a workload's `wait` goes on).
    pub fn go(&mut self) {
        writeln!(self.stdin).unwrap();
        self.stdin.flush().unwrap();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit, if it exits within `timeout`.
    pub fn exit_within(&mut self, timeout: Duration) -> Option<(ExitStatus, Instant)> {
        wait_for(timeout, || {
            self.child.try_wait().unwrap().map(|s| (s, Instant::now()))
        })
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The watchdog's actions on a container as its view shows them:
/// (reason, action) pairs.
pub fn actions_of(container: &serde_json::Value) -> Vec<(String, String)> {
    container["enforcement"]["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["reason"].as_str().unwrap().to_owned(),
                a["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Whether `status` is a death by SIGKILL.
pub fn killed(status: ExitStatus) -> bool {
    status.signal() == Some(libc::SIGKILL)
}

/// The bytes the simulator records for host pid `pid` on GPU 0.
pub fn sim_bytes(node: &Node, pid: u32) -> u64 {
    node.sim()
        .processes(0)
        .unwrap()
        .iter()
        .filter(|p| p.pid as u32 == pid)
        .map(|p| p.bytes)
        .sum()
}

/// Polls the simulator until `pid` holds more than `bytes` on GPU 0;
/// returns when it first saw that.
pub fn over_at(node: &Node, pid: u32, bytes: u64) -> Instant {
    wait_for(Duration::from_secs(30), || {
        (sim_bytes(node, pid) > bytes).then(Instant::now)
    })
    .unwrap_or_else(|| panic!("pid {pid} never held more than {} MiB", bytes >> 20))
}

/// The `[watchdog]` table of the agent's config for this node.
pub fn watchdog_toml(ebpf: &str, pins: &Path) -> String {
    format!(
        "[watchdog]\nebpf = \"{ebpf}\"\nebpf_object = \"{}\"\nguard_object = \"{}\"\ndevices = {DEVICES}\ncontext_allowance_mib = {CONTEXT_MIB}\ndeny_pin_dir = \"{}\"\n",
        sim::artifacts().join("ebpf/tessera.bpf.o").display(),
        sim::artifacts().join("ebpf/tessera-guard.bpf.o").display(),
        pins.display()
    )
}

/// A pin directory on bpffs for one test, removed on drop.
pub struct Pins(pub PathBuf);

impl Pins {
    pub fn new(name: &str) -> Self {
        Self(PathBuf::from(format!(
            "/sys/fs/bpf/tessera-wd-{name}-{}",
            std::process::id()
        )))
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The workload (linked against the simulator's libcuda).
pub fn workload() -> PathBuf {
    sim::workload(sim::Link::Direct)
}

/// `libtessera.so`.
pub fn libtessera() -> PathBuf {
    sim::artifact("lib/libtessera.so")
}

/// The escape probe (`escape.c`), compiled once per test binary.
pub fn escape_probe() -> PathBuf {
    static BUILT: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, p) = BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("escape");
        sim::cc(&[
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/watchdog_support/escape.c"
            ),
            "-o",
            out.to_str().unwrap(),
            "-ldl",
        ]);
        (dir, out)
    });
    p.clone()
}

/// Zeroes the usage region's active bitmap and every slot's byte
/// counters, as a tenant with the region mapped writable can.
pub fn clear_account(usage: &Path) {
    use std::os::unix::fs::FileExt;
    use tessera_region::layout::{MAX_SLOTS, UsageHeader, usage_offsets};
    let f = std::fs::OpenOptions::new().write(true).open(usage).unwrap();
    let bitmap = std::mem::offset_of!(UsageHeader, active);
    f.write_at(&[0u8; MAX_SLOTS / 8], bitmap as u64).unwrap();
    let used = vec![0u8; usage_offsets::LAUNCHES - usage_offsets::USED];
    f.write_at(&used, usage_offsets::USED as u64).unwrap();
}
