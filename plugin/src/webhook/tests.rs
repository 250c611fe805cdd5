use serde_json::json;

use super::*;

fn config() -> WebhookConfig {
    WebhookConfig::default()
}

/// Applies `add` operations the way the API server does, so tests check
/// the pod that would be stored rather than the patch's spelling.
fn apply(mut doc: Value, patch: &[PatchOp]) -> Value {
    for op in patch {
        assert_eq!(op.op, "add");
        let (parent, key) = op.path.rsplit_once('/').unwrap();
        let key = key.replace("~1", "/").replace("~0", "~");
        let target = doc
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("no parent {parent}"));
        target
            .as_object_mut()
            .unwrap_or_else(|| panic!("{parent} is not an object"))
            .insert(key, op.value.clone());
    }
    doc
}

fn pod(containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": containers}})
}

fn gpu_pod(limits: Value) -> Value {
    pod(json!([{"name": "train", "image": "i", "resources": {"limits": limits}}]))
}

fn admitted(object: &Value) -> Value {
    let got = admit_pod(object, &config()).unwrap();
    apply(object.clone(), &got.patch)
}

fn refused(object: &Value) -> WebhookError {
    admit_pod(object, &config()).unwrap_err()
}

/// A pod as the API server sends it: requests defaulted from limits.
fn defaulted_pod(limits: Value) -> Value {
    pod(json!([{"name": "train", "image": "i",
                "resources": {"limits": limits.clone(), "requests": limits}}]))
}

#[test]
fn design_example_gets_the_scheduler_and_no_other_change() {
    let object = defaulted_pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k", "nvidia.com/gpucores": "30"}),
    );
    let got = admit_pod(&object, &config()).unwrap();
    assert_eq!(
        got.patch,
        [PatchOp::add(
            "/spec/schedulerName".into(),
            json!("tessera-scheduler")
        )]
    );
    assert!(got.warnings.is_empty());
}

#[test]
fn a_pod_already_complete_is_left_alone() {
    let mut object = defaulted_pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k", "nvidia.com/gpucores": "30"}),
    );
    object["spec"]["schedulerName"] = json!("tessera-scheduler");
    assert_eq!(admit_pod(&object, &config()).unwrap(), Admitted::default());
}

#[test]
fn gpu_only_gets_whole_card_defaults() {
    let out = admitted(&defaulted_pod(json!({"nvidia.com/gpu": "1"})));
    assert_eq!(out["spec"]["schedulerName"], "tessera-scheduler");
    let resources = &out["spec"]["containers"][0]["resources"];
    for map in ["limits", "requests"] {
        assert_eq!(resources[map]["nvidia.com/gpumem-percentage"], "100");
        assert_eq!(resources[map]["nvidia.com/gpucores"], "100");
        assert_eq!(resources[map]["nvidia.com/gpu"], "1");
    }
}

#[test]
fn memory_only_gets_zero_cores_and_keeps_memory() {
    let out = admitted(&gpu_pod(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2k"}),
    ));
    let limits = &out["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["nvidia.com/gpucores"], "0");
    assert!(limits.get("nvidia.com/gpumem-percentage").is_none());
}

#[test]
fn patch_paths_escape_the_slash_in_resource_names() {
    let got = admit_pod(&defaulted_pod(json!({"nvidia.com/gpu": "1"})), &config()).unwrap();
    let paths: Vec<&str> = got.patch.iter().map(|op| op.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/spec/schedulerName",
            "/spec/containers/0/resources/limits/nvidia.com~1gpumem-percentage",
            "/spec/containers/0/resources/limits/nvidia.com~1gpucores",
            "/spec/containers/0/resources/requests/nvidia.com~1gpumem-percentage",
            "/spec/containers/0/resources/requests/nvidia.com~1gpucores",
        ]
    );
}

#[test]
fn requests_only_are_copied_into_new_limits() {
    let object = pod(json!([
        {"name": "side", "image": "s"},
        {"name": "train", "image": "i",
         "resources": {"requests": {"nvidia.com/gpu": "2", "cpu": "1"}}}
    ]));
    let out = admitted(&object);
    let resources = &out["spec"]["containers"][1]["resources"];
    assert_eq!(resources["limits"]["nvidia.com/gpu"], "2");
    assert_eq!(resources["limits"]["nvidia.com/gpumem-percentage"], "100");
    assert!(resources["limits"].get("cpu").is_none());
    assert_eq!(resources["requests"]["cpu"], "1");
    assert!(out["spec"]["containers"][0].get("resources").is_none());
}

#[test]
fn a_null_limits_map_is_replaced_whole() {
    let object = pod(json!([{"name": "train", "image": "i",
        "resources": {"limits": null, "requests": {"nvidia.com/gpu": "1"}}}]));
    let out = admitted(&object);
    assert_eq!(
        out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );
}

#[test]
fn every_gpu_container_gets_its_own_defaults() {
    let object = pod(json!([
        {"name": "a", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "b", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "20"}}}
    ]));
    let out = admitted(&object);
    assert_eq!(
        out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"],
        "100"
    );
    let b = &out["spec"]["containers"][1]["resources"]["limits"];
    assert_eq!(b["nvidia.com/gpucores"], "20");
    assert_eq!(b["nvidia.com/gpumem-percentage"], "100");
}

#[test]
fn pods_without_gpus_pass_untouched() {
    let object =
        pod(json!([{"name": "web", "image": "nginx", "resources": {"limits": {"cpu": "1"}}}]));
    assert_eq!(admit_pod(&object, &config()).unwrap(), Admitted::default());
}

#[test]
fn policy_annotations_on_a_cpu_pod_only_warn() {
    let mut object = pod(json!([{"name": "web", "image": "nginx"}]));
    object["metadata"]["annotations"] = json!({"tessera.dev/placement": "spread"});
    let got = admit_pod(&object, &config()).unwrap();
    assert!(got.patch.is_empty());
    assert_eq!(got.warnings.len(), 1);
    assert!(got.warnings[0].contains("no effect"));
}

#[test]
fn privileged_gpu_containers_are_refused_with_the_reason() {
    let object = pod(json!([{"name": "train", "image": "i",
        "securityContext": {"privileged": true},
        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
    let error = refused(&object);
    assert_eq!(error.code(), 403);
    let msg = error.to_string();
    assert!(
        msg.starts_with("container \"train\" is privileged and asks for GPU shares"),
        "{msg}"
    );
    assert!(
        msg.contains("accepted: securityContext.privileged unset or false"),
        "{msg}"
    );
}

#[test]
fn a_privileged_container_without_gpu_is_fine() {
    let object = pod(json!([
        {"name": "debug", "image": "d", "securityContext": {"privileged": true}},
        {"name": "train", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"}}}
    ]));
    assert!(admit_pod(&object, &config()).is_ok());
}

#[test]
fn invalid_values_and_annotations_are_all_listed() {
    let mut object = gpu_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}));
    object["metadata"]["annotations"] = json!({"tessera.dev/compute-mode": "soft"});
    let error = refused(&object);
    assert_eq!(error.code(), 422);
    assert_eq!(
        error.to_string(),
        "container \"train\": nvidia.com/gpucores is 150, out of range; accepted: whole percent of one GPU's SMs, 0..=100; annotation tessera.dev/compute-mode is \"soft\"; accepted: hard or elastic"
    );
}

#[test]
fn memory_or_cores_alone_get_one_gpu_in_limits_and_requests() {
    let out = admitted(&defaulted_pod(json!({"nvidia.com/gpucores": "30"})));
    let resources = &out["spec"]["containers"][0]["resources"];
    for map in ["limits", "requests"] {
        assert_eq!(resources[map]["nvidia.com/gpu"], "1", "{map}");
        assert_eq!(resources[map]["nvidia.com/gpucores"], "30", "{map}");
        assert_eq!(resources[map]["nvidia.com/gpumem-percentage"], "100");
    }
    // Limits alone (a manifest, before the API server defaults requests
    // from them): the limits are completed, requests left to defaulting.
    let out = admitted(&gpu_pod(json!({"nvidia.com/gpumem": "3k"})));
    let resources = &out["spec"]["containers"][0]["resources"];
    assert_eq!(resources["limits"]["nvidia.com/gpu"], "1");
    assert_eq!(resources["limits"]["nvidia.com/gpucores"], "0");
    assert!(resources.get("requests").is_none());
}

#[test]
fn numbers_from_yaml_are_written_as_quantity_strings() {
    let object = pod(json!([{"name": "train", "image": "i",
        "resources": {"requests": {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4000}}}]));
    let out = admitted(&object);
    let limits = &out["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["nvidia.com/gpu"], "2");
    assert_eq!(limits["nvidia.com/gpumem"], "4000");
}

#[test]
fn zero_gpus_with_cores_are_refused() {
    let error = refused(&gpu_pod(
        json!({"nvidia.com/gpu": "0", "nvidia.com/gpucores": "30"}),
    ));
    assert!(
        error
            .to_string()
            .contains("container \"train\": nvidia.com/gpucores needs nvidia.com/gpu"),
        "{error}"
    );
}

#[test]
fn preset_node_name_and_foreign_schedulers_are_refused() {
    let mut object = gpu_pod(json!({"nvidia.com/gpu": "1"}));
    object["spec"]["nodeName"] = json!("gpu-1");
    assert!(matches!(refused(&object), WebhookError::NodeName { node } if node == "gpu-1"));

    let mut object = gpu_pod(json!({"nvidia.com/gpu": "1"}));
    object["spec"]["schedulerName"] = json!("volcano");
    let msg = refused(&object).to_string();
    assert_eq!(
        msg,
        "pod names scheduler \"volcano\" and asks for GPU shares; accepted: schedulerName unset, default-scheduler or tessera-scheduler"
    );
    for name in ["default-scheduler", "tessera-scheduler"] {
        object["spec"]["schedulerName"] = json!(name);
        assert_eq!(
            admitted(&object)["spec"]["schedulerName"],
            "tessera-scheduler"
        );
    }
}

#[test]
fn the_scheduler_name_is_configurable() {
    let custom = WebhookConfig {
        scheduler_name: "gpu-sched".into(),
        ..WebhookConfig::default()
    };
    let got = admit_pod(&gpu_pod(json!({"nvidia.com/gpu": "1"})), &custom).unwrap();
    assert_eq!(got.patch[0].value, "gpu-sched");
}

#[test]
fn an_unreadable_object_is_a_bad_request_with_its_cause() {
    let error = refused(&json!({"spec": {"containers": "nope"}}));
    assert_eq!(error.code(), 400);
    let msg = error.full_message();
    assert!(msg.starts_with("object is not a readable pod: "), "{msg}");
    assert!(msg.len() > "object is not a readable pod: ".len());
}

fn review_of(object: Value, kind: &str, operation: &str) -> AdmissionReview {
    serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                    "kind": {"group": "", "version": "v1", "kind": kind},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "ml", "operation": operation,
                    "userInfo": {"username": "admin"},
                    "object": object, "oldObject": null, "dryRun": false}
    }))
    .unwrap()
}

#[test]
fn review_allows_with_a_base64_json_patch() {
    let incoming = review_of(gpu_pod(json!({"nvidia.com/gpu": "1"})), "Pod", "CREATE");
    let out = review(&incoming, &config()).unwrap().answer;
    let wire = serde_json::to_value(&out).unwrap();
    assert_eq!(wire["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(wire["kind"], "AdmissionReview");
    assert!(wire.get("request").is_none());
    let response = &wire["response"];
    assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = out.response.unwrap().patch_json().unwrap();
    assert_eq!(
        patch[0],
        json!({"op": "add", "path": "/spec/schedulerName", "value": "tessera-scheduler"})
    );
    // schedulerName, then memory and cores defaults in the limits.
    assert_eq!(patch.as_array().unwrap().len(), 3);
}

#[test]
fn review_refuses_with_a_status() {
    let incoming = review_of(gpu_pod(json!({"nvidia.com/gpu": "99"})), "Pod", "CREATE");
    let wire = serde_json::to_value(review(&incoming, &config()).unwrap().answer).unwrap();
    let response = &wire["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 422);
    assert_eq!(response["status"]["status"], "Failure");
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("nvidia.com/gpu is 99")
    );
    assert!(response.get("patch").is_none());
}

#[test]
fn review_passes_other_kinds_and_operations() {
    let gpu = gpu_pod(json!({"nvidia.com/gpu": "99"}));
    for (kind, operation) in [
        ("Pod", "UPDATE"),
        ("Deployment", "CREATE"),
        ("Pod", "DELETE"),
    ] {
        let out = review(&review_of(gpu.clone(), kind, operation), &config()).unwrap();
        assert!(out.templates.is_empty());
        let response = out.answer.response.unwrap();
        assert!(response.allowed, "{kind} {operation}");
        assert!(response.patch.is_none());
    }
}

#[test]
fn review_without_request_is_an_error() {
    let incoming = AdmissionReview::default();
    assert!(matches!(
        review(&incoming, &config()),
        Err(WebhookError::NoRequest)
    ));
}

/// A tenant that writes its own assignment (GPUs and limits) or allocation
/// record into the pod it creates is refused, naming the key: only the
/// scheduler's bind and the node agent write those.
#[test]
fn a_pod_carrying_tessera_s_own_records_is_refused() {
    for key in [ASSIGNMENT_KEY, ALLOCATED_KEY] {
        let mut object = defaulted_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10"}));
        object["metadata"]["annotations"] = json!({
            key: r#"{"version":1,"node":"n","boundAt":"2026-12-01T00:00:00Z","containers":[{"name":"train","gpus":[{"uuid":"GPU-12345678-9abc-def0-0123-456789abcdef","coresPercent":100}]}]}"#
        });
        let e = refused(&object).to_string();
        assert!(
            e.contains(key) && e.contains("never by the pod"),
            "{key}: {e}"
        );
    }
}

const ASSIGNMENT_KEY: &str = tessera_api::annotations::ASSIGNMENT;
const ALLOCATED_KEY: &str = tessera_api::annotations::ALLOCATED;

mod dra;
