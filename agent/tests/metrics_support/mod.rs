//! Shared by the metrics tests: a simulated node with two containers
//! running workloads under libtessera.so and the agent managing them, the
//! Debian `prometheus` and `promtool` binaries, HTTP/1.0 GETs.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::daemon_support::sim::{Gpu, NodeSpec, Running, spawn_command_ready};
use crate::daemon_support::{Agent, Link, MIB, Node, container_ok, libtessera, uuid, workload};

/// Two GPUs of 100 SMs, a 200 µs `spin` kernel.
pub fn node_spec() -> NodeSpec {
    NodeSpec::new()
        .gpu(Gpu::sim(16384))
        .gpu(Gpu::sim(16384))
        .fixed_kernel("spin", 200_000)
}

/// One container of the scene.
pub struct Workload {
    pub id: &'static str,
    pub namespace: &'static str,
    pub pod: &'static str,
    pub dir: PathBuf,
    pub running: Running,
}

/// The node, the agent and two containers on GPU 0: `trainer` busy
/// (launching `spin` kernels at a 40 % hard target, 512 MiB allocated)
/// and `notebook` idle (256 MiB allocated, nothing launched).
pub struct Scene {
    pub node: Node,
    pub root: PathBuf,
    pub gpu: String,
    pub agent: Agent,
    pub busy: Workload,
    pub idle: Workload,
}

impl Scene {
    pub fn start() -> Self {
        let node = node_spec().build();
        let root = node.dir.path().join("containers");
        let gpu = uuid(&node, 0);
        let add = |id: &str, pod: &str, target: &str, limit_mib: u64| {
            let grant = format!("{gpu},memory={limit_mib}");
            container_ok(
                &root,
                &[
                    "add",
                    "--id",
                    id,
                    "--gpu",
                    &grant,
                    "--sm-target",
                    target,
                    "--mode",
                    "hard",
                    "--namespace",
                    "ml",
                    "--pod",
                    pod,
                    "--container",
                    "main",
                ],
            )
            .trim()
            .into()
        };
        let busy_dir: PathBuf = add("trainer-main", "trainer", "40", 4096);
        let idle_dir: PathBuf = add("notebook-main", "notebook", "20", 2048);
        let agent = Agent::start(&node, &root, &[]);
        agent.wait_ready();
        let spawn = |dir: &Path, ops: &str| {
            let mut c = node.command(&workload(Link::Direct));
            c.env("LD_PRELOAD", libtessera())
                .env("TESSERA_REGION_DIR", dir)
                .args(ops.split_whitespace());
            spawn_command_ready(c, ops)
        };
        let busy = spawn(&busy_dir, "dev 0 alloc 512 ready run spin 1 256 600000");
        let idle = spawn(&idle_dir, "dev 0 alloc 256 ready hold");
        Self {
            busy: Workload {
                id: "trainer-main",
                namespace: "ml",
                pod: "trainer",
                dir: busy_dir,
                running: busy,
            },
            idle: Workload {
                id: "notebook-main",
                namespace: "ml",
                pod: "notebook",
                dir: idle_dir,
                running: idle,
            },
            node,
            root,
            gpu,
            agent,
        }
    }

    /// The bytes the simulator's NVML shows for `w`'s process on GPU 0.
    pub fn sim_memory(&self, w: &Workload) -> u64 {
        self.node
            .sim()
            .processes(0)
            .unwrap()
            .iter()
            .filter(|p| p.pid == w.running.pid())
            .map(|p| p.bytes)
            .sum()
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; the caller binds it
/// right away).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub use tessera_testkit::poll::http_get as get;

/// Percent-encodes a query-string value.
pub fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server on a free port scraping `target` every second.
pub struct Prometheus {
    pub child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(bin: &Path, target: SocketAddr) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: tessera-agent\n    static_configs:\n      \
                 - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut p = Self {
            child,
            addr,
            _dir: dir,
        };
        let ready = crate::daemon_support::wait_for(Duration::from_secs(60), || {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!("prometheus exited ({status}): {}", p.log());
            }
            (get(addr, "/-/ready").ok()?.0 == 200).then_some(())
        });
        assert!(ready.is_some(), "prometheus not ready: {}", p.log());
        p
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query's result vector (`data.result`); panics on an
    /// error answer (a bad query is a bug in the test or the dashboard).
    pub fn query(&self, q: &str) -> Vec<serde_json::Value> {
        let (code, body) = get(self.addr, &format!("/api/v1/query?query={}", encode(q))).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("query {q}: {code} {body}: {e}"));
        assert_eq!(v["status"], "success", "query {q}: {code} {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Polls `q` until it returns a non-empty vector (or `timeout`).
    pub fn wait_query(&self, q: &str, timeout: Duration) -> Vec<serde_json::Value> {
        crate::daemon_support::wait_for(timeout, || {
            let r = self.query(q);
            (!r.is_empty()).then_some(r)
        })
        .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one sample of a query result.
pub fn sample_value(s: &serde_json::Value) -> f64 {
    s["value"][1].as_str().unwrap().parse().unwrap()
}

pub const MIB_F: f64 = MIB as f64;
