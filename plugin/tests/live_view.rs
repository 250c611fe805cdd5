//! `serve`'s routes over the live GpuNode cache, against a scripted fake
//! API server behind a real `kube::Client` (a `tower-test` mock service):
//! the fake lists and watches `GpuNode`s and answers the pod reads,
//! patches and bindings of `/bind`. The verdicts are judged against what
//! the fake published (its objects and timestamps) and what it recorded
//! bound, never against the scheduler's cache or reservation table.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Response, StatusCode};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use serde_json::{Value, json};
use tessera_scheduler::bind::Binder;
use tessera_scheduler::bind::reserve::Reservations;
use tessera_scheduler::server::{AppState, Routes, Telemetry, dispatch};
use tessera_scheduler::telemetry::{Cache, Staleness};
use tessera_testkit::apiserver::{self, Call, Pods};

const GPUNODES: &str = "/apis/tessera.dev/v1alpha1/gpunodes";

/// A GpuNode with one idle 10000 MiB GPU (its UUID made from the node's
/// name), its status written `age_s` seconds ago.
fn gpu_node(name: &str, age_s: i64) -> Value {
    let uuid = format!(
        "GPU-5e1a0000-0000-4000-8000-{:012x}",
        name.bytes().fold(0u64, |h, b| h * 31 + u64::from(b)) & 0xffff_ffff_ffff
    );
    let updated = Timestamp::from_second(Timestamp::now().as_second() - age_s).unwrap();
    json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name, "uid": format!("uid-{name}")}, "spec": {},
        "status": {"updatedAt": updated.to_string(),
            "devices": [{"uuid": uuid, "index": 0, "model": "Tesla T4", "memoryMiB": 10000,
                         "smCount": 40, "health": "Healthy"}]}})
}

/// A pending pod asking for one GPU share of `mem` MiB.
fn pod(name: &str, mem: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "resourceVersion": "1"},
        "spec": {"containers": [{"name": "main", "image": "cuda:12",
            "resources": {"limits": {"nvidia.com/gpu": "1",
                "nvidia.com/gpumem": mem.to_string(), "nvidia.com/gpucores": "10"}}}]},
        "status": {"phase": "Pending"}})
}

/// GpuNodes published as a list and a watch (their own resourceVersion
/// counter), and the pods `/bind` reads, patches and binds (the
/// workspace's fake pods).
#[derive(Clone, Debug, Default)]
struct FakeApi {
    pods: Pods,
    gpunodes: Arc<Mutex<GpuNodes>>,
}

#[derive(Debug, Default)]
struct GpuNodes {
    /// The last resourceVersion.
    rv: u64,
    /// The events: (resourceVersion, type, object).
    events: Vec<(u64, &'static str, Value)>,
}

impl FakeApi {
    fn start() -> (Self, kube::Client) {
        let api = Self::default();
        let server = api.clone();
        let client = apiserver::serve(move |call| {
            let server = server.clone();
            async move { server.answer(call).await }
        });
        (api, client)
    }

    /// Publishes a GpuNode as added or modified.
    fn publish(&self, kind: &'static str, mut node: Value) {
        let mut s = self.gpunodes.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        node["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.events.push((rv, kind, node));
    }

    fn add_pod(&self, pod: Value) {
        self.pods.insert(pod);
    }

    /// The nodes as they stand, and the resourceVersion of that list.
    fn current(&self) -> (Vec<Value>, u64) {
        let s = self.gpunodes.lock().unwrap();
        let mut nodes: BTreeMap<String, Value> = BTreeMap::new();
        for (_, _, n) in &s.events {
            nodes.insert(
                n["metadata"]["name"].as_str().unwrap().to_owned(),
                n.clone(),
            );
        }
        (nodes.into_values().collect(), s.rv)
    }

    async fn answer(&self, call: Call) -> Response<Body> {
        if call.method == Method::GET && call.path == GPUNODES {
            return self.list_or_watch(&call.query).await;
        }
        self.pods.answer(&call)
    }

    /// A list, or a watch answered with the events after its
    /// resourceVersion (waiting up to a second for one, then ending the
    /// stream so the watcher asks again).
    async fn list_or_watch(&self, query: &str) -> Response<Body> {
        if !query.contains("watch=true") {
            let (items, rv) = self.current();
            return apiserver::json(
                StatusCode::OK,
                &json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeList",
                    "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
            );
        }
        let since: u64 = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("resourceVersion="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            let lines: Vec<u8> = {
                let s = self.gpunodes.lock().unwrap();
                s.events
                    .iter()
                    .filter(|(rv, _, _)| *rv > since)
                    .flat_map(|(_, kind, object)| {
                        let mut l =
                            serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
                        l.push(b'\n');
                        l
                    })
                    .collect()
            };
            if !lines.is_empty() || tokio::time::Instant::now() > deadline {
                return apiserver::bytes(StatusCode::OK, lines);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn filter(state: &AppState, pod: &Value, nodes: &[&str]) -> Value {
    let body = serde_json::to_vec(&json!({"Pod": pod, "NodeNames": nodes})).unwrap();
    let r = dispatch(Routes::All, "POST", "/filter", &body, state).await;
    assert_eq!(r.status, StatusCode::OK);
    serde_json::from_slice(&r.body).unwrap()
}

async fn bind(state: &AppState, name: &str, node: &str) -> Value {
    let body = serde_json::to_vec(&json!({"PodName": name, "PodNamespace": "ml",
        "PodUID": format!("uid-{name}"), "Node": node}))
    .unwrap();
    let r = dispatch(Routes::All, "POST", "/bind", &body, state).await;
    assert_eq!(r.status, StatusCode::OK);
    serde_json::from_slice(&r.body).unwrap()
}

/// Polls `filter` until `done` holds for its answer (10 s at most).
async fn filter_until(
    state: &AppState,
    pod: &Value,
    nodes: &[&str],
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = filter(state, pod, nodes).await;
        if done(&r) || tokio::time::Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn live_state(client: kube::Client, max_age_s: u64, max_shares: u32) -> AppState {
    let (cache, _task) = Cache::spawn(client.clone(), std::future::pending());
    AppState {
        view: Telemetry::Live {
            cache,
            staleness: Staleness::new(max_age_s).unwrap(),
        },
        binder: Some(Binder::new(client, Reservations::new(max_shares))),
        ..AppState::default()
    }
}

#[tokio::test]
async fn filter_answers_from_the_watched_gpunodes_and_drops_them_when_stale() {
    let (api, client) = FakeApi::start();
    // Written 4 s ago with a 10 s limit: fresh now, stale 6 s from now
    // unless the agent writes again (it will not).
    api.publish("ADDED", gpu_node("gpu-a", 4));
    let state = live_state(client, 10, 10);
    state.view.ready().await;
    let p = pod("p", 4000);
    let first = filter(&state, &p, &["gpu-a", "gpu-b"]).await;
    assert_eq!(first["NodeNames"], json!(["gpu-a"]), "{first}");
    assert!(
        first["FailedAndUnresolvableNodes"]["gpu-b"]
            .as_str()
            .unwrap()
            .contains("no GpuNode status"),
        "{first}"
    );
    // A node appears through the watch: it becomes a candidate.
    api.publish("ADDED", gpu_node("gpu-b", 0));
    let both = filter_until(&state, &p, &["gpu-a", "gpu-b"], |r| {
        r["NodeNames"].as_array().is_some_and(|n| n.len() == 2)
    })
    .await;
    assert_eq!(both["NodeNames"], json!(["gpu-a", "gpu-b"]), "{both}");
    // gpu-a's agent stops writing: past the limit it is unresolvable with
    // its age, while gpu-b (written later) may still pass.
    let stale = filter_until(&state, &p, &["gpu-a"], |r| {
        r["FailedAndUnresolvableNodes"]["gpu-a"].is_string()
    })
    .await;
    let reason = stale["FailedAndUnresolvableNodes"]["gpu-a"]
        .as_str()
        .unwrap_or_else(|| panic!("gpu-a never went stale: {stale}"));
    assert!(
        reason.contains("stale") && reason.contains("s ago") && reason.contains("limit 10 s"),
        "{reason}"
    );
    assert_eq!(stale["NodeNames"], json!([]), "{stale}");
    // Binding there is refused too: no fresh telemetry.
    api.add_pod(pod("p", 4000));
    let refused = bind(&state, "p", "gpu-a").await;
    assert!(
        refused["Error"].as_str().unwrap().contains("gpu-a"),
        "{refused}"
    );
    assert!(api.pods.pod("ml/p")["spec"]["nodeName"].is_null());
    api.pods.assert_all_supported();
}

#[tokio::test]
async fn filter_counts_what_bind_reserved_before_telemetry_shows_it() {
    let (api, client) = FakeApi::start();
    api.publish("ADDED", gpu_node("gpu-a", 0));
    api.publish("ADDED", gpu_node("gpu-b", 0));
    let state = live_state(client, 150, 10);
    state.view.ready().await;
    api.add_pod(pod("big", 8000));
    let next = pod("next", 4000);
    let before = filter(&state, &next, &["gpu-a", "gpu-b"]).await;
    assert_eq!(before["NodeNames"], json!(["gpu-a", "gpu-b"]), "{before}");
    // 8000 of gpu-a's 10000 MiB bound; its GpuNode is not updated.
    assert_eq!(bind(&state, "big", "gpu-a").await["Error"], "");
    assert_eq!(api.pods.pod("ml/big")["spec"]["nodeName"], "gpu-a");
    let after = filter(&state, &next, &["gpu-a", "gpu-b"]).await;
    assert_eq!(after["NodeNames"], json!(["gpu-b"]), "{after}");
    let reason = after["FailedNodes"]["gpu-a"]
        .as_str()
        .or_else(|| after["FailedAndUnresolvableNodes"]["gpu-a"].as_str())
        .unwrap_or_else(|| panic!("gpu-a has no reason: {after}"));
    assert!(!reason.is_empty());
    // A pod that fits the 2000 MiB left still passes there.
    let small = filter(&state, &pod("small", 2000), &["gpu-a"]).await;
    assert_eq!(small["NodeNames"], json!(["gpu-a"]), "{small}");
    // Prioritize does not prefer the node with no room.
    let body = serde_json::to_vec(&json!({"Pod": next, "NodeNames": ["gpu-a", "gpu-b"]})).unwrap();
    let r = dispatch(Routes::All, "POST", "/prioritize", &body, &state).await;
    let scores: Value = serde_json::from_slice(&r.body).unwrap();
    let score = |h: &str| {
        scores
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["Host"] == h)
            .unwrap()["Score"]
            .as_i64()
            .unwrap()
    };
    assert!(score("gpu-a") < score("gpu-b"), "{scores}");
    api.pods.assert_all_supported();
}

#[tokio::test]
async fn filter_refuses_a_gpu_out_of_share_slots() {
    let (api, client) = FakeApi::start();
    api.publish("ADDED", gpu_node("gpu-a", 0));
    // One share per GPU: the first bind takes the only slot.
    let state = live_state(client, 150, 1);
    state.view.ready().await;
    api.add_pod(pod("first", 1000));
    assert_eq!(bind(&state, "first", "gpu-a").await["Error"], "");
    let r = filter(&state, &pod("second", 1000), &["gpu-a"]).await;
    assert_eq!(r["NodeNames"], json!([]), "{r}");
    assert!(
        r["FailedNodes"]["gpu-a"].is_string()
            || r["FailedAndUnresolvableNodes"]["gpu-a"].is_string(),
        "{r}"
    );
    api.pods.assert_all_supported();
}
