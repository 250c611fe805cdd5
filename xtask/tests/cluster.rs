//! `cargo xtask cluster up | status | down` end to end: the cluster builds
//! (cached in `target/cluster/bin/`), comes up with its node Ready, a pod
//! of the repository's own `probe` image (imported, never pulled) runs to
//! completion on it, a second `up` changes nothing, and `down` leaves no
//! process of the cluster, no bridge, no `kubepods` cgroup, and every
//! kernel tunable the kubelet and the CNI bridge change as it was.
//!
//! The node's GPUs are the simulator's: a pod whose environment has
//! `NVIDIA_VISIBLE_DEVICES` runs the unmodified C workload (linked with
//! `-lcuda`, no rpath; its image holds the program and glibc, no CUDA
//! library) to Succeeded, and the simulator's shared state, read here on
//! the host, shows its memory while it runs and its launches after, under
//! the pid the kernel gives the pod's process; a pod without the variable
//! gets no libcuda (the loader refuses to start its program). `down`
//! removes the stand-in device nodes that `up` made.
//!
//! Skipped (with the reason) without root or without a Go toolchain, and
//! when a cluster of this checkout is already up (the test would take it
//! down).
#![allow(clippy::unwrap_used)] // helpers of a test crate

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// As `xtask/src/cluster/host.rs` lists them.
const TUNABLES: [&str; 7] = [
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
];
#[path = "cluster/dra.rs"]
mod dra;
#[path = "cluster/tessera.rs"]
mod tessera;

const PROBE_IMAGE: &str = "tessera.local/probe:v1";
const BRIDGE: &str = "tessera0";
/// The GPU test's image: the C workload and the C library it needs.
const WORKLOAD_IMAGE: &str = "tessera.local/cuda-workload:test";
/// The device nodes `up` makes for the default node (four GPUs).
const DEVICE_NODES: [&str; 6] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidia2",
    "/dev/nvidia3",
];

fn cluster_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/cluster")
}

fn xtask(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .unwrap();
    eprintln!(
        "$ xtask {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn kubectl(args: &[&str]) -> Output {
    let dir = cluster_dir();
    Command::new(dir.join("bin/tessera-kube"))
        .arg("kubectl")
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args(args)
        .output()
        .unwrap()
}

fn tunables() -> BTreeMap<&'static str, String> {
    TUNABLES
        .iter()
        .filter_map(|name| {
            let path = Path::new("/proc/sys").join(name.replace('.', "/"));
            Some((*name, std::fs::read_to_string(path).ok()?.trim().to_owned()))
        })
        .collect()
}

/// Processes running a program of the cluster's build.
fn cluster_processes() -> Vec<String> {
    let bin = cluster_dir().join("bin").canonicalize().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| {
            let exe = std::fs::read_link(e.path().join("exe")).ok()?;
            exe.starts_with(&bin)
                .then(|| format!("{} {}", e.file_name().to_string_lossy(), exe.display()))
        })
        .collect()
}

fn skip_reason() -> Option<String> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return Some("the cluster needs root".to_owned());
    }
    let go = tessera_testkit::programs::on_path("go").is_some()
        || Path::new("/usr/local/go/bin/go").is_file();
    if !go {
        return Some("no go toolchain to build the cluster".to_owned());
    }
    if cluster_dir().join("run/state.json").exists() {
        return Some(
            "a cluster of this checkout is up (target/cluster/run/state.json); the test would take it down"
                .to_owned(),
        );
    }
    None
}

/// The pod's phase, polled until it is final or `within` passes.
fn wait_pod_done(name: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let out = kubectl(&["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
        let phase = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if phase == "Succeeded" || phase == "Failed" || Instant::now() >= deadline {
            return phase;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The pod's log once it holds the probe's last line (or what `kubectl
/// logs` said when `within` passes).
fn pod_logs(name: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let out = kubectl(&["logs", name]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if text.contains("probe: done") || Instant::now() >= deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_pod_runs_on_the_local_cluster_and_down_undoes_up() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    // One cluster per machine: another checkout's cluster test (or anyone
    // holding the same lock, as `flock /tmp/tessera-cluster.lock CMD`)
    // finishes first.
    let lock = std::fs::File::create("/tmp/tessera-cluster.lock").unwrap();
    lock.lock().unwrap();
    let before = tunables();
    let nodes_before: Vec<&str> = DEVICE_NODES
        .iter()
        .copied()
        .filter(|p| Path::new(p).exists())
        .collect();

    let up = xtask(&["cluster", "up"]);
    let result = std::panic::catch_unwind(|| {
        assert!(up.status.success(), "cluster up failed");
        let status = xtask(&["cluster", "status"]);
        assert!(status.status.success());
        let text = String::from_utf8_lossy(&status.stdout);
        for component in [
            "containerd",
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(component)
                    && l.contains("running")
                    && l.ends_with(" ok")),
                "{component} is not running and healthy:\n{text}"
            );
        }
        assert!(text.contains("Ready"), "{text}");

        // A second `up` finds it running and changes nothing.
        let again = xtask(&["cluster", "up"]);
        assert!(again.status.success());
        assert!(String::from_utf8_lossy(&again.stderr).contains("already up"));

        let pod = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"probe","namespace":"default"}},
"spec":{{"restartPolicy":"Never","containers":[{{"name":"probe","image":"{PROBE_IMAGE}",
"imagePullPolicy":"Never","args":["--sleep=2s","KUBERNETES_SERVICE_HOST"]}}]}}}}"#
        );
        let file = cluster_dir().join("probe-pod.json");
        std::fs::write(&file, pod).unwrap();
        let created = kubectl(&["apply", "-f", file.to_str().unwrap()]);
        assert!(
            created.status.success(),
            "{}",
            String::from_utf8_lossy(&created.stderr)
        );
        let phase = wait_pod_done("probe", Duration::from_secs(120));
        let describe = kubectl(&["describe", "pod", "probe"]);
        assert_eq!(
            phase,
            "Succeeded",
            "{}",
            String::from_utf8_lossy(&describe.stdout)
        );
        let logs = pod_logs("probe", Duration::from_secs(30));
        assert!(logs.contains("probe: hostname=probe"), "{logs}");
        assert!(
            logs.contains("probe: env KUBERNETES_SERVICE_HOST=10.96.0.1"),
            "{logs}"
        );
        assert!(logs.contains("probe: done"), "{logs}");
        let _ = std::fs::remove_file(&file);

        gpu_pods();
        tessera::on_the_cluster();
        dra::on_the_cluster();
    });

    let down = xtask(&["cluster", "down"]);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    assert!(down.status.success(), "cluster down failed");
    assert_eq!(tunables(), before, "down left kernel tunables changed");
    assert_eq!(
        cluster_processes(),
        Vec::<String>::new(),
        "down left processes"
    );
    assert!(!Path::new("/sys/class/net").join(BRIDGE).exists());
    assert!(!cluster_dir().join("run").exists());
    assert!(!cluster_dir().join("kubeconfig").exists());
    let nodes_after: Vec<&str> = DEVICE_NODES
        .iter()
        .copied()
        .filter(|p| Path::new(p).exists())
        .collect();
    assert_eq!(nodes_after, nodes_before, "down left device nodes");
    let status = xtask(&["cluster", "status"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("the cluster is down"));
}

/// The shared libraries (and the loader) that `program` needs, as `ldd`
/// finds them here, but libcuda.
fn shared_libraries(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().unwrap();
    assert!(out.status.success(), "ldd {}", program.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("libcuda"))
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Builds the workload image (the C workload linked with `-lcuda`, no
/// rpath; glibc and what the simulator's libcuda needs of it, at this
/// machine's paths) and imports it into the cluster's containerd.
fn workload_image() {
    let dir = tempfile::tempdir().unwrap();
    let workload = dir.path().join("workload");
    let sim = tessera_testkit::sim::sim_dir();
    tessera_testkit::sim::cc(&[
        tessera_testkit::sim::workspace()
            .join("xtask/gpusim/tests/c/workload.c")
            .to_str()
            .unwrap(),
        "-o",
        workload.to_str().unwrap(),
        &format!("-L{}", sim.display()),
        "-lcuda",
    ]);
    let mut libs = shared_libraries(&workload);
    libs.extend(shared_libraries(&sim.join("libcuda.so.1")));
    libs.sort();
    libs.dedup();
    let archive = dir.path().join("workload.tar");
    let mut cmd = Command::new(cluster_dir().join("bin/oci-image"));
    cmd.args([
        "--name",
        WORKLOAD_IMAGE,
        "--entrypoint",
        "/workload",
        "--out",
    ])
    .arg(&archive)
    .arg("--add")
    .arg(format!("{}=/workload", workload.display()));
    for lib in &libs {
        cmd.arg("--add")
            .arg(format!("{}={}", lib.display(), lib.display()));
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "oci-image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(cluster_dir().join("bin/ctr"))
        .arg("--address")
        .arg(cluster_dir().join("run/containerd/containerd.sock"))
        .args(["--namespace", "k8s.io", "images", "import"])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pod of the workload image, with `env` and the workload's `args`; in
/// the host's pid namespace with `host_pid`.
fn workload_pod(name: &str, host_pid: bool, env: &[(&str, &str)], args: &[&str]) {
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "hostPID": host_pid,
            "containers": [{
                "name": "workload",
                "image": WORKLOAD_IMAGE,
                "imagePullPolicy": "Never",
                "env": env.iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect::<Vec<_>>(),
                "args": args,
            }],
        },
    });
    let file = cluster_dir().join(format!("{name}-pod.json"));
    std::fs::write(&file, pod.to_string()).unwrap();
    let created = kubectl(&["apply", "-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
}

/// The pid (on the host) of the process of pod `name` whose command line
/// starts with `program`, polled until the pod ends or `within` passes.
fn pod_process(name: &str, program: &str, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    // cgroupfs driver: kubepods/<qos>/pod<uid>/<container>.
    let needle = format!("pod{}", pod_uid(name));
    while Instant::now() < deadline {
        let phase = kubectl(&["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
        if matches!(
            String::from_utf8_lossy(&phase.stdout).trim(),
            "Succeeded" | "Failed"
        ) {
            return None;
        }
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if cgroup.contains(&needle) && cmdline.starts_with(program.as_bytes()) {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

fn pod_uid(name: &str) -> String {
    let out = kubectl(&["get", "pod", name, "-o", "jsonpath={.metadata.uid}"]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The simulated GPUs in pods: one asking for GPU 0 runs the workload on
/// it; one asking for none gets no libcuda.
fn gpu_pods() {
    workload_image();
    let state = cluster_dir().join("run/gpusim/state");
    assert!(state.is_file(), "no simulator state {}", state.display());
    // The CDI path names the same GPUs (its edits are checked with
    // containerd's CDI library in the runtime's Go tests).
    let cdi: serde_json::Value = serde_json::from_slice(
        &std::fs::read(cluster_dir().join("run/cdi/nvidia.com-gpu.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cdi["kind"], "nvidia.com/gpu");
    let names: Vec<&str> = cdi["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    for name in ["0", "3", "all", "GPU-5e1a0000-0000-4000-8000-000051510000"] {
        assert!(names.contains(&name), "CDI devices {names:?}");
    }

    // An ordinary pod (its own pid namespace) given GPU 1 only: it runs as
    // device 0 (a driver numbers a container's GPUs from 0), and on the
    // host the record names it by its host pid on GPU 1, while it runs and
    // after it ends.
    workload_pod(
        "cuda",
        false,
        &[("NVIDIA_VISIBLE_DEVICES", "1")],
        &[
            "dev", "0", "alloc", "256", "launch", "spin", "1", "32", "50", "sync", "sleep", "8000",
        ],
    );
    let pid = pod_process("cuda", "/workload", Duration::from_secs(60)).unwrap_or_else(|| {
        let logs = kubectl(&["logs", "cuda"]);
        panic!(
            "no process of pod cuda runs /workload; its log:\n{}",
            String::from_utf8_lossy(&logs.stdout)
        )
    });
    let sim = gpusim::Sim::open(&gpusim::state::Config {
        node_path: None,
        state_path: state.clone(),
    })
    .unwrap();
    assert_eq!(sim.gpu_count(), 4, "the default node has four GPUs");
    // Its memory while it runs: the 256 MiB and the context's overhead.
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        seen = sim.processes(1).unwrap();
        if seen.iter().any(|p| p.pid == pid && p.bytes >= 256 << 20) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        seen.iter().any(|p| p.pid == pid && p.bytes >= 256 << 20),
        "GPU 1 shows no 256 MiB of pid {pid}: {seen:?}"
    );
    for gpu in [0, 2, 3] {
        let others = sim.processes(gpu).unwrap();
        assert!(
            others.iter().all(|p| p.pid != pid),
            "pid {pid} on GPU {gpu}: {others:?}"
        );
    }
    let phase = wait_pod_done("cuda", Duration::from_secs(60));
    let describe = kubectl(&["describe", "pod", "cuda"]);
    let logs = String::from_utf8_lossy(&kubectl(&["logs", "cuda"]).stdout).into_owned();
    assert_eq!(
        phase,
        "Succeeded",
        "{logs}\n{}",
        String::from_utf8_lossy(&describe.stdout)
    );
    assert!(
        logs.contains("launch 50") && logs.contains("sync ok"),
        "{logs}"
    );
    // Its launches after it exits (the query reaps it first).
    assert!(sim.processes(1).unwrap().iter().all(|p| p.pid != pid));
    let launches = sim.launches(1).unwrap();
    let mine: Vec<_> = launches.iter().filter(|l| l.pid == pid).collect();
    assert!(
        mine.len() == 1 && mine[0].kernels == 50 && !mine[0].active,
        "GPU 1's launch record for pid {pid}: {launches:?}"
    );

    // An ordinary pod (its own pid namespace) naming its GPU by UUID: the
    // record is read only after it ends. The container sees that GPU only,
    // as device 0.
    let uuid = "GPU-5e1a0000-0000-4000-8000-000051510002";
    workload_pod(
        "cuda-by-uuid",
        false,
        &[("NVIDIA_VISIBLE_DEVICES", uuid)],
        &["dev", "0", "launch", "spin", "1", "32", "20", "sync"],
    );
    let phase = wait_pod_done("cuda-by-uuid", Duration::from_secs(60));
    let logs = String::from_utf8_lossy(&kubectl(&["logs", "cuda-by-uuid"]).stdout).into_owned();
    assert_eq!(phase, "Succeeded", "{logs}");
    let launches = sim.launches(2).unwrap();
    assert!(
        launches.iter().any(|l| l.kernels == 20 && !l.active),
        "GPU 2's launch record: {launches:?}"
    );
    let runtime_log =
        std::fs::read_to_string(cluster_dir().join("logs/gpusim-container-runtime.log")).unwrap();
    assert!(
        runtime_log.contains(&format!("NVIDIA_VISIBLE_DEVICES={uuid}: "))
            && runtime_log.contains("gpus [2]"),
        "{runtime_log}"
    );

    workload_pod("no-gpu", false, &[], &["dev", "0"]);
    let phase = wait_pod_done("no-gpu", Duration::from_secs(60));
    let logs = String::from_utf8_lossy(&kubectl(&["logs", "no-gpu"]).stdout).into_owned();
    assert_eq!(phase, "Failed", "{logs}");
    assert!(
        logs.contains("libcuda.so.1: cannot open shared object file"),
        "{logs}"
    );
}
