//! Filter + prioritize latency per pod through the extender's own code:
//! the simulated cluster is turned into the extender's [`ClusterView`] and
//! each sampled trace task into the Pod JSON kube-scheduler would send.
//!
//! The trace has no GPU memory, so each card is shown with a nominal 1000
//! MiB of memory, committed in proportion to its compute (1 milli-GPU =
//! 1 MiB), and a task of `gpu_milli` < 1000 asks for that many MiB and
//! `ceil(gpu_milli / 10)` % of SMs; a whole-GPU task asks for
//! `nvidia.com/gpu` alone (whole cards). The view's workload estimate is
//! the trace's GPU tasks in that form, as a cluster running them would
//! report it.

use std::time::Instant;

use serde_json::{Value, json};

use super::report::Latency;
use crate::extender::{self, ClusterView, ExtenderArgs, GpuView, NodeView};
use crate::placement::rng::Rng;
use crate::placement::{Node, Task, WHOLE_GPU, Workload};

/// The extender's view of the simulated nodes.
pub fn view_of(nodes: &[Node]) -> ClusterView {
    ClusterView::new(nodes.iter().map(|n| {
        NodeView {
            name: n.name.to_string(),
            gpus: n
                .gpus
                .iter()
                .map(|g| GpuView {
                    uuid: g.uuid.to_string(),
                    model: g.model.to_string(),
                    memory_mib: u64::from(WHOLE_GPU),
                    used_mib: u64::from(g.used_milli.min(WHOLE_GPU)),
                    cores_used_percent: g.used_milli.div_ceil(10),
                    healthy: g.healthy,
                    ..GpuView::default()
                })
                .collect(),
            ..NodeView::default()
        }
    }))
}

/// The Pod JSON of a trace task (see the module docs).
pub fn pod_json(name: &str, task: &Task) -> Value {
    let mut limits = serde_json::Map::new();
    if let Some(ask) = task.gpus.first() {
        limits.insert("nvidia.com/gpu".into(), json!(ask.count.to_string()));
        if ask.milli < WHOLE_GPU {
            limits.insert("nvidia.com/gpumem".into(), json!(ask.milli.to_string()));
            limits.insert(
                "nvidia.com/gpucores".into(),
                json!(ask.milli.div_ceil(10).to_string()),
            );
        }
    }
    limits.insert("cpu".into(), json!(format!("{}m", task.cpu_milli)));
    limits.insert("memory".into(), json!(format!("{}Mi", task.memory_mib)));
    json!({"metadata": {"name": name, "namespace": "sim"},
           "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}})
}

/// Times filter then prioritize (on filter's passing nodes) for `pods`
/// GPU tasks drawn with `seed` from `tasks`, each against every node.
pub fn measure(nodes: &[Node], tasks: &[Task], pods: usize, seed: u64) -> Option<Latency> {
    let gpu_tasks: Vec<&Task> = tasks.iter().filter(|t| t.gpu_milli() > 0).collect();
    if gpu_tasks.is_empty() || pods == 0 {
        return None;
    }
    let classes: Vec<Task> = gpu_tasks
        .iter()
        .filter_map(|t| extender::pod_request(&pod_json("class", t)).ok())
        .map(|r| extender::fit::task_of(&r.shares, &r.policy))
        .collect();
    let view = view_of(nodes).with_workload(Workload::from_tasks(&classes));
    let names: Vec<String> = nodes.iter().map(|n| n.name.to_string()).collect();
    let mut rng = Rng::new(seed);
    let mut samples = Vec::with_capacity(pods);
    for i in 0..pods {
        let task = gpu_tasks[rng.below(gpu_tasks.len() as u64) as usize];
        let pod = pod_json(&format!("pod-{i}"), task);
        let start = Instant::now();
        let filtered = extender::filter(
            &ExtenderArgs {
                pod: pod.clone(),
                nodes: None,
                node_names: Some(names.clone()),
            },
            &view,
        );
        let passing = filtered.node_names.unwrap_or_default();
        let scores = extender::prioritize(
            &ExtenderArgs {
                pod,
                nodes: None,
                node_names: Some(passing),
            },
            &view,
        );
        std::hint::black_box(scores);
        samples.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    Some(Latency::from_samples(samples, nodes.len()))
}
