use std::collections::BTreeMap;

use super::*;
use crate::pod::{PodSpec, ResourceRequirements};

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

fn container(name: &str, limits: &[(&str, &str)]) -> Container {
    Container {
        name: name.into(),
        resources: ResourceRequirements {
            limits: map(limits),
            requests: BTreeMap::new(),
        },
        security_context: None,
    }
}

#[test]
fn pod_collects_every_error_across_containers() {
    let pod = Pod {
        spec: PodSpec {
            containers: vec![
                container("a", &[(GPU, "1"), (GPU_CORES, "200")]),
                container("b", &[(GPU, "0"), (GPU_MEM, "1")]),
                container("c", &[(GPU, "1")]),
            ],
            init_containers: vec![container("setup", &[(GPU, "1")])],
            ..PodSpec::default()
        },
        ..Pod::default()
    };
    let errors = pod_gpu_shares(&pod).unwrap_err();
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 3, "{text:?}");
    assert!(text[0].starts_with("init container \"setup\": nvidia.com/gpu is not supported"));
    assert!(text[1].starts_with("container \"a\": nvidia.com/gpucores is 200"));
    assert!(text[2].starts_with("container \"b\": nvidia.com/gpumem needs nvidia.com/gpu"));
}

#[test]
fn pod_lists_only_gpu_containers() {
    let pod = Pod {
        spec: PodSpec {
            containers: vec![
                container("sidecar", &[("cpu", "100m")]),
                container("train", &[(GPU, "2"), (GPU_MEM, "8000")]),
            ],
            ..PodSpec::default()
        },
        ..Pod::default()
    };
    let shares = pod_gpu_shares(&pod).unwrap();
    assert_eq!(shares.len(), 1);
    assert_eq!(shares[0].container, "train");
}
