//! What `up` started and changed, in `target/cluster/run/state.json`, so
//! that `down` stops exactly that: each process by its pid and start time
//! (a pid that now names another process is left alone), the kernel
//! tunables as they were, the system paths that did not exist.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Value, json};

use super::{Layout, config};

/// A process of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Containerd,
    Etcd,
    ApiServer,
    ControllerManager,
    Scheduler,
    Kubelet,
    /// The kubernetes service's data path (no kube-proxy).
    ServiceProxy,
}

impl Component {
    const ALL: [Self; 7] = [
        Self::Containerd,
        Self::Etcd,
        Self::ApiServer,
        Self::ControllerManager,
        Self::Scheduler,
        Self::Kubelet,
        Self::ServiceProxy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Containerd => "containerd",
            Self::Etcd => "etcd",
            Self::ApiServer => "kube-apiserver",
            Self::ControllerManager => "kube-controller-manager",
            Self::Scheduler => "kube-scheduler",
            Self::Kubelet => "kubelet",
            Self::ServiceProxy => "service-proxy",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// A started process.
#[derive(Clone, Debug)]
pub struct Process {
    pub component: Component,
    pub pid: i32,
    /// Field 22 of `/proc/PID/stat` when it started (clock ticks since boot).
    pub start_time: u64,
    pub log: PathBuf,
}

impl Process {
    /// Whether the recorded process still runs (not a zombie, not a
    /// newer process under the same pid).
    pub fn alive(&self) -> bool {
        matches!(proc_stat(self.pid), Some((state, start)) if state != 'Z' && start == self.start_time)
    }

    /// SIGTERM, then SIGKILL after 15 s; notes a failure in `problems`.
    pub fn stop(&self, problems: &mut Vec<String>) {
        let name = self.component.name();
        if !self.alive() {
            eprintln!("not running: {name} (pid {})", self.pid);
            return;
        }
        let Some(pid) = Pid::from_raw(self.pid) else {
            problems.push(format!("{name}: bad pid {}", self.pid));
            return;
        };
        if let Err(e) = kill_process(pid, Signal::TERM) {
            problems.push(format!("cannot signal {name} (pid {}): {e}", self.pid));
            return;
        }
        if wait_gone(self, Duration::from_secs(15)) {
            eprintln!("stopped {name} (pid {})", self.pid);
            return;
        }
        eprintln!(
            "{name} (pid {}) ignored SIGTERM for 15 s: SIGKILL",
            self.pid
        );
        if self.alive() {
            let _ = kill_process(pid, Signal::KILL);
        }
        if !wait_gone(self, Duration::from_secs(5)) {
            problems.push(format!("{name} (pid {}) survives SIGKILL", self.pid));
        }
    }
}

fn wait_gone(process: &Process, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while process.alive() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// The state letter and start time of `pid`, from `/proc/PID/stat`.
pub fn proc_stat(pid: i32) -> Option<(char, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<(char, u64)> {
    // `pid (comm) S ...`: comm may hold spaces and parentheses, so the
    // fields start after the last `)`.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 3 is the state; the start time is field 22.
    let start = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start))
}

/// Starts `component` in a process group of its own (so that a Ctrl-C of
/// the terminal that ran `up` does not reach it), stdin closed, stdout
/// and stderr to its log (a new one, or the old one continued with
/// `append`). The process outlives xtask.
pub fn spawn(layout: &Layout, component: Component, append: bool) -> Result<Process> {
    let (program, args) = config::command_line(layout, component);
    let log = layout.logs().join(format!("{}.log", component.name()));
    let file = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(&log)
        .with_context(|| format!("cannot create {}", log.display()))?;
    let err = file
        .try_clone()
        .with_context(|| format!("cannot reopen {}", log.display()))?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(
        [layout.bin()]
            .into_iter()
            .chain(std::env::split_paths(&path)),
    )
    .context("PATH holds a separator")?;
    let child = Command::new(&program)
        .args(&args)
        .current_dir(layout.run())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {} ({})", component.name(), program.display()))?;
    let pid = i32::try_from(child.id()).context("pid out of range")?;
    let (_, start_time) = proc_stat(pid)
        .with_context(|| format!("{} (pid {pid}) exited at once", component.name()))?;
    Ok(Process {
        component,
        pid,
        start_time,
        log,
    })
}

/// The last `lines` lines of a log.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// The state file's content.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// Kernel tunables (`vm.overcommit_memory`, …) before `up`.
    pub tunables: BTreeMap<String, String>,
    /// System paths that `up` found missing (the runtime may create them).
    pub created_paths: Vec<PathBuf>,
    /// Whether `up` created the pod network's bridge.
    pub bridge_created: bool,
    /// Mount points `up` made shared (they were private).
    pub made_shared: Vec<PathBuf>,
    pub processes: Vec<Process>,
    /// Whether `up` finished.
    pub complete: bool,
}

impl State {
    pub fn process(&self, component: Component) -> Option<&Process> {
        self.processes.iter().find(|p| p.component == component)
    }

    pub fn load(path: &Path) -> Result<Option<Self>> {
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("cannot parse the cluster state {}", path.display()))?;
        Self::from_json(&value)
            .with_context(|| format!("the cluster state {} is malformed", path.display()))
            .map(Some)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(&self.to_json())?;
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
        fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
    }

    fn to_json(&self) -> Value {
        json!({
            "tunables": self.tunables,
            "created_paths": self.created_paths,
            "bridge_created": self.bridge_created,
            "made_shared": self.made_shared,
            "complete": self.complete,
            "processes": self.processes.iter().map(|p| json!({
                "component": p.component.name(),
                "pid": p.pid,
                "start_time": p.start_time,
                "log": p.log,
            })).collect::<Vec<_>>(),
        })
    }

    fn from_json(value: &Value) -> Result<Self> {
        let tunables = value["tunables"]
            .as_object()
            .context("no tunables")?
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    v.as_str().context("tunable not a string")?.to_owned(),
                ))
            })
            .collect::<Result<_>>()?;
        let created_paths = value["created_paths"]
            .as_array()
            .context("no created_paths")?
            .iter()
            .map(|p| p.as_str().map(PathBuf::from).context("path not a string"))
            .collect::<Result<_>>()?;
        let processes = value["processes"]
            .as_array()
            .context("no processes")?
            .iter()
            .map(|p| {
                let name = p["component"].as_str().context("no component")?;
                Ok(Process {
                    component: Component::from_name(name)
                        .with_context(|| format!("unknown component {name:?}"))?,
                    pid: i32::try_from(p["pid"].as_i64().context("no pid")?)?,
                    start_time: p["start_time"].as_u64().context("no start_time")?,
                    log: PathBuf::from(p["log"].as_str().context("no log")?),
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            tunables,
            created_paths,
            bridge_created: value["bridge_created"].as_bool().unwrap_or(false),
            made_shared: value["made_shared"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| p.as_str().map(PathBuf::from))
                        .collect()
                })
                .unwrap_or_default(),
            processes,
            complete: value["complete"].as_bool().unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_state_and_start_time_from_stat() {
        let stat = "4242 (kube (api) server) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 12 0 987654 1000000 300";
        assert_eq!(parse_stat(stat), Some(('S', 987654)));
        assert_eq!(parse_stat("1 (x) Z 0"), None);
        let (state, _) = proc_stat(i32::try_from(std::process::id()).unwrap()).unwrap();
        assert_ne!(state, 'Z');
    }

    #[test]
    fn the_state_file_round_trips() {
        let state = State {
            tunables: [("vm.overcommit_memory".to_owned(), "0".to_owned())].into(),
            created_paths: vec![PathBuf::from("/run/containerd")],
            bridge_created: true,
            made_shared: vec![PathBuf::from("/sys/fs/bpf")],
            processes: vec![Process {
                component: Component::ApiServer,
                pid: 77,
                start_time: 12345,
                log: PathBuf::from("/l/kube-apiserver.log"),
            }],
            complete: true,
        };
        let back = State::from_json(&state.to_json()).unwrap();
        assert_eq!(back.tunables, state.tunables);
        assert_eq!(back.created_paths, state.created_paths);
        assert!(back.bridge_created && back.complete);
        assert_eq!(back.made_shared, [PathBuf::from("/sys/fs/bpf")]);
        assert_eq!(back.processes[0].component, Component::ApiServer);
        assert_eq!(back.processes[0].pid, 77);
        assert_eq!(back.processes[0].start_time, 12345);
        assert!(State::from_json(&json!({"tunables": {}})).is_err());
    }

    #[test]
    fn a_dead_or_reused_pid_is_not_alive() {
        let me = i32::try_from(std::process::id()).unwrap();
        let (_, start) = proc_stat(me).unwrap();
        let process = |pid, start_time| Process {
            component: Component::Etcd,
            pid,
            start_time,
            log: PathBuf::new(),
        };
        assert!(process(me, start).alive());
        assert!(!process(me, start + 1).alive());
        assert!(!process(i32::MAX, start).alive());
    }
}
