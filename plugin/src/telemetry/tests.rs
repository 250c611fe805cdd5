use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::client::Body;
use serde_json::json;
use tessera_api::gpunode::{Device, GpuNodeSpec, GpuNodeStatus, Health, Summary};

use super::*;

const NOW: i64 = 1_800_000_000;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).expect("timestamp")
}

/// A node with one idle 80 GiB GPU whose status was written at `updated`.
fn node(name: &str, updated: Option<i64>) -> GpuNode {
    let mut n = GpuNode::new(name, GpuNodeSpec {});
    n.status = updated.map(|s| GpuNodeStatus {
        updated_at: Time(at(s)),
        agent_version: None,
        summary: Summary::default(),
        devices: vec![Device {
            uuid: "GPU-5e1a0000-0000-4000-8000-000000000001"
                .parse()
                .expect("uuid"),
            index: 0,
            model: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81920,
            sm_count: 108,
            numa_node: Some(0),
            nvlink_peers: Vec::new(),
            health: Health::Healthy,
            health_reason: None,
        }],
        allocations: Vec::new(),
        usage: Vec::new(),
    });
    n
}

fn args(limits: serde_json::Value, names: &[&str]) -> ExtenderArgs {
    ExtenderArgs {
        pod: json!({"metadata": {"name": "p", "namespace": "ml"},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}),
        nodes: None,
        node_names: Some(names.iter().map(|s| (*s).to_owned()).collect()),
    }
}

#[test]
fn the_limit_is_inclusive_and_works_both_ways() {
    let s = Staleness::default();
    assert_eq!(s.max_age(), Duration::from_secs(150));
    let now = at(NOW);
    assert_eq!(s.stale_reason(&node("n", Some(NOW - 150)), now), None);
    assert_eq!(s.stale_reason(&node("n", Some(NOW + 150)), now), None);
    let old = s
        .stale_reason(&node("n", Some(NOW - 151)), now)
        .expect("stale");
    assert!(
        old.contains("updated 151 s ago") && old.contains("limit 150 s"),
        "{old}"
    );
    let ahead = s
        .stale_reason(&node("n", Some(NOW + 151)), now)
        .expect("ahead");
    assert!(ahead.contains("151 s in the future"), "{ahead}");
    let none = s.stale_reason(&node("n", None), now).expect("no status");
    assert!(none.contains("no GpuNode status"), "{none}");
    assert_eq!(Staleness::new(9), Err(StalenessError { got_s: 9 }));
    assert!(
        Staleness::new(86_401)
            .unwrap_err()
            .to_string()
            .contains("10 to 86400")
    );
}

#[test]
fn stale_nodes_take_no_gpu_pods_and_say_why() {
    let nodes = [node("fresh", Some(NOW - 10)), node("old", Some(NOW - 200))];
    let snap = Snapshot::new(&nodes, Staleness::new(60).expect("limit"), at(NOW));
    let gpu_pod = args(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
        &["fresh", "old", "cpu-only"],
    );
    let r = snap.filter(&gpu_pod);
    assert_eq!(r.error, "");
    assert_eq!(r.node_names, Some(vec!["fresh".to_owned()]));
    let old = &r.failed_and_unresolvable_nodes["old"];
    assert!(
        old.contains("stale") && old.contains("200 s ago") && old.contains("limit 60 s"),
        "{old}"
    );
    assert!(r.failed_and_unresolvable_nodes["cpu-only"].contains("no GpuNode status"));
    // The same nodes with a limit they meet: both pass.
    let lax = Snapshot::new(&nodes, Staleness::new(300).expect("limit"), at(NOW));
    assert_eq!(
        lax.filter(&gpu_pod).node_names,
        Some(vec!["fresh".to_owned(), "old".to_owned()])
    );
    // A pod without GPUs is not affected by staleness.
    let plain = snap.filter(&args(json!({"cpu": "1"}), &["fresh", "old"]));
    assert_eq!(
        plain.node_names,
        Some(vec!["fresh".to_owned(), "old".to_owned()])
    );
}

fn object_json(n: &GpuNode, rv: &str) -> serde_json::Value {
    let mut v = serde_json::to_value(n).expect("json");
    v["metadata"]["resourceVersion"] = rv.into();
    v["metadata"]["uid"] = format!("uid-{}", n.metadata.name.as_deref().unwrap_or("")).into();
    v
}

fn reply(body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("response")
}

#[tokio::test]
async fn the_cache_follows_list_and_watch() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (cache, task) = Cache::spawn(client, async move {
        let _ = stop_rx.await;
    });
    let server = async move {
        let (req, send) = handle.next_request().await.expect("list");
        assert_eq!(req.uri().path(), "/apis/tessera.dev/v1alpha1/gpunodes");
        assert!(!req.uri().query().unwrap_or("").contains("watch=true"));
        let list = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeList",
                          "metadata": {"resourceVersion": "10"},
                          "items": [object_json(&node("a", Some(NOW)), "9")]});
        send.send_response(reply(serde_json::to_vec(&list).expect("json")));
        let (req, send) = handle.next_request().await.expect("watch");
        let q = req.uri().query().unwrap_or("").to_owned();
        assert!(
            q.contains("watch=true") && q.contains("resourceVersion=10"),
            "{q}"
        );
        let mut lines = Vec::new();
        for event in [
            json!({"type": "ADDED", "object": object_json(&node("b", Some(NOW - 500)), "11")}),
            json!({"type": "MODIFIED", "object": object_json(&node("a", Some(NOW - 20)), "12")}),
        ] {
            lines.extend(serde_json::to_vec(&event).expect("json"));
            lines.push(b'\n');
        }
        send.send_response(reply(lines));
        // Later re-watches stay unanswered.
        let _pending = handle.next_request().await;
        std::future::pending::<()>().await;
    };
    let server = tokio::spawn(server);
    tokio::time::timeout(Duration::from_secs(10), cache.ready())
        .await
        .expect("the first list is read");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let snap = loop {
        let snap = cache.snapshot(Staleness::new(60).expect("limit"), at(NOW));
        if snap.stale.contains_key("b") || tokio::time::Instant::now() > deadline {
            break snap;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(snap.view.node("a").is_some(), "{snap:?}");
    assert!(
        snap.stale.get("b").is_some_and(|r| r.contains("500 s ago")),
        "{snap:?}"
    );
    // No event since: the view is reused, the reasons name the age now.
    let limit = Staleness::new(60).expect("limit");
    let later = cache.snapshot(limit, at(NOW + 1));
    assert!(later.view.node("a").is_some(), "{later:?}");
    assert!(
        later
            .stale
            .get("b")
            .is_some_and(|r| r.contains("501 s ago")),
        "{later:?}"
    );
    // "a" was written at NOW - 20: fresh through NOW + 40, stale after,
    // with no event to say so.
    let edge = cache.snapshot(limit, at(NOW + 35));
    assert!(edge.view.node("a").is_some(), "{edge:?}");
    // Within the reuse cap of the view built at NOW + 35, so only the
    // flip instant can tell it to rebuild.
    let just_after = Timestamp::from_millisecond((NOW + 40) * 1000 + 1).expect("ts");
    assert!(cache.snapshot(limit, just_after).view.node("a").is_none());
    let gone = cache.snapshot(limit, at(NOW + 41));
    assert!(gone.view.node("a").is_none(), "{gone:?}");
    assert!(
        gone.stale.get("a").is_some_and(|r| r.contains("61 s ago")),
        "{gone:?}"
    );
    // And back (a clock set back): the view follows.
    assert!(cache.snapshot(limit, at(NOW)).view.node("a").is_some());
    let _ = stop_tx.send(());
    task.await.expect("cache task");
    server.abort();
}
