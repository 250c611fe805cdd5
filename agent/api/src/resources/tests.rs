use std::collections::BTreeMap;

use super::*;

fn container<'a>(name: &'a str, limits: &[(&'a str, &'a str)]) -> ContainerResources<'a> {
    ContainerResources {
        name,
        limits: limits.iter().copied().collect(),
        requests: BTreeMap::new(),
    }
}

fn share(limits: &[(&str, &str)]) -> Result<Option<GpuShare>, Vec<ResourceError>> {
    GpuShare::read(&container("train", limits))
}

fn one_error(limits: &[(&str, &str)]) -> String {
    let errors = share(limits).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    errors[0].to_string()
}

#[test]
fn the_design_example_reads_as_written() {
    let got = share(&[(GPU, "1"), (GPU_MEM, "4000"), (GPU_CORES, "30")])
        .unwrap()
        .unwrap();
    assert_eq!(
        got,
        GpuShare {
            container: "train".into(),
            count: 1,
            memory: Some(Memory::Mib(4000)),
            cores: Some(30),
            priority: None,
        }
    );
    assert_eq!(got.effective_cores(), 30);
}

#[test]
fn canonical_api_server_spellings_are_read() {
    let got = share(&[(GPU, "2"), (GPU_MEM, "4k"), (PRIORITY, "1")])
        .unwrap()
        .unwrap();
    assert_eq!(got.count, 2);
    assert_eq!(got.memory, Some(Memory::Mib(4000)));
    assert_eq!(got.priority, Some(1));
}

#[test]
fn no_gpu_resources_means_no_share() {
    assert_eq!(share(&[("cpu", "2"), ("memory", "1Gi")]), Ok(None));
    assert_eq!(share(&[(GPU, "0")]), Ok(None));
}

#[test]
fn gpu_only_defaults_to_whole_cards() {
    let got = share(&[(GPU, "1")]).unwrap().unwrap();
    assert_eq!(got.memory, None);
    assert_eq!(got.effective_memory(), Memory::Percent(100));
    assert_eq!(got.effective_cores(), 100);
}

#[test]
fn memory_only_reserves_no_cores() {
    let got = share(&[(GPU, "1"), (GPU_MEM_PERCENTAGE, "50")])
        .unwrap()
        .unwrap();
    assert_eq!(got.effective_memory(), Memory::Percent(50));
    assert_eq!(got.effective_cores(), 0);
}

#[test]
fn range_edges_are_accepted() {
    for (field, value) in [
        (GPU, "16"),
        (GPU_MEM, "1"),
        (GPU_MEM, "1048576"),
        (GPU_CORES, "0"),
        (GPU_CORES, "100"),
        (PRIORITY, "0"),
    ] {
        let mut limits = vec![(field, value)];
        if field != GPU {
            limits.push((GPU, "1"));
        }
        assert!(share(&limits).is_ok(), "{field}={value}");
    }
    let got = share(&[(GPU, "1"), (GPU_MEM_PERCENTAGE, "100")])
        .unwrap()
        .unwrap();
    assert_eq!(got.memory, Some(Memory::Percent(100)));
}

#[test]
fn out_of_range_values_name_container_field_and_range() {
    assert_eq!(
        one_error(&[(GPU, "17")]),
        "container \"train\": nvidia.com/gpu is 17, out of range; accepted: whole number of GPUs, 0..=16"
    );
    assert_eq!(
        one_error(&[(GPU, "1"), (GPU_CORES, "101")]),
        "container \"train\": nvidia.com/gpucores is 101, out of range; accepted: whole percent of one GPU's SMs, 0..=100"
    );
    let msg = one_error(&[(GPU, "1"), (GPU_MEM, "0")]);
    assert!(
        msg.contains("nvidia.com/gpumem is 0") && msg.contains("1..=1048576"),
        "{msg}"
    );
    let msg = one_error(&[(GPU, "1"), (GPU_MEM_PERCENTAGE, "0")]);
    assert!(msg.contains("1..=100"), "{msg}");
    let msg = one_error(&[(GPU, "1"), (PRIORITY, "2")]);
    assert!(msg.contains("accepted: 0 (high) or 1 (low)"), "{msg}");
}

#[test]
fn binary_suffixes_on_gpumem_are_out_of_range_with_a_hint() {
    let msg = one_error(&[(GPU, "1"), (GPU_MEM, "4Gi")]);
    assert!(msg.contains("is 4294967296, out of range"), "{msg}");
    assert!(msg.contains("1Gi means 1Gi MiB"), "{msg}");
}

#[test]
fn malformed_and_fractional_quantities_are_named() {
    assert_eq!(
        one_error(&[(GPU, "1"), (GPU_MEM, "500m")]),
        "container \"train\": nvidia.com/gpumem \"500m\" is not a whole number; accepted: whole MiB per GPU, 1..=1048576 (e.g. 4000; 1Gi means 1Gi MiB)"
    );
    let msg = one_error(&[(GPU, "one")]);
    assert!(
        msg.starts_with("container \"train\": nvidia.com/gpu \"one\" is not a Kubernetes quantity"),
        "{msg}"
    );
    let msg = one_error(&[(GPU, "1"), (GPU_CORES, "-5")]);
    assert!(msg.contains("\"-5\" is negative"), "{msg}");
}

#[test]
fn a_bad_gpu_count_is_not_reported_twice() {
    // The gpumem value is fine; only the count is wrong.
    let msg = one_error(&[(GPU, "0.5"), (GPU_MEM, "4000")]);
    assert!(
        msg.contains("nvidia.com/gpu \"0.5\" is not a whole number"),
        "{msg}"
    );
}

#[test]
fn memory_both_ways_is_refused() {
    assert_eq!(
        one_error(&[(GPU, "1"), (GPU_MEM, "4000"), (GPU_MEM_PERCENTAGE, "50")]),
        "container \"train\": nvidia.com/gpumem and nvidia.com/gpumem-percentage are both set; accepted: one of them"
    );
}

#[test]
fn memory_or_cores_without_a_gpu_count_ask_for_one_gpu() {
    for fields in [
        &[(GPU_MEM, "4000")][..],
        &[(GPU_CORES, "30")],
        &[(GPU_MEM_PERCENTAGE, "50"), (PRIORITY, "1")],
    ] {
        let got = share(fields).unwrap().unwrap();
        assert_eq!(got.count, 1, "{fields:?}");
    }
    let got = share(&[(GPU_MEM, "4000"), (GPU_CORES, "30")])
        .unwrap()
        .unwrap();
    assert_eq!((got.memory, got.cores), (Some(Memory::Mib(4000)), Some(30)));
}

#[test]
fn share_parameters_with_zero_gpus_are_refused_each() {
    let errors = share(&[(GPU, "0"), (GPU_CORES, "30"), (GPU_MEM, "4000")]).unwrap_err();
    let fields: Vec<_> = errors
        .iter()
        .map(|e| match e {
            ResourceError::NeedsGpu { field, .. } => *field,
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(fields, [GPU_MEM, GPU_CORES]);
    assert_eq!(
        errors[1].to_string(),
        "container \"train\": nvidia.com/gpucores needs nvidia.com/gpu (the number of GPUs); accepted: nvidia.com/gpu of 1..=16 alongside it, or unset with nvidia.com/gpumem, nvidia.com/gpumem-percentage or nvidia.com/gpucores (one GPU)"
    );
    for fields in [&[(GPU, "0"), (PRIORITY, "0")][..], &[(PRIORITY, "0")]] {
        let msg = one_error(fields);
        assert!(
            msg.contains("nvidia.com/priority needs nvidia.com/gpu"),
            "{msg}"
        );
    }
}

#[test]
fn requests_must_equal_limits() {
    let mut c = container("train", &[(GPU, "1"), (GPU_MEM, "4000")]);
    c.requests = [(GPU, "1"), (GPU_MEM, "3000")].into_iter().collect();
    let errors = GpuShare::read(&c).unwrap_err();
    assert_eq!(
        errors[0].to_string(),
        "container \"train\": nvidia.com/gpumem request \"3000\" differs from limit \"4000\"; accepted: equal values, or the limit alone"
    );
    // Equal in value but spelled differently is fine.
    c.requests = [(GPU, "1"), (GPU_MEM, "4k")].into_iter().collect();
    assert!(GpuShare::read(&c).is_ok());
}

#[test]
fn a_request_alone_is_read() {
    let mut c = container("train", &[]);
    c.requests = [(GPU, "2"), (GPU_CORES, "20")].into_iter().collect();
    let got = GpuShare::read(&c).unwrap().unwrap();
    assert_eq!((got.count, got.cores), (2, Some(20)));
}

#[test]
fn every_spelling_of_a_whole_number_reads_the_same() {
    // As a person types them and as kube-apiserver stores them.
    for spelling in [
        "4000", "4k", "4e3", "4E3", "+4k", "4000.0", "4.000k", "0.004M", "40e2",
    ] {
        let got = share(&[(GPU, "1"), (GPU_MEM, spelling)]).unwrap().unwrap();
        assert_eq!(got.memory, Some(Memory::Mib(4000)), "{spelling}");
    }
    let got = share(&[(GPU, "1"), (GPU_MEM, "4Ki")]).unwrap().unwrap();
    assert_eq!(got.memory, Some(Memory::Mib(4096)));
    let got = share(&[(GPU, "1e0"), (GPU_CORES, "3e1"), (PRIORITY, "1e0")])
        .unwrap()
        .unwrap();
    assert_eq!((got.count, got.cores, got.priority), (1, Some(30), Some(1)));
}

#[test]
fn a_resource_of_another_name_is_any_whole_number() {
    let c = container("main", &[("example.com/vgpu", "2k")]);
    assert_eq!(c.whole("example.com/vgpu"), Ok(Some(2000)));
    assert_eq!(c.whole("example.com/other"), Ok(None));
    let c = container("main", &[("example.com/vgpu", "0.5")]);
    assert_eq!(
        c.whole("example.com/vgpu").unwrap_err().to_string(),
        "container \"main\": example.com/vgpu \"0.5\" is not a whole number; accepted: a whole number"
    );
}

#[test]
fn percentage_memory_rounds_down_so_shares_of_100_fit() {
    assert_eq!(Memory::Percent(50).mib_on(8001), 4000);
    assert!(
        Memory::Percent(50).mib_on(8001) * 2 <= 8001,
        "two halves fit"
    );
    assert_eq!(Memory::Percent(33).mib_on(3001), 990);
    assert_eq!(Memory::Percent(100).mib_on(81920), 81920);
    assert_eq!(Memory::Mib(4000).mib_on(1), 4000);
    assert_eq!(percent_of_mib(u64::MAX, 100), u64::MAX);
}

#[test]
fn hami_priority_and_cores_on_the_agent_scale() {
    assert_eq!(agent_priority(0), Some(HAMI_HIGH));
    assert_eq!(agent_priority(1), Some(HAMI_LOW));
    assert_eq!(agent_priority(2), None);
    const { assert!(HAMI_HIGH > HAMI_LOW) };
    assert_eq!(sm_target(None), 100);
    assert_eq!(sm_target(Some(0)), 100);
    assert_eq!(sm_target(Some(30)), 30);
}

#[test]
fn a_k8s_openapi_container_reads_as_its_lists() {
    let c: k8s_openapi::api::core::v1::Container = serde_json::from_value(serde_json::json!({
        "name": "main",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"},
                      "requests": {"nvidia.com/gpu": "1"}}
    }))
    .unwrap();
    let r = ContainerResources::from(&c);
    assert_eq!(r.name, "main");
    let got = GpuShare::read(&r).unwrap().unwrap();
    assert_eq!(got.memory, Some(Memory::Mib(3000)));
    let bare: k8s_openapi::api::core::v1::Container =
        serde_json::from_value(serde_json::json!({"name": "bare"})).unwrap();
    assert_eq!(GpuShare::read(&ContainerResources::from(&bare)), Ok(None));
}
