//! The running agent applies the node policy file and follows its
//! changes: a rule that makes a namespace elastic changes the effective
//! mode of its containers in `/containers` within a period of the write,
//! and the controller follows (judged by the simulator's own record of
//! each process's kernel time, not by the agent's numbers); a broken file
//! keeps the old policy and `/containers` names the line; the fix applies;
//! an explicit mode in a container's metadata wins over the rule.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use daemon_support::sim::{Gpu, NodeSpec, Running, spawn_command_ready};
use daemon_support::{Agent, Link, Node, container_ok, libtessera, uuid, workload};

/// Two GPUs of 100 SMs with a 200 µs `spin` kernel, one container alone on
/// each.
fn node_spec() -> NodeSpec {
    NodeSpec::new()
        .gpu(Gpu::sim(16384))
        .gpu(Gpu::sim(16384))
        .fixed_kernel("spin", 200_000)
}

/// No rules: every container hard (the built-in default, written out).
const HARD: &str = "apiVersion: tessera.dev/v1alpha1
kind: Policy
defaults:
  computeMode: hard
";

/// The namespace `research` lends idle compute.
const ELASTIC: &str = "apiVersion: tessera.dev/v1alpha1
kind: Policy
defaults:
  computeMode: hard
rules:
  - name: research-elastic
    match:
      namespaces: [research]
    computeMode: elastic
";

/// [`ELASTIC`] with a priority out of range on line 10.
const BROKEN: &str = "apiVersion: tessera.dev/v1alpha1
kind: Policy
defaults:
  computeMode: hard
rules:
  - name: research-elastic
    match:
      namespaces: [research]
    computeMode: elastic
    priority: 500
";

fn spawn(node: &Node, dir: &Path, ops: &str) -> Running {
    let mut c = node.command(&workload(Link::Direct));
    c.env("LD_PRELOAD", libtessera())
        .env("TESSERA_REGION_DIR", dir)
        .args(ops.split_whitespace());
    spawn_command_ready(c, ops)
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// `pid`'s SM percent on GPU `gpu` over the last `window`, from the
/// simulator.
fn share(node: &Node, gpu: usize, pid: i32, window: Duration) -> f64 {
    let since = unix_us() - window.as_micros() as u64;
    node.sim()
        .process_samples(gpu, since)
        .unwrap()
        .iter()
        .filter(|p| p.pid == pid)
        .map(|p| f64::from(p.sm_percent))
        .sum()
}

/// `(mode, rule)` the view shows as the policy's decision for `id`.
fn decided(view: &serde_json::Value, id: &str) -> (String, Option<String>) {
    let c = Agent::container(view, id).unwrap();
    (
        c["policy"]["mode"].as_str().unwrap().to_owned(),
        c["policy"]["rule"].as_str().map(str::to_owned),
    )
}

fn period(view: &serde_json::Value) -> u64 {
    view["period"].as_u64().unwrap()
}

#[test]
fn a_policy_rule_changes_the_mode_live_and_a_broken_file_keeps_the_old_one() {
    let node = node_spec().build();
    let root = node.dir.path().join("containers");
    let policy = node.dir.path().join("policy.yaml");
    std::fs::write(&policy, HARD).unwrap();
    // r: in research, mode left to the policy; x: in research too, but
    // explicitly hard (in Kubernetes: the pod's annotation).
    let (g0, g1) = (uuid(&node, 0), uuid(&node, 1));
    let r = container_ok(
        &root,
        &[
            "add",
            "--id",
            "r",
            "--gpu",
            &g0,
            "--sm-target",
            "30",
            "--namespace",
            "research",
        ],
    );
    let x = container_ok(
        &root,
        &[
            "add",
            "--id",
            "x",
            "--gpu",
            &g1,
            "--sm-target",
            "30",
            "--namespace",
            "research",
            "--mode",
            "hard",
        ],
    );
    let agent = Agent::start(
        &node,
        &root,
        &["--period-ms", "100", "--policy", policy.to_str().unwrap()],
    );
    agent.wait_ready();
    let v = agent.wait_view("the policy loaded", |v| v["policy"]["loads"] == 1);
    assert_eq!(v["policy"]["file"], policy.to_str().unwrap());
    assert_eq!(decided(&v, "r"), ("hard".to_owned(), None));
    let wr = spawn(
        &node,
        Path::new(r.trim()),
        "dev 0 ready run spin 1 256 60000",
    );
    let wx = spawn(
        &node,
        Path::new(x.trim()),
        "dev 1 ready run spin 1 256 60000",
    );

    // Hard: each holds its 30 % although alone on its GPU.
    std::thread::sleep(Duration::from_secs(4));
    let window = Duration::from_secs(2);
    let (sr, sx) = (
        share(&node, 0, wr.pid(), window),
        share(&node, 1, wx.pid(), window),
    );
    eprintln!("hard: r {sr:.1} %, x {sx:.1} %");
    assert!(
        (sr - 30.0).abs() <= 3.0 && (sx - 30.0).abs() <= 3.0,
        "r {sr}, x {sx}"
    );

    // The rule: in /containers within a period of the write.
    let before = period(&agent.view());
    std::fs::write(&policy, ELASTIC).unwrap();
    let v = agent.wait_view("r elastic", |v| decided(v, "r").0 == "elastic");
    assert!(
        period(&v) <= before + 2,
        "applied in period {} after the write in period {before}",
        period(&v)
    );
    assert_eq!(
        decided(&v, "r"),
        ("elastic".to_owned(), Some("research-elastic".to_owned()))
    );
    // x matches the rule too, but its explicit mode wins.
    assert_eq!(
        decided(&v, "x"),
        ("hard".to_owned(), Some("research-elastic".to_owned()))
    );
    assert_eq!(
        (v["policy"]["loads"].as_u64(), &v["policy"]["error"]),
        (Some(2), &serde_json::Value::Null)
    );

    // The controller follows: r, alone on GPU 0, now runs well above its
    // target; x stays capped.
    std::thread::sleep(Duration::from_secs(4));
    let (sr, sx) = (
        share(&node, 0, wr.pid(), window),
        share(&node, 1, wx.pid(), window),
    );
    eprintln!("elastic rule: r {sr:.1} %, x {sx:.1} %");
    assert!(sr >= 60.0, "elastic r alone on its GPU: {sr}");
    assert!((sx - 30.0).abs() <= 3.0, "explicitly hard x: {sx}");

    // A broken file: the old policy stays, the view names line and field.
    std::fs::write(&policy, BROKEN).unwrap();
    let v = agent.wait_view("the policy error", |v| !v["policy"]["error"].is_null());
    let e = v["policy"]["error"].as_str().unwrap();
    assert!(e.contains(policy.to_str().unwrap()), "{e}");
    assert!(
        e.contains("line 10") && e.contains("rules[0].priority"),
        "{e}"
    );
    assert_eq!(decided(&v, "r").0, "elastic");
    assert_eq!(v["policy"]["loads"], 2);
    // Still elastic in the controller too, and logged once, not per period.
    std::thread::sleep(Duration::from_secs(1));
    let sr = share(&node, 0, wr.pid(), Duration::from_secs(1));
    eprintln!("broken file: r {sr:.1} %");
    assert!(sr >= 60.0, "the old (elastic) policy stays: {sr}");
    let logged = agent.wait_log("the refused policy file", |l| {
        l.contains("policy file not applied")
    });
    assert_eq!(logged, 1, "{:?}", agent.log());

    // Fixed (back to hard): applied, the error gone, and r is capped again.
    let before = period(&agent.view());
    std::fs::write(&policy, HARD).unwrap();
    let v = agent.wait_view("r hard again", |v| decided(v, "r").0 == "hard");
    assert!(period(&v) <= before + 2, "{} vs {before}", period(&v));
    assert_eq!(
        (v["policy"]["loads"].as_u64(), &v["policy"]["error"]),
        (Some(3), &serde_json::Value::Null)
    );
    std::thread::sleep(Duration::from_secs(4));
    let sr = share(&node, 0, wr.pid(), window);
    eprintln!("fixed (hard): r {sr:.1} %");
    assert!((sr - 30.0).abs() <= 3.0, "r hard again: {sr}");

    // Deleted: the policy stays, and the view says so.
    std::fs::remove_file(&policy).unwrap();
    let v = agent.wait_view("the removal", |v| !v["policy"]["error"].is_null());
    let e = v["policy"]["error"].as_str().unwrap();
    assert!(e.contains("was removed"), "{e}");
    assert_eq!(decided(&v, "r").0, "hard");
    assert_eq!(v["policy"]["file"], policy.to_str().unwrap());
}
