//! The real node agent as a user runs it: `tessera-agent run` on the
//! simulated node (its NVML stand-in), the `container` subcommands, and the
//! `/containers` view over HTTP.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal, kill_process};

/// What every process of the demo needs to reach the simulated node.
#[derive(Clone, Debug)]
pub(super) struct NodeEnv {
    pub(super) node: PathBuf,
    pub(super) state: PathBuf,
    /// `libcuda.so.1` and `libnvidia-ml.so.1`.
    pub(super) sim_dir: PathBuf,
}

impl NodeEnv {
    pub(super) fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        c.env("GPUSIM_NODE", &self.node)
            .env("GPUSIM_STATE", &self.state)
            .env("LD_LIBRARY_PATH", &self.sim_dir)
            .env_remove("TESSERA_ROOT")
            .env_remove("TESSERA_AGENT_CONFIG")
            .env_remove("TESSERA_NVML_LIB")
            .stdin(Stdio::null());
        c
    }
}

/// A running `tessera-agent run`; dropping it stops it (SIGTERM, then
/// SIGKILL after 5 s) and reaps it.
pub(super) struct Agent {
    child: Child,
    bin: PathBuf,
    root: PathBuf,
    pub(super) addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Agent {
    /// Starts the agent on a free port with `root` and waits until
    /// `/readyz` answers 200 (NVML up, first period done).
    pub(super) fn start(env: &NodeEnv, bin: &Path, root: &Path) -> Result<Self> {
        let mut child = env
            .command(bin)
            .arg("--nvml-lib")
            .arg(env.sim_dir.join("libnvidia-ml.so.1"))
            .args(["run", "--listen", "127.0.0.1:0", "--log", "info", "--root"])
            .arg(root)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        if let Some(stderr) = child.stderr.take() {
            let sink = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    // The start line: `… tessera-agent running listen=ADDR …`.
                    if let Some(a) = line
                        .split("listen=")
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                        .and_then(|a| a.parse::<SocketAddr>().ok())
                    {
                        let _ = tx.send(a);
                    }
                    sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            });
        }
        let addr = rx.recv_timeout(Duration::from_secs(30));
        let mut agent = Self {
            child,
            bin: bin.to_owned(),
            root: root.to_owned(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
        };
        let Ok(addr) = addr else {
            bail!(
                "the agent did not start listening within 30 s; its log:\n{}",
                agent.log_tail(20)
            );
        };
        agent.addr = addr;
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            match get(addr, "/readyz") {
                Ok((200, _)) => return Ok(agent),
                _ if Instant::now() >= end => bail!(
                    "the agent at {addr} was not ready within 30 s ({:?}); its log:\n{}",
                    get(addr, "/readyz").map(|r| r.1),
                    agent.log_tail(20)
                ),
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The last period's view (`/containers`).
    pub(super) fn view(&self) -> Result<serde_json::Value> {
        let (code, body) = get(self.addr, "/containers")
            .with_context(|| format!("cannot reach the agent at {}", self.addr))?;
        if code != 200 {
            bail!("the agent's /containers answered {code}: {body}");
        }
        serde_json::from_str(&body)
            .with_context(|| format!("the agent's /containers is not JSON: {body}"))
    }

    /// Waits (at most 10 s) until the agent's view lists every container
    /// of `ids` with a launch rate written to its control region.
    pub(super) fn wait_for_rates(&self, ids: &[String]) -> Result<()> {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let view = self.view()?;
            let missing = super::screen::not_taken_over(&view, ids);
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= end {
                bail!(
                    "the agent did not take over {} within 10 s; its log:\n{}",
                    missing.join(", "),
                    self.log_tail(20)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `tessera-agent container --root ROOT ARGS`; returns its stdout.
    pub(super) fn container(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.bin)
            .env_remove("TESSERA_ROOT")
            .arg("container")
            .arg("--root")
            .arg(&self.root)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("cannot run tessera-agent container")?;
        if !out.status.success() {
            bail!(
                "tessera-agent container {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The last `n` lines of its log.
    pub(super) fn log_tail(&self, n: usize) -> String {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log[log.len().saturating_sub(n)..].join("\n")
    }

    /// Whether it is still running.
    pub(super) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, wait up to 5 s, then SIGKILL; reaps it.
    pub(super) fn stop(&mut self) {
        if !self.running() {
            return;
        }
        if let Some(pid) = Pid::from_raw(self.child.id() as i32) {
            let _ = kill_process(pid, Signal::TERM);
        }
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if !self.running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET path` from the agent, waiting at most 5 s (the live view must not
/// stall on a hung agent).
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    tessera_testkit::poll::http_get_within(addr, path, Duration::from_secs(5))
}
