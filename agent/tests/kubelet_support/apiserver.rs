//! A scripted fake API server behind a real `kube::Client`, in the style
//! of kube's own tests (a `tower-test` mock service): it holds pods as
//! JSON, answers the calls the agent makes (list pods with a
//! `spec.nodeName` field selector, get a pod, JSON merge patch of a pod)
//! as the API server does, including `resourceVersion` preconditions
//! (409 Conflict), and fails any other request loudly.
//!
//! Pod fixtures are files under `tests/fixtures/pods/` shaped like
//! `kubectl get pod -o json` (without `managedFields`), with `{{KEY}}`
//! placeholders filled by [`fixture`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{Value, json};

/// What the server saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    /// Pod lists answered.
    pub lists: u64,
    /// Patches applied.
    pub patches: u64,
    /// Patches refused with 409.
    pub conflicts: u64,
}

#[derive(Debug, Default)]
struct State {
    /// `namespace/name` → pod.
    pods: BTreeMap<String, Value>,
    /// The cluster's resourceVersion counter.
    rv: u64,
    counts: Counts,
    /// Requests refused as unsupported (the test fails on any).
    unsupported: Vec<String>,
}

/// The server's state, shared with the test.
#[derive(Clone, Debug, Default)]
pub struct FakeApi(Arc<Mutex<State>>);

/// A fixture file with `{{KEY}}` replaced by each value, parsed.
pub fn fixture(name: &str, vars: &[(&str, &str)]) -> Value {
    let path = format!("{}/tests/fixtures/pods/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    for (k, v) in vars {
        text = text.replace(&format!("{{{{{k}}}}}"), v);
    }
    assert!(
        !text.contains("{{"),
        "{path}: a placeholder is left: {text}"
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn ok(v: &Value) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn key_of(pod: &Value) -> String {
    format!(
        "{}/{}",
        pod["metadata"]["namespace"].as_str().unwrap(),
        pod["metadata"]["name"].as_str().unwrap()
    )
}

impl FakeApi {
    /// A server holding `pods`, and a client talking to it (the client's
    /// requests are served by a task on the current runtime).
    pub fn start(pods: Vec<Value>) -> (Self, kube::Client) {
        let api = Self::default();
        for p in pods {
            api.insert(p);
        }
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = api.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let server = server.clone();
                tokio::spawn(async move {
                    send.send_response(server.answer(request).await);
                });
            }
        });
        (api, kube::Client::new(service, "default"))
    }

    /// Adds a pod (its resourceVersion is set).
    pub fn insert(&self, mut pod: Value) {
        let mut s = self.0.lock().unwrap();
        s.rv += 1;
        pod["metadata"]["resourceVersion"] = Value::String(s.rv.to_string());
        s.pods.insert(key_of(&pod), pod);
    }

    /// The pod `namespace/name` now.
    pub fn pod(&self, key: &str) -> Value {
        self.0.lock().unwrap().pods[key].clone()
    }

    /// A change by someone else (kubelet updating the status): the pod's
    /// resourceVersion moves on.
    pub fn touch(&self, key: &str) {
        let mut s = self.0.lock().unwrap();
        s.rv += 1;
        let rv = s.rv.to_string();
        if let Some(p) = s.pods.get_mut(key) {
            p["metadata"]["resourceVersion"] = Value::String(rv);
        }
    }

    /// What was answered so far.
    pub fn counts(&self) -> Counts {
        self.0.lock().unwrap().counts
    }

    /// Requests the fake does not serve (must stay empty).
    pub fn unsupported(&self) -> Vec<String> {
        self.0.lock().unwrap().unsupported.clone()
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let path = parts.uri.path().to_owned();
        let query = parts.uri.query().unwrap_or("").to_owned();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let mut s = self.0.lock().unwrap();
        match (&parts.method, segments.as_slice()) {
            (&Method::GET, ["api", "v1", "pods"]) => {
                let mut node = None;
                for kv in query.split('&') {
                    if let Some(v) = kv.strip_prefix("fieldSelector=") {
                        let v = v.replace("%3D", "=").replace("%2F", "/");
                        match v.strip_prefix("spec.nodeName=") {
                            Some(n) => node = Some(n.to_owned()),
                            None => {
                                s.unsupported.push(format!("field selector {v}"));
                                return status(
                                    StatusCode::BAD_REQUEST,
                                    "BadRequest",
                                    format!("unsupported field selector {v}"),
                                );
                            }
                        }
                    }
                }
                s.counts.lists += 1;
                let items: Vec<Value> = s
                    .pods
                    .values()
                    .filter(|p| node.as_deref().is_none_or(|n| p["spec"]["nodeName"] == n))
                    .map(|p| {
                        // List items carry no apiVersion/kind.
                        let mut p = p.clone();
                        let o = p.as_object_mut().unwrap();
                        o.remove("apiVersion");
                        o.remove("kind");
                        p
                    })
                    .collect();
                ok(&json!({
                    "kind": "PodList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": s.rv.to_string()},
                    "items": items,
                }))
            }
            (&Method::GET, ["api", "v1", "namespaces", ns, "pods", name]) => {
                match s.pods.get(&format!("{ns}/{name}")) {
                    Some(p) => ok(p),
                    None => status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        format!("pods \"{name}\" not found"),
                    ),
                }
            }
            (&Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name]) => {
                let ct = parts
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                if ct != "application/merge-patch+json" {
                    s.unsupported.push(format!("patch content type {ct}"));
                    return status(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "UnsupportedMediaType",
                        ct.to_owned(),
                    );
                }
                let patch: Value = serde_json::from_slice(&body).unwrap();
                s.rv += 1;
                let rv = s.rv.to_string();
                let key = format!("{ns}/{name}");
                let Some(pod) = s.pods.get_mut(&key) else {
                    return status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        format!("pods \"{name}\" not found"),
                    );
                };
                if let Some(want) = patch["metadata"]["resourceVersion"].as_str()
                    && pod["metadata"]["resourceVersion"] != want
                {
                    s.counts.conflicts += 1;
                    return status(
                        StatusCode::CONFLICT,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on pods \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                        ),
                    );
                }
                merge(pod, &patch);
                pod["metadata"]["resourceVersion"] = Value::String(rv);
                let out = pod.clone();
                s.counts.patches += 1;
                ok(&out)
            }
            (m, _) => {
                s.unsupported.push(format!("{m} {path}?{query}"));
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("the fake API server does not serve {m} {path}"),
                )
            }
        }
    }
}
