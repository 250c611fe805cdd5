//! Tessera on the real cluster, installed by its Helm chart: HAMi's
//! documented pods, unchanged, go through the webhook, the extender and
//! the real kube-scheduler, the agent's `Allocate` under the real kubelet,
//! and containerd and runc with the node's simulated GPUs; each workload
//! is judged by the simulator's record on the host (memory held, SM share
//! over a window), the kernel (errno of a write), and the API server
//! (phases, events, the GpuNode).
//!
//! Runs inside the cluster test, on its one cluster, after `up`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{cluster_dir, kubectl, pod_logs, wait_pod_done, xtask};

const IMAGE: &str = "localhost/tessera/workload:dev";
const MIB: u64 = 1 << 20;
/// The demo node's GPUs: H100s of this size.
const GPU_MIB: u64 = 81559;
/// The simulated node's charge per CUDA context (its node file).
const CONTEXT_MIB: u64 = 500;

pub(super) fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub(super) fn get_json(args: &[&str]) -> Value {
    let out = kubectl(&[args, &["-o", "json"]].concat());
    assert!(out.status.success(), "kubectl {args:?}: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A pod of the workload image asking `limits` (HAMi's names) with
/// `annotations`, running `args`; returns what `kubectl apply` said.
fn hami_pod(
    name: &str,
    limits: &[(&str, &str)],
    annotations: &[(&str, &str)],
    args: &[&str],
) -> std::process::Output {
    pod_of(name, IMAGE, limits, annotations, args)
}

fn pod_of(
    name: &str,
    image: &str,
    limits: &[(&str, &str)],
    annotations: &[(&str, &str)],
    args: &[&str],
) -> std::process::Output {
    pod_with_env(name, image, limits, annotations, args, &[], None)
}

fn pod_with_env(
    name: &str,
    image: &str,
    limits: &[(&str, &str)],
    annotations: &[(&str, &str)],
    args: &[&str],
    env: &[(&str, &str)],
    user: Option<u32>,
) -> std::process::Output {
    let env: Vec<Value> = env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let limits: BTreeMap<&str, &str> = limits.iter().copied().collect();
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": image,
                "imagePullPolicy": "Never",
                "args": args,
                "env": env,
                "securityContext": user.map(|u| json!({"runAsUser": u, "runAsNonRoot": true})),
                "resources": {"limits": limits},
            }],
        },
    });
    let file = cluster_dir().join(format!("{name}-pod.json"));
    std::fs::write(&file, pod.to_string()).unwrap();
    let out = kubectl(&["apply", "-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    out
}

fn created(out: &std::process::Output) {
    assert!(out.status.success(), "{}", text(out));
}

/// The GPU UUIDs the scheduler assigned to pod `name`'s container.
fn assigned(name: &str) -> Vec<String> {
    let pod = get_json(&["get", "pod", name]);
    let a: Value = serde_json::from_str(
        pod["metadata"]["annotations"]["tessera.dev/assignment"]
            .as_str()
            .unwrap_or_else(|| panic!("pod {name} has no assignment: {pod}")),
    )
    .unwrap();
    a["containers"][0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_owned())
        .collect()
}

pub(super) fn wait_running(name: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let out = kubectl(&["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
        let phase = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if phase == "Running" {
            return;
        }
        assert!(
            Instant::now() < deadline && phase != "Failed" && phase != "Succeeded",
            "pod {name} is {phase:?}:\n{}\n{}",
            text(&kubectl(&["describe", "pod", name])),
            text(&kubectl(&["logs", name]))
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until pod `name`'s log has a line starting with `prefix`.
pub(super) fn log_line(name: &str, prefix: &str, within: Duration) -> String {
    container_log_line(name, None, prefix, within)
}

/// Waits until the log of pod `name` (of its `container`, or its only
/// one) has a line starting with `prefix`.
pub(super) fn container_log_line(
    name: &str,
    container: Option<&str>,
    prefix: &str,
    within: Duration,
) -> String {
    let deadline = Instant::now() + within;
    let mut args = vec!["logs", name];
    args.extend(container.iter().flat_map(|c| ["-c", c]));
    loop {
        let logs = text(&kubectl(&args));
        if let Some(line) = logs.lines().find(|l| l.starts_with(prefix)) {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} ({container:?}) never printed {prefix:?}; its log:\n{logs}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub(super) fn sim() -> gpusim::Sim {
    gpusim::Sim::open(&gpusim::state::Config {
        node_path: None,
        state_path: cluster_dir().join("run/gpusim/state"),
    })
    .unwrap()
}

/// The simulator's GPU index of `uuid`.
fn gpu_of(sim: &gpusim::Sim, uuid: &str) -> usize {
    (0..sim.gpu_count())
        .find(|&g| {
            let b = sim.uuid_bytes(g);
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            let text = format!(
                "GPU-{}-{}-{}-{}-{}",
                &hex[..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..]
            );
            text.eq_ignore_ascii_case(uuid)
        })
        .unwrap_or_else(|| panic!("no simulated GPU {uuid}"))
}

/// The host pid of pod `name`'s workload (its cgroup names the pod).
fn workload_pid(name: &str) -> i32 {
    super::pod_process(name, "/usr/local/bin/workload", Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no workload process in pod {name}"))
}

/// Mean SM percent of `pid` on `gpu` over `windows` windows of 4 s, from
/// the simulator's timeline.
pub(super) fn sm_share(sim: &gpusim::Sim, gpu: usize, pid: i32, windows: u32) -> f64 {
    let mut sum = 0.0;
    for _ in 0..windows {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        std::thread::sleep(Duration::from_secs(4));
        let samples = sim.process_samples(gpu, since).unwrap();
        let mine = samples
            .iter()
            .find(|s| s.pid == pid)
            .unwrap_or_else(|| panic!("no sample of pid {pid} on GPU {gpu}: {samples:?}"));
        sum += f64::from(mine.sm_percent);
    }
    sum / f64::from(windows)
}

/// Device memory `pid` holds on `gpu`, in the simulator's record.
pub(super) fn held_mib(sim: &gpusim::Sim, gpu: usize, pid: i32) -> u64 {
    sim.processes(gpu)
        .unwrap()
        .iter()
        .find(|p| p.pid == pid)
        .map_or(0, |p| p.bytes / MIB)
}

pub(super) fn agent_ip() -> String {
    let out = kubectl(&[
        "-n",
        "tessera-system",
        "get",
        "pod",
        "-l",
        "app.kubernetes.io/component=agent",
        "--field-selector=status.phase=Running",
        "-o",
        "jsonpath={.items[0].status.podIP}",
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Deletes the agent's pod and waits until the DaemonSet's new one is
/// ready (and a little more, for its first periods).
pub(super) fn replace_agent() {
    created(&kubectl(&[
        "-n",
        "tessera-system",
        "delete",
        "pod",
        "-l",
        "app.kubernetes.io/component=agent",
        "--wait=true",
    ]));
    let deadline = Instant::now() + Duration::from_secs(90);
    while agent_ip().is_empty()
        || !text(&kubectl(&["-n", "tessera-system", "get", "pods"])).contains("1/1")
    {
        assert!(
            Instant::now() < deadline,
            "the DaemonSet made no new agent pod"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(2));
}

pub(super) fn http_get(ip: &str, path: &str) -> String {
    let addr: std::net::SocketAddr = format!("{ip}:9400").parse().unwrap();
    let (code, body) = tessera_testkit::poll::http_get(addr, path).unwrap();
    assert_eq!(code, 200, "{path}: {body}");
    body
}

pub fn on_the_cluster() {
    let install = xtask(&[
        "cluster",
        "install",
        "--artifacts",
        tessera_testkit::sim::artifacts().to_str().unwrap(),
    ]);
    assert!(install.status.success(), "cluster install failed");
    let pods = text(&kubectl(&["-n", "tessera-system", "get", "pods"]));
    assert!(
        pods.contains("tessera-agent") && pods.contains("tessera-scheduler"),
        "{pods}"
    );

    // The agent's GpuNode, written through the API server (its first
    // write follows the agent's first periods).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let gpunodes = text(&kubectl(&["get", "gpunodes"]));
        if gpunodes.contains("tessera-node") {
            break;
        }
        assert!(Instant::now() < deadline, "no GpuNode: {gpunodes}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // HAMi's first example, and a neighbour pinned to the same GPU.
    created(&hami_pod(
        "hami-30",
        &[
            ("nvidia.com/gpu", "1"),
            ("nvidia.com/gpumem", "4000"),
            ("nvidia.com/gpucores", "30"),
        ],
        &[],
        &[
            "dev",
            "0",
            "meminfo",
            "alloc-until-oom",
            "500",
            "meminfo",
            "ready",
            "run",
            "spin",
            "132",
            "128",
            "40000",
        ],
    ));
    wait_running("hami-30", Duration::from_secs(90));
    let gpu_uuid = assigned("hami-30")[0].clone();
    created(&hami_pod(
        "hami-50",
        &[
            ("nvidia.com/gpu", "1"),
            ("nvidia.com/gpumem", "6000"),
            ("nvidia.com/gpucores", "50"),
        ],
        &[("tessera.dev/gpu-uuid-include", gpu_uuid.as_str())],
        &[
            "dev", "0", "meminfo", "alloc", "6000", "ready", "run", "spin", "132", "128", "40000",
        ],
    ));
    wait_running("hami-50", Duration::from_secs(90));
    assert_eq!(
        assigned("hami-50"),
        std::slice::from_ref(&gpu_uuid),
        "two pods share one GPU"
    );

    // The limit as the workload sees it (only the preload can show it):
    // memory info says 4000 MiB, allocation stops there.
    assert_eq!(
        log_line("hami-30", "meminfo ", Duration::from_secs(30)),
        format!("meminfo {} {}", 4000 * MIB, 4000 * MIB)
    );
    assert_eq!(
        log_line("hami-30", "allocs ", Duration::from_secs(30)),
        "allocs 8 CUDA_ERROR_OUT_OF_MEMORY"
    );
    log_line("hami-30", "ready", Duration::from_secs(30));
    log_line("hami-50", "ready", Duration::from_secs(30));

    // The simulator's record: each holds its limit (plus its context),
    // never more, and runs at its SM target.
    let sim = sim();
    let gpu = gpu_of(&sim, &gpu_uuid);
    let (p30, p50) = (workload_pid("hami-30"), workload_pid("hami-50"));
    assert_eq!(held_mib(&sim, gpu, p30), 4000 + CONTEXT_MIB);
    assert_eq!(held_mib(&sim, gpu, p50), 6000 + CONTEXT_MIB);
    // Let the controllers settle, then judge two windows each.
    std::thread::sleep(Duration::from_secs(3));
    let (s30, s50) = (sm_share(&sim, gpu, p30, 2), sm_share(&sim, gpu, p50, 2));
    eprintln!("tessera on the cluster: SM {s30:.1} % (target 30), {s50:.1} % (target 50)");
    assert!(
        (s30 - 30.0).abs() <= 3.0,
        "hami-30 ran at {s30:.1} % of its GPU, target 30"
    );
    assert!(
        (s50 - 50.0).abs() <= 3.0,
        "hami-50 ran at {s50:.1} % of its GPU, target 50"
    );

    // What only a real runtime shows: the agent acts on the pod's real
    // cgroup, and its view names the pod.
    let ip = agent_ip();
    let containers: Value = serde_json::from_str(&http_get(&ip, "/containers")).unwrap();
    let c30 = containers["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["meta"]["pod"] == "hami-30")
        .unwrap_or_else(|| panic!("the agent does not show hami-30: {containers}"));
    let cgroup = c30["meta"]["cgroup"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let uid = super::pod_uid("hami-30");
    assert!(
        cgroup.contains(&format!("pod{uid}")),
        "cgroup {cgroup:?} is not the pod's"
    );
    let procs = std::fs::read_to_string(format!("/proc/{p30}/cgroup")).unwrap();
    assert!(
        procs
            .lines()
            .any(|l| l.starts_with("0::") && l.ends_with(&cgroup)),
        "{procs}"
    );
    // Its metrics, scraped from its pod.
    let metrics = http_get(&ip, "/metrics");
    assert!(
        metrics.contains("pod=\"hami-30\""),
        "no series of hami-30 in /metrics"
    );

    // Life: a new agent pod (the DaemonSet makes it) changes no limit.
    replace_agent();
    let after = sm_share(&sim, gpu, p30, 1);
    eprintln!("tessera on the cluster: SM {after:.1} % after the agent pod was replaced");
    assert!(
        (after - 30.0).abs() <= 4.0,
        "hami-30 ran at {after:.1} % after the agent restarted"
    );
    assert_eq!(held_mib(&sim, gpu, p30), 4000 + CONTEXT_MIB);

    // Deleting the pods: their region directories go (the agent's
    // collection of departed pods, checked at the end).
    let dirs: Vec<std::path::PathBuf> = ["hami-30", "hami-50"]
        .iter()
        .map(|name| {
            let containers: Value =
                serde_json::from_str(&http_get(&agent_ip(), "/containers")).unwrap();
            let dir = containers["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["meta"]["pod"] == *name)
                .and_then(|c| c["dir"].as_str())
                .unwrap_or_else(|| panic!("the new agent does not show {name}"))
                .to_owned();
            std::path::PathBuf::from(dir)
        })
        .collect();
    assert!(dirs.iter().all(|d| d.is_dir()), "{dirs:?}");
    for name in ["hami-30", "hami-50"] {
        created(&kubectl(&["delete", "pod", name, "--wait=false"]));
    }

    hostile();

    // A pod that fits nowhere stays Pending with the extender's reason.
    created(&hami_pod(
        "too-big",
        &[("nvidia.com/gpu", "1"), ("nvidia.com/gpumem", "90000")],
        &[],
        &["meminfo"],
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = text(&kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=too-big",
        ]));
        if events.contains("FailedScheduling") {
            // The extender's reason, whole (no format verbs mangled).
            assert!(
                events.contains("needs 1 GPU(s) with 90000 MiB") && !events.contains("%!"),
                "{events}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no FailedScheduling event for too-big: {events}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let phase = kubectl(&["get", "pod", "too-big", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(String::from_utf8_lossy(&phase.stdout).trim(), "Pending");

    // A webhook refusal reaches the user as kubectl's error.
    let refused = hami_pod(
        "too-many-cores",
        &[("nvidia.com/gpu", "1"), ("nvidia.com/gpucores", "150")],
        &[],
        &["meminfo"],
    );
    assert!(!refused.status.success());
    let said = text(&refused);
    assert!(
        said.contains("denied the request") && said.contains("nvidia.com/gpucores"),
        "{said}"
    );

    // Memory only; a percentage; two GPUs; a priority: each runs, each
    // sees its limit.
    // (As a user other than root, as many images run.)
    created(&pod_with_env(
        "mem-only",
        IMAGE,
        &[("nvidia.com/gpu", "1"), ("nvidia.com/gpumem", "2000")],
        &[],
        &[
            "dev",
            "0",
            "meminfo",
            "alloc-until-oom",
            "250",
            "ready",
            "sleep",
            "8000",
        ],
        &[],
        Some(65534),
    ));
    created(&hami_pod(
        "mem-percent",
        &[
            ("nvidia.com/gpu", "1"),
            ("nvidia.com/gpumem-percentage", "10"),
        ],
        &[],
        &[
            "dev",
            "0",
            "meminfo",
            "alloc-until-oom",
            "250",
            "ready",
            "sleep",
            "8000",
        ],
    ));
    created(&hami_pod(
        "two-gpus",
        &[("nvidia.com/gpu", "2"), ("nvidia.com/gpumem", "1000")],
        &[],
        &[
            "dev",
            "0",
            "meminfo",
            "alloc-until-oom",
            "250",
            "dev",
            "1",
            "meminfo",
            "alloc-until-oom",
            "250",
            "ready",
            "sleep",
            "8000",
        ],
    ));
    created(&hami_pod(
        "low-priority",
        &[
            ("nvidia.com/gpu", "1"),
            ("nvidia.com/gpumem", "1000"),
            ("nvidia.com/gpucores", "20"),
            ("nvidia.com/priority", "1"),
        ],
        &[],
        &[
            "dev",
            "0",
            "meminfo",
            "alloc-until-oom",
            "250",
            "ready",
            "sleep",
            "8000",
        ],
    ));
    let percent = GPU_MIB * 10 / 100;
    // Each fills its limit in 250 MiB steps: in the simulator's record it
    // holds its limit (less what a step could not fit) and its context on
    // each of its GPUs, never more.
    for (name, limit) in [
        ("mem-only", 2000),
        ("mem-percent", percent),
        ("two-gpus", 1000),
        ("low-priority", 1000),
    ] {
        log_line(name, "ready", Duration::from_secs(90));
        let pid = workload_pid(name);
        for uuid in assigned(name) {
            let held = held_mib(&sim, gpu_of(&sim, &uuid), pid);
            assert!(
                held <= limit + CONTEXT_MIB && held + 250 > limit + CONTEXT_MIB,
                "pod {name} holds {held} MiB on {uuid}, limit {limit} + context {CONTEXT_MIB}"
            );
        }
    }
    for (name, lines) in [
        (
            "mem-only",
            vec![format!("meminfo {} {}", 2000 * MIB, 2000 * MIB)],
        ),
        (
            "mem-percent",
            vec![format!("meminfo {} {}", percent * MIB, percent * MIB)],
        ),
        (
            "two-gpus",
            vec![format!("meminfo {} {}", 1000 * MIB, 1000 * MIB); 2],
        ),
        (
            "low-priority",
            vec![format!("meminfo {} {}", 1000 * MIB, 1000 * MIB)],
        ),
    ] {
        let phase = wait_pod_done(name, Duration::from_secs(90));
        let logs = text(&kubectl(&["logs", name]));
        assert_eq!(
            phase,
            "Succeeded",
            "pod {name}:\n{logs}\n{}",
            text(&kubectl(&["describe", "pod", name]))
        );
        let got: Vec<&str> = logs.lines().filter(|l| l.starts_with("meminfo ")).collect();
        assert_eq!(
            got,
            lines.iter().map(String::as_str).collect::<Vec<_>>(),
            "pod {name}"
        );
    }
    let two = assigned("two-gpus");
    assert!(two.len() == 2 && two[0] != two[1], "two-gpus got {two:?}");

    // A process in the pod cannot write its limits nor the preload list.
    created(&pod_of(
        "readonly",
        super::PROBE_IMAGE,
        &[("nvidia.com/gpu", "1"), ("nvidia.com/gpumem", "1000")],
        &[],
        &[
            "--write=/run/tessera/control",
            "--write=/etc/ld.so.preload",
            "--write=/run/tessera/usage",
        ],
    ));
    assert_eq!(
        wait_pod_done("readonly", Duration::from_secs(90)),
        "Succeeded"
    );
    let logs = pod_logs("readonly", Duration::from_secs(30));
    assert!(
        logs.contains(
            "write /run/tessera/control: open /run/tessera/control: read-only file system"
        ),
        "{logs}"
    );
    assert!(
        logs.contains("write /etc/ld.so.preload: open /etc/ld.so.preload: read-only file system"),
        "{logs}"
    );
    assert!(logs.contains("write /run/tessera/usage: ok"), "{logs}");

    let deadline = Instant::now() + Duration::from_secs(240);
    while dirs.iter().any(|d| d.exists()) {
        assert!(
            Instant::now() < deadline,
            "the region directories of deleted pods are still there: {dirs:?}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }

    kubelet_restart();

    for name in [
        "hostile",
        "too-big",
        "mem-only",
        "mem-percent",
        "two-gpus",
        "low-priority",
        "readonly",
    ] {
        let _ = kubectl(&["delete", "pod", name, "--wait=true"]);
    }
}

/// A hostile tenant: a pod whose program reaches the driver around the
/// preload (its own lookup of the driver's entry points) and takes 3000
/// MiB under a 1000 MiB limit is killed by the watchdog in the pod's
/// cgroup, and the GPU holds nothing of it after.
fn hostile() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("escape");
    tessera_testkit::sim::cc(&[
        tessera_testkit::sim::workspace()
            .join("agent/tests/watchdog_support/escape.c")
            .to_str()
            .unwrap(),
        "-o",
        program.to_str().unwrap(),
        "-ldl",
    ]);
    let sim_dir = tessera_testkit::sim::sim_dir();
    let preload = tessera_testkit::sim::artifacts().join("lib/libtessera.so");
    let mut libs = super::shared_libraries(&program);
    libs.extend(super::shared_libraries(&sim_dir.join("libcuda.so.1")));
    libs.extend(super::shared_libraries(&preload));
    libs.sort();
    libs.dedup();
    let name = "tessera.local/escape:test";
    let archive = dir.path().join("escape.tar");
    let mut cmd = std::process::Command::new(cluster_dir().join("bin/oci-image"));
    cmd.args(["--name", name, "--entrypoint", "/escape", "--out"])
        .arg(&archive)
        .arg("--add")
        .arg(format!("{}=/escape", program.display()));
    for lib in &libs {
        cmd.arg("--add")
            .arg(format!("{}={}", lib.display(), lib.display()));
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "oci-image: {}", text(&out));
    let out = std::process::Command::new(cluster_dir().join("bin/ctr"))
        .arg("--address")
        .arg(cluster_dir().join("run/containerd/containerd.sock"))
        .args(["--namespace", "k8s.io", "images", "import"])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(out.status.success(), "ctr images import: {}", text(&out));

    created(&pod_with_env(
        "hostile",
        name,
        &[("nvidia.com/gpu", "1"), ("nvidia.com/gpumem", "1000")],
        &[],
        &["libcuda.so.1", "3000"],
        &[("ESCAPE_GO", "1")],
        None,
    ));
    let phase = wait_pod_done("hostile", Duration::from_secs(90));
    let pod = get_json(&["get", "pod", "hostile"]);
    let term = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    let logs = text(&kubectl(&["logs", "hostile"]));
    assert_eq!(phase, "Failed", "{logs}\n{pod}");
    // SIGKILL, from cgroup.kill: the program itself never exits on its own
    // while it holds the memory.
    assert_eq!(term["exitCode"], 137, "{logs}\n{term}");
    assert!(
        logs.contains("alloc 0"),
        "the escape's allocation went through: {logs}"
    );
    let containers: Value = serde_json::from_str(&http_get(&agent_ip(), "/containers")).unwrap();
    let c = containers["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["meta"]["pod"] == "hostile")
        .unwrap_or_else(|| panic!("the agent does not show the hostile pod: {containers}"));
    let actions = c["enforcement"]["actions"].to_string();
    assert!(
        actions.contains("memory_overage") && actions.contains("kill"),
        "{actions}"
    );
    let uid = super::pod_uid("hostile");
    let cgroup = c["meta"]["cgroup"].as_str().unwrap_or_default();
    assert!(
        cgroup.contains(&format!("pod{uid}")),
        "killed in {cgroup:?}, not the pod's cgroup"
    );
    // Nothing of it is left on the GPUs: every process the simulator still
    // records is alive and outside the pod.
    let sim = sim();
    for gpu in 0..sim.gpu_count() {
        for p in sim.processes(gpu).unwrap() {
            let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid))
                .unwrap_or_else(|_| panic!("GPU {gpu} records pid {}, which is gone", p.pid));
            assert!(
                !cgroup.contains(&format!("pod{uid}")),
                "GPU {gpu} still holds {} MiB of the hostile pod (pid {})",
                p.bytes / MIB,
                p.pid
            );
        }
    }
}

/// The time of day (seconds) of a klog line (`I1206 09:18:49.270046 …`).
fn klog_seconds(line: &str) -> Option<f64> {
    let time = line.split_whitespace().nth(1)?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// A restarted kubelet has the agent's device plugin registered again
/// within a second of making its registration socket: the socket's change
/// time (the kernel's) against the kubelet's own log of the request.
fn kubelet_restart() {
    let log = cluster_dir().join("logs/kubelet.log");
    let before = std::fs::read_to_string(&log).unwrap().len();
    let restart = xtask(&["cluster", "restart", "kubelet"]);
    assert!(restart.status.success(), "cluster restart kubelet failed");
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if let Some(l) = text[before..].lines().find(|l| {
            l.contains("Got registration request from device plugin")
                && l.contains("nvidia.com/gpu")
        }) {
            break l.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the device plugin did not register again"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let registered = klog_seconds(&line).unwrap();
    let socket = std::fs::metadata("/var/lib/kubelet/device-plugins/kubelet.sock").unwrap();
    use std::os::unix::fs::MetadataExt as _;
    let made = (socket.ctime().rem_euclid(86_400)) as f64 + socket.ctime_nsec() as f64 / 1e9;
    let after = registered - made;
    eprintln!(
        "tessera on the cluster: registered again {:.0} ms after kubelet made its socket",
        after * 1000.0
    );
    assert!(
        (0.0..1.0).contains(&after),
        "registered {after:.3} s after the socket was made"
    );
}
