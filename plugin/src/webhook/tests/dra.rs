//! DRA mode: HAMi's pod specs become claims of content-named
//! ResourceClaimTemplates. Patches are applied with an independent RFC
//! 6902 implementation (json-patch) and the result read back through
//! k8s-openapi's Pod, so a misspelt field would be lost and fail.

use json_patch::Patch;
use k8s_openapi::api::core::v1::Pod as KubePod;
use serde_json::json;

use super::*;
use crate::webhook::dra::{ClaimShape, DraError, entry_name};

fn dra() -> WebhookConfig {
    WebhookConfig {
        dra: true,
        ..WebhookConfig::default()
    }
}

/// The patch applied by json-patch, and checked to survive k8s-openapi's
/// Pod (whose deserializer drops unknown fields).
fn patched(object: &Value, admitted: &Admitted) -> Value {
    let mut pod = object.clone();
    let patch: Patch = serde_json::from_value(serde_json::to_value(&admitted.patch).unwrap())
        .expect("the patch is RFC 6902");
    json_patch::patch(&mut pod, &patch).expect("the patch applies");
    let typed: KubePod = serde_json::from_value(pod.clone()).expect("a core/v1 Pod");
    let spec = typed.spec.as_ref().unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        back["spec"].get("resourceClaims"),
        pod["spec"].get("resourceClaims"),
        "spec.resourceClaims as k8s-openapi reads it"
    );
    for (i, c) in spec.containers.iter().enumerate() {
        assert_eq!(
            back["spec"]["containers"][i]["resources"].get("claims"),
            pod["spec"]["containers"][i]["resources"].get("claims"),
            "container {}'s resources.claims",
            c.name
        );
    }
    pod
}

fn admit(object: &Value) -> (Admitted, Value) {
    let got = admit_pod(object, &dra()).unwrap_or_else(|e| panic!("refused: {e}"));
    let pod = patched(object, &got);
    (got, pod)
}

fn refused_dra(object: &Value) -> WebhookError {
    admit_pod(object, &dra()).unwrap_err()
}

fn template_json(admitted: &Admitted, i: usize) -> Value {
    serde_json::to_value(&admitted.templates[i]).unwrap()
}

/// No `nvidia.com/*` resource is left anywhere in the pod's containers.
fn assert_no_gpu_resources(pod: &Value) {
    for c in pod["spec"]["containers"].as_array().unwrap() {
        for map in ["limits", "requests"] {
            for name in c["resources"][map]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k)
            {
                assert!(!name.starts_with("nvidia.com/"), "{c}");
            }
        }
    }
}

#[test]
fn the_design_example_becomes_a_claim_of_a_content_named_template() {
    let object = defaulted_pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k", "nvidia.com/gpucores": "30", "cpu": "2"}),
    );
    let (got, pod) = admit(&object);
    assert_eq!(
        serde_json::to_value(&got.patch).unwrap(),
        json!([
            {"op": "add", "path": "/spec/resourceClaims",
             "value": [{"name": "gpu-train", "resourceClaimTemplateName": "tessera-gpu-1x-4000mi-30c"}]},
            {"op": "add", "path": "/spec/containers/0/resources/limits", "value": {"cpu": "2"}},
            {"op": "add", "path": "/spec/containers/0/resources/requests", "value": {"cpu": "2"}},
            {"op": "add", "path": "/spec/containers/0/resources/claims", "value": [{"name": "gpu-train"}]},
        ])
    );
    assert!(got.warnings.is_empty());
    // Not handed to Tessera's scheduler: kube-scheduler allocates claims.
    assert!(pod["spec"].get("schedulerName").is_none());
    assert_no_gpu_resources(&pod);
    assert_eq!(got.templates.len(), 1);
    assert_eq!(
        template_json(&got, 0),
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "tessera-gpu-1x-4000mi-30c", "namespace": "ml",
                         "labels": {"app.kubernetes.io/managed-by": "tessera-webhook"}},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.tessera.dev", "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": "4000Mi", "cores": "30"}}}}]}}}
        })
    );
}

#[test]
fn cores_only_asks_for_no_memory_which_dra_reads_as_the_whole_memory() {
    let (got, pod) = admit(&gpu_pod(json!({"nvidia.com/gpucores": "30"})));
    assert_eq!(got.templates.len(), 1);
    let t = template_json(&got, 0);
    assert_eq!(t["metadata"]["name"], "tessera-gpu-1x-30c");
    assert_eq!(
        t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"],
        json!({"requests": {"cores": "30"}})
    );
    let resources = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(resources["limits"], json!({}));
    assert!(resources.get("requests").is_none());
    assert_eq!(resources["claims"], json!([{"name": "gpu-train"}]));
}

#[test]
fn memory_without_cores_is_refused_naming_container_and_resources() {
    for limits in [
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2k"}),
        json!({"nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "0"}),
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"}),
    ] {
        let error = refused_dra(&gpu_pod(limits.clone()));
        assert_eq!(error.code(), 422);
        assert_eq!(
            error.to_string(),
            "container \"train\": nvidia.com/gpumem without nvidia.com/gpucores (or with 0) has no DRA equivalent: a claim's cores are both what the scheduler books and the SM cap the agent holds (1..=100), so HAMi's \"no SMs booked, no cap\" cannot be asked for; accepted in DRA mode: nvidia.com/gpucores of 1..=100 alongside it (100: all of the GPU's SMs)",
            "{limits}"
        );
    }
}

#[test]
fn two_gpus_with_memory_and_cores_ask_for_two_distinct_devices() {
    let (got, pod) = admit(&defaulted_pod(
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "50"}),
    ));
    assert_no_gpu_resources(&pod);
    let t = template_json(&got, 0);
    assert_eq!(t["metadata"]["name"], "tessera-gpu-2x-8000mi-50c");
    let devices = &t["spec"]["spec"]["devices"];
    assert_eq!(devices["requests"][0]["exactly"]["count"], 2);
    assert_eq!(
        devices["requests"][0]["exactly"]["capacity"]["requests"],
        json!({"memory": "8000Mi", "cores": "50"})
    );
    assert_eq!(
        devices["constraints"],
        json!([{"requests": ["gpu"], "distinctAttribute": "gpu.tessera.dev/uuid"}])
    );
    // One GPU: no constraint.
    let (got, _) = admit(&gpu_pod(
        json!({"nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "50"}),
    ));
    assert!(
        template_json(&got, 0)["spec"]["spec"]["devices"]
            .get("constraints")
            .is_none()
    );
}

#[test]
fn gpumem_percentage_100_is_the_default_memory_and_others_are_refused() {
    let (got, _) = admit(&gpu_pod(
        json!({"nvidia.com/gpumem-percentage": "100", "nvidia.com/gpucores": "30"}),
    ));
    assert_eq!(
        got.templates[0].metadata.name.as_deref(),
        Some("tessera-gpu-1x-30c")
    );
    // The whole memory and no cores: the whole GPU (nothing else fits on
    // it anyway), uncapped as HAMi gives; no capacity requested at all.
    let (got, pod) = admit(&defaulted_pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}),
    ));
    assert_no_gpu_resources(&pod);
    let t = template_json(&got, 0);
    assert_eq!(t["metadata"]["name"], "tessera-gpu-1x");
    assert!(
        t["spec"]["spec"]["devices"]["requests"][0]["exactly"]
            .get("capacity")
            .is_none()
    );
    // gpucores 100 is the default: not requested.
    let (got, _) = admit(&gpu_pod(
        json!({"nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "100"}),
    ));
    assert_eq!(
        got.templates[0].metadata.name.as_deref(),
        Some("tessera-gpu-1x-4000mi")
    );

    let error = refused_dra(&gpu_pod(
        json!({"nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "30"}),
    ));
    assert_eq!(error.code(), 422);
    let msg = error.to_string();
    assert_eq!(
        msg,
        "container \"train\": nvidia.com/gpumem-percentage is 50, which a DRA claim cannot ask for (capacity requests are absolute amounts and GPUs differ in memory); accepted in DRA mode: nvidia.com/gpumem (MiB per GPU), or nvidia.com/gpumem-percentage 100 (the whole memory)"
    );
}

#[test]
fn whole_gpus_only_are_left_to_the_extended_resource_mapping() {
    for object in [
        defaulted_pod(json!({"nvidia.com/gpu": "1"})),
        gpu_pod(json!({"nvidia.com/gpu": "2", "cpu": "1"})),
    ] {
        assert_eq!(admit_pod(&object, &dra()).unwrap(), Admitted::default());
    }
    // Another scheduler is neither refused nor replaced.
    let mut object = gpu_pod(json!({"nvidia.com/gpu": "1"}));
    object["spec"]["schedulerName"] = json!("volcano");
    assert_eq!(admit_pod(&object, &dra()).unwrap(), Admitted::default());
    // A GPU request without a limit gets its limit, as Kubernetes requires.
    let object = pod(json!([{"name": "train", "image": "i",
        "resources": {"requests": {"nvidia.com/gpu": 2, "cpu": "1"}}}]));
    let (got, pod) = admit(&object);
    assert!(got.templates.is_empty());
    assert_eq!(
        pod["spec"]["containers"][0]["resources"],
        json!({"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": 2, "cpu": "1"}})
    );
    assert!(pod["spec"].get("resourceClaims").is_none());
}

#[test]
fn every_container_gets_its_own_claim_and_equal_requests_share_a_template() {
    let object = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "resourceClaims": [{"name": "nic", "resourceClaimName": "rdma-0"}],
            "containers": [
                {"name": "web", "image": "w"},
                {"name": "a", "image": "i", "resources": {
                    "limits": {"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"},
                    "claims": [{"name": "nic"}]}},
                {"name": "b", "image": "i", "resources": {
                    "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"}}},
                {"name": "whole", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"name": "c", "image": "i", "resources": {
                    "limits": {"nvidia.com/gpumem": "6000", "nvidia.com/gpucores": "50"}}}
            ]
        }
    });
    let (got, pod) = admit(&object);
    assert_eq!(
        pod["spec"]["resourceClaims"],
        json!([
            {"name": "nic", "resourceClaimName": "rdma-0"},
            {"name": "gpu-a", "resourceClaimTemplateName": "tessera-gpu-1x-3000mi-20c"},
            {"name": "gpu-b", "resourceClaimTemplateName": "tessera-gpu-1x-3000mi-20c"},
            {"name": "gpu-c", "resourceClaimTemplateName": "tessera-gpu-1x-6000mi-50c"},
        ])
    );
    let containers = &pod["spec"]["containers"];
    assert_eq!(containers[0], object["spec"]["containers"][0]);
    assert_eq!(
        containers[1]["resources"]["claims"],
        json!([{"name": "nic"}, {"name": "gpu-a"}])
    );
    assert_eq!(
        containers[2]["resources"]["claims"],
        json!([{"name": "gpu-b"}])
    );
    assert_eq!(
        containers[3], object["spec"]["containers"][3],
        "whole GPUs untouched"
    );
    assert_eq!(
        containers[4]["resources"]["claims"],
        json!([{"name": "gpu-c"}])
    );
    let names: Vec<_> = got
        .templates
        .iter()
        .map(|t| t.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        ["tessera-gpu-1x-3000mi-20c", "tessera-gpu-1x-6000mi-50c"]
    );
}

#[test]
fn what_cannot_be_honoured_is_all_listed_at_once() {
    let mut object = pod(json!([
        {"name": "a", "image": "i", "resources": {"limits": {
            "nvidia.com/gpumem-percentage": "50", "nvidia.com/priority": "0"}}},
        {"name": "b", "image": "i", "resources": {"limits": {
            "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}}}
    ]));
    object["metadata"]["annotations"] = json!({"tessera.dev/gpu-model-include": "A100"});
    let error = refused_dra(&object);
    assert_eq!(error.code(), 422);
    let WebhookError::Dra(problems) = &error else {
        panic!("{error:?}")
    };
    assert_eq!(
        problems,
        &[
            DraError::Priority {
                container: "a".into()
            },
            DraError::MemoryPercentage {
                container: "a".into(),
                percent: 50
            },
            DraError::MemoryWithoutCores {
                container: "a".into(),
                field: "nvidia.com/gpumem-percentage"
            },
            DraError::Annotation {
                key: "tessera.dev/gpu-model-include".into()
            },
        ]
    );
    let msg = error.to_string();
    assert!(
        msg.contains("container \"a\": nvidia.com/priority is not carried by DRA claims"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "annotation tessera.dev/gpu-model-include constrains which GPUs the pod may get"
        ),
        "{msg}"
    );
    assert_eq!(msg.matches("; container").count() + 1, 3, "{msg}");
}

#[test]
fn gpu_constraints_are_refused_and_preferences_warned_where_the_extender_does_not_place() {
    let share = json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"});
    for (key, value) in [
        ("tessera.dev/gpu-model-include", "A100"),
        ("tessera.dev/gpu-model-exclude", "T4"),
        (
            "tessera.dev/gpu-uuid-include",
            "GPU-12345678-9abc-def0-0123-456789abcdef",
        ),
        (
            "tessera.dev/gpu-uuid-exclude",
            "GPU-12345678-9abc-def0-0123-456789abcdef",
        ),
        ("tessera.dev/numa-bind", "true"),
    ] {
        let mut object = gpu_pod(share.clone());
        object["metadata"]["annotations"] = json!({ key: value });
        let error = refused_dra(&object);
        assert_eq!(
            error.to_string(),
            format!(
                "annotation {key} constrains which GPUs the pod may get, which only Tessera's scheduler extender reads, and it does not place this pod's GPUs in DRA mode; accepted in DRA mode: no GPU constraint annotations (a ResourceClaim's CEL selectors choose GPUs)"
            )
        );
    }
    // The design's example pod: allowed, its preferences warned about.
    let mut object = gpu_pod(share);
    object["metadata"]["annotations"] = json!({"tessera.dev/compute-mode": "hard",
        "tessera.dev/placement": "binpack", "tessera.dev/numa-bind": "false"});
    let (got, _) = admit(&object);
    assert_eq!(
        got.warnings,
        [
            "annotation tessera.dev/compute-mode has no effect in DRA mode: the node agent takes a claim's compute mode from its node policy",
            "annotation tessera.dev/numa-bind has no effect in DRA mode: the pod's scheduler places its claims",
            "annotation tessera.dev/placement has no effect in DRA mode: the pod's scheduler places its claims",
        ]
    );
    // Whole GPUs: the same, unless the pod names Tessera's scheduler,
    // whose extender places them and reads its annotations.
    let mut object = gpu_pod(json!({"nvidia.com/gpu": "1"}));
    object["metadata"]["annotations"] = json!({"tessera.dev/gpu-model-include": "A100"});
    assert!(matches!(refused_dra(&object), WebhookError::Dra(_)));
    object["spec"]["schedulerName"] = json!("tessera-scheduler");
    assert_eq!(admit_pod(&object, &dra()).unwrap(), Admitted::default());
}

#[test]
fn device_plugin_mode_refusals_still_apply() {
    let mut object = gpu_pod(json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}));
    object["spec"]["nodeName"] = json!("gpu-1");
    assert!(matches!(
        refused_dra(&object),
        WebhookError::NodeName { .. }
    ));
    let object = pod(json!([{"name": "train", "image": "i",
        "securityContext": {"privileged": true},
        "resources": {"limits": {"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}}}]));
    assert!(matches!(
        refused_dra(&object),
        WebhookError::Privileged { .. }
    ));
    let object = json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": {
        "initContainers": [{"name": "warmup", "image": "i",
            "resources": {"limits": {"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}}}],
        "containers": [{"name": "train", "image": "i"}]}});
    let msg = refused_dra(&object).to_string();
    assert!(
        msg.starts_with(
            "init container \"warmup\": nvidia.com/gpumem is not supported in init containers"
        ),
        "{msg}"
    );
    let msg = refused_dra(&gpu_pod(json!({"nvidia.com/gpucores": "101"}))).to_string();
    assert!(
        msg.contains("nvidia.com/gpucores is 101, out of range"),
        "{msg}"
    );
}

#[test]
fn a_pod_naming_another_scheduler_keeps_it() {
    let mut object = gpu_pod(json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}));
    object["spec"]["schedulerName"] = json!("volcano");
    let (_, pod) = admit(&object);
    assert_eq!(pod["spec"]["schedulerName"], "volcano");
}

#[test]
fn template_names_are_deterministic_dns_labels() {
    let shapes = [
        ClaimShape {
            count: 1,
            memory_mib: Some(4000),
            cores: Some(30),
        },
        ClaimShape {
            count: 16,
            memory_mib: Some(1 << 20),
            cores: Some(99),
        },
        ClaimShape {
            count: 3,
            memory_mib: None,
            cores: None,
        },
    ];
    let names: Vec<String> = shapes.iter().map(ClaimShape::template_name).collect();
    assert_eq!(
        names,
        [
            "tessera-gpu-1x-4000mi-30c",
            "tessera-gpu-16x-1048576mi-99c",
            "tessera-gpu-3x"
        ]
    );
    for name in &names {
        assert!(name.len() <= 63, "{name}");
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "{name}"
        );
        assert!(!name.starts_with('-') && !name.ends_with('-'), "{name}");
    }
    // The same request in any spelling: the same template.
    let spellings = [
        json!({"nvidia.com/gpumem": "4k", "nvidia.com/gpucores": "30"}),
        json!({"nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 30, "nvidia.com/gpu": 1}),
        json!({"nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"}),
    ];
    for limits in spellings {
        let (got, _) = admit(&gpu_pod(limits.clone()));
        assert_eq!(
            got.templates,
            admit(&defaulted_pod(
                json!({"nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"})
            ))
            .0
            .templates,
            "{limits}"
        );
    }
}

#[test]
fn claim_entries_are_labels_and_never_collide() {
    assert_eq!(entry_name("train", 0), "gpu-train");
    let long = "c".repeat(63);
    assert_eq!(entry_name(&long, 2), "gpu-2");
    assert_eq!(entry_name(&"c".repeat(59), 2).len(), 63);

    let mut object = gpu_pod(json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}));
    object["spec"]["resourceClaims"] = json!([{"name": "gpu-train", "resourceClaimName": "x"}]);
    let error = refused_dra(&object);
    assert_eq!(
        error.to_string(),
        "pod already has a resourceClaims entry named \"gpu-train\", which the webhook names the claim of container \"train\"; accepted: another name for that entry"
    );
}

#[test]
fn a_container_without_resources_elsewhere_keeps_its_other_fields() {
    // Requests only (limits left to the API server's validation).
    let object = pod(json!([{"name": "train", "image": "i",
        "resources": {"requests": {"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10", "memory": "1Gi"}}}]));
    let (_, pod) = admit(&object);
    assert_eq!(
        pod["spec"]["containers"][0]["resources"],
        json!({"requests": {"memory": "1Gi"}, "claims": [{"name": "gpu-train"}]})
    );
}

#[test]
fn review_in_dra_mode_carries_the_templates_in_the_request_s_namespace() {
    let mut object = gpu_pod(json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}));
    object["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    let mut incoming = review_of(object, "Pod", "CREATE");
    let reviewed = review(&incoming, &dra()).unwrap();
    assert!(!reviewed.dry_run);
    assert_eq!(reviewed.templates.len(), 1);
    assert_eq!(
        reviewed.templates[0].metadata.namespace.as_deref(),
        Some("ml")
    );
    let response = reviewed.answer.response.clone().unwrap();
    assert!(response.allowed);
    let patch = response.patch_json().unwrap();
    assert_eq!(patch[0]["path"], "/spec/resourceClaims");

    incoming.request.as_mut().unwrap().dry_run = Some(true);
    assert!(review(&incoming, &dra()).unwrap().dry_run);

    // Refused when the templates cannot be made: no patch goes back.
    let refused = reviewed.refused(
        500,
        "resourceclaimtemplate ml/x could not be created".into(),
    );
    let response = refused.response.unwrap();
    assert!(!response.allowed);
    assert!(response.patch.is_none() && response.patch_type.is_none());
    assert_eq!(response.status.unwrap().code, 500);
}

#[test]
fn device_plugin_mode_makes_no_templates() {
    let got = admit_pod(
        &gpu_pod(json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"})),
        &config(),
    )
    .unwrap();
    assert!(got.templates.is_empty());
    assert_eq!(got.patch[0].path, "/spec/schedulerName");
}
