//! Tessera's DRA mode on the real cluster: the chart upgraded with
//! `dra.enabled`, the agent publishes its node's ResourceSlice (judged by
//! the API server), the real kube-scheduler allocates ResourceClaims of
//! DeviceClass `gpu.tessera.dev` by consumable capacity, the real kubelet
//! calls the agent's `NodePrepareResources`, containerd applies its CDI
//! spec, and each workload is held to its claim's share (judged by the
//! simulator's record on the host), series carry the claim, a new agent
//! pod and a restarted kubelet leave prepared claims running and held,
//! two containers sharing a claim share its limits, a lost GPU or a
//! critical Xid takes the GPU out of the slice; a claim that fits no GPU
//! leaves its pod Pending with the scheduler's reason; deleting pod and
//! claim removes the claim's region directory and CDI spec (the host's
//! files).
//!
//! Runs inside the cluster test after `tessera::on_the_cluster()` (which
//! installed the release in device-plugin mode).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::tessera::{
    agent_ip, container_log_line, get_json, held_mib, http_get, log_line, sim, sm_share, text,
    wait_running,
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

/// A canonical quantity in bytes (plain, or with one of the suffixes the
/// API server writes).
fn quantity_bytes(q: &str) -> u64 {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits.parse().unwrap_or_else(|_| panic!("quantity {q:?}"));
    let scale = match &q[digits.len()..] {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("quantity {q:?}: suffix {other:?}"),
    };
    n * scale
}

/// A pod of the workload image running `args` with extended-resource
/// `limits` (HAMi's names), no claim.
fn limited_pod(name: &str, limits: &[(&str, &str)], args: &[&str]) -> Value {
    let limits: serde_json::Map<String, Value> = limits
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": IMAGE,
                "imagePullPolicy": "Never",
                "args": args,
                "resources": {"limits": limits},
            }],
        },
    })
}

/// Waits up to `seconds` until the devices of the node's slice satisfy
/// `ok`.
fn wait_devices(what: &str, seconds: u64, ok: impl Fn(&[String]) -> bool) {
    let t = Instant::now();
    loop {
        let slice = wait_slice(Duration::from_secs(10));
        let devices: Vec<String> = slice["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect();
        if ok(&devices) {
            eprintln!(
                "dra on the cluster: {what}: the slice has {devices:?} (generation {}) after {:.1} s",
                slice["spec"]["pool"]["generation"],
                t.elapsed().as_secs_f64()
            );
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(seconds),
            "{what}: the slice still has {devices:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The host pids of the `n` workload processes of pod `name`.
fn pod_processes(name: &str, n: usize, within: Duration) -> Vec<i32> {
    let out = kubectl(&["get", "pod", name, "-o", "jsonpath={.metadata.uid}"]);
    let needle = format!("pod{}", String::from_utf8_lossy(&out.stdout).trim());
    let deadline = Instant::now() + within;
    loop {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if cgroup.contains(&needle) && cmdline.starts_with(b"/usr/local/bin/workload") {
                found.push(pid);
            }
        }
        if found.len() == n {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} has {} workload processes, not {n}",
            found.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The SM percent `pids` took together on `gpu` over 4 s (the
/// simulator's timeline).
fn sm_sum(sim: &gpusim::Sim, gpu: usize, pids: &[i32]) -> f64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    std::thread::sleep(Duration::from_secs(4));
    sim.process_samples(gpu, since)
        .unwrap()
        .iter()
        .filter(|s| pids.contains(&s.pid))
        .map(|s| f64::from(s.sm_percent))
        .sum()
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
        // Through the restarts below; the pods are deleted at the end.
        "300000",
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
    // The runtime was also given NVIDIA's CDI device for the GPU (the
    // node's nvidia.com/gpu spec, as the NVIDIA Container Toolkit writes
    // one): kubelet's checkpoint of prepared claims lists it.
    let checkpoint =
        std::fs::read_to_string(cluster_dir().join("run/kubelet/dra_manager_state")).unwrap();
    assert!(
        checkpoint.contains(&format!("nvidia.com/gpu={uuid30}")),
        "{checkpoint}"
    );
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
    // Its series name the claim.
    let limit = metrics
        .lines()
        .find(|l| {
            l.starts_with("tessera_container_memory_limit_bytes{") && l.contains("claim=\"dra-30\"")
        })
        .unwrap_or_else(|| panic!("no memory limit series with claim=\"dra-30\":\n{metrics}"));
    assert!(limit.ends_with(&format!(" {}", 4096 * MIB)), "{limit}");

    // Restarts: a new agent pod, then a restarted kubelet. The prepared
    // claims stay (their state is on the host): each pod keeps running,
    // held as before, and the new agent knows each claim's cgroup.
    super::tessera::replace_agent();
    let ip = agent_ip();
    let containers: Value = serde_json::from_str(&http_get(&ip, "/containers")).unwrap();
    let c30 = containers["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == format!("claim_{uid30}"))
        .unwrap_or_else(|| panic!("the new agent lost claim dra-30: {containers}"));
    assert!(c30["meta"]["cgroup"].is_string(), "{c30}");
    let kubelet = xtask(&["cluster", "restart", "kubelet"]);
    assert!(kubelet.status.success(), "cluster restart kubelet failed");
    // A starting kubelet deletes the node's slices; the agent publishes
    // its own again.
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    wait_slice(Duration::from_secs(30));
    eprintln!(
        "dra on the cluster: the slice is published again {:.1} s after kubelet restarted",
        t.elapsed().as_secs_f64()
    );
    for name in ["dra-30", "dra-50"] {
        wait_running(name, Duration::from_secs(5));
    }
    let (s30, s50) = (
        sm_share(&sim, index30, p30, 1),
        sm_share(&sim, index50, p50, 1),
    );
    eprintln!(
        "dra on the cluster: after the agent pod was replaced and kubelet restarted: SM {s30:.1} %, {s50:.1} %"
    );
    assert!((s30 - 30.0).abs() <= 4.0, "dra-30 ran at {s30:.1} %");
    assert!((s50 - 50.0).abs() <= 4.0, "dra-50 ran at {s50:.1} %");
    assert_eq!(held_mib(&sim, index30, p30), 4096 + CONTEXT_MIB);
    assert_eq!(held_mib(&sim, index50, p50), 6144 + CONTEXT_MIB);

    // One claim, two containers: they share its limits (prepared after
    // the kubelet restart, so the driver registered again).
    let shared_gpu = 2;
    apply(
        "dra-shared",
        &claim("dra-shared", &uuid_of(shared_gpu), "3Gi", "20"),
    );
    let mut two = pod("dra-shared", "dra-shared", &workload);
    let main = two["spec"]["containers"][0].clone();
    let mut second = main.clone();
    second["name"] = json!("second");
    two["spec"]["containers"] = json!([main, second]);
    apply("dra-shared", &two);
    wait_running("dra-shared", Duration::from_secs(90));
    let pids = pod_processes("dra-shared", 2, Duration::from_secs(60));
    let mut allocs = 0;
    for c in ["main", "second"] {
        let line = container_log_line("dra-shared", Some(c), "allocs ", Duration::from_secs(30));
        let n: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(line.ends_with("CUDA_ERROR_OUT_OF_MEMORY"), "{c}: {line}");
        allocs += n;
        container_log_line("dra-shared", Some(c), "ready", Duration::from_secs(30));
    }
    let held: u64 = pids.iter().map(|&p| held_mib(&sim, shared_gpu, p)).sum();
    std::thread::sleep(Duration::from_secs(3));
    let sm = sm_sum(&sim, shared_gpu, &pids);
    eprintln!(
        "dra on the cluster: a claim of 3Gi/20 shared by two containers: {allocs} allocations of 512 MiB in all, {held} MiB held, SM {sm:.1} % together"
    );
    assert_eq!(allocs, 3072 / 512, "the two containers share one limit");
    assert_eq!(held, 3072 + 2 * CONTEXT_MIB);
    assert!(
        (sm - 20.0).abs() <= 3.0,
        "the shared claim ran at {sm:.1} %"
    );

    // Whole GPUs by the extended resource: the DeviceClass maps
    // nvidia.com/gpu (the device plugin is off), kube-scheduler makes the
    // pod's claim, and the pod gets a whole GPU.
    let class = get_json(&["get", "deviceclass", DRIVER]);
    assert_eq!(
        class["spec"]["extendedResourceName"], "nvidia.com/gpu",
        "{class}"
    );
    apply(
        "dra-whole",
        &limited_pod(
            "dra-whole",
            &[("nvidia.com/gpu", "1")],
            &["dev", "0", "meminfo", "ready", "hold"],
        ),
    );
    wait_running("dra-whole", Duration::from_secs(90));
    let pod_json = get_json(&["get", "pod", "dra-whole"]);
    let extended = pod_json["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        .as_str()
        .unwrap_or_else(|| panic!("no extended-resource claim in the pod's status: {pod_json}"))
        .to_owned();
    let c = get_json(&["get", "resourceclaim", &extended]);
    let r = &c["status"]["allocation"]["devices"]["results"][0];
    let device = r["device"].as_str().unwrap().to_owned();
    let total = devices
        .iter()
        .find(|d| d["name"] == device.as_str())
        .unwrap()["capacity"]["memory"]["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(r["consumedCapacity"]["memory"], total.as_str(), "{c}");
    assert_eq!(r["consumedCapacity"]["cores"], "100", "{c}");
    // Its total is the whole GPU's (free is less the simulator's charge
    // for its context).
    let meminfo = log_line("dra-whole", "meminfo ", Duration::from_secs(30));
    assert_eq!(
        meminfo.split_whitespace().nth(2),
        Some(total.as_str()),
        "{meminfo}"
    );
    eprintln!(
        "dra on the cluster: nvidia.com/gpu: 1 without the device plugin: claim {extended} got {device} whole ({total} bytes, 100 cores)"
    );
    let whole_uid = c["metadata"]["uid"].as_str().unwrap().to_owned();

    // HAMi's pod spec in DRA mode: the webhook turns gpumem/gpucores into
    // a ResourceClaimTemplate; kube-scheduler allocates the pod's claim and
    // the workload is held to it.
    apply(
        "dra-hami",
        &limited_pod(
            "dra-hami",
            &[
                ("nvidia.com/gpu", "1"),
                ("nvidia.com/gpumem", "2000"),
                ("nvidia.com/gpucores", "20"),
            ],
            &[
                "dev",
                "0",
                "meminfo",
                "alloc-until-oom",
                "250",
                "ready",
                "run",
                "spin",
                "132",
                "128",
                "300000",
            ],
        ),
    );
    wait_running("dra-hami", Duration::from_secs(90));
    let pod_json = get_json(&["get", "pod", "dra-hami"]);
    let template = pod_json["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        .as_str()
        .unwrap_or_else(|| panic!("the webhook gave dra-hami no claim template: {pod_json}"))
        .to_owned();
    assert!(
        pod_json["spec"]["containers"][0]["resources"]["limits"]
            .get("nvidia.com/gpumem")
            .is_none(),
        "{pod_json}"
    );
    let hami_claim = pod_json["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .unwrap()
        .to_owned();
    let c = get_json(&["get", "resourceclaim", &hami_claim]);
    let r = &c["status"]["allocation"]["devices"]["results"][0];
    // (The API server writes quantities canonically: 2000Mi reads back
    // as 2097152k.)
    assert_eq!(
        quantity_bytes(r["consumedCapacity"]["memory"].as_str().unwrap()),
        2000 * MIB,
        "{c}"
    );
    assert_eq!(r["consumedCapacity"]["cores"], "20", "{c}");
    let hami_gpu: usize = r["device"]
        .as_str()
        .unwrap()
        .trim_start_matches("gpu-")
        .parse()
        .unwrap();
    assert_eq!(
        log_line("dra-hami", "meminfo ", Duration::from_secs(30)),
        format!("meminfo {} {}", 2000 * MIB, 2000 * MIB)
    );
    log_line("dra-hami", "ready", Duration::from_secs(60));
    let hami_pid = super::pod_process(
        "dra-hami",
        "/usr/local/bin/workload",
        Duration::from_secs(60),
    )
    .expect("no workload process in pod dra-hami");
    let held = held_mib(&sim, hami_gpu, hami_pid);
    std::thread::sleep(Duration::from_secs(3));
    let sm = sm_share(&sim, hami_gpu, hami_pid, 1);
    eprintln!(
        "dra on the cluster: HAMi's gpumem 2000/gpucores 20 through template {template}: claim {hami_claim} on gpu-{hami_gpu}, {held} MiB held, SM {sm:.1} %"
    );
    assert!(
        held <= 2000 + CONTEXT_MIB && held + 250 > 2000 + CONTEXT_MIB,
        "dra-hami holds {held} MiB"
    );
    assert!((sm - 20.0).abs() <= 3.0, "dra-hami ran at {sm:.1} %");

    // Health reaches the slice: a lost GPU leaves it and comes back, and
    // a critical Xid takes its GPU out for the quarantine.
    // (A lost GPU's Xid 79 quarantines it for the agent's 60 s before
    // it is back.)
    sim.set_lost(1, true).unwrap();
    wait_devices("gpu-1 lost", 30, |d| !d.contains(&"gpu-1".to_owned()));
    sim.set_lost(1, false).unwrap();
    wait_devices("gpu-1 back", 90, |d| d.contains(&"gpu-1".to_owned()));
    sim.inject_xid(0, 48).unwrap();
    wait_devices("gpu-0 after Xid 48", 30, |d| {
        !d.contains(&"gpu-0".to_owned())
    });

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
    for name in ["dra-whole", "dra-hami"] {
        let _ = kubectl(&["delete", "pod", name, "--wait=true", "--timeout=60s"]);
    }
    for name in ["dra-30", "dra-50", "dra-big", "dra-shared"] {
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
    for uid in [&uid30, &uid50, &whole_uid] {
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
    eprintln!("dra on the cluster: the claims' regions and CDI specs removed");
}
