//! `tessera-scheduler check-pod` end to end.
#![allow(clippy::unwrap_used)] // helpers of a test crate

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn check_pod(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .arg("check-pod")
        .args(args)
        .env_remove("TESSERA_SCHEDULER_NAME")
        .env_remove("TESSERA_DRA")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

const WHOLE_GPU: &str = "kind: Pod\nmetadata: {name: p, namespace: ml}\nspec:\n  containers:\n  - name: train\n    resources:\n      limits: {nvidia.com/gpu: 1}\n";

#[test]
fn the_example_manifest_is_allowed_unchanged() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/gpu-pod.yaml");
    let out = check_pod(&[example.to_str().unwrap()], "");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert_eq!(stdout, "Pod default/cuda-slice: allowed (unchanged)\n");
}

/// DRA mode: the design's example pod becomes a claim; the patch, the
/// warnings for its now idle annotations, and the template it names.
#[test]
fn dra_mode_prints_the_claim_and_its_template() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/gpu-pod.yaml");
    let out = check_pod(&["--dra", example.to_str().unwrap()], "");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert_eq!(
        stdout,
        r#"Pod default/cuda-slice: allowed
  add /spec/resourceClaims = [{"name":"gpu-cuda","resourceClaimTemplateName":"tessera-gpu-1x-4000mi-30c"}]
  add /spec/containers/0/resources/limits = {}
  add /spec/containers/0/resources/claims = [{"name":"gpu-cuda"}]
  warning: annotation tessera.dev/compute-mode has no effect in DRA mode: the node agent takes a claim's compute mode from its node policy
  warning: annotation tessera.dev/placement has no effect in DRA mode: the pod's scheduler places its claims
  template tessera-gpu-1x-4000mi-30c: {"spec":{"devices":{"requests":[{"exactly":{"allocationMode":"ExactCount","capacity":{"requests":{"cores":"30","memory":"4000Mi"}},"count":1,"deviceClassName":"gpu.tessera.dev"},"name":"gpu"}]}}}
"#
    );
    let out = check_pod(&["--dra", "--json", example.to_str().unwrap()], "");
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let template = &verdict["templates"][0];
    assert_eq!(template["kind"], "ResourceClaimTemplate");
    assert_eq!(template["metadata"]["namespace"], "default");
    // gpumem-percentage has no DRA spelling: refused, exit 1.
    let share = WHOLE_GPU.replace(
        "nvidia.com/gpu: 1}",
        "nvidia.com/gpumem-percentage: 50, nvidia.com/gpucores: 10}",
    );
    let out = check_pod(&["--dra", "-"], &share);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with(
            "Pod ml/p: denied (422): container \"train\": nvidia.com/gpumem-percentage is 50"
        ),
        "{stdout}"
    );
}

#[test]
fn defaults_are_printed_as_patch_operations() {
    let out = check_pod(&["-"], WHOLE_GPU);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    assert_eq!(
        stdout,
        "Pod ml/p: allowed\n  add /spec/schedulerName = \"tessera-scheduler\"\n  add /spec/containers/0/resources/limits/nvidia.com~1gpumem-percentage = \"100\"\n  add /spec/containers/0/resources/limits/nvidia.com~1gpucores = \"100\"\n"
    );
}

#[test]
fn a_refusal_exits_1_and_json_output_carries_the_code() {
    let privileged = WHOLE_GPU.replace(
        "  - name: train\n",
        "  - name: train\n    securityContext: {privileged: true}\n",
    );
    let out = check_pod(&["--json", "-"], &privileged);
    assert_eq!(out.status.code(), Some(1));
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdict["allowed"], false);
    assert_eq!(verdict["code"], 403);
    assert_eq!(verdict["source"], "Pod ml/p");
    assert!(
        verdict["message"]
            .as_str()
            .unwrap()
            .contains("is privileged")
    );
}

#[test]
fn the_scheduler_name_flag_is_used() {
    let out = check_pod(&["--scheduler-name", "gpu", "--json", "-"], WHOLE_GPU);
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdict["patch"][0]["value"], "gpu");
}

#[test]
fn unreadable_input_is_an_error_naming_the_file() {
    let out = check_pod(&["-"], "kind: Service\n");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("in -"), "{stderr}");
    assert!(stderr.contains("document 1 is a \"Service\""), "{stderr}");
}
