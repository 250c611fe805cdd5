//! The `bind` verb against a scripted fake API server behind a real
//! `kube::Client` (a `tower-test` mock service): what it writes is judged
//! by the contract's own parser (`tessera_api::assignment`) and the fake's
//! record of requests, never by the binder's reservation table.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use std::collections::BTreeMap;
use std::sync::Arc;

use http::StatusCode;
use serde_json::{Value, json};
use tessera_api::assignment::{ASSIGNMENT, Assignment};
use tessera_scheduler::bind::reserve::Reservations;
use tessera_scheduler::bind::{BindError, Binder};
use tessera_scheduler::extender::{ClusterView, ExtenderBindingArgs, GpuView, NodeView};
use tessera_scheduler::server::{AppState, Routes, dispatch};
use tessera_testkit::apiserver::Pods;
use tessera_testkit::promtool::Promtool;

const NODE: &str = "gpu-node-1";

fn uuid(i: usize) -> String {
    format!("GPU-5e1a0000-0000-4000-8000-{i:012x}")
}

fn view(gpus: usize, memory_mib: u64) -> ClusterView {
    ClusterView::new([NodeView {
        name: NODE.into(),
        gpus: (0..gpus)
            .map(|i| GpuView {
                uuid: uuid(i),
                model: "NVIDIA A100-SXM4-80GB".into(),
                memory_mib,
                used_mib: 0,
                cores_used_percent: 0,
                healthy: true,
                ..GpuView::default()
            })
            .collect(),
        ..NodeView::default()
    }])
}

/// A pod as `kubectl get pod -o json` shows one waiting for its node.
fn pod(name: &str, mem: u64, cores: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "creationTimestamp": "2026-12-01T15:00:00Z",
            "labels": {"app": "train"},
            "annotations": {"tessera.dev/placement": "binpack"}},
        "spec": {"schedulerName": "tessera-scheduler", "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "cuda:12",
                "resources": {"limits": {"nvidia.com/gpu": "1",
                    "nvidia.com/gpumem": mem.to_string(),
                    "nvidia.com/gpucores": cores.to_string()}}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 300}]},
        "status": {"phase": "Pending", "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "False"}]}
    })
}

fn args(name: &str) -> ExtenderBindingArgs {
    ExtenderBindingArgs {
        pod_name: name.into(),
        pod_namespace: "ml".into(),
        pod_uid: format!("uid-{name}"),
        node: NODE.into(),
    }
}

fn assignment_of(pod: &Value) -> Option<Assignment> {
    let text = pod["metadata"]["annotations"][ASSIGNMENT].as_str()?;
    Some(Assignment::parse(text).expect("the contract's parser accepts what bind wrote"))
}

#[tokio::test]
async fn bind_writes_the_contracts_assignment_then_the_binding() {
    let (api, client) = Pods::start(vec![pod("p", 4000, 30)]);
    let binder = Binder::new(client, Reservations::default());
    let view = view(2, 10_000);
    binder.bind(&args("p"), &view).await.unwrap();

    let stored = api.pod("ml/p");
    let a = assignment_of(&stored).expect("annotation written");
    assert_eq!(a.node, NODE);
    assert_eq!(a.containers.len(), 1);
    let c = &a.containers[0];
    assert_eq!(
        (c.name.as_str(), c.resource.as_str()),
        ("main", "nvidia.com/gpu")
    );
    assert_eq!(c.gpus.len(), 1);
    assert!([uuid(0), uuid(1)].contains(&c.gpus[0].uuid.to_string()));
    assert_eq!(c.gpus[0].memory_mib, Some(4000));
    assert_eq!(c.gpus[0].memory_percent, None);
    assert_eq!(c.gpus[0].cores_percent, Some(30));
    assert_eq!(stored["spec"]["nodeName"], NODE);

    let log = api.log();
    let calls: Vec<(&str, &str)> = log
        .iter()
        .map(|(m, p, _)| (m.as_str(), p.as_str()))
        .collect();
    assert_eq!(
        calls,
        [
            ("GET", "/api/v1/namespaces/ml/pods/p"),
            ("PATCH", "/api/v1/namespaces/ml/pods/p"),
            ("POST", "/api/v1/namespaces/ml/pods/p/binding"),
        ]
    );
    // The patch was conditioned on the version read.
    assert_eq!(log[1].2["metadata"]["resourceVersion"], "1");
    assert_eq!(
        log[2].2,
        json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}})
    );
}

#[tokio::test]
async fn a_conflict_rereads_the_pod_and_retries() {
    let (api, client) = Pods::start(vec![pod("p", 4000, 30)]);
    api.faults(|f| f.conflicts = 1);
    let binder = Binder::new(client, Reservations::default());
    binder.bind(&args("p"), &view(1, 10_000)).await.unwrap();
    let methods: Vec<String> = api.log().into_iter().map(|(m, _, _)| m).collect();
    assert_eq!(methods, ["GET", "PATCH", "GET", "PATCH", "POST"]);
    assert!(assignment_of(&api.pod("ml/p")).is_some());

    // Conflicts without end: a clear refusal, nothing bound.
    let (api, client) = Pods::start(vec![pod("q", 4000, 30)]);
    api.faults(|f| f.conflicts = u32::MAX);
    let binder = Binder::new(client, Reservations::default());
    let e = binder.bind(&args("q"), &view(1, 10_000)).await.unwrap_err();
    assert!(matches!(e, BindError::Conflicts { .. }), "{e}");
    assert!(e.to_string().contains("ml/q"), "{e}");
    assert!(api.pod("ml/q")["spec"]["nodeName"].is_null());
}

#[tokio::test]
async fn a_pod_that_no_longer_fits_is_refused_and_writes_nothing() {
    let (api, client) = Pods::start(vec![
        pod("a", 6000, 10),
        pod("big", 6000, 10),
        pod("rest", 4000, 10),
    ]);
    let binder = Binder::new(client, Reservations::default());
    let view = view(1, 10_000);
    binder.bind(&args("a"), &view).await.unwrap();
    let before = api.log().len();
    let e = binder.bind(&args("big"), &view).await.unwrap_err();
    assert!(matches!(e, BindError::NoFit { .. }), "{e}");
    assert!(e.full_message().contains("ml/big"), "{}", e.full_message());
    let after: Vec<String> = api.log()[before..]
        .iter()
        .map(|(m, _, _)| m.clone())
        .collect();
    assert_eq!(after, ["GET"], "nothing written for the refused pod");
    assert!(assignment_of(&api.pod("ml/big")).is_none());
    // The refused pod holds nothing: exactly the rest still fits.
    binder.bind(&args("rest"), &view).await.unwrap();
    assert!(assignment_of(&api.pod("ml/rest")).is_some());
}

/// A bind whose Binding or whose write the API server refuses leaves
/// nothing behind: the assignment is removed again, and what it had
/// reserved is free for the next pod (which takes exactly that room).
#[tokio::test]
async fn a_refused_binding_or_write_removes_the_assignment_and_frees_the_room() {
    let (api, client) = Pods::start(vec![
        pod("x", 6000, 60),
        pod("w", 6000, 60),
        pod("y", 6000, 60),
    ]);
    api.faults(|f| {
        f.refuse_binding
            .insert("ml/x".into(), "etcd timed out".into());
        f.refuse_annotation.insert("ml/w".into(), ASSIGNMENT.into());
    });
    let binder = Binder::new(client, Reservations::default());
    let view = view(1, 10_000);
    let e = binder.bind(&args("x"), &view).await.unwrap_err();
    assert!(matches!(e, BindError::Binding { .. }), "{e}");
    assert!(
        e.full_message().contains("etcd timed out"),
        "{}",
        e.full_message()
    );
    let x = api.pod("ml/x");
    assert!(assignment_of(&x).is_none(), "assignment removed: {x}");
    assert!(x["spec"]["nodeName"].is_null());
    let e = binder.bind(&args("w"), &view).await.unwrap_err();
    assert!(matches!(e, BindError::Patch { .. }), "{e}");
    assert!(assignment_of(&api.pod("ml/w")).is_none());
    binder.bind(&args("y"), &view).await.unwrap();
    assert!(assignment_of(&api.pod("ml/y")).is_some());
}

#[tokio::test]
async fn pods_bound_before_a_restart_are_counted() {
    let (api, client) = Pods::start(vec![pod("old", 7000, 50), pod("new", 7000, 50)]);
    let view = view(1, 10_000);
    Binder::new(client.clone(), Reservations::default())
        .bind(&args("old"), &view)
        .await
        .unwrap();
    // A new process: the table is empty until it refreshes from the API,
    // and binds nothing before (it would over-commit "old"'s GPU).
    let restarted = Binder::awaiting_count(client, Reservations::default());
    let before = api.log().len();
    let e = restarted.bind(&args("new"), &view).await.unwrap_err();
    assert!(matches!(e, BindError::NotCounted { .. }), "{e}");
    assert_eq!(api.log().len(), before, "refused without touching the API");
    assert_eq!(restarted.refresh(&view).await.unwrap(), 1);
    let e = restarted.bind(&args("new"), &view).await.unwrap_err();
    assert!(matches!(e, BindError::NoFit { .. }), "{e}");
    assert!(assignment_of(&api.pod("ml/new")).is_none());
}

/// 200 pods bound at once against 4 GPUs, some of their writes refused
/// with 409 first: summing the written annotations, no GPU is
/// over-committed in memory, cores or slots; every pod is bound (with an
/// annotation and a node) or refused with a reason (with neither).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_binds_never_over_commit_and_lose_nothing() {
    const PODS: usize = 200;
    const GPUS: usize = 4;
    const MEM: u64 = 20_000;
    let pods: Vec<Value> = (0..PODS)
        .map(|i| {
            pod(
                &format!("p{i}"),
                500 + (i as u64 * 7919) % 3000,
                1 + (i as u32 * 31) % 12,
            )
        })
        .collect();
    let (api, client) = Pods::start(pods);
    api.faults(|f| f.conflict_once = (0..PODS).step_by(5).map(|i| format!("ml/p{i}")).collect());
    let binder = Arc::new(Binder::new(client, Reservations::new(10)));
    let view = Arc::new(view(GPUS, MEM));
    let tasks: Vec<_> = (0..PODS)
        .map(|i| {
            let (binder, view) = (binder.clone(), view.clone());
            tokio::spawn(async move { binder.bind(&args(&format!("p{i}")), &view).await })
        })
        .collect();
    let mut refused = BTreeMap::<&str, usize>::new();
    let mut bound = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let result = t.await.unwrap();
        let stored = api.pod(&format!("ml/p{i}"));
        match result {
            Ok(_) => {
                bound += 1;
                assert_eq!(stored["spec"]["nodeName"], NODE, "p{i}");
                assert!(assignment_of(&stored).is_some(), "p{i}");
            }
            Err(e) => {
                *refused.entry(e.reason()).or_default() += 1;
                assert!(stored["spec"]["nodeName"].is_null(), "p{i}: {e}");
                assert!(assignment_of(&stored).is_none(), "p{i}: {e}");
            }
        }
    }
    let mut per_gpu = BTreeMap::<String, (u64, u32, u32)>::new();
    for i in 0..PODS {
        let stored = api.pod(&format!("ml/p{i}"));
        let Some(a) = assignment_of(&stored) else {
            continue;
        };
        for c in &a.containers {
            for g in &c.gpus {
                let e = per_gpu.entry(g.uuid.to_string()).or_default();
                e.0 += g.memory_mib.unwrap();
                e.1 += g.cores_percent.unwrap();
                e.2 += 1;
            }
        }
    }
    for (gpu, (mib, cores, shares)) in &per_gpu {
        assert!(*mib <= MEM, "{gpu}: {mib} MiB of {MEM}");
        assert!(*cores <= 100, "{gpu}: {cores}% SMs");
        assert!(*shares <= 10, "{gpu}: {shares} shares");
    }
    assert_eq!(bound + refused.values().sum::<usize>(), PODS);
    assert!(bound >= GPUS, "the GPUs were used: {bound} bound");
    assert!(
        refused.keys().all(|r| *r == "no_fit"),
        "refused only for lack of room: {refused:?}"
    );
    api.assert_all_supported();
    println!("bound {bound}, refused {refused:?}, per GPU {per_gpu:?}");
}

#[tokio::test]
async fn metrics_pass_promtool_and_count_binds() {
    let (_api, client) = Pods::start(vec![pod("p", 4000, 30), pod("huge", 40_000, 30)]);
    let state = AppState {
        view: view(2, 10_000).into(),
        binder: Some(Binder::new(client, Reservations::default())),
        ..AppState::default()
    };
    for name in ["p", "huge"] {
        let body = serde_json::to_vec(&json!({"PodName": name, "PodNamespace": "ml",
            "PodUID": format!("uid-{name}"), "Node": NODE}))
        .unwrap();
        let r = dispatch(Routes::All, "POST", "/bind", &body, &state).await;
        assert_eq!(r.status, StatusCode::OK);
        let answer: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(answer["Error"] == "", name == "p", "{answer}");
    }
    let filter =
        serde_json::to_vec(&json!({"Pod": pod("f", 4000, 30), "NodeNames": [NODE]})).unwrap();
    let r = dispatch(Routes::All, "POST", "/filter", &filter, &state).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = dispatch(Routes::All, "POST", "/filter", b"not json", &state).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = dispatch(Routes::All, "GET", "/metrics", b"", &state).await;
    assert_eq!(r.status, StatusCode::OK);
    let text = String::from_utf8(r.body).unwrap();
    for line in [
        "tessera_scheduler_decisions_total{outcome=\"bound\",verb=\"bind\"} 1",
        "tessera_scheduler_decisions_total{outcome=\"refused\",verb=\"bind\"} 1",
        "tessera_scheduler_failures_total{reason=\"no_fit\",verb=\"bind\"} 1",
        "tessera_scheduler_verb_seconds_count{verb=\"bind\"} 2",
        "tessera_scheduler_verb_seconds_count{verb=\"filter\"} 2",
        "tessera_scheduler_decisions_total{outcome=\"schedulable\",verb=\"filter\"} 1",
        "tessera_scheduler_decisions_total{outcome=\"error\",verb=\"filter\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
    let gpu = text
        .lines()
        .find(|l| l.starts_with("tessera_scheduler_gpu_allocated{") && l.contains("memory_mib"))
        .expect("allocated memory series");
    assert!(gpu.ends_with(" 4000"), "{gpu}");
    assert!(
        text.contains("tessera_scheduler_gpu_capacity{gpu=\""),
        "{text}"
    );
    // The webhook listener does not serve metrics.
    let hidden = dispatch(Routes::Webhook, "GET", "/metrics", b"", &state).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);

    let promtool = tessera_testkit::or_skip!(Promtool::find());
    let checked = promtool.check_metrics(&text);
    assert!(checked.success, "promtool: {}\n{text}", checked.said);
}
