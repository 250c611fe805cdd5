//! Tessera's DRA mode on the real cluster: the chart upgraded with
//! `dra.enabled`, the agent publishes its node's ResourceSlice (judged by
//! the API server), the real kube-scheduler allocates ResourceClaims of
//! DeviceClass `gpu.tessera.dev` by consumable capacity, the real kubelet
//! calls the agent's `NodePrepareResources`, containerd applies its CDI
//! spec, and each workload is held to its claim's share (judged by the
//! simulator's record on the host); a claim that fits no GPU leaves its
//! pod Pending with the scheduler's reason; deleting pod and claim
//! removes the claim's region directory and CDI spec (the host's files).
//!
//! Runs inside the cluster test after `tessera::on_the_cluster()` (which
//! installed the release in device-plugin mode).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::tessera::{
    agent_ip, get_json, held_mib, http_get, log_line, sim, sm_share, text, wait_running,
};
use super::{cluster_dir, kubectl, xtask};

const IMAGE: &str = "localhost/tessera/workload:dev";
const DRIVER: &str = "gpu.tessera.dev";
const MIB: u64 = 1 << 20;
/// The simulated node's charge per CUDA context (its node file).
const CONTEXT_MIB: u64 = 500;

fn apply(name: &str, object: &Value) {
    let file = cluster_dir().join(format!("{name}-dra.json"));
    std::fs::write(&file, object.to_string()).unwrap();
    let out = kubectl(&["apply", "-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{name}: {}", text(&out));
}

/// A claim of one Tessera GPU whose `uuid` is `uuid`, consuming `memory`
/// and `cores` of it.
fn claim(name: &str, uuid: &str, memory: &str, cores: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{
            "name": "gpu",
            "exactly": {
                "deviceClassName": DRIVER,
                "selectors": [{"cel": {"expression":
                    format!("device.attributes[\"{DRIVER}\"].uuid == \"{uuid}\"")}}],
                "capacity": {"requests": {"memory": memory, "cores": cores}},
            },
        }]}},
    })
}

/// A pod of the workload image running `args` with claim `claim`.
fn pod(name: &str, claim: &str, args: &[&str]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{
                "name": "main",
                "image": IMAGE,
                "imagePullPolicy": "Never",
                "args": args,
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        },
    })
}

/// The node's slice of this driver, once the agent has applied it.
fn wait_slice(within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let list = get_json(&["get", "resourceslices"]);
        if let Some(s) = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["spec"]["driver"] == DRIVER)
        {
            return s.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no ResourceSlice of {DRIVER}: {list}\n{}",
            text(&kubectl(&[
                "-n",
                "tessera-system",
                "logs",
                "-l",
                "app.kubernetes.io/component=agent",
                "--tail=40"
            ]))
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The host files of claim `uid`: its region directory and its CDI spec.
fn claim_files(uid: &str) -> [std::path::PathBuf; 2] {
    let run = cluster_dir().join("run");
    [
        run.join(format!("tessera/containers/claim_{uid}")),
        run.join(format!("cdi/{DRIVER}-claim_{uid}.json")),
    ]
}

pub fn on_the_cluster() {
    // DRA mode on, over the release the device-plugin phase installed.
    let values = cluster_dir().join("dra-values.json");
    std::fs::write(&values, json!({"dra": {"enabled": true}}).to_string()).unwrap();
    let upgrade = xtask(&[
        "cluster",
        "install",
        "--no-images",
        "--values",
        values.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&values);
    assert!(upgrade.status.success(), "helm upgrade to DRA mode failed");
    let class = get_json(&["get", "deviceclass", DRIVER]);
    assert_eq!(
        class["spec"]["selectors"][0]["cel"]["expression"],
        format!("device.driver == \"{DRIVER}\"")
    );

    // The slice: one shared device per GPU with its capacity and uuid.
    let slice = wait_slice(Duration::from_secs(90));
    assert_eq!(slice["spec"]["nodeName"], "tessera-node", "{slice}");
    let devices = slice["spec"]["devices"].as_array().unwrap();
    let names: Vec<&str> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], "{slice}");
    for d in devices {
        assert_eq!(d["allowMultipleAllocations"], true, "{d}");
        assert!(d["capacity"]["memory"]["value"].is_string(), "{d}");
        assert_eq!(d["capacity"]["cores"]["value"], "100", "{d}");
    }
    let uuid_of = |i: usize| {
        devices[i]["attributes"]["uuid"]["string"]
            .as_str()
            .unwrap_or_else(|| panic!("device {i} has no uuid: {}", devices[i]))
            .to_owned()
    };
    eprintln!(
        "dra on the cluster: slice {} with {names:?}, gpu-3 memory {}",
        slice["metadata"]["name"], devices[3]["capacity"]["memory"]["value"]
    );

    // Two claims pinned by a CEL selector to one GPU's uuid, each used by
    // a workload pod: both on that GPU, side by side.
    let (uuid30, index30) = (uuid_of(3), 3);
    let (uuid50, index50) = (uuid30.clone(), index30);
    apply("dra-30", &claim("dra-30", &uuid30, "4Gi", "30"));
    apply("dra-50", &claim("dra-50", &uuid50, "6Gi", "50"));
    let workload = [
        "dev",
        "0",
        "meminfo",
        "alloc-until-oom",
        "512",
        "meminfo",
        "ready",
        "run",
        "spin",
        "132",
        "128",
        "40000",
    ];
    apply("dra-30", &pod("dra-30", "dra-30", &workload));
    apply("dra-50", &pod("dra-50", "dra-50", &workload));
    wait_running("dra-30", Duration::from_secs(90));
    wait_running("dra-50", Duration::from_secs(90));

    // Allocated by kube-scheduler to the pinned GPU, with the share asked.
    // (The API server keeps quantities canonical: 4Gi reads back in bytes.)
    for (name, index, memory, cores) in [
        ("dra-30", index30, "4294967296", "30"),
        ("dra-50", index50, "6442450944", "50"),
    ] {
        let c = get_json(&["get", "resourceclaim", name]);
        let r = &c["status"]["allocation"]["devices"]["results"][0];
        assert_eq!(r["driver"], DRIVER, "{c}");
        assert_eq!(r["device"], format!("gpu-{index}"), "{c}");
        assert_eq!(r["consumedCapacity"]["memory"], memory, "{c}");
        assert_eq!(r["consumedCapacity"]["cores"], cores, "{c}");
    }

    // Each sees and is held to its memory: 4 GiB and 6 GiB in 512 MiB steps.
    for (name, mib) in [("dra-30", 4096), ("dra-50", 6144)] {
        assert_eq!(
            log_line(name, "meminfo ", Duration::from_secs(30)),
            format!("meminfo {} {}", mib * MIB, mib * MIB),
            "{name}"
        );
        assert_eq!(
            log_line(name, "allocs ", Duration::from_secs(30)),
            format!("allocs {} CUDA_ERROR_OUT_OF_MEMORY", mib / 512),
            "{name}"
        );
        log_line(name, "ready", Duration::from_secs(30));
    }
    let sim = sim();
    let p30 = super::pod_process("dra-30", "/usr/local/bin/workload", Duration::from_secs(60))
        .expect("no workload process in pod dra-30");
    let p50 = super::pod_process("dra-50", "/usr/local/bin/workload", Duration::from_secs(60))
        .expect("no workload process in pod dra-50");
    let (h30, h50) = (held_mib(&sim, index30, p30), held_mib(&sim, index50, p50));
    eprintln!("dra on the cluster: held {h30} MiB (claim 4096), {h50} MiB (claim 6144)");
    assert_eq!(h30, 4096 + CONTEXT_MIB);
    assert_eq!(h50, 6144 + CONTEXT_MIB);

    // The agent knows each claim's pod and cgroup (learnt from the claim's
    // reservedFor pod), so its controller and watchdog act on it.
    let ip = agent_ip();
    let deadline = Instant::now() + Duration::from_secs(30);
    let uid30 = get_json(&["get", "resourceclaim", "dra-30"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let uid50 = get_json(&["get", "resourceclaim", "dra-50"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    loop {
        let containers: Value = serde_json::from_str(&http_get(&ip, "/containers")).unwrap();
        let c30 = containers["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == format!("claim_{uid30}"))
            .cloned();
        let bound = c30
            .as_ref()
            .and_then(|c| c["meta"]["cgroup"].as_str())
            .map(str::to_owned);
        if let (Some(c30), Some(cgroup)) = (&c30, bound) {
            assert_eq!(c30["meta"]["pod"], "dra-30", "{c30}");
            let procs = std::fs::read_to_string(format!("/proc/{p30}/cgroup")).unwrap();
            assert!(
                procs
                    .lines()
                    .any(|l| l.starts_with("0::") && l.ends_with(&cgroup)),
                "claim dra-30's cgroup {cgroup} is not its workload's: {procs}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent never learnt claim dra-30's cgroup: {containers}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(3));
    let (s30, s50) = (
        sm_share(&sim, index30, p30, 2),
        sm_share(&sim, index50, p50, 2),
    );
    eprintln!("dra on the cluster: SM {s30:.1} % (claim 30), {s50:.1} % (claim 50)");
    assert!((s30 - 30.0).abs() <= 3.0, "dra-30 ran at {s30:.1} %");
    assert!((s50 - 50.0).abs() <= 3.0, "dra-50 ran at {s50:.1} %");
    let metrics = http_get(&ip, "/metrics");
    assert!(
        metrics.contains("pod=\"dra-30\""),
        "no series of dra-30 in /metrics"
    );

    // A claim that fits no GPU: its pod stays Pending with the reason.
    apply("dra-big", &claim("dra-big", &uuid30, "90Gi", "10"));
    apply("dra-big", &pod("dra-big", "dra-big", &["meminfo"]));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events = text(&kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=dra-big",
        ]));
        if events.contains("FailedScheduling") {
            eprintln!("dra on the cluster: dra-big: {}", events.trim());
            assert!(events.contains("cannot allocate all claims"), "{events}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no FailedScheduling event for dra-big: {events}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let phase = kubectl(&["get", "pod", "dra-big", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(String::from_utf8_lossy(&phase.stdout).trim(), "Pending");

    // Deleting pod and claim takes the region and the CDI spec away.
    for uid in [&uid30, &uid50] {
        for f in claim_files(uid) {
            assert!(
                f.exists(),
                "{} is missing while its claim runs",
                f.display()
            );
        }
    }
    for name in ["dra-30", "dra-50", "dra-big"] {
        let _ = kubectl(&["delete", "pod", name, "--wait=true", "--timeout=60s"]);
        let _ = kubectl(&[
            "delete",
            "resourceclaim",
            name,
            "--wait=true",
            "--timeout=60s",
        ]);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for uid in [&uid30, &uid50] {
        for f in claim_files(uid) {
            while f.exists() {
                assert!(
                    Instant::now() < deadline,
                    "{} is still there after its pod and claim were deleted",
                    f.display()
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    eprintln!("dra on the cluster: regions and CDI specs of both claims removed");
}
