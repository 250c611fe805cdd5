//! The watchdog's freeze and deny actions, with the daemon's own control
//! period ([`Agent::tick`], every 100 ms in a thread of this test) under a
//! policy that asks for them, on the simulator, the tenant in a real
//! cgroup:
//! - a tenant that keeps resetting its launch bucket (so its kernels run
//!   above its SM cap) is frozen: `frozen 1` in `cgroup.events` within
//!   1 s of the first reset;
//! - a tenant without the preload that allocates past its limit is denied
//!   further GPU device opens: a new process of its cgroup gets EPERM
//!   opening the GPU's device node within 1 s of the simulator recording
//!   the overage.
//!
//! Both states live in the kernel, so a new agent reports them, and
//! `tessera-agent container thaw|allow` undo them. Needs root; prints
//! "skipped: <reason>" otherwise.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;
mod watchdog_support;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use daemon_support::{add_container, container_ok, nvml_lib, uuid};
use tessera_agent::config::{Config, ConfigArgs, ConfigFile};
use tessera_agent::control::Mode;
use tessera_agent::daemon::tick::Agent;
use tessera_agent::policy::{Action, Effective, Policy};
use tessera_agent::view::View;
use tessera_agent::view::status::Status;
use tessera_agent::watchdog::{WatchdogFile, WatchdogSettings};
use tessera_region::layout::{Bucket, usage_offsets};
use tessera_testkit::sim::Node;
use watchdog_support::{
    CONTEXT_MIB, DEVICES, MIB, Pins, Tenant, TestCgroup, libtessera, node_spec, over_at,
    skip_reason, wait_for, workload,
};

const BOUND: Duration = Duration::from_secs(1);

/// One simulated node for this binary: the in-process agent's NVML reads
/// the node from the environment.
fn node() -> &'static Node {
    static NODE_ONCE: OnceLock<Node> = OnceLock::new();
    NODE_ONCE.get_or_init(|| {
        let n = node_spec().build();
        // SAFETY: set once, before this binary starts any process or
        // loads NVML (each test calls node() first; OnceLock holds the
        // others back until it is done).
        unsafe {
            std::env::set_var("GPUSIM_NODE", &n.node);
            std::env::set_var("GPUSIM_STATE", &n.state);
        }
        n
    })
}

fn config(root: &Path, pins: &Path) -> Config {
    let args = ConfigArgs {
        root: Some(root.to_owned()),
        listen: Some("127.0.0.1:0".into()),
        ..ConfigArgs::default()
    };
    let mut c = Config::merge(ConfigFile::default(), None, &args, Some(&nvml_lib())).unwrap();
    let devices: Vec<String> = serde_json::from_str(DEVICES).unwrap();
    c.watchdog = WatchdogSettings::from_file(WatchdogFile {
        ebpf: Some(tessera_agent::watchdog::EbpfSetting::Off),
        guard_object: Some(tessera_testkit::sim::artifact("ebpf/tessera-guard.bpf.o")),
        devices: Some(devices),
        context_allowance_mib: Some(CONTEXT_MIB),
        deny_pin_dir: Some(pins.to_owned()),
        ..WatchdogFile::default()
    })
    .unwrap();
    c
}

fn policy(bypass: Action, memory: Action) -> Policy {
    Policy {
        defaults: Effective {
            mode: Mode::Hard,
            priority: 0,
            bypass_action: bypass,
            memory_overage_action: memory,
            compute_overage_action: Action::Throttle,
            rule: None,
        },
        rules: Vec::new(),
    }
}

/// The agent's control loop in a thread, keeping the latest view.
struct Running {
    stop: Arc<AtomicBool>,
    view: Arc<Mutex<Option<View>>>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn start(config: &Config, policy: Policy) -> Self {
        let mut agent = Agent::new(config);
        agent.set_policy(policy);
        agent.store().ensure_root().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let view = Arc::new(Mutex::new(None));
        let (s, v, period) = (stop.clone(), view.clone(), config.period);
        let thread = std::thread::spawn(move || {
            let status = Status::new(Duration::from_secs(5));
            let mut next = Instant::now();
            while !s.load(Ordering::Relaxed) {
                let got = agent.tick(&status);
                *v.lock().unwrap() = Some(got);
                next += period;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        Self {
            stop,
            view,
            thread: Some(thread),
        }
    }

    /// Container `id` in the latest view, as JSON.
    fn container(&self, id: &str) -> Option<serde_json::Value> {
        let v = self.view.lock().unwrap();
        let c = v.as_ref()?.containers.iter().find(|c| c.id == id)?;
        Some(serde_json::to_value(c).unwrap())
    }

    /// Waits (20 s at most) until container `id` satisfies `f`.
    fn wait(
        &self,
        id: &str,
        what: &str,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_for(Duration::from_secs(20), || {
            self.container(id).filter(|c| f(c))
        })
        .unwrap_or_else(|| panic!("no view of {id} with {what}: {:#?}", self.container(id)))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn add(root: &Path, id: &str, cg: &TestCgroup, limit_mib: u64, sm: u32) -> PathBuf {
    let cgroup = cg.dir.to_str().unwrap();
    add_container(
        root,
        id,
        &uuid(node(), 0),
        limit_mib,
        sm,
        &["--cgroup", cgroup],
    )
}

fn cli(root: &Path, args: &[&str]) -> String {
    container_ok(root, args)
}

#[test]
fn a_reset_launch_bucket_is_frozen_until_thawed() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    let node = node();
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("containers");
    let cg = TestCgroup::new("bucket");
    let dir = add(&root, "bucket", &cg, 1000, 30);
    let pins = Pins::new("bucket");
    let config = config(&root, &pins.0);
    let agent = Running::start(&config, policy(Action::Freeze, Action::Kill));
    let lib = libtessera();
    let mut t = Tenant::start(
        node,
        &cg,
        &workload(),
        &[
            "dev", "0", "ready", "run", "spin", "100", "1024", "60000", "hold",
        ],
        &[("LD_PRELOAD", &lib), ("TESSERA_REGION_DIR", &dir)],
    );
    // Capped by the controller, and left alone while it is honest.
    agent.wait("bucket", "a launch rate", |c| {
        c["gpus"][0]["launch_rate"].is_u64()
    });
    std::thread::sleep(Duration::from_millis(1000));
    assert!(!cg.frozen(), "{:#?}", agent.container("bucket"));
    let c = agent.container("bucket").unwrap();
    assert_eq!(c["enforcement"]["actions"], serde_json::json!([]), "{c:#}");
    // The attack: the bucket's theoretical arrival time back to 0, again
    // and again.
    let usage = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("usage"))
        .unwrap();
    let tat = (usage_offsets::BUCKETS + std::mem::offset_of!(Bucket, tat_ns)) as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let reset_at = Instant::now();
    let attacker = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            usage.write_at(&0u64.to_le_bytes(), tat).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    let frozen = wait_for(Duration::from_secs(10), || cg.frozen().then(Instant::now));
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();
    let Some(frozen) = frozen else {
        panic!(
            "not frozen 10 s after the reset: {:#?}",
            agent.container("bucket")
        );
    };
    let took = frozen.duration_since(reset_at);
    println!("first bucket reset to frozen: {} ms", took.as_millis());
    assert!(took < BOUND, "{} ms", took.as_millis());
    assert!(t.alive(), "frozen, not killed");
    let c = agent.wait("bucket", "state frozen", |c| {
        c["enforcement"]["state"] == "frozen"
    });
    let acts = c["enforcement"]["actions"].as_array().unwrap();
    assert!(
        acts.iter()
            .any(|a| a["reason"] == "tampering" && a["action"] == "freeze"),
        "{c:#}"
    );
    // A new agent finds it frozen (the state is the cgroup's).
    drop(agent);
    let agent = Running::start(&config, policy(Action::Freeze, Action::Kill));
    agent.wait("bucket", "state frozen after a restart", |c| {
        c["enforcement"]["state"] == "frozen"
    });
    assert!(cg.frozen());
    // The operator's way back; the attack is over, so it stays thawed.
    let out = cli(&root, &["thaw", "--id", "bucket"]);
    assert!(out.contains("thawed"), "{out}");
    assert!(!cg.frozen());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!cg.frozen(), "{:#?}", agent.container("bucket"));
    agent.wait("bucket", "state running", |c| {
        c["enforcement"]["state"] == "running"
    });
    assert!(t.alive());
}

#[test]
fn memory_past_the_limit_is_denied_until_allowed() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    let node = node();
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("containers");
    let cg = TestCgroup::new("deny");
    add(&root, "deny", &cg, 500, 100);
    let pins = Pins::new("deny");
    let config = config(&root, &pins.0);
    let agent = Running::start(&config, policy(Action::Alert, Action::Deny));
    // No preload; within its limit first.
    let mut t = Tenant::start(
        node,
        &cg,
        &workload(),
        &["dev", "0", "ready", "wait", "alloc", "600", "hold"],
        &[],
    );
    agent.wait("deny", "the bypass alert", |c| {
        c["enforcement"]["actions"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    });
    cg.probe_open().expect("opens allowed before the overage");
    t.go();
    let over = over_at(node, t.pid(), (500 + CONTEXT_MIB) * MIB);
    let denied = wait_for(Duration::from_secs(10), || {
        cg.probe_open().is_err().then(Instant::now)
    });
    let Some(denied) = denied else {
        panic!(
            "opens still allowed 10 s after the overage: {:#?}",
            agent.container("deny")
        );
    };
    let took = denied.duration_since(over);
    println!("over the limit to denied opens: {} ms", took.as_millis());
    assert!(took < BOUND, "{} ms", took.as_millis());
    let err = cg.probe_open().unwrap_err();
    assert!(err.contains("not permitted"), "{err}");
    assert!(t.alive(), "denied, not killed");
    let c = agent.wait("deny", "state denied", |c| {
        c["enforcement"]["state"] == "denied"
    });
    println!("{}", c["enforcement"]["last_event"]);
    // A new agent finds it denied (the guard is pinned).
    drop(agent);
    let agent = Running::start(&config, policy(Action::Alert, Action::Deny));
    agent.wait("deny", "state denied after a restart", |c| {
        c["enforcement"]["state"] == "denied"
    });
    // The operator ends the overage, then allows the container again.
    drop(agent);
    drop(t);
    let out = cli(
        &root,
        &[
            "allow",
            "--id",
            "deny",
            "--deny-pin-dir",
            pins.0.to_str().unwrap(),
        ],
    );
    assert!(out.contains("removed device guard"), "{out}");
    let allowed = wait_for(Duration::from_secs(3), || cg.probe_open().ok());
    assert!(allowed.is_some(), "{:?}", cg.probe_open());
}
