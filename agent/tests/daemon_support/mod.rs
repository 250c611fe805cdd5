//! Shared by the daemon tests: the real `tessera-agent` binary on a
//! simulated node (the stand-in NVML from `$TESSERA_ARTIFACTS/sim`), HTTP
//! over real TCP, the `container` CLI.

#![allow(dead_code, clippy::unwrap_used)]

pub use tessera_testkit::sim;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[allow(unused_imports)]
pub use sim::{Link, Node, artifact, sim_dir, workload};

pub const MIB: u64 = 1 << 20;

/// The binary under test.
pub fn agent_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tessera-agent"))
}

/// The simulator's NVML.
pub fn nvml_lib() -> PathBuf {
    artifact("sim/libnvidia-ml.so.1")
}

/// `libtessera.so`.
pub fn libtessera() -> PathBuf {
    artifact("lib/libtessera.so")
}

pub use tessera_testkit::poll::{http_get as get, wait_for};

/// A running agent.
pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<String>>>,
    /// Copies the agent's stderr into `log`; it ends at EOF, once the
    /// agent has exited.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    /// Starts `tessera-agent run --root ROOT --listen 127.0.0.1:0 ARGS` on
    /// `node` with the simulator's NVML; waits until it listens.
    pub fn start(node: &Node, root: &Path, args: &[&str]) -> Self {
        let mut c = node.command(&agent_bin());
        c.env_remove("TESSERA_NVML_LIB")
            .env_remove("RUST_LOG")
            .arg("--nvml-lib")
            .arg(nvml_lib())
            .args(["run", "--listen", "127.0.0.1:0", "--root"])
            .arg(root)
            .args(args);
        Self::spawn(c)
    }

    /// Starts `c` (a `tessera-agent run` command) and waits until it
    /// listens (the address from its log).
    pub fn spawn(mut c: Command) -> Self {
        let mut child = c
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listen=").nth(1)
                    && let Some(a) = rest.split_whitespace().next()
                    && let Ok(a) = a.parse::<SocketAddr>()
                {
                    let _ = tx.send(a);
                }
                sink.lock().unwrap().push(line);
            }
        });
        let Ok(addr) = rx.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            let status = child.wait();
            std::thread::sleep(Duration::from_millis(100));
            panic!(
                "the agent did not start listening ({status:?}): {:?}",
                log.lock().unwrap()
            );
        };
        Self {
            child,
            addr,
            log,
            reader: Some(reader),
        }
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> (u16, String) {
        get(self.addr, path).unwrap()
    }

    /// Waits for `/readyz` to answer 200.
    pub fn wait_ready(&self) {
        let ok = wait_for(Duration::from_secs(30), || {
            (get(self.addr, "/readyz").ok()?.0 == 200).then_some(())
        });
        assert!(
            ok.is_some(),
            "not ready: {:?}; log: {:?}",
            get(self.addr, "/readyz"),
            self.log()
        );
    }

    /// The last period's view.
    pub fn view(&self) -> serde_json::Value {
        serde_json::from_str(&self.get("/containers").1).unwrap()
    }

    /// Waits for a view that satisfies `f`.
    pub fn wait_view(
        &self,
        what: &str,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_for(Duration::from_secs(20), || {
            let v = self.view();
            f(&v).then_some(v)
        })
        .unwrap_or_else(|| panic!("no view with {what}: {:#}", self.view()))
    }

    /// The container `id` in a view.
    pub fn container<'a>(view: &'a serde_json::Value, id: &str) -> Option<&'a serde_json::Value> {
        view["containers"]
            .as_array()?
            .iter()
            .find(|c| c["id"] == id)
    }

    /// Sends `signal` and waits (at most 10 s) for the exit.
    pub fn signal_and_wait(&mut self, signal: i32) -> ExitStatus {
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
        let rc = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(rc, 0);
        let status = wait_for(Duration::from_secs(10), || self.child.try_wait().unwrap());
        let status = status.unwrap_or_else(|| panic!("the agent did not exit on signal {signal}"));
        // Everything it wrote is in the log before this returns: the
        // reader stops at EOF (unless something else holds the pipe).
        let drained = wait_for(Duration::from_secs(5), || {
            self.reader
                .as_ref()
                .is_none_or(|r| r.is_finished())
                .then_some(())
        });
        if drained.is_some()
            && let Some(r) = self.reader.take()
        {
            let _ = r.join();
        }
        status
    }

    /// The log so far. A line the agent wrote a moment ago may not be
    /// here yet (a thread copies it from the pipe): to look for one that
    /// follows an event, use [`Agent::wait_log`].
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits (at most 10 s) until some log line satisfies `f`, and returns
    /// how many do then.
    pub fn wait_log(&self, what: &str, f: impl Fn(&str) -> bool) -> usize {
        wait_for(Duration::from_secs(10), || {
            let n = self.log().iter().filter(|l| f(l)).count();
            (n > 0).then_some(n)
        })
        .unwrap_or_else(|| panic!("no log line with {what}: {:#?}", self.log()))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tessera-agent container --root ROOT ARGS`.
pub fn container(root: &Path, args: &[&str]) -> Output {
    Command::new(agent_bin())
        .env_remove("TESSERA_ROOT")
        .arg("container")
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .unwrap()
}

/// As [`container`], expecting success; returns stdout.
pub fn container_ok(root: &Path, args: &[&str]) -> String {
    let out = container(root, args);
    assert!(
        out.status.success(),
        "container {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `container add --id ID --gpu GPU,memory=MEMORY_MIB --sm-target
/// SM_TARGET` plus `extra`, expecting success; returns the region
/// directory.
pub fn add_container(
    root: &Path,
    id: &str,
    gpu: &str,
    memory_mib: u64,
    sm_target: u32,
    extra: &[&str],
) -> PathBuf {
    let grant = format!("{gpu},memory={memory_mib}");
    let target = sm_target.to_string();
    let mut args = vec!["add", "--id", id, "--gpu", &grant, "--sm-target", &target];
    args.extend_from_slice(extra);
    PathBuf::from(container_ok(root, &args).trim())
}

/// GPU `index`'s UUID on `node`.
pub fn uuid(node: &Node, index: usize) -> String {
    node.sim().node().uuid(index)
}
