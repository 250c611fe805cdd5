use serde_json::{Value, json};

use super::*;
use crate::webhook::dra::ClaimShape;

fn ours(memory_mib: Option<u64>, cores: Option<u8>, count: u32) -> ResourceClaimTemplate {
    ClaimShape {
        count,
        memory_mib,
        cores,
    }
    .template(Some("ml"))
}

/// `template` as the API server might return it, edited by `edit`.
fn stored(template: &ResourceClaimTemplate, edit: impl Fn(&mut Value)) -> ResourceClaimTemplate {
    let mut v = serde_json::to_value(template).unwrap();
    v["metadata"]["uid"] = json!("0b0c5e4e-0000-4000-8000-000000000001");
    v["metadata"]["resourceVersion"] = json!("812");
    v["metadata"]["creationTimestamp"] = json!("2026-12-01T10:00:00Z");
    edit(&mut v);
    serde_json::from_value(v).unwrap()
}

type Edit = Box<dyn Fn(&mut Value)>;

const EXACTLY: &str = "/spec/spec/devices/requests/0/exactly";

#[test]
fn what_the_api_server_stores_is_the_same_spec() {
    let t = ours(Some(4096), Some(30), 2);
    assert!(same_spec(&t, &t));
    // Canonical quantities, explicit empties and false, other labels.
    let found = stored(&t, |v| {
        let exactly = v.pointer_mut(EXACTLY).unwrap();
        exactly["capacity"]["requests"]["memory"] = json!("4Gi");
        exactly["adminAccess"] = json!(false);
        exactly["selectors"] = json!([]);
        v["metadata"]["labels"] = json!({"team": "ml"});
        v["spec"]["metadata"] = json!({});
    });
    assert!(same_spec(&t, &found));
    // Defaults the API server fills when a template leaves them out.
    let bare = stored(&t, |v| {
        let exactly = v.pointer_mut(EXACTLY).unwrap().as_object_mut().unwrap();
        exactly.remove("allocationMode");
    });
    assert!(same_spec(&bare, &stored(&bare, |_| {})));
    let one = ours(None, Some(30), 1);
    let defaulted = stored(&one, |v| {
        let exactly = v.pointer_mut(EXACTLY).unwrap().as_object_mut().unwrap();
        exactly.remove("count");
        exactly.remove("allocationMode");
    });
    assert!(same_spec(&one, &defaulted));
}

#[test]
fn any_other_spec_is_a_mismatch() {
    let t = ours(Some(4000), Some(30), 1);
    let edits: [(&str, Edit); 6] = [
        (
            "memory",
            Box::new(|v| {
                v.pointer_mut(EXACTLY).unwrap()["capacity"]["requests"]["memory"] = json!("8000Mi")
            }),
        ),
        (
            "no cores",
            Box::new(|v| {
                v.pointer_mut(EXACTLY).unwrap()["capacity"]["requests"]
                    .as_object_mut()
                    .unwrap()
                    .remove("cores");
            }),
        ),
        (
            "count",
            Box::new(|v| v.pointer_mut(EXACTLY).unwrap()["count"] = json!(2)),
        ),
        (
            "class",
            Box::new(|v| {
                v.pointer_mut(EXACTLY).unwrap()["deviceClassName"] = json!("gpu.nvidia.com")
            }),
        ),
        (
            "selector",
            Box::new(
                |v| v.pointer_mut(EXACTLY).unwrap()["selectors"] = json!([{"cel": {"expression": "device.attributes[\"gpu.tessera.dev\"].productName == \"H100\""}}]),
            ),
        ),
        (
            "claim labels",
            Box::new(|v| v["spec"]["metadata"] = json!({"labels": {"x": "y"}})),
        ),
    ];
    for (what, edit) in edits {
        assert!(!same_spec(&t, &stored(&t, edit)), "{what}");
    }
    assert!(!same_spec(
        &ours(Some(4000), Some(30), 2),
        &stored(&t, |_| {})
    ));
}

#[test]
fn errors_name_the_template_and_its_namespace() {
    let e = TemplateError::Mismatch {
        namespace: "ml".into(),
        name: "tessera-gpu-1x-4000mi-30c".into(),
    };
    assert_eq!(e.code(), 409);
    assert!(
        e.to_string().starts_with(
            "resourceclaimtemplate ml/tessera-gpu-1x-4000mi-30c exists with a spec other than"
        ),
        "{e}"
    );
    let e = TemplateError::no_client(&[ours(None, Some(5), 1), ours(Some(1), Some(5), 1)]);
    assert_eq!(e.code(), 500);
    assert_eq!(
        e.to_string(),
        "resourceclaimtemplates ml/tessera-gpu-1x-5c, ml/tessera-gpu-1x-1mi-5c cannot be made: this server has no API client for them (serve --dra makes one)"
    );
}
