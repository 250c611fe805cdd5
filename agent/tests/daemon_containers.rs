//! Containers under a running agent, judged by the simulator and the
//! region files: a killed agent leaves every limit as it was and a new one
//! resumes control in its first period (I4); `container set` resizes a
//! running process's memory without a restart, refusing new allocations
//! below its use and freeing nothing.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;

use std::path::Path;
use std::time::Duration;

use daemon_support::sim::{Running, spawn_command_ready};
use daemon_support::{
    Agent, Link, MIB, Node, container, container_ok, libtessera, uuid, wait_for, workload,
};
use tessera_region::ControlSnapshot;
use tessera_region::file::open_control;

fn control(dir: &Path) -> ControlSnapshot {
    open_control(&dir.join("control")).unwrap().snapshot()
}

/// The workload with `ops` in container `dir`, under libtessera.so.
fn spawn(node: &Node, dir: &Path, ops: &str) -> Running {
    let mut c = node.command(&workload(Link::Direct));
    c.env("LD_PRELOAD", libtessera())
        .env("TESSERA_REGION_DIR", dir)
        .args(ops.split_whitespace());
    spawn_command_ready(c, ops)
}

/// Device memory the simulator charges to `pid` on GPU 0.
fn sim_bytes(node: &Node, pid: i32) -> u64 {
    node.sim()
        .processes(0)
        .unwrap()
        .iter()
        .find(|p| p.pid == pid)
        .map_or(0, |p| p.bytes)
}

#[test]
fn a_killed_agent_changes_no_limit_and_a_new_one_resumes_in_its_first_period() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let gpu = uuid(&node, 0);
    let dir = container_ok(
        &root,
        &[
            "add",
            "--id",
            "job1",
            "--gpu",
            &format!("{gpu},memory=1000"),
            "--sm-target",
            "30",
        ],
    );
    let dir = Path::new(dir.trim());
    let mut work = spawn(&node, dir, "dev 0 alloc 600 ready hold");
    let pid = work.pid();

    let mut a = Agent::start(&node, &root, &[]);
    a.wait_ready();
    let view = a.wait_view("job1 with its process", |v| {
        Agent::container(v, "job1").is_some_and(|c| {
            c["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["host_pid"] == pid && p["source"] == "same_namespace")
        })
    });
    let c = Agent::container(&view, "job1").unwrap();
    assert_eq!(c["gpus"][0]["preload_used_bytes"], 600 * MIB, "{c:#}");
    let nvml = c["gpus"][0]["nvml_used_bytes"].as_u64().unwrap();
    assert_eq!(
        nvml,
        sim_bytes(&node, pid),
        "NVML's figure is the simulator's"
    );
    let before = control(dir);
    assert_eq!(before.gpus[0].memory_limit, 1000 * MIB);

    let status = a.signal_and_wait(libc::SIGKILL);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert_eq!(control(dir), before, "SIGKILL changed the control region");
    assert!(
        work.child.try_wait().unwrap().is_none(),
        "the workload runs on"
    );
    assert!(sim_bytes(&node, pid) >= 600 * MIB);

    let mut b = Agent::start(&node, &root, &[]);
    b.wait_ready();
    let view = b.wait_view("job1", |v| Agent::container(v, "job1").is_some());
    let c = Agent::container(&view, "job1").unwrap();
    assert_eq!(c["since_period"], 0, "resumed in the first period: {c:#}");
    assert_eq!(control(dir), before, "starting an agent changed the limits");

    // B is in control: a metadata change (as the device plugin makes)
    // reaches the control region within a few periods.
    let meta_path = dir.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    meta["gpus"][0]["memory_limit_bytes"] = (700 * MIB).into();
    let tmp = dir.join(".meta.json.test");
    std::fs::write(&tmp, serde_json::to_vec(&meta).unwrap()).unwrap();
    std::fs::rename(&tmp, &meta_path).unwrap();
    wait_for(Duration::from_secs(5), || {
        (control(dir).gpus[0].memory_limit == 700 * MIB).then_some(())
    })
    .unwrap_or_else(|| panic!("B did not apply the metadata: {:?}", control(dir)));

    let after = control(dir);
    let status = b.signal_and_wait(libc::SIGTERM);
    assert_eq!(status.code(), Some(0));
    assert_eq!(control(dir), after, "a clean stop changed the limits");
    drop(work);
}

/// A workload started right after `container add`, before any agent
/// period has decided a rate (here: no agent at all), is already paced at
/// the controller's starting rate instead of running unlimited. Judged by
/// the simulator's launch log.
#[test]
fn a_new_container_is_paced_before_the_agent_first_decides() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let gpu = uuid(&node, 0);
    let dir = container_ok(
        &root,
        &["add", "--id", "fresh", "--gpu", &gpu, "--sm-target", "25"],
    );
    let dir = Path::new(dir.trim());
    // What the controller documents as every container's start.
    let start = tessera_agent::control::ControllerConfig::default().initial_limits();
    let (rate, burst) = (start.rate, start.burst);
    // One-warp kernels of 200 µs for 1.5 s (unlimited: ~7500 warps), then
    // the process holds, still attached, so the simulator's record of it
    // names its pid (a detached channel's pid is cleared).
    let mut work = spawn(&node, dir, "dev 0 ready run spin 1 32 1500 hold");
    let pid = work.pid();
    let done = work.next_line().unwrap_or_default();
    assert!(done.starts_with("run "), "the workload said {done:?}");
    let warps = node
        .sim()
        .launches(0)
        .unwrap()
        .iter()
        .find(|l| l.pid == pid && l.active)
        .map(|l| l.warps)
        .expect("the simulator has a launch record of the workload");
    let allowed = rate as f64 * 1.6 + burst as f64 + 1.0;
    assert!(
        warps as f64 <= allowed,
        "{warps} warps ran in 1.5 s before any agent period (starting rate {rate}, burst {burst}; control region: {:?})",
        control(dir).gpus[0]
    );
    drop(work);
}

#[test]
fn lowering_memory_below_use_refuses_new_allocations_and_frees_nothing() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let gpu = uuid(&node, 0);
    let dir = container_ok(
        &root,
        &[
            "add",
            "--id",
            "resize",
            "--gpu",
            &format!("{gpu},memory=1000"),
        ],
    );
    let dir = Path::new(dir.trim());
    let agent = Agent::start(&node, &root, &[]);
    agent.wait_ready();
    let mut work = spawn(
        &node,
        dir,
        "dev 0 alloc 600 ready sleep 2000 alloc 200 sleep 2000 alloc 200 hold",
    );
    let pid = work.pid();
    let held = sim_bytes(&node, pid);
    assert!(held >= 600 * MIB, "{held}");

    container_ok(
        &root,
        &[
            "set",
            "--id",
            "resize",
            "--gpu",
            &format!("{gpu},memory=400"),
        ],
    );
    assert_eq!(control(dir).gpus[0].memory_limit, 400 * MIB);
    assert_eq!(
        work.next_line().as_deref(),
        Some("alloc CUDA_ERROR_OUT_OF_MEMORY"),
        "an allocation over the lowered limit"
    );
    assert_eq!(sim_bytes(&node, pid), held, "nothing was freed or added");
    // The agent keeps the lowered limit (the metadata says so).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(control(dir).gpus[0].memory_limit, 400 * MIB);

    container_ok(
        &root,
        &[
            "set",
            "--id",
            "resize",
            "--gpu",
            &format!("{gpu},memory=2000"),
        ],
    );
    assert_eq!(work.next_line().as_deref(), Some("alloc CUDA_SUCCESS"));
    assert_eq!(sim_bytes(&node, pid), held + 200 * MIB);
    let view = agent.wait_view("the new limit", |v| {
        Agent::container(v, "resize")
            .is_some_and(|c| c["gpus"][0]["memory_limit_bytes"] == 2000 * MIB)
    });
    let c = Agent::container(&view, "resize").unwrap();
    assert!(c["gpus"][0]["preload_used_bytes"].as_u64().unwrap() >= 600 * MIB);
}

#[test]
fn sm_target_mode_and_priority_change_live_and_bad_changes_are_refused() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let gpu = uuid(&node, 0);
    container_ok(
        &root,
        &["add", "--id", "t", "--gpu", &gpu, "--sm-target", "30"],
    );
    let agent = Agent::start(&node, &root, &[]);
    agent.wait_ready();
    container_ok(
        &root,
        &[
            "set",
            "--id",
            "t",
            "--sm-target",
            "55",
            "--mode",
            "elastic",
            "--priority",
            "7",
        ],
    );
    let view = agent.wait_view("the new target", |v| {
        Agent::container(v, "t").is_some_and(|c| c["meta"]["sm_target"] == 55)
    });
    let c = Agent::container(&view, "t").unwrap();
    assert_eq!(
        (c["meta"]["mode"].as_str(), c["meta"]["priority"].as_u64()),
        (Some("elastic"), Some(7))
    );
    for (args, says) in [
        (vec!["--sm-target", "0"], "sm_target"),
        (vec!["--sm-target", "101"], "sm_target"),
        (vec!["--priority", "1000"], "priority"),
        (vec!["--mode", "soft"], "accepted: hard, elastic"),
        (
            vec!["--gpu", "GPU-00000000-0000-0000-0000-000000000000,memory=1"],
            "has no GPU",
        ),
        (vec!["--gpu", &format!("{gpu},rate=100")], "--sm-target"),
        (vec!["--cgroup", "/a/../../etc"], "'..'"),
    ] {
        let mut a = vec!["set", "--id", "t"];
        a.extend(args.iter().copied());
        let out = container(&root, &a);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains(says), "{a:?}: {e}");
    }
    let out = container(&root, &["set", "--id", "nobody", "--sm-target", "5"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("there is no container nobody"));
    // The refused changes left the container as it was.
    let shown: serde_json::Value =
        serde_json::from_str(&container_ok(&root, &["show", "--id", "t"])).unwrap();
    assert_eq!(shown["meta"]["sm_target"], 55);
    // rm: gone at once, and the agent stops managing it.
    container_ok(&root, &["rm", "--id", "t"]);
    assert!(!root.join("t").exists());
    agent.wait_view("t gone", |v| Agent::container(v, "t").is_none());
    let names: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, [".lock"], "nothing left behind");
}
