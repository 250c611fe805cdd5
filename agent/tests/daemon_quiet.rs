//! Containers with nothing running in them are looked at only every
//! `quiet_revisit_ms` (`agent/src/daemon/tick`), yet what happens to them
//! is seen in the next period: a process that starts using a GPU (the
//! simulator's NVML lists it), or `container set`. Each test sets the
//! revisit to a minute, so only the wake-up path can answer in time;
//! judged by the simulator's process list and the region files.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use daemon_support::sim::{Running, spawn_command_ready};
use daemon_support::{
    Agent, Link, Node, add_container, container_ok, libtessera, uuid, wait_for, workload,
};
use tessera_region::file::open_control;

/// Long enough that no test here waits for a revisit.
const REVISIT: &str = "quiet_revisit_ms = 60000\n";

fn agent(node: &Node, root: &Path) -> Agent {
    let config = node.dir.path().join("agent.toml");
    std::fs::write(&config, REVISIT).unwrap();
    let a = Agent::start(node, root, &["--config", config.to_str().unwrap()]);
    a.wait_ready();
    a
}

fn add(node: &Node, root: &Path, id: &str, target: u32) -> PathBuf {
    add_container(root, id, &uuid(node, 0), 1000, target, &["--mode", "hard"])
}

/// A workload under the interposer in the container of `dir`, running
/// `ops`; `stdin` piped when the test drives it.
fn tenant(node: &Node, dir: &Path, ops: &str, stdin: bool) -> Running {
    let mut c = node.command(&workload(Link::Direct));
    c.env("LD_PRELOAD", libtessera())
        .env("TESSERA_REGION_DIR", dir)
        .args(ops.split_whitespace());
    if stdin {
        c.stdin(std::process::Stdio::piped());
    }
    spawn_command_ready(c, ops)
}

fn launch_rate(dir: &Path) -> u64 {
    open_control(&dir.join("control")).unwrap().snapshot().gpus[0].launch_rate
}

/// The launch rate in `dir`'s control region moves from `before` within
/// 10 s (the revisit is a minute: only a wake-up path answers in time).
#[track_caller]
fn assert_rate_moves(dir: &Path, before: u64, a: &Agent, when: &str) {
    let moved = wait_for(Duration::from_secs(10), || {
        (launch_rate(dir) != before).then_some(())
    });
    assert!(
        moved.is_some(),
        "launch rate still {before} {when} (revisit is 60 s): {:#}",
        a.view()
    );
}

#[test]
fn a_workload_started_in_a_quiet_container_is_controlled_in_the_next_periods() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let dir = add(&node, &root, "sleeper", 30);
    let a = agent(&node, &root);
    a.wait_view("sleeper visited", |v| {
        Agent::container(v, "sleeper").is_some_and(|c| c["since_period"].is_u64())
    });
    // Well past its first visit: from here on it is skipped.
    std::thread::sleep(Duration::from_millis(1500));
    let before = launch_rate(&dir);

    let work = tenant(&node, &dir, "dev 0 ready run spin 1 256 30000", false);
    let pid = work.pid();
    let started = Instant::now();
    // The simulator's NVML lists it (the oracle of "it uses the GPU").
    assert!(
        wait_for(Duration::from_secs(5), || {
            node.sim()
                .processes(0)
                .unwrap()
                .iter()
                .any(|p| p.pid == pid)
                .then_some(())
        })
        .is_some(),
        "the simulator never listed pid {pid}"
    );
    let seen = wait_for(Duration::from_secs(10), || {
        let v = a.view();
        let c = Agent::container(&v, "sleeper")?;
        c["processes"]
            .as_array()?
            .iter()
            .any(|p| p["host_pid"] == pid)
            .then_some(())
    });
    assert!(
        seen.is_some(),
        "the agent did not see pid {pid} in its quiet container within 10 s (revisit is 60 s): {:#}",
        a.view()
    );
    // And its controller acts on it: the rate in the control region moves.
    assert_rate_moves(
        &dir,
        before,
        &a,
        &format!("{:?} after the workload started", started.elapsed()),
    );
}

#[test]
fn container_set_on_a_quiet_container_applies_in_the_next_periods() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    add(&node, &root, "idle", 30);
    let a = agent(&node, &root);
    a.wait_view("idle visited at target 30", |v| {
        Agent::container(v, "idle").is_some_and(|c| c["meta"]["sm_target"] == 30)
    });
    std::thread::sleep(Duration::from_millis(1500));
    container_ok(&root, &["set", "--id", "idle", "--sm-target", "55"]);
    let applied = wait_for(Duration::from_secs(10), || {
        let v = a.view();
        (Agent::container(&v, "idle")?["meta"]["sm_target"] == 55).then_some(())
    });
    assert!(
        applied.is_some(),
        "target 55 not taken up within 10 s (revisit is 60 s): {:#}",
        a.view()
    );
}

#[test]
fn an_idle_process_that_starts_launching_wakes_its_quiet_container() {
    use std::io::Write;
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let dir = add(&node, &root, "server", 30);
    // An inference server between requests: memory held, no kernel, until
    // the test writes a line.
    let ops = "dev 0 alloc 100 ready wait run spin 1 256 30000";
    let mut work = tenant(&node, &dir, ops, true);
    let pid = work.pid();
    let a = agent(&node, &root);
    a.wait_view("server with its process", |v| {
        Agent::container(v, "server").is_some_and(|c| {
            c["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["host_pid"] == pid)
        })
    });
    // Quiet from here on: nothing launches, its memory stays.
    std::thread::sleep(Duration::from_millis(1500));
    let before = launch_rate(&dir);
    writeln!(work.child.stdin.as_mut().unwrap(), "go").unwrap();
    assert_rate_moves(&dir, before, &a, "10 s after its process started launching");
}

/// A quiet container's revisit is cut short only when it finds everything
/// as the last visit did: bytes a process of it charges in its usage
/// region (no launch, no NVML change: nothing wakes it) show in its view
/// at the next revisit. Judged by the bytes the test wrote into the file.
#[test]
fn a_revisit_shows_what_changed_in_a_quiet_containers_usage_region() {
    use std::os::unix::fs::FileExt;
    use tessera_region::layout::usage_offsets;
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let dir = add(&node, &root, "holder", 30);
    let work = tenant(&node, &dir, "dev 0 alloc 100 ready hold", false);
    let pid = work.pid();
    let config = node.dir.path().join("agent.toml");
    std::fs::write(&config, "quiet_revisit_ms = 500\n").unwrap();
    let a = Agent::start(&node, &root, &["--config", config.to_str().unwrap()]);
    a.wait_ready();
    let v = a.wait_view("holder with its slot", |v| {
        Agent::container(v, "holder").is_some_and(|c| {
            c["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["host_pid"] == pid && p["slot"].is_u64())
        })
    });
    let c = Agent::container(&v, "holder").unwrap();
    let slot = c["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["host_pid"] == pid)
        .unwrap()["slot"]
        .as_u64()
        .unwrap() as usize;
    // Quiet from here on (ten calm visits), revisited twice a second.
    std::thread::sleep(Duration::from_millis(2500));
    let usage = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("usage"))
        .unwrap();
    for bytes in [300u64 << 20, 7 << 20] {
        usage
            .write_at(
                &bytes.to_le_bytes(),
                (usage_offsets::USED + slot * 8) as u64,
            )
            .unwrap();
        let shown = wait_for(Duration::from_secs(5), || {
            let v = a.view();
            (Agent::container(&v, "holder")?["gpus"][0]["preload_used_bytes"] == bytes)
                .then_some(())
        });
        assert!(
            shown.is_some(),
            "{bytes} bytes written into slot {slot} not shown within 5 s (revisit is 0.5 s): {:#}",
            a.view()
        );
    }
}
