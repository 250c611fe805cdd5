use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;
use crate::extender::{GpuView, NodeView};

fn state() -> AppState {
    AppState {
        view: ClusterView::new([NodeView {
            name: "gpu-1".into(),
            gpus: vec![GpuView {
                uuid: "GPU-5e1a0000-0000-4000-8000-000051510000".into(),
                model: "NVIDIA A100-SXM4-80GB".into(),
                memory_mib: 81920,
                used_mib: 0,
                cores_used_percent: 0,
                healthy: true,
            }],
        }]),
        webhook: WebhookConfig::default(),
    }
}

fn gpu_pod() -> Value {
    json!({"metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k"}}}]}})
}

fn extender_args() -> Vec<u8> {
    serde_json::to_vec(&json!({"Pod": gpu_pod(), "Nodes": null, "NodeNames": ["gpu-1", "cpu-1"]}))
        .unwrap()
}

fn json_of(reply: &Reply) -> Value {
    assert_eq!(reply.content_type, "application/json");
    serde_json::from_slice(&reply.body).unwrap()
}

#[test]
fn filter_route_answers_with_the_filter_result() {
    let reply = route("POST", "/filter", &extender_args(), &state());
    assert_eq!(reply.status, StatusCode::OK);
    let body = json_of(&reply);
    assert_eq!(body["NodeNames"], json!(["gpu-1"]));
    assert!(body["FailedAndUnresolvableNodes"]["cpu-1"].is_string());
}

#[test]
fn an_unreadable_filter_body_still_answers_200_with_error() {
    let reply = route("POST", "/filter", b"{not json", &state());
    assert_eq!(reply.status, StatusCode::OK);
    let body = json_of(&reply);
    assert!(
        body["Error"]
            .as_str()
            .unwrap()
            .starts_with("request body is not ExtenderArgs JSON")
    );
    assert_eq!(body["NodeNames"], Value::Null);
}

#[test]
fn prioritize_route_answers_a_host_priority_list() {
    let reply = route("POST", "/prioritize", &extender_args(), &state());
    let body = json_of(&reply);
    assert_eq!(body[0]["Host"], "gpu-1");
    assert_eq!(body[1], json!({"Host": "cpu-1", "Score": 0}));
    let reply = route("POST", "/prioritize", b"{not json", &state());
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

#[test]
fn bind_route_says_binding_is_planned() {
    let reply = route("POST", "/bind", b"{}", &state());
    assert!(
        json_of(&reply)["Error"]
            .as_str()
            .unwrap()
            .contains("does not bind yet")
    );
}

#[test]
fn webhook_route_answers_an_admission_review() {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "object": gpu_pod()}});
    let reply = route(
        "POST",
        "/webhook",
        &serde_json::to_vec(&review).unwrap(),
        &state(),
    );
    let body = json_of(&reply);
    assert_eq!(body["response"]["uid"], "u1");
    assert_eq!(body["response"]["allowed"], true);
    assert_eq!(body["response"]["patchType"], "JSONPatch");
    let reply = route("POST", "/webhook", b"{}", &state());
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        String::from_utf8_lossy(&reply.body),
        "admission review has no request\n"
    );
}

#[test]
fn unknown_routes_and_methods_are_refused() {
    assert_eq!(route("GET", "/healthz", b"", &state()).body, b"ok\n");
    assert_eq!(
        route("GET", "/filter", b"", &state()).status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        route("POST", "/healthz", b"", &state()).status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        route("POST", "/nope", b"", &state()).status,
        StatusCode::NOT_FOUND
    );
}

/// One HTTP/1.1 exchange over a real socket; returns status and body.
async fn exchange(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

#[tokio::test]
async fn serves_routes_over_http_and_stops_on_shutdown() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, Arc::new(state()), async {
        let _ = stopped.await;
    }));

    let (status, body) = exchange(
        addr,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    let args = String::from_utf8(extender_args()).unwrap();
    let request = format!(
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{args}",
        args.len()
    );
    let (status, body) = exchange(addr, &request).await;
    assert_eq!(status, 200);
    let result: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(result["NodeNames"], json!(["gpu-1"]));

    let too_big = format!(
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        MAX_BODY + 1
    );
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), exchange(addr, &too_big))
        .await
        .expect("an oversized body is refused without waiting for it");
    assert_eq!(status, 413);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}
