//! Host pids of a container come from its cgroup (`cgroup.procs`, the v2
//! hierarchy detected, not assumed) and are joined with the usage
//! region's slots through `NSpid`: a workload in its own pid namespace
//! registers as pid 1, and the agent names its host pid. Needs root (it
//! creates a real cgroup and a pid namespace); prints "skipped" otherwise.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use daemon_support::sim::spawn_command_ready;
use daemon_support::{Agent, Link, Node, container_ok, libtessera, uuid, wait_for, workload};
use tessera_agent::cgroup::cgroup2_root;

/// A cgroup made for the test, removed on drop (after its processes).
struct TestCgroup(PathBuf);

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = wait_for(Duration::from_secs(5), || {
            std::fs::remove_dir(&self.0).is_ok().then_some(())
        });
    }
}

/// A new cgroup `name` of this test process (tests run in parallel).
fn root_cgroup(name: &str) -> Result<TestCgroup, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        return Err("no unshare(1)".into());
    }
    let v2 = cgroup2_root().map_err(|e| e.to_string())?;
    let dir = v2.join(format!("tessera-daemon-test-{}-{name}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(TestCgroup(dir))
}

/// The only child pid of `pid`.
fn child_of(pid: i32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// SIGKILLs a pid this test started when dropped.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a pid this test started.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

/// Container `id` on GPU 0 of `node` with a 1000 MiB limit, its
/// processes in cgroup `cg`; its region directory.
fn container_in(node: &Node, root: &std::path::Path, id: &str, cg: &TestCgroup) -> PathBuf {
    let gpu = uuid(node, 0);
    let dir = container_ok(
        root,
        &[
            "add",
            "--id",
            id,
            "--gpu",
            &format!("{gpu},memory=1000"),
            "--cgroup",
            cg.0.to_str().unwrap(),
        ],
    );
    PathBuf::from(dir.trim())
}

#[test]
fn cgroup_members_are_mapped_through_nspid_to_usage_slots() {
    let cg = match root_cgroup("ns") {
        Ok(cg) => cg,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let dir = container_in(&node, &root, "ns", &cg);
    let procs = cg.0.join("cgroup.procs");
    // The workload: into the cgroup, then pid 1 of a new pid namespace
    // (with its own /proc, as in a container).
    let mut c = node.command(&PathBuf::from("sh"));
    c.arg("-c")
        .arg(format!(
            "echo 0 > {} && exec unshare --pid --fork --mount-proc --kill-child {} dev 0 alloc 100 ready hold",
            procs.display(),
            workload(Link::Direct).display()
        ))
        .env("LD_PRELOAD", libtessera())
        .env("TESSERA_REGION_DIR", &dir);
    let work = spawn_command_ready(c, "workload in a pid namespace");
    let host = child_of(work.pid()).expect("unshare's child");
    // The namespace's init ignores SIGTERM from outside: SIGKILL it on
    // any exit of this test (unshare's --kill-child covers unshare's end).
    let _init = KillOnDrop(host);
    // A member that never loads the preload.
    let mut plain = Command::new("sh")
        .arg("-c")
        .arg(format!("echo 0 > {} && exec sleep 60", procs.display()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let plain_pid = plain.id();

    let agent = Agent::start(&node, &root, &[]);
    agent.wait_ready();
    let view = agent.wait_view("both processes", |v| {
        Agent::container(v, "ns").is_some_and(|c| {
            let p = c["processes"].as_array().unwrap();
            p.iter().any(|p| p["source"] == "registered")
                && p.iter().any(|p| p["host_pid"] == plain_pid)
        })
    });
    let c = Agent::container(&view, "ns").unwrap();
    let p = c["processes"].as_array().unwrap();
    let reg = p.iter().find(|p| p["source"] == "registered").unwrap();
    assert_eq!(reg["ns_pid"], 1, "{c:#}");
    assert_eq!(reg["host_pid"], host, "{c:#}");
    let plain_view = p.iter().find(|p| p["host_pid"] == plain_pid).unwrap();
    assert_eq!(plain_view["source"], "unregistered", "{c:#}");
    assert!(!p.iter().any(|p| p["source"] == "unmatched_slot"), "{c:#}");
    assert_eq!(c["gpus"][0]["preload_used_bytes"], 100u64 << 20);
    drop(work);
    let _ = plain.kill();
    let _ = plain.wait();
}

/// Two pid namespaces in one container (as the containers of a pod sharing
/// a DRA claim): each registers as pid 1, and when one namespace dies with
/// its process no process of the other may judge its slot (its pid names
/// itself there); the agent, which sees the cgroup, frees it, and the
/// survivor can then use the whole limit.
#[test]
fn the_agent_frees_the_slot_of_a_pid_namespace_that_died() {
    let cg = match root_cgroup("two") {
        Ok(cg) => cg,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let dir = container_in(&node, &root, "two", &cg);
    let procs = cg.0.join("cgroup.procs");
    let spawn = |ops: &str| {
        let mut c = node.command(&PathBuf::from("sh"));
        c.arg("-c")
            .arg(format!(
                "echo 0 > {} && exec unshare --pid --fork --mount-proc --kill-child {} {ops}",
                procs.display(),
                workload(Link::Direct).display()
            ))
            .env("LD_PRELOAD", libtessera())
            .env("TESSERA_REGION_DIR", &dir)
            .stdin(Stdio::piped());
        spawn_command_ready(c, ops)
    };
    let a = spawn("dev 0 alloc 600 ready hold");
    let a_init = KillOnDrop(child_of(a.pid()).expect("unshare's child"));
    let mut b = spawn("dev 0 ready wait alloc-until-oom 100 ready hold");
    let _b_init = KillOnDrop(child_of(b.pid()).expect("unshare's child"));

    let agent = Agent::start(&node, &root, &[]);
    agent.wait_ready();
    agent.wait_view("two registered pid 1s", |v| {
        Agent::container(v, "two").is_some_and(|c| {
            c["processes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["source"] == "registered" && p["ns_pid"] == 1)
                .count()
                == 2
        })
    });
    // A's namespace dies with its only process.
    drop(a_init);
    drop(a);
    let view = agent.wait_view("A's slot freed", |v| {
        Agent::container(v, "two").is_some_and(|c| {
            c["gpus"][0]["preload_used_bytes"] == 0
                && !c["processes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["source"] == "unmatched_slot")
        })
    });
    let c = Agent::container(&view, "two").unwrap();
    assert_eq!(
        c["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["source"] == "registered")
            .count(),
        1,
        "{c:#}"
    );
    assert!(
        agent
            .log()
            .iter()
            .any(|l| l.contains("freed the usage slots")),
        "no log of the agent freeing the slot"
    );
    // The region (the preload's own record) agrees: B may now take it all.
    use std::io::Write as _;
    writeln!(b.child.stdin.as_mut().unwrap(), "go").unwrap();
    let mut allocs = None;
    while let Some(line) = b.next_line() {
        if line.starts_with("allocs ") {
            allocs = Some(line);
            break;
        }
    }
    assert_eq!(
        allocs.as_deref(),
        Some("allocs 10 CUDA_ERROR_OUT_OF_MEMORY")
    );
}
