//! The hostile tenant against the real daemon (`tessera-agent run` on the
//! simulator, default policy: kill on a memory overage, alert on a
//! bypass), with the tenant's processes in a real cgroup:
//! - under libtessera.so, it clears its usage region's bitmap and byte
//!   counters, then allocates past its limit;
//! - it never loads the preload;
//! - under libtessera.so, it loads the driver itself, around the
//!   interposer.
//!
//! Each is judged by the simulator's record (when the process first holds
//! more than it may) and the kernel (its death by SIGKILL), never by the
//! watchdog's counters: killed within 1 s of going over. Needs root;
//! prints "skipped: <reason>" otherwise.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;
mod watchdog_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use daemon_support::{Agent, container_ok, uuid};
use tessera_testkit::sim::Node;
use watchdog_support::{
    CONTEXT_MIB, MIB, Pins, Tenant, TestCgroup, escape_probe, killed, libtessera, node_spec,
    over_at, skip_reason, watchdog_toml, workload,
};

/// The limit of every container here.
const LIMIT_MIB: u64 = 500;
/// The most the simulator may record for one process before the
/// watchdog must act: the limit and one (uncharged) context.
const MAY_HOLD: u64 = (LIMIT_MIB + CONTEXT_MIB) * MIB;
/// Going over to killed (the bound).
const BOUND: Duration = Duration::from_secs(1);

struct Setup {
    node: Node,
    root: PathBuf,
    cg: TestCgroup,
    dir: PathBuf,
    agent: Agent,
    _pins: Pins,
}

fn setup(name: &str, ebpf: &str) -> Option<Setup> {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return None;
    }
    let node = node_spec().build();
    let root = node.dir.path().join("containers");
    let cg = TestCgroup::new(name);
    let gpu = uuid(&node, 0);
    let dir = container_ok(
        &root,
        &[
            "add",
            "--id",
            name,
            "--gpu",
            &format!("{gpu},memory={LIMIT_MIB}"),
            "--cgroup",
            cg.dir.to_str().unwrap(),
            "--namespace",
            "tenants",
            "--pod",
            "hostile",
        ],
    );
    let dir = PathBuf::from(dir.trim());
    let pins = Pins::new(name);
    let config = node.dir.path().join("agent.toml");
    std::fs::write(&config, watchdog_toml(ebpf, &pins.0)).unwrap();
    let agent = Agent::start(&node, &root, &["--config", config.to_str().unwrap()]);
    agent.wait_ready();
    Some(Setup {
        node,
        root,
        cg,
        dir,
        agent,
        _pins: pins,
    })
}

/// Waits for the tenant's death, which must be a SIGKILL within
/// [`BOUND`] of `over`.
fn assert_killed_within(t: &mut Tenant, over: Instant, s: &Setup) {
    let exit = t.exit_within(Duration::from_secs(10));
    let Some((status, at)) = exit else {
        panic!(
            "the tenant still runs 10 s after going over; view {:#}; log {:#?}",
            s.agent.view(),
            s.agent.log()
        );
    };
    assert!(killed(status), "{status:?}");
    let took = at.duration_since(over);
    println!("over the limit to SIGKILL: {} ms", took.as_millis());
    assert!(
        took < BOUND,
        "killed {} ms after going over; log {:#?}",
        took.as_millis(),
        s.agent.log()
    );
}

fn actions(v: &serde_json::Value, id: &str) -> Vec<(String, String)> {
    watchdog_support::actions_of(Agent::container(v, id).unwrap())
}

#[test]
fn a_cleared_usage_region_does_not_buy_memory_past_the_limit() {
    let Some(s) = setup("bitmap", "off") else {
        return;
    };
    // 100 MiB through the preload, then it clears its account and takes
    // 450 more: the preload sees 0 + 450 <= 500 and lets it.
    let lib = libtessera();
    let mut t = Tenant::start(
        &s.node,
        &s.cg,
        &workload(),
        &[
            "dev", "0", "alloc", "100", "ready", "wait", "alloc", "450", "hold",
        ],
        &[("LD_PRELOAD", &lib), ("TESSERA_REGION_DIR", &s.dir)],
    );
    // An honest container is left alone: nothing acted while it was.
    std::thread::sleep(Duration::from_millis(500));
    assert!(t.alive());
    assert_eq!(actions(&s.agent.view(), "bitmap"), []);
    watchdog_support::clear_account(&s.dir.join("usage"));
    t.go();
    let over = over_at(&s.node, t.pid(), MAY_HOLD);
    assert_killed_within(&mut t, over, &s);
    let v = s.agent.wait_view("the kill in the view", |v| {
        Agent::container(v, "bitmap").is_some_and(|c| c["enforcement"]["last_event"].is_string())
    });
    let a = actions(&v, "bitmap");
    assert!(
        a.contains(&("memory_overage".into(), "kill".into())),
        "{a:?}"
    );
    assert!(a.contains(&("tampering".into(), "alert".into())), "{a:?}");
    s.agent.wait_log("the kill, naming the pod", |l| {
        l.contains("watchdog acted") && l.contains("pod tenants/hostile")
    });
    let _ = &s.root;
}

#[test]
fn a_process_without_the_preload_is_reported_and_killed_over_the_limit() {
    let Some(s) = setup("nopreload", "off") else {
        return;
    };
    // First within its limit: a bypass, alerted (the default), not killed.
    let mut t = Tenant::start(
        &s.node,
        &s.cg,
        &workload(),
        &[
            "dev", "0", "alloc", "100", "ready", "wait", "alloc", "450", "hold",
        ],
        &[],
    );
    let seen = Instant::now();
    let v = s.agent.wait_view("the bypass alert", |v| {
        actions(v, "nopreload").contains(&("bypass".into(), "alert".into()))
    });
    println!("bypass to alert: {} ms", seen.elapsed().as_millis());
    assert!(seen.elapsed() < BOUND + Duration::from_millis(500), "{v:#}");
    assert!(t.alive(), "an alert must not touch the process");
    let last = Agent::container(&v, "nopreload").unwrap()["enforcement"]["last_event"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(last.contains(&t.pid().to_string()), "{last}");
    // Then past the limit: killed.
    t.go();
    let over = over_at(&s.node, t.pid(), MAY_HOLD);
    assert_killed_within(&mut t, over, &s);
}

#[test]
fn a_process_that_loads_the_driver_itself_is_killed_over_the_limit() {
    let Some(s) = setup("escape", "off") else {
        return;
    };
    let lib = libtessera();
    let sim_cuda = tessera_testkit::sim::artifact("sim/libcuda.so.1");
    let probe = escape_probe();
    let mut t = Tenant::start(
        &s.node,
        &s.cg,
        &probe,
        &[sim_cuda.to_str().unwrap(), "600"],
        &[("LD_PRELOAD", &lib), ("TESSERA_REGION_DIR", &s.dir)],
    );
    t.go();
    let over = over_at(&s.node, t.pid(), MAY_HOLD);
    assert_killed_within(&mut t, over, &s);
    // What gave it away besides the memory: its NVML memory that no usage
    // slot accounts for.
    let v = s.agent.wait_view("the kill in the view", |v| {
        actions(v, "escape").contains(&("memory_overage".into(), "kill".into()))
    });
    let a = actions(&v, "escape");
    assert!(
        a.iter().any(|(r, _)| r == "bypass" || r == "tampering"),
        "{a:?}"
    );
}

#[test]
fn the_ebpf_observer_reports_a_process_that_only_talks_to_the_driver() {
    let Some(s) = setup("ebpfonly", "auto") else {
        return;
    };
    let v = s.agent.view();
    let status = v["ebpf"].as_str().unwrap().to_owned();
    assert!(status.starts_with("running"), "{status}");
    // A cooperating process first: its ioctls are counted, and its first
    // ones (before the agent copied its registration) are no bypass.
    let lib = libtessera();
    let mut honest = Tenant::start(
        &s.node,
        &s.cg,
        &workload(),
        &["dev", "0", "alloc", "100", "ready", "hold"],
        &[("LD_PRELOAD", &lib), ("TESSERA_REGION_DIR", &s.dir)],
    );
    let v = s.agent.wait_view("its ioctls", |v| {
        Agent::container(v, "ebpfonly").is_some_and(|c| c["ebpf"]["ioctls"].as_u64() > Some(0))
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(actions(&s.agent.view(), "ebpfonly"), [], "{v:#}");
    let c = Agent::container(&v, "ebpfonly").unwrap();
    assert!(c["gpus"][0]["ebpf_used_bytes"].is_u64(), "{c:#}");
    // Then one that only initialises the driver, without the preload:
    // NVML lists nothing for it, the kernel sees its ioctls.
    let mut t = Tenant::start(&s.node, &s.cg, &workload(), &["ready", "hold"], &[]);
    let started = Instant::now();
    let v = s.agent.wait_view("the bypass alert", |v| {
        actions(v, "ebpfonly").contains(&("bypass".into(), "alert".into()))
    });
    let took = started.elapsed();
    println!(
        "driver use without the preload to alert: {} ms",
        took.as_millis()
    );
    assert_eq!(watchdog_support::sim_bytes(&s.node, t.pid()), 0);
    let c = Agent::container(&v, "ebpfonly").unwrap();
    assert!(c["ebpf"]["bypass_events"].as_u64() >= Some(1), "{c:#}");
    let last = c["enforcement"]["last_event"].as_str().unwrap();
    assert!(last.contains(&t.pid().to_string()), "{last}");
    assert!(!last.contains(&honest.pid().to_string()), "{last}");
    assert!(took < BOUND, "{} ms", took.as_millis());
    assert!(t.alive() && honest.alive());
}
