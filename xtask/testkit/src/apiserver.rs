//! A scripted fake Kubernetes API server behind a real `kube::Client`, in
//! the style of kube's own tests (a `tower-test` mock service), for the
//! agent's and the scheduler's tests:
//!
//! - [`pair`]: a client and the handle its requests come out of, for a
//!   test that answers each request itself (and checks when it came);
//! - [`serve`]: a client whose every request is answered by a function;
//! - [`Call`]: one request with its body read; [`json`], [`status`] and
//!   [`merge_patch`]: answers as the API server gives them;
//! - [`Pods`]: pods held as JSON and the pod calls the agent and the
//!   scheduler make, answered as the API server does — list (with a
//!   `spec.nodeName` field selector), get, JSON merge patch with its
//!   `resourceVersion` precondition (409 Conflict), the `binding`
//!   subresource — with injectable refusals ([`Faults`]) and a record of
//!   every request; anything else is refused and noted as unsupported
//!   (a test asserts that stays empty).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use kube::client::Body;
use serde_json::{Value, json};

/// Where the requests of a [`pair`]'s client come out.
pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The answer slot of one request taken from a [`Handle`].
pub type Reply = tower_test::mock::SendResponse<Response<Body>>;

/// A client whose requests the test takes from the handle one by one.
pub fn pair() -> (kube::Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), handle)
}

/// A client whose every request is answered by `answer`, each on a task
/// of its own on the current runtime (so a slow answer, a watch, holds no
/// other).
pub fn serve<F, Fut>(answer: F) -> kube::Client
where
    F: Fn(Call) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let (client, mut handle) = pair();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let call = Call::read(request).await;
                send.send_response(answer(call).await);
            });
        }
    });
    client
}

/// One request, its body read.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    /// The URI's path.
    pub path: String,
    /// The URI's query, as sent (`""` without one).
    pub query: String,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl Call {
    /// `request` with its body collected.
    pub async fn read(request: Request<Body>) -> Self {
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .expect("the request body")
            .to_bytes()
            .to_vec();
        Self {
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().unwrap_or("").to_owned(),
            content_type: parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            method: parts.method,
            body,
        }
    }

    /// The path's segments (`/api/v1/pods` → `["api", "v1", "pods"]`).
    pub fn segments(&self) -> Vec<&str> {
        self.path.trim_start_matches('/').split('/').collect()
    }

    /// The query's `key=value` pairs, as sent (not percent-decoded).
    pub fn query_pairs(&self) -> BTreeMap<String, String> {
        self.query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The body as JSON (null when it is none).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// An answer with `body` as JSON.
pub fn bytes(code: StatusCode, body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("a response")
}

/// An answer with `v`.
pub fn json(code: StatusCode, v: &Value) -> Response<Body> {
    bytes(code, serde_json::to_vec(v).expect("json"))
}

/// The `Status` object the API server answers a failure with.
pub fn status_object(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    })
}

/// A failure answered as the API server does.
pub fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json(code, &status_object(code, reason, message))
}

/// RFC 7386 JSON merge patch of `target` by `patch`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("an object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// What [`Pods`] answered.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    /// Pod lists answered.
    pub lists: u64,
    /// Patches applied.
    pub patches: u64,
    /// Patches refused with 409 (a stale `resourceVersion`, or
    /// [`Faults`]).
    pub conflicts: u64,
    /// Bindings made.
    pub bindings: u64,
}

/// Refusals [`Pods`] answers instead of doing what was asked; pods by
/// `namespace/name`.
#[derive(Debug, Default)]
pub struct Faults {
    /// The next this many patches are refused with 409, each as if the
    /// pod had changed under it (its `resourceVersion` moves on).
    pub conflicts: u32,
    /// Pods whose next patch is refused so, once.
    pub conflict_once: BTreeSet<String>,
    /// Pods whose patches setting this annotation (to a value, not null)
    /// are refused with 403.
    pub refuse_annotation: BTreeMap<String, String>,
    /// Pods whose bindings are refused with 500, with this message.
    pub refuse_binding: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct State {
    /// `namespace/name` → pod.
    pods: BTreeMap<String, Value>,
    /// The cluster's resourceVersion counter.
    rv: u64,
    counts: Counts,
    faults: Faults,
    /// (method, path, body as JSON) of every request.
    log: Vec<(String, String, Value)>,
    /// Requests refused as unsupported.
    unsupported: Vec<String>,
}

/// Pods as the API server holds them, shared with the test (see the
/// module documentation).
#[derive(Clone, Debug, Default)]
pub struct Pods(Arc<Mutex<State>>);

fn key_of(pod: &Value) -> String {
    format!(
        "{}/{}",
        pod["metadata"]["namespace"]
            .as_str()
            .expect("a pod's namespace"),
        pod["metadata"]["name"].as_str().expect("a pod's name")
    )
}

fn not_found(name: &str) -> Response<Body> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("pods \"{name}\" not found"),
    )
}

fn conflict(name: &str) -> Response<Body> {
    status(
        StatusCode::CONFLICT,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on pods \"{name}\": the object has been modified; \
             please apply your changes to the latest version and try again"
        ),
    )
}

impl State {
    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// The pod's `resourceVersion` moves on (someone else changed it).
    fn touch(&mut self, key: &str) {
        let rv = self.next_rv();
        if let Some(p) = self.pods.get_mut(key) {
            p["metadata"]["resourceVersion"] = Value::String(rv);
        }
    }

    fn unsupported(&mut self, what: String) -> Response<Body> {
        let message = format!("the fake API server does not serve {what}");
        self.unsupported.push(what);
        status(StatusCode::BAD_REQUEST, "BadRequest", &message)
    }

    fn list(&mut self, call: &Call) -> Response<Body> {
        let mut node = None;
        for (k, v) in call.query_pairs() {
            if k == "fieldSelector" {
                let v = v.replace("%3D", "=").replace("%2F", "/");
                match v.strip_prefix("spec.nodeName=") {
                    Some(n) => node = Some(n.to_owned()),
                    None => return self.unsupported(format!("field selector {v}")),
                }
            }
        }
        self.counts.lists += 1;
        let items: Vec<Value> = self
            .pods
            .values()
            .filter(|p| node.as_deref().is_none_or(|n| p["spec"]["nodeName"] == n))
            .map(|p| {
                // List items carry no apiVersion/kind.
                let mut p = p.clone();
                let o = p.as_object_mut().expect("a pod object");
                o.remove("apiVersion");
                o.remove("kind");
                p
            })
            .collect();
        json(
            StatusCode::OK,
            &json!({
                "kind": "PodList", "apiVersion": "v1",
                "metadata": {"resourceVersion": self.rv.to_string()},
                "items": items,
            }),
        )
    }

    fn patch(&mut self, call: &Call, key: &str, name: &str) -> Response<Body> {
        let ct = call.content_type.as_deref().unwrap_or("");
        if ct != "application/merge-patch+json" {
            return self.unsupported(format!("patch content type {ct}"));
        }
        let patch: Value = match serde_json::from_slice(&call.body) {
            Ok(p) => p,
            Err(e) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("the patch is no JSON: {e}"),
                );
            }
        };
        if let Some(annotation) = self.faults.refuse_annotation.get(key)
            && !patch["metadata"]["annotations"][annotation].is_null()
        {
            return status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!("pods \"{name}\" is forbidden"),
            );
        }
        let once = self.faults.conflict_once.remove(key);
        if once || self.faults.conflicts > 0 {
            if !once {
                self.faults.conflicts -= 1;
            }
            self.touch(key);
            self.counts.conflicts += 1;
            return conflict(name);
        }
        let rv = self.next_rv();
        let Some(pod) = self.pods.get_mut(key) else {
            return not_found(name);
        };
        let want = &patch["metadata"]["resourceVersion"];
        if !want.is_null() && *want != pod["metadata"]["resourceVersion"] {
            self.counts.conflicts += 1;
            return conflict(name);
        }
        merge_patch(pod, &patch);
        pod["metadata"]["resourceVersion"] = Value::String(rv);
        let out = json(StatusCode::OK, pod);
        self.counts.patches += 1;
        out
    }

    fn bind(&mut self, call: &Call, key: &str, name: &str) -> Response<Body> {
        if let Some(message) = self.faults.refuse_binding.get(key) {
            return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message);
        }
        let binding = call.json();
        let rv = self.next_rv();
        let Some(pod) = self.pods.get_mut(key) else {
            return not_found(name);
        };
        if !pod["spec"]["nodeName"].is_null() {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                &format!(
                    "pod {name} is already assigned to node {}",
                    pod["spec"]["nodeName"]
                ),
            );
        }
        pod["spec"]["nodeName"] = binding["target"]["name"].clone();
        pod["metadata"]["resourceVersion"] = Value::String(rv);
        self.counts.bindings += 1;
        json(
            StatusCode::CREATED,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Success", "code": 201}),
        )
    }
}

impl Pods {
    /// A store holding `pods`.
    pub fn new(pods: Vec<Value>) -> Self {
        let api = Self::default();
        for p in pods {
            api.insert(p);
        }
        api
    }

    /// A server of `pods` alone, and a client talking to it (its requests
    /// are served by tasks on the current runtime).
    pub fn start(pods: Vec<Value>) -> (Self, kube::Client) {
        let api = Self::new(pods);
        let server = api.clone();
        let client = serve(move |call| {
            let answer = server.answer(&call);
            async move { answer }
        });
        (api, client)
    }

    /// Adds a pod (its resourceVersion is set).
    pub fn insert(&self, mut pod: Value) {
        let mut s = self.0.lock().unwrap();
        let rv = s.next_rv();
        pod["metadata"]["resourceVersion"] = Value::String(rv);
        s.pods.insert(key_of(&pod), pod);
    }

    /// The pod `namespace/name` now.
    pub fn pod(&self, key: &str) -> Value {
        self.0
            .lock()
            .unwrap()
            .pods
            .get(key)
            .unwrap_or_else(|| panic!("the fake API server holds no pod {key}"))
            .clone()
    }

    /// A change by someone else (kubelet updating the status): the pod's
    /// resourceVersion moves on.
    pub fn touch(&self, key: &str) {
        self.0.lock().unwrap().touch(key);
    }

    /// Changes the refusals to come.
    pub fn faults(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.0.lock().unwrap().faults);
    }

    /// What was answered so far.
    pub fn counts(&self) -> Counts {
        self.0.lock().unwrap().counts
    }

    /// (method, path, body as JSON) of every request so far.
    pub fn log(&self) -> Vec<(String, String, Value)> {
        self.0.lock().unwrap().log.clone()
    }

    /// Requests refused as unsupported (a test asserts none).
    pub fn unsupported(&self) -> Vec<String> {
        self.0.lock().unwrap().unsupported.clone()
    }

    /// Panics, listing them, if any request was refused as unsupported
    /// (the code under test called something this fake does not serve).
    pub fn assert_all_supported(&self) {
        let unsupported = self.unsupported();
        assert!(
            unsupported.is_empty(),
            "unsupported requests: {unsupported:?}"
        );
    }

    /// Records and answers `call`: one of the pod calls, or refused as
    /// unsupported.
    pub fn answer(&self, call: &Call) -> Response<Body> {
        let mut s = self.0.lock().unwrap();
        s.log
            .push((call.method.to_string(), call.path.clone(), call.json()));
        match (&call.method, call.segments().as_slice()) {
            (&Method::GET, ["api", "v1", "pods"]) => s.list(call),
            (&Method::GET, ["api", "v1", "namespaces", ns, "pods", name]) => {
                match s.pods.get(&format!("{ns}/{name}")) {
                    Some(p) => json(StatusCode::OK, p),
                    None => not_found(name),
                }
            }
            (&Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name]) => {
                s.patch(call, &format!("{ns}/{name}"), name)
            }
            (&Method::POST, ["api", "v1", "namespaces", ns, "pods", name, "binding"]) => {
                s.bind(call, &format!("{ns}/{name}"), name)
            }
            _ => s.unsupported(format!("{} {}?{}", call.method, call.path, call.query)),
        }
    }
}
