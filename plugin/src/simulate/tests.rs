//! Trace parsing with bad inputs named, and inflation on synthetic traces
//! whose outcome is worked out by hand.

use std::path::PathBuf;

use super::trace::{TraceError, read_nodes, read_pods};
use super::*;
use crate::placement::Models;

/// Writes `text` to a fresh file under the temp directory (a new name on
/// every call: tests run in parallel).
fn file(name: &str, text: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tessera-sim-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

const NODES: &str =
    "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,1,T4\nn1,64000,262144,1,T4\n";

#[test]
fn node_and_pod_lists_are_read_by_header_name() {
    let nodes = read_nodes(&file(
        "n.csv",
        "model,gpu,sn,memory_mib,cpu_milli\nV100M32,8,a,393216,96000\n",
    ))
    .unwrap();
    assert_eq!(&*nodes[0].name, "a");
    assert_eq!(nodes[0].gpus.len(), 8);
    assert_eq!(&*nodes[0].gpus[7].model, "V100M32");
    assert_eq!(nodes[0].cpu_milli.unwrap().capacity, 96000);
    // The multigpu20 form: no gpu_spec and no timing columns.
    let pods = read_pods(&file(
        "p.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,6000,12288,1,460\np1,8000,30517,0,0\n",
    ))
    .unwrap();
    assert_eq!(pods[0].task.gpu_milli(), 460);
    assert!(pods[1].task.gpus.is_empty());
    let spec = read_pods(&file(
        "s.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1,1,2,1000,V100M16|V100M32\n",
    ))
    .unwrap();
    assert_eq!(
        spec[0].task.models,
        crate::placement::Models::OneOf(vec!["V100M16".into(), "V100M32".into()])
    );
    assert_eq!(spec[0].task.gpu_milli(), 2000);
}

fn pod_error(text: &str) -> String {
    let path = file("bad.csv", text);
    let e = read_pods(&path).unwrap_err();
    let message = e.to_string();
    assert!(
        message.starts_with(&path.display().to_string()),
        "{message}"
    );
    message
}

#[test]
fn bad_inputs_name_file_line_and_column() {
    let h = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n";
    let m = pod_error(&format!("{h}p0,6000,12288,1,460\np1,6000,x12,1,460\n"));
    assert!(
        m.ends_with("line 3, column \"memory_mib\": \"x12\" is not a whole number ≥ 0"),
        "{m}"
    );
    let m = pod_error(&format!("{h}p0,6000,12288,1,1460\n"));
    assert!(
        m.contains("line 2, column \"gpu_milli\": 1460 is above the most accepted, 1000"),
        "{m}"
    );
    let m = pod_error(&format!("{h}p0,6000,12288,0,500\n"));
    assert!(
        m.contains("column \"gpu_milli\": 500 with num_gpu 0"),
        "{m}"
    );
    let m = pod_error(&format!("{h}p0,6000,12288,2,0\n"));
    assert!(m.contains("column \"gpu_milli\": 0 with num_gpu 2"), "{m}");
    let m = pod_error(&format!("{h}p0,6000,12288,1\n"));
    assert!(
        m.contains("line 2, column \"record\": 4 fields, header has 5"),
        "{m}"
    );
    let m = pod_error("name,cpu_milli,num_gpu,gpu_milli\np0,1,1,1\n");
    assert!(m.contains("line 1: missing column \"memory_mib\""), "{m}");
    let m = pod_error(h);
    assert!(m.ends_with("no records after the header"), "{m}");
    let m = pod_error("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,1,10,T4||A10\n");
    assert!(
        m.contains("column \"gpu_spec\": \"T4||A10\" has an empty model name"),
        "{m}"
    );
    let e = read_nodes(&file(
        "bn.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,\n",
    ))
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("line 2, column \"model\": empty, but the node has 2 GPU(s)"),
        "{e}"
    );
    let e = read_nodes(&PathBuf::from("/nonexistent/nodes.csv")).unwrap_err();
    assert!(matches!(e, TraceError::Read { .. }), "{e}");
    assert_eq!(e.to_string(), "/nonexistent/nodes.csv: cannot read");
}

fn options(nodes: &str, pods: &str, policies: Vec<Policy>) -> Options {
    Options {
        nodes: file("nodes.csv", nodes),
        pods: file("pods.csv", pods),
        policies,
        seeds: vec![1, 2],
        latency_pods: 0,
        bound: false,
    }
}

/// Two 1-GPU nodes (2000 milli), every task 600: tasks arrive until
/// 2400 are requested (4 tasks); each GPU takes one (400 left < 600), so
/// 1200 of 2400 are allocated: share 0.5, 0.8 GPUs unallocated — for
/// every policy and seed.
#[test]
fn inflation_of_a_single_class_trace_has_the_worked_outcome() {
    let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,600\n";
    let outcome = simulate(&options(NODES, pods, Policy::ALL.to_vec())).unwrap();
    for report in &outcome.policies {
        for run in &report.runs {
            assert_eq!(run.arrived, 4, "{run:?}");
            assert_eq!(run.placed, 2, "{run:?}");
            assert_eq!(run.requested_milli, 2400);
            assert_eq!(run.allocated_milli, 1200);
        }
        assert!((report.allocated_share() - 0.5).abs() < 1e-12);
        assert!((report.unallocated_gpus() - 0.8).abs() < 1e-12);
        let json = report.to_json();
        assert_eq!(json["policy"], report.policy.name());
        assert_eq!(json["allocated_share"], 0.5);
        assert_eq!(json["unallocated_gpus"], 0.8);
    }
}

/// Node CPU is respected: one 1-GPU node with 4 cores; tasks ask for 3
/// cores and 300 milli. Only one fits (CPU), though the GPU has room for
/// three: requests stop at 1200 (4 tasks), 300 allocated.
#[test]
fn node_cpu_limits_what_the_gpus_could_take() {
    let nodes = "sn,cpu_milli,memory_mib,gpu,model\nn0,4000,262144,1,T4\n";
    let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,3000,1024,1,300\n";
    let outcome = simulate(&options(nodes, pods, vec![Policy::Tessera])).unwrap();
    let run = &outcome.policies[0].runs[0];
    assert_eq!((run.arrived, run.placed, run.allocated_milli), (4, 1, 300));
}

/// A model constraint no node satisfies: nothing is allocated.
#[test]
fn gpu_spec_is_honoured() {
    let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,1024,1,500,V100M16\n";
    let outcome = simulate(&options(NODES, pods, vec![Policy::Binpack])).unwrap();
    let run = &outcome.policies[0].runs[0];
    assert_eq!((run.placed, run.allocated_milli), (0, 0));
    assert!((outcome.policies[0].unallocated_gpus() - 2.0).abs() < 1e-12);
}

#[test]
fn traces_without_gpu_tasks_or_gpus_are_refused() {
    let cpu_only = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,0,0\n";
    let e = simulate(&options(NODES, cpu_only, vec![Policy::Fgd])).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("no task asks for GPU; workload inflation needs at least one"),
        "{e}"
    );
    let no_gpu = "sn,cpu_milli,memory_mib,gpu,model\nn0,4000,1024,0,\n";
    let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\n";
    let e = simulate(&options(no_gpu, pods, vec![Policy::Fgd])).unwrap_err();
    assert!(e.to_string().ends_with("no node has a GPU"), "{e}");
}

/// The latency measurement runs the extender's filter and prioritize on
/// the simulated cluster: the Pod JSON it builds must pass filter on a
/// node with room and fail on a full one.
#[test]
fn latency_pods_go_through_the_extender() {
    use crate::extender::{ExtenderArgs, filter};
    use crate::placement::{Gpu, Node};
    let gpu = |used| Gpu {
        uuid: format!("GPU-{used}").into(),
        model: "T4".into(),
        memory_mib: 0,
        used_mib: 0,
        used_milli: used,
        healthy: true,
        ..Gpu::default()
    };
    let node = |name: &str, used| Node {
        name: name.into(),
        cpu_milli: None,
        memory_mib: None,
        gpus: vec![gpu(used)],
    };
    let nodes = [node("room", 500), node("full", 600)];
    let pods = read_pods(&file(
        "lp.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,450\n",
    ))
    .unwrap();
    let result = filter(
        &ExtenderArgs {
            pod: latency::pod_json("p", &pods[0].task),
            nodes: None,
            node_names: Some(vec!["room".into(), "full".into()]),
        },
        &latency::view_of(&nodes),
    );
    assert_eq!(result.error, "");
    assert_eq!(result.node_names, Some(vec!["room".into()]));
    assert!(result.failed_nodes.contains_key("full"), "{result:?}");
    let measured = latency::measure(&nodes, &[pods[0].task.clone()], 5, 1).unwrap();
    assert_eq!((measured.pods, measured.nodes), (5, 2));
    assert!(measured.p50_ms <= measured.p99_ms && measured.p99_ms <= measured.max_ms);
}

/// The bound is computed per seed from that seed's arrivals and reported
/// in the JSON; with the worked single-class trace above (four 600-milli
/// tasks, two 1-GPU nodes) it is exact: one task per GPU, 0.8 GPUs left.
#[test]
fn the_bound_is_reported_per_seed_and_never_beaten() {
    let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,600\n";
    let mut asked = options(NODES, pods, Policy::ALL.to_vec());
    asked.bound = true;
    let outcome = simulate(&asked).unwrap();
    let bound = outcome.bound.unwrap();
    assert_eq!(bound.runs.len(), 2);
    for &(_, b) in &bound.runs {
        assert_eq!(b, 0.8);
    }
    let json = bound.to_json();
    assert_eq!(json["bound_unallocated_gpus"], 0.8);
    assert_eq!(json["runs"][1]["seed"], 2);
    for report in &outcome.policies {
        assert!(report.unallocated_gpus() >= bound.unallocated_gpus());
    }
}

/// The derived trace: the asked share of all tasks carries a rule, each
/// drawn from the source's rules for tasks of the same shape; the same
/// seed gives the same list; it reads back as written.
#[test]
fn derived_traces_constrain_the_asked_share() {
    let base = read_pods(&file(
        "base.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n\
         a,1,1,1,1000\nb,1,1,1,500\nc,1,1,0,0\nd,1,1,1,1000\ne,1,1,8,1000\nf,1,1,1,300\n",
    ))
    .unwrap();
    let source = read_pods(&file(
        "source.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
         s0,1,1,1,1000,T4\ns1,1,1,1,200,P100|T4\ns2,1,1,8,1000,G2\ns3,1,1,1,1000,\n",
    ))
    .unwrap();
    let derived = derive::constrain_models(&base, &source, 0.5, 3);
    let constrained: Vec<_> = derived.iter().filter(|t| !t.task.is_open()).collect();
    assert_eq!(constrained.len(), 3);
    for t in &constrained {
        let Models::OneOf(names) = &t.task.models else {
            panic!("{t:?}")
        };
        let ask = &t.task.gpus[0];
        let expected: &[&str] = match (ask.count, ask.milli) {
            (1, 1000) => &["T4"],
            (1, _) => &["P100", "T4"],
            _ => &["G2"],
        };
        assert_eq!(names, expected, "{t:?}");
    }
    assert_eq!(derived, derive::constrain_models(&base, &source, 0.5, 3));
    let written = derive::write_pods(&derived);
    assert_eq!(read_pods(&file("derived.csv", &written)).unwrap(), derived);
}
