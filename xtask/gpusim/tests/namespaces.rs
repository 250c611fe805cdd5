//! The simulated node as processes in containers see it, judged by the
//! kernel (`/proc`) and by the simulator's record read from the host:
//!
//! - a process in a pid namespace of its own (`unshare --pid`, as a pod
//!   without `hostPID`) is named by its host pid on the host (the record,
//!   `gpusim show`), by its own pid inside its namespace (NVML there), not
//!   at all by NVML in a sibling namespace, and is reaped by nobody while it
//!   runs and by the host once it exits;
//! - a process that can open only some GPUs' device nodes (a container
//!   given GPU 1) sees just those, numbered from 0, with their own UUIDs,
//!   bus ids and minor numbers, while the record shows the GPU it used;
//! - both at once (a pod given GPU 1 of three, without `hostPID`);
//! - a process of another uid uses the state file root shares with it.
//!
//! The pid namespace and uid tests need root and `unshare`/`nsenter`/
//! `setpriv` (util-linux); without them they say `skipped: <reason>`.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use tessera_testkit::or_skip;
use tessera_testkit::sim as support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use support::{Gpu, Link, NodeSpec};

const MIB: u64 = 1 << 20;

/// `nvml_devices.c`, compiled once.
fn nvml_devices() -> PathBuf {
    static BUILT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let exe = dir.path().join("nvml_devices");
            support::cc(&[
                concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/nvml_devices.c"),
                "-o",
                exe.to_str().unwrap(),
                "-ldl",
            ]);
            (dir, exe)
        })
        .1
        .clone()
}

fn stdout(mut c: Command) -> String {
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{c:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The lines of `out` starting with `key`, split into fields after it.
fn lines<'a>(out: &'a str, key: &str) -> Vec<Vec<&'a str>> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.first() == Some(&key))
        .map(|f| f[1..].to_vec())
        .collect()
}

/// Why processes in new pid namespaces cannot be made here, if so.
fn pid_namespaces() -> Result<(), String> {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root (pid namespaces are made with unshare)".into());
    }
    if gpusim::pidns::own_namespace() != gpusim::pidns::PROC_PID_INIT_INO {
        return Err("not in the initial pid namespace (the host's view is judged)".into());
    }
    for (tool, args) in [
        (
            "unshare",
            &["--pid", "--fork", "--mount-proc", "--kill-child", "true"][..],
        ),
        ("nsenter", &["--version"][..]),
    ] {
        match Command::new(tool).args(args).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Err(format!(
                    "{tool} {args:?} fails: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Err(e) => return Err(format!("{tool} cannot run: {e}")),
        }
    }
    Ok(())
}

/// `/proc/<pid>/status`'s `key:` fields.
fn status(pid: i32, key: &str) -> Option<Vec<i32>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix(key))?;
    line.strip_prefix(':')?
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect()
}

/// The child of `parent` (as this `/proc` shows it).
fn child_of(parent: i32) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .find(|&p| status(p, "PPid").is_some_and(|v| v == [parent]));
        if found.is_some() {
            return found;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

#[test]
fn a_process_in_its_own_pid_namespace_is_named_by_each_reader_in_its_own_terms() {
    or_skip!(pid_namespaces());
    let node = NodeSpec::small().build();
    let sim = node.sim();
    let ops = "dev 0 alloc 64 launch spin 1 32 5 sync ready hold";
    let mut c = node.command(std::path::Path::new("unshare"));
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(support::workload(Link::Direct))
        .args(ops.split_whitespace());
    let running = support::spawn_command_ready(c, ops);
    let host = child_of(running.pid()).expect("unshare's child");
    // The kernel: pid `host` here, 1 in its own namespace.
    assert_eq!(status(host, "NSpid"), Some(vec![host, 1]));
    let bytes = (300 + 64) * MIB;

    // The host: its host pid, again and again (every query reaps).
    for _ in 0..5 {
        let procs = sim.processes(0).unwrap();
        assert_eq!(
            procs.iter().map(|p| (p.pid, p.bytes)).collect::<Vec<_>>(),
            [(host, bytes)],
            "pid 1 in its namespace is pid {host} here"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let show: serde_json::Value = serde_json::from_str(&node.gpusim(&["show", "--json"])).unwrap();
    let listed = &show["processes"][0];
    assert_eq!(listed["pid"], host, "{show}");
    assert_eq!(listed["name"], "workload", "{show}");

    // Its own namespace (and its /proc): pid 1.
    let mut inside = node.command(std::path::Path::new("nsenter"));
    inside
        .args(["-t", &host.to_string(), "--pid", "--mount"])
        .arg(nvml_devices());
    let out = stdout(inside);
    let b = bytes.to_string();
    assert_eq!(lines(&out, "proc"), [vec!["0", "1", b.as_str()]], "{out}");

    // A sibling namespace cannot see it: not listed (a real driver leaves
    // out what it cannot translate), its memory still in use, not reaped.
    let mut sibling = node.command(std::path::Path::new("unshare"));
    sibling
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(nvml_devices());
    let out = stdout(sibling);
    assert!(lines(&out, "proc").is_empty(), "{out}");
    let used: u64 = lines(&out, "gpu")[0][5].parse().unwrap();
    assert_eq!(used, bytes, "{out}");
    assert_eq!(
        sim.processes(0)
            .unwrap()
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>(),
        [host],
        "the sibling reaped it"
    );

    // Once it exits, the host reaps it and still names its launches.
    running.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{host}")).exists() {
        assert!(Instant::now() < deadline, "pid {host} did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(sim.processes(0).unwrap().is_empty());
    assert_eq!(sim.memory_info(0).unwrap().used, 0);
    let launches = sim.launches(0).unwrap();
    assert!(
        launches.len() == 1
            && launches[0].pid == host
            && launches[0].kernels == 5
            && !launches[0].active,
        "{launches:?}"
    );
}

#[test]
fn a_process_sees_only_the_gpus_whose_device_nodes_it_can_open() {
    let dev = tempfile::tempdir().unwrap();
    let paths: Vec<String> = (0..3)
        .map(|i| dev.path().join(format!("nvidia{i}")).display().to_string())
        .collect();
    // Only GPU 1's node is there, as in a container given GPU 1.
    std::fs::write(&paths[1], b"").unwrap();
    let node = NodeSpec::new()
        .gpu(Gpu::sim(4096))
        .gpu(Gpu::sim(2048))
        .gpu(Gpu::sim(4096))
        .fixed_kernel("spin", 200_000)
        .ioctl_devices(&paths.iter().map(String::as_str).collect::<Vec<_>>())
        .build();
    let host = node.sim();
    assert_eq!(host.gpu_count(), 3, "the host's view is the node's");
    let uuid1 = host.node().uuid(1);

    // CUDA: device 0 is GPU 1 (2 GiB, its bus id); GPU 0's bus id and a
    // device 1 are not there.
    let out = node.run(
        Link::Direct,
        "dev 0 alloc 64 launch spin 1 32 7 sync meminfo bybus 0000:20:00.0 bybus 0000:18:00.0",
    );
    assert_eq!(support::field(&out, "meminfo")[1], (2048 * MIB).to_string());
    let bybus = lines(&out, "bybus");
    assert_eq!(
        bybus,
        [
            vec!["CUDA_SUCCESS", "0"],
            vec!["CUDA_ERROR_INVALID_DEVICE", "-1"]
        ],
        "{out}"
    );
    let out = node
        .command(&support::workload(Link::Direct))
        .args(["dev", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && text.contains("error dev CUDA_ERROR_INVALID_DEVICE"),
        "{text}"
    );

    // The record, read from the host: GPU 1 ran the kernels (and its
    // memory went when the process exited: this query reaps).
    assert_eq!(host.memory_info(1).unwrap().used, 0);
    let on = |gpu| host.launches(gpu).unwrap();
    assert!(
        on(1).iter().any(|l| l.kernels == 7 && !l.active),
        "{:?}",
        on(1)
    );
    assert!(on(0).is_empty() && on(2).is_empty());

    // NVML: one device, index 0, with GPU 1's UUID, minor number and bus id.
    let out = stdout(node.command(&nvml_devices()));
    assert_eq!(lines(&out, "count"), [vec!["1"]], "{out}");
    let gpu = &lines(&out, "gpu")[0];
    let total = (2048 * MIB).to_string();
    assert_eq!(
        gpu[..5],
        ["0", uuid1.as_str(), "1", "00000000:20:00.0", total.as_str()],
        "{out}"
    );
    assert_eq!(lines(&out, "self"), [vec!["0", "0"]], "{out}");

    // With every node there, every GPU, in node order.
    for p in [&paths[0], &paths[2]] {
        std::fs::write(p, b"").unwrap();
    }
    let out = stdout(node.command(&nvml_devices()));
    assert_eq!(lines(&out, "count"), [vec!["3"]], "{out}");
    let minors: Vec<&str> = lines(&out, "gpu").iter().map(|g| g[2]).collect();
    assert_eq!(minors, ["0", "1", "2"], "{out}");
}

/// A container running as another uid than the node's: the state file is
/// root's, handed to it by the runtime. With root's private mode the
/// process cannot open it; once root shares it (mode 0666 at a path named
/// by `GPUSIM_STATE`) the process runs, and the host's record has it.
#[test]
fn a_process_of_another_uid_uses_a_state_file_root_shares() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: not root (the workload runs as another uid)");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        println!("skipped: setpriv (util-linux) is not installed");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let node = NodeSpec::small().build();
    let host = node.sim();
    let open = |p: &std::path::Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    open(node.dir.path(), 0o755);
    let exe = node.dir.path().join("workload");
    std::fs::copy(support::workload(Link::Direct), &exe).unwrap();
    let run = || {
        let mut c = node.command(std::path::Path::new("setpriv"));
        c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(&exe)
            .args([
                "dev", "0", "alloc", "64", "launch", "spin", "1", "32", "3", "sync",
            ]);
        let child = c
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        (pid, child.wait_with_output().unwrap())
    };
    let (_, out) = run();
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("cannot open state file"),
        "{out:?}"
    );
    open(&node.state, 0o666);
    let (pid, out) = run();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(host.memory_info(0).unwrap().used, 0, "reaped at exit");
    let launches = host.launches(0).unwrap();
    assert!(
        launches
            .iter()
            .any(|l| l.pid == pid && l.kernels == 3 && !l.active),
        "{launches:?}"
    );
}

/// Both at once, as a pod without `hostPID` given GPU 1 of three: the
/// workload runs as device 0 in its own pid namespace, and the host's
/// record shows its host pid on GPU 1 while it runs and after it exits.
#[test]
fn a_pod_given_gpu_1_runs_as_device_0_and_the_host_sees_gpu_1() {
    or_skip!(pid_namespaces());
    let dev = tempfile::tempdir().unwrap();
    let paths: Vec<String> = (0..3)
        .map(|i| dev.path().join(format!("nvidia{i}")).display().to_string())
        .collect();
    std::fs::write(&paths[1], b"").unwrap();
    let node = NodeSpec::new()
        .gpu(Gpu::sim(4096))
        .gpu(Gpu::sim(4096))
        .gpu(Gpu::sim(4096))
        .fixed_kernel("spin", 200_000)
        .ioctl_devices(&paths.iter().map(String::as_str).collect::<Vec<_>>())
        .build();
    let sim = node.sim();
    let ops = "dev 0 alloc 256 launch spin 1 32 50 sync ready hold";
    let mut c = node.command(std::path::Path::new("unshare"));
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(support::workload(Link::Direct))
        .args(ops.split_whitespace());
    let running = support::spawn_command_ready(c, ops);
    let host = child_of(running.pid()).expect("unshare's child");
    assert_eq!(status(host, "NSpid"), Some(vec![host, 1]));
    let on = |gpu| -> Vec<(i32, u64)> {
        sim.processes(gpu)
            .unwrap()
            .iter()
            .map(|p| (p.pid, p.bytes))
            .collect()
    };
    assert_eq!(on(1), [(host, (300 + 256) * MIB)]);
    assert!(on(0).is_empty() && on(2).is_empty());
    running.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{host}")).exists() {
        assert!(Instant::now() < deadline, "pid {host} did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(on(1).is_empty());
    let launches = sim.launches(1).unwrap();
    assert!(
        launches.len() == 1
            && launches[0].pid == host
            && launches[0].kernels == 50
            && !launches[0].active,
        "{launches:?}"
    );
}
