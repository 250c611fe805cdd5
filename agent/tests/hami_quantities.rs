//! HAMi's resource values read the same on both sides of a pod's life: the
//! scheduler (webhook, extender and bind read a pod through
//! `tessera_scheduler::resources`) and the node agent (`Allocate` turns
//! the container's spec into the limits of its region,
//! `tessera_agent::kubelet::grant`). Pods are written as kube-apiserver
//! returns them: quantities canonicalised (`4000` is read back as `4k`),
//! which a person may also type in any other spelling Kubernetes accepts.
//!
//! Oracle: the two sides against each other, and for the spellings the
//! number each one denotes in the Kubernetes quantity grammar.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use std::collections::HashSet;

use proptest::prelude::*;
use serde_json::{Value, json};
use tessera_agent::gpu::{Health, InventoryGpu};
use tessera_agent::kubelet::{grant, pods};

const UUID: &str = "GPU-00000000-0000-0000-0000-000000000000";
/// Large enough for every `gpumem` the scheduler accepts, so only the
/// reading of the value can refuse it.
const GPU_MIB: u64 = 1 << 21;

fn node_gpus() -> Vec<InventoryGpu> {
    vec![InventoryGpu {
        index: 0,
        uuid: UUID.into(),
        name: "NVIDIA H100 80GB HBM3".into(),
        memory_total_mib: Some(GPU_MIB),
        pci_bus_id: "00000000:01:00.0".into(),
        numa_node: Some(0),
        sm_count: Some(132),
        compute_capability: Some("9.0".into()),
        nvlink_peers: vec![],
        mig_enabled: None,
        health: Health::Healthy,
    }]
}

/// A pod bound to this node whose container `main` has `limits`, and an
/// assignment that leaves memory and cores to the spec.
fn pod(limits: &Value) -> Value {
    let assignment = json!({"version": 1, "node": "n", "boundAt": "2026-12-01T00:00:00Z",
        "containers": [{"name": "main", "gpus": [{"uuid": UUID}]}]});
    json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                     "annotations": {"tessera.dev/assignment": assignment.to_string()}},
        "spec": {"nodeName": "n", "containers": [{"name": "main", "resources": {"limits": limits}}]}
    })
}

/// What one side made of a container: memory MiB on the GPU, SM percent
/// (100 for none), agent priority; or the error text.
type Reading = Result<(u64, u32, Option<u32>), String>;

fn scheduler(limits: &Value) -> Reading {
    let p = tessera_scheduler::pod::Pod::from_json(&pod(limits)).unwrap();
    let shares = tessera_scheduler::resources::pod_gpu_shares(&p).map_err(|errors| {
        let each: Vec<String> = errors.iter().map(ToString::to_string).collect();
        each.join("; ")
    })?;
    let share = &shares[0];
    Ok((
        share.effective_memory().mib_on(GPU_MIB),
        tessera_api::resources::sm_target(share.cores),
        share.agent_priority(),
    ))
}

fn agent(limits: &Value) -> Reading {
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod(limits)).unwrap();
    let choice = pods::choose(&[p], "n", "nvidia.com/gpu", 1, &HashSet::new())
        .map_err(|no| no.message("n", "nvidia.com/gpu", 1))?;
    let g = grant::grant(&choice, &node_gpus()).map_err(|e| e.to_string())?;
    Ok((
        g.meta.gpus[0].memory_limit_bytes.unwrap() >> 20,
        g.meta.sm_target,
        g.meta.priority,
    ))
}

/// Both sides agree: the same limits, or both refuse, naming the
/// container and the resource.
fn agree(resource: &str, value: &str) {
    let limits = json!({"nvidia.com/gpu": "1", resource: value});
    match (scheduler(&limits), agent(&limits)) {
        (Ok(s), Ok(a)) => assert_eq!(s, a, "{resource}: {value:?}"),
        (Err(s), Err(a)) => {
            for e in [&s, &a] {
                assert!(
                    e.contains("container \"main\"") && e.contains(resource),
                    "{resource}: {value:?}: {e}"
                );
            }
        }
        (s, a) => panic!("{resource}: {value:?}: the scheduler read {s:?}, the agent {a:?}"),
    }
}

#[test]
fn every_spelling_of_a_whole_number_gives_the_same_limit_on_both_sides() {
    let memory = |value: &str| {
        agree("nvidia.com/gpumem", value);
        scheduler(&json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": value}))
            .unwrap()
            .0
    };
    for spelling in [
        "4000", "4k", "4e3", "4E3", "+4k", "4000.0", "4.0k", "0.004M", "40e2",
    ] {
        assert_eq!(memory(spelling), 4000, "{spelling}");
    }
    assert_eq!(memory("4Ki"), 4096);
    assert_eq!(memory("1500"), 1500);
    for (resource, value) in [
        ("nvidia.com/gpucores", "3e1"),
        ("nvidia.com/gpucores", "0"),
        ("nvidia.com/gpumem-percentage", "5e1"),
        ("nvidia.com/priority", "0"),
        ("nvidia.com/priority", "1e0"),
    ] {
        agree(resource, value);
    }
    let l = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "33", "nvidia.com/gpucores": "3e1", "nvidia.com/priority": "0"});
    assert_eq!(agent(&l), Ok((GPU_MIB * 33 / 100, 30, Some(100))));
}

#[test]
fn fractions_and_garbage_are_refused_by_both_naming_container_and_resource() {
    for resource in [
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "nvidia.com/priority",
    ] {
        for value in ["0.5", "500m", "four", "4 k", "", "-1", "1e999", "4KB"] {
            let limits = json!({"nvidia.com/gpu": "1", resource: value});
            assert!(scheduler(&limits).is_err(), "{resource}: {value:?}");
            agree(resource, value);
        }
    }
}

/// Quantity-like text: signs, digits, a fraction, every suffix and
/// exponent form, and some that are not suffixes at all.
fn quantity() -> impl Strategy<Value = String> {
    let sign = prop::sample::select(vec!["", "", "+", "-"]);
    let int = "[0-9]{0,7}";
    let frac = prop::option::of("\\.[0-9]{0,4}");
    let suffix = prop::sample::select(vec![
        "", "", "", "k", "M", "G", "m", "Ki", "Mi", "Gi", "e3", "E2", "e-1", "e+2", "e", "x", " k",
        "KB",
    ]);
    (sign, int, frac, suffix).prop_map(|(s, i, f, x)| format!("{s}{i}{}{x}", f.unwrap_or_default()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn scheduler_and_agent_agree_on_any_quantity(
        resource in prop::sample::select(vec![
            "nvidia.com/gpumem",
            "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores",
            "nvidia.com/priority",
        ]),
        value in prop_oneof![quantity(), "\\PC{0,8}"],
    ) {
        agree(resource, &value);
    }
}
