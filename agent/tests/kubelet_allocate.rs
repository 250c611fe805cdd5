//! `Allocate` end to end, on the simulated node: a fake kubelet calls the
//! plugin's real gRPC socket; the plugin finds the pod through a real
//! `kube::Client` talking to a scripted fake API server (pod fixtures
//! under `tests/fixtures/pods/`), creates the region directory and
//! answers.
//!
//! Oracles: the region files as `tessera-region`'s reader sees them (the
//! control region's GPUs and memory limits), `meta.json` as raw JSON, the
//! pods as the fake API server holds them afterwards, the simulator's
//! node description (GPU memory, minor numbers), and the gRPC answer.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod kubelet_support;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kubelet_support::allocate::{
    GPU_MIB, MIB, NODE_NAME, allocate, bound, mounts, single, start, uid,
};
use kubelet_support::apiserver::{FakeApi, fixture};
use kubelet_support::{UUIDS, nvml, on_node, runtime};
use serde_json::Value;
use tessera_agent::kubelet::AllocateSetup;

fn vgpus(gpus: &[usize]) -> Vec<String> {
    gpus.iter().map(|g| format!("{}::3", UUIDS[*g])).collect()
}

/// What the region files say: per GPU (UUID, memory limit bytes), and
/// the metadata.
fn region(root: &Path, uid: &str, container: &str) -> (Vec<(String, u64)>, Value) {
    let dir = root.join(format!("{uid}_{container}"));
    let control = tessera_region::file::open_control(&dir.join("control"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let snap = control.snapshot();
    let gpus = snap
        .gpus
        .iter()
        .map(|g| (tessera_region::spec::format_uuid(&g.uuid), g.memory_limit))
        .collect();
    tessera_region::file::open_usage(&dir.join("usage")).unwrap();
    let meta: Value =
        serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
    (gpus, meta)
}

fn allocated(api: &FakeApi, key: &str) -> Vec<String> {
    let p = api.pod(key);
    match p["metadata"]["annotations"]["tessera.dev/allocated"].as_str() {
        Some(t) => serde_json::from_str(t).unwrap(),
        None => vec![],
    }
}

#[test]
fn single_container_pod_gets_its_region_limits_mounts_and_devices() {
    on_node(
        "single_container_pod_gets_its_region_limits_mounts_and_devices",
        || {
            runtime().block_on(async {
                let pods = vec![
                    single("trainer", 1, UUIDS[1], 4000, 30, 5),
                    fixture(
                        "plain.json",
                        &[("NAME", "web"), ("UID", &uid(2)), ("NODE", NODE_NAME), ("BOUND", &bound(1))],
                    ),
                    // Another node's pod, bound earlier: never chosen.
                    single("elsewhere", 3, UUIDS[0], 1000, 10, 0)
                        .to_string()
                        .replace(NODE_NAME, "gpu-node-8")
                        .parse()
                        .unwrap(),
                ];
                let mut env = start(pods).await;
                // Kubelet's own pick (GPU 0) is not the assignment's (GPU 1):
                // the assignment wins.
                let r = allocate(&mut env.client, &vgpus(&[0])).await.unwrap();
                assert_eq!(
                    r.envs,
                    [("NVIDIA_VISIBLE_DEVICES".to_owned(), UUIDS[1].to_owned())].into(),
                    "only visibility in the environment, never limits"
                );
                let dev = |n: &str| env.dev().join(n).to_string_lossy().into_owned();
                let devices: Vec<(String, String, String)> = r
                    .devices
                    .iter()
                    .map(|d| (d.container_path.clone(), d.host_path.clone(), d.permissions.clone()))
                    .collect();
                // The simulator's minor number of GPU 1 is 1.
                assert_eq!(
                    devices,
                    vec![
                        ("/dev/nvidiactl".into(), dev("nvidiactl"), "rw".into()),
                        ("/dev/nvidia-uvm".into(), dev("nvidia-uvm"), "rw".into()),
                        ("/dev/nvidia1".into(), dev("nvidia1"), "rw".into()),
                    ]
                );
                let region_dir = env.root().join(format!("{}_main", uid(1)));
                let lib = env.library_dir();
                let s = |p: PathBuf| p.to_string_lossy().into_owned();
                assert_eq!(
                    mounts(&r),
                    BTreeMap::from([
                        ("/usr/local/lib/tessera".to_owned(), (s(lib.clone()), true)),
                        ("/etc/ld.so.preload".to_owned(), (s(lib.join("ld.so.preload")), true)),
                        ("/run/tessera/control".to_owned(), (s(region_dir.join("control")), true)),
                        ("/run/tessera/usage".to_owned(), (s(region_dir.join("usage")), false)),
                    ])
                );
                let (gpus, meta) = region(&env.root(), &uid(1), "main");
                assert_eq!(gpus, vec![(UUIDS[1].to_owned(), 4000 * MIB)]);
                assert_eq!(meta["namespace"], "ml");
                assert_eq!(meta["pod"], "trainer");
                assert_eq!(meta["container"], "main");
                assert_eq!(meta["pod_uid"], uid(1).as_str());
                assert_eq!(meta["sm_target"], 30);
                assert_eq!(meta["mode"], "elastic");
                assert!(meta.get("priority").is_none(), "{meta}");
                assert_eq!(meta["labels"]["tier"], "batch");
                assert_eq!(env.regions(), vec![format!("{}_main", uid(1))]);
                assert_eq!(allocated(&env.api, "ml/trainer"), vec!["main"]);

                // The pod is done: the next request finds nothing, and
                // says why, naming the pod without an assignment.
                let e = allocate(&mut env.client, &vgpus(&[0])).await.unwrap_err();
                assert_eq!(e.code(), tonic::Code::FailedPrecondition);
                let m = e.message();
                assert!(m.contains("no pod on node gpu-node-7 waits for a container with 1 nvidia.com/gpu"), "{m}");
                assert!(m.contains("pod ml/web asks for nvidia.com/gpu but has no tessera.dev/assignment (schedulerName default-scheduler"), "{m}");
                assert!(!m.contains("elsewhere"), "{m}");
                assert_eq!(env.regions().len(), 1);
                env.stop().await;
            });
        },
    );
}

/// HAMi's example pod asks for `nvidia.com/gpumem: 4000`, which
/// kube-apiserver stores as `4k`; with an assignment that leaves memory to
/// the spec, every spelling of a whole number gives its limit, and a
/// fraction or garbage is refused naming the container and the resource.
#[test]
fn spec_quantities_in_every_spelling_the_api_server_keeps_give_their_limits() {
    on_node(
        "spec_quantities_in_every_spelling_the_api_server_keeps_give_their_limits",
        || {
            runtime().block_on(async {
                let pod = |i: usize, spelling: &str| {
                    let mut p = single(&format!("hami-{i}"), 400 + i, UUIDS[0], 4000, 30, i);
                    let a = p["metadata"]["annotations"]["tessera.dev/assignment"]
                        .as_str()
                        .unwrap()
                        .replace("\"memoryMiB\":4000,", "");
                    p["metadata"]["annotations"]["tessera.dev/assignment"] = Value::String(a);
                    for list in ["limits", "requests"] {
                        p["spec"]["containers"][0]["resources"][list]["nvidia.com/gpumem"] =
                            spelling.into();
                    }
                    p
                };
                let good = [
                    ("4k", 4000),
                    ("4e3", 4000),
                    ("+4k", 4000),
                    ("4000", 4000),
                    ("4Ki", 4096),
                    ("1500", 1500),
                ];
                let pods = good
                    .iter()
                    .enumerate()
                    .map(|(i, (q, _))| pod(i, q))
                    .collect();
                let mut env = start(pods).await;
                for (i, (q, mib)) in good.iter().enumerate() {
                    allocate(&mut env.client, &vgpus(&[0])).await.unwrap();
                    let (gpus, _) = region(&env.root(), &uid(400 + i), "main");
                    assert_eq!(gpus, vec![(UUIDS[0].to_owned(), mib * MIB)], "gpumem {q}");
                }
                env.stop().await;

                for (q, says) in [
                    ("0.5", "nvidia.com/gpumem \"0.5\" is not a whole number"),
                    ("500m", "nvidia.com/gpumem \"500m\" is not a whole number"),
                    (
                        "four",
                        "nvidia.com/gpumem \"four\" is not a Kubernetes quantity",
                    ),
                    ("2Gi", "nvidia.com/gpumem is 2147483648, out of range"),
                ] {
                    let mut env = start(vec![pod(0, q)]).await;
                    let e = allocate(&mut env.client, &vgpus(&[0])).await.unwrap_err();
                    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{q}");
                    let m = e.message();
                    assert!(
                        m.contains("pod ml/hami-0 container main")
                            && m.contains("container \"main\": ")
                            && m.contains(says),
                        "{q}: {m}"
                    );
                    assert!(env.regions().is_empty(), "{q}");
                    env.stop().await;
                }
            });
        },
    );
}

#[test]
fn multi_container_pod_gives_each_container_its_own_gpus_and_limits() {
    on_node(
        "multi_container_pod_gives_each_container_its_own_gpus_and_limits",
        || {
            runtime().block_on(async {
                let pod = fixture(
                    "multi.json",
                    &[
                        ("NAME", "pipeline"),
                        ("UID", &uid(7)),
                        ("NODE", NODE_NAME),
                        ("BOUND", &bound(3)),
                        ("GPU0", UUIDS[0]),
                        ("GPU1", UUIDS[1]),
                        ("GPU2", UUIDS[2]),
                    ],
                );
                let mut env = start(vec![pod]).await;
                // Kubelet: the init container has no GPU (no call), then
                // `a` (2 devices), then `b` (1).
                let a = allocate(&mut env.client, &vgpus(&[2, 1])).await.unwrap();
                assert_eq!(
                    a.envs["NVIDIA_VISIBLE_DEVICES"],
                    format!("{},{}", UUIDS[0], UUIDS[1])
                );
                let nodes: Vec<&str> = a
                    .devices
                    .iter()
                    .map(|d| d.container_path.as_str())
                    .collect();
                assert_eq!(
                    nodes,
                    [
                        "/dev/nvidiactl",
                        "/dev/nvidia-uvm",
                        "/dev/nvidia0",
                        "/dev/nvidia1"
                    ]
                );
                assert_eq!(allocated(&env.api, "ml/pipeline"), vec!["a"]);
                let b = allocate(&mut env.client, &vgpus(&[0])).await.unwrap();
                assert_eq!(b.envs["NVIDIA_VISIBLE_DEVICES"], UUIDS[2]);
                let nodes: Vec<&str> = b
                    .devices
                    .iter()
                    .map(|d| d.container_path.as_str())
                    .collect();
                assert_eq!(nodes, ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia2"]);

                let (ga, ma) = region(&env.root(), &uid(7), "a");
                assert_eq!(
                    ga,
                    vec![
                        (UUIDS[0].to_owned(), 10000 * MIB),
                        (UUIDS[1].to_owned(), 12000 * MIB)
                    ]
                );
                assert_eq!(
                    (ma["container"].as_str(), ma["sm_target"].as_u64()),
                    (Some("a"), Some(50))
                );
                let (gb, mb) = region(&env.root(), &uid(7), "b");
                // 50 % of GPU 2's memory as the simulator's NVML reports it.
                assert_eq!(gb, vec![(UUIDS[2].to_owned(), GPU_MIB[2] / 2 * MIB)]);
                assert_eq!(
                    (mb["container"].as_str(), mb["sm_target"].as_u64()),
                    (Some("b"), Some(20))
                );
                assert!(
                    mb.get("mode").is_none(),
                    "no annotation: the policy decides: {mb}"
                );
                let mut got = allocated(&env.api, "ml/pipeline");
                got.sort();
                assert_eq!(got, vec!["a", "b"]);
                assert_eq!(env.regions().len(), 2);
                let ma_mounts = mounts(&a);
                let mb_mounts = mounts(&b);
                assert_ne!(
                    ma_mounts["/run/tessera/control"],
                    mb_mounts["/run/tessera/control"]
                );
                env.stop().await;
            });
        },
    );
}

#[test]
fn requests_that_cannot_be_matched_fail_naming_pod_resource_and_gpu() {
    on_node(
        "requests_that_cannot_be_matched_fail_naming_pod_resource_and_gpu",
        || {
            runtime().block_on(async {
                // No pod at all.
                let mut env = start(vec![]).await;
                let e = allocate(&mut env.client, &vgpus(&[0])).await.unwrap_err();
                assert_eq!(e.code(), tonic::Code::FailedPrecondition);
                assert!(
                    e.message().contains("no pod on node gpu-node-7 waits for a container with 1 nvidia.com/gpu")
                        && e.message().contains("no pod on this node has a tessera.dev/assignment"),
                    "{}",
                    e.message()
                );
                // A device that is not ours.
                let e = allocate(&mut env.client, &["GPU-ffffffff-1111-2222-3333-444444444444::0".into()])
                    .await
                    .unwrap_err();
                assert!(e.message().contains("not on node gpu-node-7"), "{}", e.message());
                env.stop().await;

                // An assigned GPU that is not on this node; a pod asking
                // for fewer devices than the request; a tampered
                // assignment granting more than the spec asks for.
                let ghost = single("ghost", 1, "GPU-ffffffff-1111-2222-3333-444444444444", 1000, 10, 1);
                let mut env = start(vec![ghost]).await;
                let e = allocate(&mut env.client, &vgpus(&[0])).await.unwrap_err();
                assert!(
                    e.message().contains("pod ml/ghost container main: assigned GPU GPU-ffffffff-1111-2222-3333-444444444444 is not on this node"),
                    "{}",
                    e.message()
                );
                let e = allocate(&mut env.client, &vgpus(&[0, 1])).await.unwrap_err();
                assert!(
                    e.message().contains("2 nvidia.com/gpu")
                        && e.message().contains("pod ml/ghost: its next container main has 1 GPUs assigned, the request 2 devices"),
                    "{}",
                    e.message()
                );
                assert!(env.regions().is_empty(), "{:?}", env.regions());
                assert!(allocated(&env.api, "ml/ghost").is_empty());
                env.stop().await;

                let mut tampered = single("greedy", 2, UUIDS[0], 4000, 30, 1);
                let a = tampered["metadata"]["annotations"]["tessera.dev/assignment"]
                    .as_str()
                    .unwrap()
                    .replace("\"memoryMiB\":4000", "\"memoryMiB\":80000");
                tampered["metadata"]["annotations"]["tessera.dev/assignment"] = Value::String(a);
                let mut env = start(vec![tampered]).await;
                let e = allocate(&mut env.client, &vgpus(&[0])).await.unwrap_err();
                assert!(
                    e.message().contains("pod ml/greedy container main")
                        && e.message().contains("grants 80000 MiB on GPU")
                        && e.message().contains("more than the container asks for (4000 MiB)"),
                    "{}",
                    e.message()
                );
                assert!(env.regions().is_empty());
                // The preload library missing: refused, naming the file.
                std::fs::remove_file(env.library_dir().join("libtessera.so")).unwrap();
                let e = allocate(&mut env.client, &vgpus(&[0])).await.unwrap_err();
                assert!(e.message().contains("libtessera.so is missing on node gpu-node-7"), "{}", e.message());
                env.stop().await;
            });
        },
    );
}

#[test]
fn fifty_concurrent_allocates_for_fifty_pods_each_get_their_own_region() {
    on_node(
        "fifty_concurrent_allocates_for_fifty_pods_each_get_their_own_region",
        || {
            runtime().block_on(async {
                const N: usize = 50;
                let spec = |i: usize| (UUIDS[i % 3], 1000 + 10 * i as u64, 1 + (i as u32 * 7) % 100);
                let pods: Vec<Value> = (0..N)
                    .map(|i| {
                        let (g, mib, cores) = spec(i);
                        single(&format!("job-{i:02}"), 100 + i, g, mib, cores, i)
                    })
                    .collect();
                let env = start(pods).await;
                // Someone else (kubelet's status updates) changes pods while
                // the calls run: the agent's conditioned patches must cope.
                let toucher = {
                    let api = env.api.clone();
                    tokio::spawn(async move {
                        for k in 0.. {
                            api.touch(&format!("ml/job-{:02}", (k * 17) % N));
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                    })
                };
                let t = Instant::now();
                let calls: Vec<_> = (0..N)
                    .map(|i| {
                        let mut c = env.client.clone();
                        tokio::spawn(async move { allocate(&mut c, &vgpus(&[i % 3])).await })
                    })
                    .collect();
                let mut answers = Vec::new();
                for c in calls {
                    answers.push(c.await.unwrap().unwrap_or_else(|e| panic!("{e:?}")));
                }
                let took = t.elapsed();
                toucher.abort();
                let counts = env.api.counts();
                println!(
                    "figure: {N} concurrent Allocates in {took:?}: {} pod lists, {} patches, {} conflicts retried",
                    counts.lists, counts.patches, counts.conflicts
                );
                // Every answer names a different region; every pod has one,
                // with its own limits; every pod is marked exactly once.
                let controls: HashSet<String> = answers
                    .iter()
                    .map(|a| mounts(a)["/run/tessera/control"].0.clone())
                    .collect();
                assert_eq!(controls.len(), N);
                assert_eq!(env.regions().len(), N, "{:?}", env.regions());
                for i in 0..N {
                    let (g, mib, cores) = spec(i);
                    let (gpus, meta) = region(&env.root(), &uid(100 + i), "main");
                    assert_eq!(gpus, vec![(g.to_owned(), mib * MIB)], "job-{i:02}");
                    assert_eq!(meta["pod"], format!("job-{i:02}").as_str());
                    assert_eq!(meta["sm_target"], cores, "job-{i:02}");
                    assert_eq!(allocated(&env.api, &format!("ml/job-{i:02}")), vec!["main"]);
                    let control = env.root().join(format!("{}_main", uid(100 + i))).join("control");
                    assert!(controls.contains(&*control.to_string_lossy()));
                }
                // Each answer's visible GPU is the one its region limits.
                for a in &answers {
                    let control = &mounts(a)["/run/tessera/control"].0;
                    let dir = Path::new(control).parent().unwrap();
                    let meta: Value =
                        serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
                    assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], meta["gpus"][0]["uuid"]);
                }
                env.stop().await;
            });
        },
    );
}

#[test]
fn hami_manifest_with_resources_only_gets_hami_defaults() {
    on_node(
        "hami_manifest_with_resources_only_gets_hami_defaults",
        || {
            runtime().block_on(async {
                let pod = fixture(
                    "hami.json",
                    &[
                        ("NAME", "hami"),
                        ("UID", &uid(9)),
                        ("NODE", NODE_NAME),
                        ("BOUND", &bound(2)),
                        ("GPU0", UUIDS[2]),
                        ("GPU1", UUIDS[0]),
                    ],
                );
                let mut env = start(vec![pod]).await;
                allocate(&mut env.client, &vgpus(&[0])).await.unwrap();
                allocate(&mut env.client, &vgpus(&[1])).await.unwrap();
                // `a`: nvidia.com/gpu only: all of the GPU's memory, no compute
                // cap, priority and mode left to the policy.
                let (ga, ma) = region(&env.root(), &uid(9), "a");
                assert_eq!(ga, vec![(UUIDS[2].to_owned(), GPU_MIB[2] * MIB)]);
                assert_eq!(ma["sm_target"], 100);
                assert!(
                    ma.get("priority").is_none() && ma.get("mode").is_none(),
                    "{ma}"
                );
                assert_eq!(ma["labels"]["app"], "hami-demo");
                // `b`: gpumem-percentage 25, gpucores 40, priority 0 (HAMi's
                // high) → the agent's highest.
                let (gb, mb) = region(&env.root(), &uid(9), "b");
                assert_eq!(gb, vec![(UUIDS[0].to_owned(), GPU_MIB[0] * 25 / 100 * MIB)]);
                assert_eq!(mb["sm_target"], 40);
                assert_eq!(mb["priority"], 100);
                env.stop().await;
            });
        },
    );
}

#[test]
fn two_agents_racing_for_the_same_pods_never_both_take_a_container() {
    on_node(
        "two_agents_racing_for_the_same_pods_never_both_take_a_container",
        || {
            runtime().block_on(async {
                use std::sync::Arc;
                use tessera_agent::gpu::Inventory;
                use tessera_agent::kubelet::Allocator;
                const N: usize = 20;
                let pods: Vec<Value> = (0..N)
                    .map(|i| single(&format!("race-{i:02}"), 200 + i, UUIDS[i % 3], 2000, 10, i))
                    .collect();
                let (api, kube) = FakeApi::start(pods);
                let dir = tempfile::tempdir().unwrap();
                let lib = dir.path().join("lib").join(env!("CARGO_PKG_VERSION"));
                std::fs::create_dir_all(&lib).unwrap();
                std::fs::write(lib.join("libtessera.so"), b"").unwrap();
                std::fs::write(lib.join("ld.so.preload"), b"").unwrap();
                let nvml = nvml();
                let gpus = Arc::new(Inventory::collect(&*nvml).unwrap().gpus);
                // Two agents (an old and a new one during a rolling update),
                // each with its own claims and root: only the API server's
                // resourceVersion check stands between them.
                let agent = |root: &str| {
                    Arc::new(Allocator::new(
                        AllocateSetup {
                            client: kube.clone(),
                            node: NODE_NAME.into(),
                            root: dir.path().join(root),
                            preload_dir: dir.path().join("lib"),
                            version: env!("CARGO_PKG_VERSION").into(),
                            dev_dir: dir.path().into(),
                        },
                        "nvidia.com/gpu".into(),
                        gpus.clone(),
                        vec![Some(0), Some(1), Some(2)],
                    ))
                };
                let (one, two) = (agent("one"), agent("two"));
                let calls: Vec<_> = (0..N)
                    .map(|i| {
                        let a = if i % 2 == 0 { one.clone() } else { two.clone() };
                        tokio::spawn(async move { a.allocate(&[format!("{}::0", UUIDS[0])]).await })
                    })
                    .collect();
                for c in calls {
                    c.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
                }
                let names = |root: &str| -> HashSet<String> {
                    std::fs::read_dir(dir.path().join(root))
                        .unwrap()
                        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .filter(|n| !n.starts_with('.'))
                        .collect()
                };
                let (a, b) = (names("one"), names("two"));
                println!(
                    "figure: two agents, {N} pods: {} + {} regions, {} conflicts",
                    a.len(),
                    b.len(),
                    api.counts().conflicts
                );
                assert!(
                    a.is_disjoint(&b),
                    "a container was taken twice: {:?}",
                    a.intersection(&b).collect::<Vec<_>>()
                );
                assert_eq!(a.len() + b.len(), N);
                for i in 0..N {
                    assert_eq!(allocated(&api, &format!("ml/race-{i:02}")), vec!["main"]);
                    let id = format!("{}_main", uid(200 + i));
                    assert!(a.contains(&id) || b.contains(&id), "{id}");
                }
                api.assert_all_supported();
            });
        },
    );
}
