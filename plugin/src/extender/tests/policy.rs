//! The extender's placement policy against views built from `GpuNode`
//! telemetry: topology, live use and the running workload as the agent
//! reports them, with the right node worked out by hand in each test.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use tessera_api::GpuNode;
use tessera_api::gpunode::{
    Allocation, Device, DeviceUsage, GpuNodeSpec, GpuNodeStatus, Health, Summary,
};

use super::uuid;
use crate::extender::*;
use crate::placement::Workload;

/// An 80 GiB H100 numbered `n` on `numa` with NVLinks to `peers`.
fn device(n: u32, numa: Option<u32>, peers: &[u32]) -> Device {
    Device {
        uuid: uuid(n).parse().expect("uuid"),
        index: n,
        model: "NVIDIA H100 80GB HBM3".into(),
        memory_mib: 81920,
        sm_count: 132,
        numa_node: numa,
        nvlink_peers: peers
            .iter()
            .map(|&p| uuid(p).parse().expect("uuid"))
            .collect(),
        health: Health::Healthy,
        health_reason: None,
    }
}

/// A share of `cores` % and `mib` MiB on GPU `n` for `pod`/`container`.
fn share(n: u32, pod: &str, container: &str, mib: u64, cores: u32) -> Allocation {
    Allocation {
        device: uuid(n).parse().expect("uuid"),
        namespace: "ml".into(),
        pod: pod.into(),
        pod_uid: Some(format!("uid-{pod}")),
        container: container.into(),
        memory_mib: mib,
        cores_percent: cores,
        compute_mode: None,
    }
}

fn usage(n: u32, mib: u64, sm: u32) -> DeviceUsage {
    DeviceUsage {
        device: uuid(n).parse().expect("uuid"),
        memory_used_mib: mib,
        sm_util_percent: sm,
        processes: Some(1),
    }
}

fn gpu_node(
    name: &str,
    devices: Vec<Device>,
    allocations: Vec<Allocation>,
    usage: Vec<DeviceUsage>,
) -> NodeView {
    let mut n = GpuNode::new(name, GpuNodeSpec {});
    n.status = Some(GpuNodeStatus {
        updated_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        agent_version: None,
        summary: Summary::default(),
        devices,
        allocations,
        usage,
    });
    NodeView::from_gpu_node(&n)
}

fn pod(limits: serde_json::Value, annotations: serde_json::Value) -> serde_json::Value {
    json!({"metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
           "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}})
}

fn scores(pod: serde_json::Value, names: &[&str], view: &ClusterView) -> Vec<i64> {
    let args = ExtenderArgs {
        pod,
        nodes: None,
        node_names: Some(names.iter().map(|s| (*s).to_owned()).collect()),
    };
    prioritize(&args, view).iter().map(|h| h.score).collect()
}

#[test]
fn a_gpu_node_gives_topology_live_use_and_one_running_share_per_container() {
    let node = gpu_node(
        "n",
        vec![device(0, Some(0), &[1]), device(1, Some(1), &[0, 9])],
        vec![
            share(0, "a", "c", 10_000, 30),
            share(1, "a", "c", 10_000, 30),
            share(0, "b", "x", 20_000, 25),
        ],
        vec![usage(0, 35_000, 80), usage(1, 9_000, 20)],
    );
    assert_eq!(node.gpus[0].numa_node, Some(0));
    assert_eq!(node.gpus[1].nvlink_peers, [uuid(0), uuid(9)]);
    assert_eq!(
        (node.gpus[0].live_sm_percent, node.gpus[1].live_sm_percent),
        (80, 20)
    );
    assert_eq!(
        (node.gpus[0].used_mib, node.gpus[0].cores_used_percent),
        (35_000, 55),
        "memory: live use above the shares' 30000; cores: the shares' sum"
    );
    assert_eq!(
        node.running,
        [
            RunningShare {
                gpus: 2,
                memory_mib: 10_000,
                cores_percent: 30
            },
            RunningShare {
                gpus: 1,
                memory_mib: 20_000,
                cores_percent: 25
            },
        ]
    );
    let placed = fit::node_of(&node);
    assert_eq!(&*placed.gpus[0].nvlink, [1]);
    assert_eq!(
        &*placed.gpus[1].nvlink,
        [0],
        "a peer outside the node is dropped"
    );
    assert_eq!(placed.gpus[0].live_milli, 800);

    let view = ClusterView::new([node]);
    let none = fit::task_of(&[], &Default::default());
    let workload = view.workload_for(&none);
    let classes: Vec<(u32, u64, u32, f64)> = workload
        .classes()
        .iter()
        .map(|c| {
            let a = &c.task.gpus[0];
            (a.count, a.memory.mib_on(81920), a.milli, c.popularity)
        })
        .collect();
    assert_eq!(
        classes,
        [(2, 10_240, 300, 0.5), (1, 20_480, 250, 0.5)],
        "memory rounded up to {WORKLOAD_MEMORY_STEP_MIB} MiB"
    );
}

#[test]
fn a_new_cluster_keeps_room_for_pods_like_the_one_being_placed() {
    let view = ClusterView::new([gpu_node("n", vec![device(0, None, &[])], vec![], vec![])]);
    let request = pod_request(&pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5k", "nvidia.com/gpucores": "40"}),
        json!({}),
    ))
    .unwrap();
    let task = fit::task_of(&request.shares, &request.policy);
    let workload = view.workload_for(&task);
    assert_eq!(workload.classes().len(), 1);
    assert_eq!(workload.classes()[0].task, task);
}

/// Running workload: 50 % shares (a node "pool" full of them). The new
/// pod asks 10 %. "wide" has 40 % committed, "tight" 45 %: after the pod,
/// wide keeps 50 % free (one more running-class share fits), tight 45 %
/// (none does). Best fit takes tight; the default keeps wide's room.
#[test]
fn the_default_keeps_room_for_the_running_workload_where_binpack_does_not() {
    let view = ClusterView::new([
        gpu_node(
            "pool",
            vec![device(0, None, &[])],
            vec![share(0, "r1", "c", 1000, 50), share(0, "r2", "c", 1000, 50)],
            vec![],
        ),
        gpu_node(
            "wide",
            vec![device(1, None, &[])],
            vec![share(1, "w", "c", 1000, 40)],
            vec![],
        ),
        gpu_node(
            "tight",
            vec![device(2, None, &[])],
            vec![share(2, "t", "c", 1000, 45)],
            vec![],
        ),
    ]);
    let limits =
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1k", "nvidia.com/gpucores": "10"});
    let nodes = ["pool", "wide", "tight"];
    let default = scores(pod(limits.clone(), json!({})), &nodes, &view);
    assert_eq!(default[0], MIN_PRIORITY, "pool is full");
    assert!(default[1] > default[2], "default {default:?}");
    let explicit = scores(
        pod(
            limits.clone(),
            json!({"tessera.dev/placement": "fragmentation"}),
        ),
        &nodes,
        &view,
    );
    assert_eq!(explicit, default);
    let binpack = scores(
        pod(limits, json!({"tessera.dev/placement": "binpack"})),
        &nodes,
        &view,
    );
    assert!(binpack[2] > binpack[1], "binpack {binpack:?}");
}

#[test]
fn an_elastic_pod_goes_where_measured_use_leaves_it_idle_sms() {
    // Same commitments (30 %); on "hot" the elastic tenants use 95 %.
    let view = ClusterView::new([
        gpu_node(
            "hot",
            vec![device(0, None, &[])],
            vec![share(0, "a", "c", 1000, 30)],
            vec![usage(0, 1000, 95)],
        ),
        gpu_node(
            "cool",
            vec![device(1, None, &[])],
            vec![share(1, "b", "c", 1000, 30)],
            vec![usage(1, 1000, 30)],
        ),
    ]);
    let limits =
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1k", "nvidia.com/gpucores": "20"});
    let elastic = scores(
        pod(
            limits.clone(),
            json!({"tessera.dev/compute-mode": "elastic"}),
        ),
        &["hot", "cool"],
        &view,
    );
    assert_eq!(elastic, [MAX_PRIORITY - 1, MAX_PRIORITY]);
    let hard = scores(
        pod(limits, json!({"tessera.dev/compute-mode": "hard"})),
        &["hot", "cool"],
        &view,
    );
    assert_eq!(
        hard,
        [MAX_PRIORITY, MAX_PRIORITY],
        "a hard share's SMs are its own"
    );
}

#[test]
fn numa_binding_refuses_a_node_whose_gpus_straddle_numa_nodes() {
    let view = ClusterView::new([
        gpu_node(
            "split",
            vec![device(0, Some(0), &[]), device(1, Some(1), &[])],
            vec![],
            vec![],
        ),
        gpu_node(
            "local",
            vec![device(2, Some(0), &[]), device(3, Some(0), &[])],
            vec![],
            vec![],
        ),
    ]);
    let limits = json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1k"});
    let args = |annotations| ExtenderArgs {
        pod: pod(limits.clone(), annotations),
        nodes: None,
        node_names: Some(vec!["split".into(), "local".into()]),
    };
    let bound = filter(&args(json!({"tessera.dev/numa-bind": "true"})), &view);
    assert_eq!(bound.node_names, Some(vec!["local".into()]));
    let reason = &bound.failed_and_unresolvable_nodes["split"];
    assert!(reason.contains("on one NUMA node"), "{reason}");
    let free = filter(&args(json!({})), &view);
    assert_eq!(free.node_names, Some(vec!["split".into(), "local".into()]));
}

#[test]
fn a_two_gpu_pod_takes_an_nvlink_pair_and_bind_places_it_the_same_way() {
    // Pairs (0,1) and (2,3) are linked; 1 and 2 carry shares, so best fit
    // alone would take 1 and 2 across the pairs.
    let node = gpu_node(
        "n",
        vec![
            device(0, Some(0), &[1]),
            device(1, Some(0), &[0]),
            device(2, Some(1), &[3]),
            device(3, Some(1), &[2]),
        ],
        vec![share(1, "a", "c", 1000, 30), share(2, "b", "c", 1000, 30)],
        vec![],
    );
    let request = pod_request(&pod(
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1k", "nvidia.com/gpucores": "20"}),
        json!({"tessera.dev/placement": "binpack"}),
    ))
    .unwrap();
    let placed = place(
        &request.shares,
        &request.policy,
        &Workload::default(),
        &node,
    )
    .unwrap();
    let mut gpus = placed.containers[0].1.clone();
    gpus.sort();
    assert!(
        gpus == [uuid(0), uuid(1)] || gpus == [uuid(2), uuid(3)],
        "{gpus:?}"
    );
}
