use serde_json::json;

use super::*;
use crate::placement::{Score, Workload};

const A100: &str = "NVIDIA A100-SXM4-80GB";
const T4: &str = "Tesla T4";

/// The placement policy's own tests, over views built from telemetry.
mod policy;

fn uuid(n: u32) -> String {
    format!("GPU-5e1a0000-0000-4000-8000-{n:012x}")
}

fn gpu(n: u32, model: &str, memory_mib: u64, used_mib: u64, cores: u32) -> GpuView {
    GpuView {
        uuid: uuid(n),
        model: model.into(),
        memory_mib,
        used_mib,
        cores_used_percent: cores,
        healthy: true,
        ..GpuView::default()
    }
}

fn node(name: &str, gpus: Vec<GpuView>) -> NodeView {
    NodeView {
        name: name.into(),
        gpus,
        ..NodeView::default()
    }
}

fn pod(limits: serde_json::Value, annotations: serde_json::Value) -> serde_json::Value {
    json!({"metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
           "spec": {"containers": [{"name": "train", "resources": {"limits": limits}}]}})
}

fn args(pod: serde_json::Value, names: &[&str]) -> ExtenderArgs {
    ExtenderArgs {
        pod,
        nodes: None,
        node_names: Some(names.iter().map(|s| (*s).to_owned()).collect()),
    }
}

fn design_pod() -> serde_json::Value {
    pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k", "nvidia.com/gpucores": "30"}),
        json!({}),
    )
}

/// Three nodes: roomy, busy (memory nearly full), and a CPU node without
/// telemetry.
fn cluster() -> ClusterView {
    ClusterView::new([
        node(
            "roomy",
            vec![gpu(0, A100, 81920, 0, 0), gpu(1, A100, 81920, 40000, 50)],
        ),
        node("busy", vec![gpu(2, A100, 81920, 80000, 10)]),
    ])
}

#[test]
fn filter_sorts_nodes_into_pass_busy_and_never() {
    let result = filter(
        &args(design_pod(), &["roomy", "busy", "cpu-only"]),
        &cluster(),
    );
    assert_eq!(result.error, "");
    assert_eq!(result.node_names, Some(vec!["roomy".to_owned()]));
    assert!(result.nodes.is_none());
    let busy = &result.failed_nodes["busy"];
    assert!(
        busy.contains(
            "needs 1 GPU(s) with 4000 MiB and 30 percent of SMs free; 0 of 1 usable GPUs have room"
        ),
        "{busy}"
    );
    assert_eq!(
        result.failed_and_unresolvable_nodes["cpu-only"],
        "no tessera GPU telemetry for this node (no GpuNode status)"
    );
    assert_eq!(
        result.failed_nodes.len() + result.failed_and_unresolvable_nodes.len(),
        2
    );
}

#[test]
fn cores_are_a_limit_too() {
    let view = ClusterView::new([node("n", vec![gpu(0, A100, 81920, 0, 80)])]);
    let result = filter(&args(design_pod(), &["n"]), &view);
    assert!(result.failed_nodes.contains_key("n"), "{result:?}");
    let view = ClusterView::new([node("n", vec![gpu(0, A100, 81920, 0, 70)])]);
    assert_eq!(
        filter(&args(design_pod(), &["n"]), &view).node_names,
        Some(vec!["n".into()])
    );
}

#[test]
fn a_whole_card_request_needs_an_untouched_card() {
    let whole = pod(json!({"nvidia.com/gpu": "1"}), json!({}));
    let view = ClusterView::new([
        node("shared", vec![gpu(0, A100, 81920, 1, 0)]),
        node("free", vec![gpu(1, A100, 81920, 0, 0)]),
    ]);
    let result = filter(&args(whole, &["shared", "free"]), &view);
    assert_eq!(result.node_names, Some(vec!["free".into()]));
    assert!(result.failed_nodes["shared"].contains("100 percent of memory and 100 percent of SMs"));
}

#[test]
fn multi_gpu_requests_need_distinct_cards() {
    let two = pod(
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1k"}),
        json!({}),
    );
    let view = ClusterView::new([
        node("one", vec![gpu(0, A100, 81920, 0, 0)]),
        node(
            "two",
            vec![gpu(1, A100, 81920, 0, 0), gpu(2, A100, 81920, 0, 0)],
        ),
    ]);
    let result = filter(&args(two, &["one", "two"]), &view);
    assert_eq!(result.node_names, Some(vec!["two".into()]));
    // One card can never be two: preemption would not help.
    assert!(result.failed_and_unresolvable_nodes["one"].contains("1 of 1 usable GPUs have room"));
}

#[test]
fn containers_of_one_pod_count_against_each_other() {
    let object = json!({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6k"}}},
        {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6k"}}}
    ]}});
    let small = ClusterView::new([node("n", vec![gpu(0, T4, 15360, 0, 0)])]);
    assert_eq!(
        filter(&args(object.clone(), &["n"]), &small).node_names,
        Some(vec!["n".into()])
    );
    let smaller = ClusterView::new([node("n", vec![gpu(0, T4, 11000, 0, 0)])]);
    let result = filter(&args(object, &["n"]), &smaller);
    assert!(result.failed_and_unresolvable_nodes["n"].starts_with("container \"b\""));
}

#[test]
fn unhealthy_gpus_and_selectors_exclude_cards() {
    let mut sick = gpu(0, A100, 81920, 0, 0);
    sick.healthy = false;
    let view = ClusterView::new([
        node("sick", vec![sick]),
        node("t4", vec![gpu(1, T4, 15360, 0, 0)]),
        node("a100", vec![gpu(2, A100, 81920, 0, 0)]),
    ]);
    let wants_a100 = pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1k"}),
        json!({"tessera.dev/gpu-model-include": "a100"}),
    );
    let result = filter(&args(wants_a100, &["sick", "t4", "a100"]), &view);
    assert_eq!(result.node_names, Some(vec!["a100".into()]));
    assert!(result.failed_and_unresolvable_nodes["sick"].contains("(1 unhealthy or outside"));
    assert!(result.failed_and_unresolvable_nodes["t4"].contains("0 of 0 usable GPUs"));

    let not_this_one = pod(
        json!({"nvidia.com/gpu": "1"}),
        json!({"tessera.dev/gpu-uuid-exclude": uuid(2)}),
    );
    let result = filter(&args(not_this_one, &["t4", "a100"]), &view);
    assert_eq!(result.node_names, Some(vec!["t4".into()]));
}

#[test]
fn invalid_pods_fail_through_the_error_field() {
    let bad = pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"}),
        json!({}),
    );
    let result = filter(&args(bad, &["roomy"]), &cluster());
    assert_eq!(result.node_names, None);
    assert!(
        result
            .error
            .starts_with("pod ml/p: container \"train\": nvidia.com/gpucores is 101"),
        "{}",
        result.error
    );

    let result = filter(
        &args(json!({"spec": {"containers": 7}}), &["roomy"]),
        &cluster(),
    );
    assert!(
        result.error.starts_with("pod could not be read: "),
        "{}",
        result.error
    );
}

#[test]
fn pods_without_gpus_pass_everywhere() {
    let cpu = pod(json!({"cpu": "1"}), json!({}));
    let result = filter(&args(cpu, &["roomy", "cpu-only"]), &cluster());
    assert_eq!(
        result.node_names,
        Some(vec!["roomy".into(), "cpu-only".into()])
    );
}

#[test]
fn full_node_lists_come_back_filtered() {
    let nodes = json!({"kind": "NodeList", "apiVersion": "v1", "items": [
        {"metadata": {"name": "roomy", "labels": {"x": "y"}}},
        {"metadata": {"name": "busy"}}
    ]});
    let request = ExtenderArgs {
        pod: design_pod(),
        nodes: Some(nodes),
        node_names: None,
    };
    let result = filter(&request, &cluster());
    let kept = result.nodes.unwrap();
    assert_eq!(kept["kind"], "NodeList");
    assert_eq!(kept["items"].as_array().unwrap().len(), 1);
    assert_eq!(kept["items"][0]["metadata"]["labels"]["x"], "y");
    assert_eq!(result.node_names, Some(vec!["roomy".into()]));
}

#[test]
fn binpack_prefers_the_fuller_card_and_spread_the_emptier() {
    let node = node(
        "n",
        vec![gpu(0, A100, 81920, 0, 0), gpu(1, A100, 81920, 40000, 50)],
    );
    let none = Workload::default();
    // The default (fragmentation-aware) with nothing to keep room for
    // falls to its tie-break, the fuller card; so does binpack.
    let request = pod_request(&design_pod()).unwrap();
    let packed = place(&request.shares, &request.policy, &none, &node).unwrap();
    assert_eq!(packed.containers, [("train".to_owned(), vec![uuid(1)])]);
    let binpack = pod_request(&pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k"}),
        json!({"tessera.dev/placement": "binpack"}),
    ))
    .unwrap();
    let packed = place(&binpack.shares, &binpack.policy, &none, &node).unwrap();
    assert_eq!(packed.containers[0].1, [uuid(1)]);

    let spread = pod_request(&pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k"}),
        json!({"tessera.dev/placement": "spread"}),
    ))
    .unwrap();
    let spread = place(&spread.shares, &spread.policy, &none, &node).unwrap();
    assert_eq!(spread.containers[0].1, [uuid(0)]);
}

#[test]
fn scores_follow_the_placement_policy() {
    let view = ClusterView::new([
        node("empty", vec![gpu(0, A100, 100_000, 0, 0)]),
        node("half", vec![gpu(1, A100, 100_000, 50_000, 50)]),
    ]);
    let pack = pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10k", "nvidia.com/gpucores": "10"}),
        json!({}),
    );
    let scores = prioritize(&args(pack, &["empty", "half", "missing"]), &view);
    assert_eq!(
        scores,
        [
            HostPriority {
                host: "empty".into(),
                score: 9
            },
            HostPriority {
                host: "half".into(),
                score: 10
            },
            HostPriority {
                host: "missing".into(),
                score: 0
            },
        ]
    );
    let scores_as = |placement: &str| -> Vec<i64> {
        let pod = pod(
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10k", "nvidia.com/gpucores": "10"}),
            json!({"tessera.dev/placement": placement}),
        );
        prioritize(&args(pod, &["empty", "half"]), &view)
            .iter()
            .map(|h| h.score)
            .collect()
    };
    assert_eq!(scores_as("spread"), [10, 9]);
    assert_eq!(scores_as("binpack"), [9, 10]);
}

#[test]
fn scores_stay_in_range_and_unreadable_pods_score_zero() {
    // Fourteen distinct scores, two equal, one unfit node.
    let mut scores: Vec<Option<Score>> = (0..14)
        .map(|i| Some(Score([1.0, f64::from(i), 0.0])))
        .collect();
    scores.push(Some(Score([1.0, 13.0, 0.0])));
    scores.push(None);
    let ranked = rank_scores(&scores);
    assert_eq!(ranked[13], MAX_PRIORITY, "the best");
    assert_eq!(ranked[14], MAX_PRIORITY, "equal to the best");
    assert_eq!(ranked[12], MAX_PRIORITY - 1);
    assert_eq!(
        ranked[0],
        MIN_PRIORITY + 1,
        "every fitting node above an unfit one"
    );
    assert_eq!(ranked[15], MIN_PRIORITY);
    assert!(
        ranked
            .iter()
            .all(|s| (MIN_PRIORITY..=MAX_PRIORITY).contains(s))
    );
    let scores = prioritize(&args(json!("not a pod"), &["roomy"]), &cluster());
    assert_eq!(
        scores,
        [HostPriority {
            host: "roomy".into(),
            score: 0
        }]
    );
}

#[test]
fn wire_format_uses_go_field_names() {
    let request: ExtenderArgs = serde_json::from_value(json!({
        "Pod": design_pod(), "Nodes": null, "NodeNames": ["roomy", "busy"]
    }))
    .unwrap();
    assert_eq!(request.candidate_names(), ["roomy", "busy"]);
    let wire = serde_json::to_value(filter(&request, &cluster())).unwrap();
    let mut keys: Vec<&str> = wire
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "Error",
            "FailedAndUnresolvableNodes",
            "FailedNodes",
            "NodeNames",
            "Nodes"
        ]
    );
    assert_eq!(wire["Nodes"], serde_json::Value::Null);
    assert_eq!(wire["NodeNames"], json!(["roomy"]));
    let priorities = serde_json::to_value(prioritize(&request, &cluster())).unwrap();
    assert_eq!(
        priorities[0],
        json!({"Host": "roomy", "Score": priorities[0]["Score"]})
    );
    assert!(priorities[0]["Score"].is_i64());
    let bind: ExtenderBindingArgs = serde_json::from_value(json!({
        "PodName": "p", "PodNamespace": "ml", "PodUID": "u", "Node": "roomy"
    }))
    .unwrap();
    assert_eq!(bind.node, "roomy");
    assert_eq!(
        serde_json::to_value(ExtenderBindingResult::default()).unwrap(),
        json!({"Error": ""})
    );
}

#[test]
fn a_gpu_node_becomes_a_view_committing_its_shares_and_live_use() {
    let a = "GPU-00000000-0000-4000-8000-00000000000a";
    let b = "GPU-00000000-0000-4000-8000-00000000000b";
    let node: tessera_api::GpuNode = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n1"}, "spec": {},
        "status": {"updatedAt": "2026-12-01T09:00:00Z",
            "devices": [
                {"uuid": a, "index": 0, "model": A100, "memoryMiB": 81920, "smCount": 108,
                 "health": "Healthy"},
                {"uuid": b, "index": 1, "model": A100, "memoryMiB": 81920, "smCount": 108,
                 "health": "Unhealthy", "healthReason": "xid 79"}],
            "allocations": [
                {"device": a, "namespace": "ml", "pod": "p", "container": "c",
                 "memoryMiB": 10000, "coresPercent": 30},
                {"device": a, "namespace": "ml", "pod": "q", "container": "c",
                 "memoryMiB": 5000, "coresPercent": 20}],
            // b holds memory outside any share (a process that bypassed
            // the interposer): live use counts as committed.
            "usage": [
                {"device": a, "memoryUsedMiB": 9000, "smUtilPercent": 40},
                {"device": b, "memoryUsedMiB": 30000, "smUtilPercent": 0}]}
    }))
    .unwrap();
    let view = NodeView::from_gpu_node(&node);
    assert_eq!(view.name, "n1");
    assert_eq!(view.gpus.len(), 2);
    assert_eq!(view.gpus[0].uuid, a);
    assert_eq!(view.gpus[0].used_mib, 15000);
    assert_eq!(view.gpus[0].cores_used_percent, 50);
    assert!(view.gpus[0].healthy);
    assert_eq!(view.gpus[1].used_mib, 30000);
    assert_eq!(view.gpus[1].cores_used_percent, 0);
    assert!(!view.gpus[1].healthy);

    let bare: tessera_api::GpuNode = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n2"}, "spec": {}}))
    .unwrap();
    assert!(NodeView::from_gpu_node(&bare).gpus.is_empty());
}

/// A 100 % SM share asks for a whole card: a GPU holding a memory-only
/// share (0 % SMs) is not idle, so only the untouched GPU qualifies, and a
/// node with none untouched is busy.
#[test]
fn whole_gpu_shares_take_only_idle_gpus() {
    let view = ClusterView::new([
        node("shared", vec![gpu(0, A100, 81920, 1000, 0)]),
        node("idle", vec![gpu(1, A100, 81920, 0, 0)]),
    ]);
    let whole = pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k", "nvidia.com/gpucores": "100"}),
        json!({}),
    );
    let result = filter(&args(whole, &["shared", "idle"]), &view);
    assert_eq!(result.node_names, Some(vec!["idle".into()]));
    assert!(
        result.failed_nodes["shared"].contains("0 of 1 usable GPUs have room"),
        "{result:?}"
    );
}
