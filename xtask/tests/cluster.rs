//! `cargo xtask cluster up | status | down` end to end: the cluster builds
//! (cached in `target/cluster/bin/`), comes up with its node Ready, a pod
//! of the repository's own `probe` image (imported, never pulled) runs to
//! completion on it, a second `up` changes nothing, and `down` leaves no
//! process of the cluster, no bridge, no `kubepods` cgroup, and every
//! kernel tunable the kubelet and the CNI bridge change as it was.
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
const PROBE_IMAGE: &str = "tessera.local/probe:v1";
const BRIDGE: &str = "tessera0";

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
    let before = tunables();

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
    let status = xtask(&["cluster", "status"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("the cluster is down"));
}
