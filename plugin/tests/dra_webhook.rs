//! The webhook's DRA mode through the server's `/webhook` route against a
//! scripted fake API server behind a real `kube::Client`: the templates a
//! pod names are made before it is admitted (created, found, found made
//! meanwhile), a template of that name with another spec or an API error
//! refuses the pod naming the template, and a dry run makes nothing. What
//! the API server would store (the patched pod, the template) is checked
//! against the Kubernetes JSON schemas (kubernetes-validate, strict).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_scheduler::claim_templates::ClaimTemplates;
use tessera_scheduler::server::{AppState, Routes, dispatch};
use tessera_scheduler::webhook::WebhookConfig;
use tessera_testkit::apiserver::{self, Call};
use tessera_testkit::helm::NO_VALIDATE;

const TEMPLATE: &str = "tessera-gpu-1x-4000mi-30c";
const PATH: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates";

/// What the fake API server holds and was asked.
#[derive(Default)]
struct Store {
    /// `namespace/name` → template as stored.
    templates: BTreeMap<String, Value>,
    /// `METHOD path` of every request.
    calls: Vec<String>,
    /// Made by "someone else" between the webhook's read and its create.
    made_meanwhile: Option<Value>,
    /// The next create is refused with this code, reason and message.
    refuse_create: Option<(StatusCode, &'static str, &'static str)>,
    /// Every answer waits this long.
    delay: Duration,
}

type Shared = Arc<Mutex<Store>>;

/// The object as the API server stores it: server fields, and memory in
/// its canonical spelling (`4096Mi` → `4Gi`), which the webhook must
/// read as the same.
fn stored(mut object: Value, rv: usize) -> Value {
    object["metadata"]["uid"] = json!(format!("5d9e0000-0000-4000-8000-{rv:012}"));
    object["metadata"]["resourceVersion"] = json!(rv.to_string());
    object["metadata"]["creationTimestamp"] = json!("2026-12-01T10:00:00Z");
    let memory =
        object.pointer_mut("/spec/spec/devices/requests/0/exactly/capacity/requests/memory");
    if let Some(m) = memory
        && m == "4096Mi"
    {
        *m = json!("4Gi");
    }
    object
}

fn answer(store: &Shared, call: &Call) -> http::Response<kube::client::Body> {
    let mut s = store.lock().unwrap();
    s.calls.push(format!("{} {}", call.method, call.path));
    let segments = call.segments();
    let not_ours = || {
        apiserver::status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("fake: no route {} {}", call.method, call.path),
        )
    };
    // apis resource.k8s.io v1 namespaces NS resourceclaimtemplates [NAME]
    if segments.len() < 6
        || segments[..3] != ["apis", "resource.k8s.io", "v1"]
        || segments[5] != "resourceclaimtemplates"
    {
        return not_ours();
    }
    let ns = segments[4];
    match (&call.method, segments.get(6)) {
        (&Method::GET, Some(name)) => match s.templates.get(&format!("{ns}/{name}")) {
            Some(t) => apiserver::json(StatusCode::OK, t),
            None => {
                if let Some(made) = s.made_meanwhile.take() {
                    let rv = s.calls.len();
                    s.templates.insert(format!("{ns}/{name}"), stored(made, rv));
                }
                apiserver::status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("resourceclaimtemplates.resource.k8s.io \"{name}\" not found"),
                )
            }
        },
        (&Method::POST, None) => {
            if let Some((code, reason, message)) = s.refuse_create.take() {
                return apiserver::status(code, reason, message);
            }
            let body = call.json();
            let name = body["metadata"]["name"].as_str().unwrap().to_owned();
            assert_eq!(
                body["metadata"]["namespace"], ns,
                "created in the pod's namespace"
            );
            let key = format!("{ns}/{name}");
            if s.templates.contains_key(&key) {
                return apiserver::status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("resourceclaimtemplates.resource.k8s.io \"{name}\" already exists"),
                );
            }
            let rv = s.calls.len();
            let object = stored(body, rv);
            s.templates.insert(key, object.clone());
            apiserver::json(StatusCode::CREATED, &object)
        }
        _ => not_ours(),
    }
}

fn fake() -> (Shared, kube::Client) {
    let store = Shared::default();
    let s = store.clone();
    let client = apiserver::serve(move |call| {
        let s = s.clone();
        async move {
            let delay = s.lock().unwrap().delay;
            tokio::time::sleep(delay).await;
            answer(&s, &call)
        }
    });
    (store, client)
}

fn state(client: Option<kube::Client>) -> AppState {
    AppState {
        webhook: WebhookConfig {
            dra: true,
            ..WebhookConfig::default()
        },
        claim_templates: client
            .map(|c| ClaimTemplates::new(c).with_timeout(Duration::from_millis(500))),
        ..AppState::default()
    }
}

/// The fixture the API server sent for a Deployment's pod (gpu 1,
/// gpumem 4k, gpucores 30), with `dryRun` as given.
fn share_review(dry_run: bool) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission/share.json");
    let mut review: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    review["request"]["dryRun"] = json!(dry_run);
    review
}

async fn post(state: &AppState, review: &Value) -> Value {
    let reply = dispatch(
        Routes::Webhook,
        "POST",
        "/webhook",
        review.to_string().as_bytes(),
        state,
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let answer: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(answer["response"]["uid"], review["request"]["uid"]);
    answer["response"].clone()
}

/// The pod the API server would store.
fn patched(review: &Value, response: &Value) -> Value {
    let mut pod = review["request"]["object"].clone();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod
}

fn refusal(response: &Value) -> (u64, String) {
    assert_eq!(response["allowed"], false, "{response}");
    assert!(response.get("patch").is_none() && response.get("patchType").is_none());
    assert_eq!(response["status"]["status"], "Failure");
    (
        response["status"]["code"].as_u64().unwrap(),
        response["status"]["message"].as_str().unwrap().to_owned(),
    )
}

/// Strict schema errors of `objects` (Kubernetes 1.34's schemas, the
/// newest kubernetes-validate ships; every field written here is in
/// them); `None` when kubernetes-validate is not installed.
fn schema_errors(objects: &[Value]) -> Option<Vec<String>> {
    const SCRIPT: &str = r#"
import json, sys
try:
    import kubernetes_validate
except ImportError:
    sys.exit(3)
errors = []
for doc in json.load(sys.stdin):
    try:
        kubernetes_validate.validate(doc, "1.34.0", strict=True)
    except kubernetes_validate.ValidationError as e:
        errors.append(doc["kind"] + ": at " + "/".join(str(p) for p in e.path) + ": " + e.message)
print(json.dumps(errors))
"#;
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    serde_json::to_writer(child.stdin.take().unwrap(), objects).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.code() == Some(3) {
        return None;
    }
    assert!(out.status.success(), "{out:?}");
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// Nulls dropped (`creationTimestamp: null` as the API server sends it
/// before it sets one): the schemas type every field.
fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

#[tokio::test]
async fn the_template_is_made_before_the_pod_is_admitted_and_then_reused() {
    let (store, client) = fake();
    let state = state(Some(client));
    let review = share_review(false);
    let response = post(&state, &review).await;
    assert_eq!(response["allowed"], true, "{response}");
    let pod = patched(&review, &response);
    assert_eq!(
        pod["spec"]["resourceClaims"],
        json!([{"name": "gpu-train", "resourceClaimTemplateName": TEMPLATE}])
    );
    let train = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(
        train,
        &json!({"limits": {"cpu": "2", "memory": "8Gi"}, "requests": {"cpu": "2", "memory": "8Gi"},
                "claims": [{"name": "gpu-train"}]})
    );
    assert_eq!(
        pod["spec"]["containers"][1],
        review["request"]["object"]["spec"]["containers"][1]
    );
    assert_eq!(
        pod["spec"]["schedulerName"],
        review["request"]["object"]["spec"]["schedulerName"]
    );
    let template = {
        let s = store.lock().unwrap();
        assert_eq!(
            s.calls,
            [format!("GET {PATH}/{TEMPLATE}"), format!("POST {PATH}")]
        );
        s.templates[&format!("ml/{TEMPLATE}")].clone()
    };
    assert_eq!(
        template["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "tessera-webhook"
    );
    assert_eq!(
        template["spec"]["spec"]["devices"]["requests"],
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev",
            "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "4000Mi", "cores": "30"}}}}])
    );
    match schema_errors(&[without_nulls(&pod), template]) {
        Some(errors) => assert_eq!(errors, Vec::<String>::new()),
        None => println!("skipped: {NO_VALIDATE}"),
    }

    // The next pod asking the same finds it: one read, nothing made.
    store.lock().unwrap().calls.clear();
    let response = post(&state, &review).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        store.lock().unwrap().calls,
        [format!("GET {PATH}/{TEMPLATE}")]
    );
}

#[tokio::test]
async fn a_template_made_meanwhile_is_used_if_it_is_the_same() {
    // 4096 MiB: the API server stores "4Gi", read back as the same.
    let mut review = share_review(false);
    for map in ["limits", "requests"] {
        review["request"]["object"]["spec"]["containers"][0]["resources"][map]["nvidia.com/gpumem"] =
            json!("4096");
    }
    let name = "tessera-gpu-1x-4096mi-30c";
    let ours = |cores: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.tessera.dev", "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": "4096Mi", "cores": cores}}}}]}}}})
    };
    let (store, client) = fake();
    store.lock().unwrap().made_meanwhile = Some(ours("30"));
    let state = state(Some(client));
    let response = post(&state, &review).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        store.lock().unwrap().calls,
        [
            format!("GET {PATH}/{name}"),
            format!("POST {PATH}"),
            format!("GET {PATH}/{name}")
        ],
        "read, AlreadyExists, read again"
    );

    // Made meanwhile with another spec: refused.
    let (store, client) = fake();
    store.lock().unwrap().made_meanwhile = Some(ours("50"));
    let (code, message) = refusal(&post(&state_with(client), &review).await);
    assert_eq!(code, 409);
    assert!(
        message.starts_with(&format!(
            "resourceclaimtemplate ml/{name} exists with a spec other than"
        )),
        "{message}"
    );
}

fn state_with(client: kube::Client) -> AppState {
    state(Some(client))
}

#[tokio::test]
async fn a_template_of_that_name_with_another_spec_refuses_the_pod() {
    let (store, client) = fake();
    let edited = stored(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.tessera.dev", "allocationMode": "ExactCount", "count": 1,
                "selectors": [{"cel": {"expression": "device.attributes[\"gpu.tessera.dev\"].index == 0"}}],
                "capacity": {"requests": {"memory": "4000Mi", "cores": "30"}}}}]}}}}),
        1,
    );
    store
        .lock()
        .unwrap()
        .templates
        .insert(format!("ml/{TEMPLATE}"), edited.clone());
    let (code, message) = refusal(&post(&state(Some(client)), &share_review(false)).await);
    assert_eq!(code, 409);
    assert_eq!(
        message,
        format!(
            "resourceclaimtemplate ml/{TEMPLATE} exists with a spec other than the one the webhook writes for this request (made or replaced by someone else), so the pod would get something other than its resources say; accepted: delete that template (the webhook makes it again) or give the pod other GPU resources"
        )
    );
    let s = store.lock().unwrap();
    assert_eq!(
        s.calls,
        [format!("GET {PATH}/{TEMPLATE}")],
        "nothing written"
    );
    assert_eq!(s.templates[&format!("ml/{TEMPLATE}")], edited);
}

#[tokio::test]
async fn a_dry_run_reads_but_makes_nothing() {
    let (store, client) = fake();
    let state = state(Some(client));
    let review = share_review(true);
    let response = post(&state, &review).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(patched(&review, &response)["spec"]["resourceClaims"].is_array());
    let s = store.lock().unwrap();
    assert_eq!(s.calls, [format!("GET {PATH}/{TEMPLATE}")]);
    assert!(s.templates.is_empty());
}

#[tokio::test]
async fn api_errors_and_silence_refuse_the_pod_naming_the_template() {
    let (store, client) = fake();
    store.lock().unwrap().refuse_create = Some((
        StatusCode::FORBIDDEN,
        "Forbidden",
        "resourceclaimtemplates.resource.k8s.io is forbidden: User \"system:serviceaccount:tessera-system:tessera-scheduler\" cannot create resource \"resourceclaimtemplates\"",
    ));
    let (code, message) = refusal(&post(&state(Some(client)), &share_review(false)).await);
    assert_eq!(code, 500);
    assert!(
        message.starts_with(&format!(
            "resourceclaimtemplate ml/{TEMPLATE} could not be created: "
        )),
        "{message}"
    );
    assert!(message.contains("cannot create resource"), "{message}");
    assert!(store.lock().unwrap().templates.is_empty());

    let (store, client) = fake();
    store.lock().unwrap().delay = Duration::from_secs(5);
    let (code, message) = refusal(&post(&state(Some(client)), &share_review(false)).await);
    assert_eq!(code, 500);
    assert_eq!(
        message,
        format!("resourceclaimtemplates ml/{TEMPLATE} were not all made within 500ms")
    );

    let (code, message) = refusal(&post(&state(None), &share_review(false)).await);
    assert_eq!(code, 500);
    assert!(
        message.starts_with(&format!(
            "resourceclaimtemplates ml/{TEMPLATE} cannot be made"
        )),
        "{message}"
    );
}

#[tokio::test]
async fn pods_needing_no_template_never_reach_the_api() {
    let (store, client) = fake();
    let state = state(Some(client));
    // Whole GPUs only: unchanged, for the DeviceClass's extended-resource mapping.
    let mut review = share_review(false);
    for map in ["limits", "requests"] {
        let r = &mut review["request"]["object"]["spec"]["containers"][0]["resources"][map];
        let r = r.as_object_mut().unwrap();
        r.remove("nvidia.com/gpumem");
        r.remove("nvidia.com/gpucores");
    }
    let response = post(&state, &review).await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
    // Refused before any template: a percentage DRA cannot ask for.
    let mut review = share_review(false);
    for map in ["limits", "requests"] {
        let r = review["request"]["object"]["spec"]["containers"][0]["resources"][map]
            .as_object_mut()
            .unwrap();
        r.remove("nvidia.com/gpumem");
        r.insert("nvidia.com/gpumem-percentage".into(), json!("50"));
    }
    let (code, message) = refusal(&post(&state, &review).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("accepted in DRA mode: nvidia.com/gpumem (MiB per GPU)"),
        "{message}"
    );
    // Device-plugin mode: the scheduler's name, no template.
    let plain = AppState {
        claim_templates: state.claim_templates.clone(),
        ..AppState::default()
    };
    let response = post(&plain, &share_review(false)).await;
    assert_eq!(
        patched(&share_review(false), &response)["spec"]["schedulerName"],
        "tessera-scheduler"
    );
    assert!(store.lock().unwrap().calls.is_empty());
}
