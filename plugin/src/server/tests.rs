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
                ..GpuView::default()
            }],
            ..NodeView::default()
        }])
        .into(),
        webhook: WebhookConfig::default(),
        ..AppState::default()
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
fn bind_route_without_an_api_client_says_so() {
    let reply = route("POST", "/bind", b"{}", &state());
    assert!(
        json_of(&reply)["Error"]
            .as_str()
            .unwrap()
            .contains("no API client to bind with")
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
    let server = tokio::spawn(serve(
        listener,
        Arc::new(state()),
        Limits::default(),
        async {
            let _ = stopped.await;
        },
    ));

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

/// Short limits, so that the slow clients below meet them quickly.
const TIGHT: Limits = Limits {
    header_read_timeout: Duration::from_millis(500),
    body_read_timeout: Duration::from_millis(500),
    max_body: 1000,
    max_connections: 4,
};

/// How late past a timeout a disconnect may come on a loaded machine.
const SLACK: Duration = Duration::from_secs(3);

/// How long a slow client keeps at it before giving up on the server.
const PATIENCE: Duration = Duration::from_secs(20);

/// A server under `limits` on 127.0.0.1; stop it with the sender.
async fn start(
    limits: Limits,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), ServerError>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, Arc::new(state()), limits, async {
        let _ = stopped.await;
    }));
    (addr, stop, server)
}

/// What a slow client saw: the server's bytes, and when (after the
/// connect) the server closed the connection; `None` if it was still open
/// after [`PATIENCE`].
struct Slow {
    answer: String,
    closed_after: Option<Duration>,
}

/// Sends `head`, then one byte of `trickle` every 100 ms (a slowloris:
/// never idle long enough for a per-read timeout), or nothing when
/// `None`, until the server closes the connection or [`PATIENCE`] runs
/// out.
async fn slow_client(addr: std::net::SocketAddr, head: &str, trickle: Option<u8>) -> Slow {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let start = std::time::Instant::now();
    let (mut rd, mut wr) = stream.into_split();
    let reader = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return (seen, start.elapsed()),
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    });
    wr.write_all(head.as_bytes()).await.unwrap();
    while !reader.is_finished() && start.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(byte) = trickle
            && wr.write_all(&[byte]).await.is_err()
        {
            break;
        }
    }
    match tokio::time::timeout(Duration::from_secs(1), reader).await {
        Ok(done) => {
            let (seen, at) = done.unwrap();
            Slow {
                answer: String::from_utf8_lossy(&seen).into_owned(),
                closed_after: Some(at),
            }
        }
        Err(_) => Slow {
            answer: String::new(),
            closed_after: None,
        },
    }
}

fn assert_cut_off_at(slow: &Slow, timeout: Duration) {
    let at = slow
        .closed_after
        .unwrap_or_else(|| panic!("still connected after {PATIENCE:?}"));
    assert!(at >= timeout, "closed after {at:?}, before the timeout");
    assert!(at < timeout + SLACK, "closed only after {at:?}");
}

#[tokio::test]
async fn a_client_sending_headers_byte_by_byte_is_cut_off_at_the_header_timeout() {
    let (addr, stop, server) = start(TIGHT).await;
    let slowloris = tokio::spawn(slow_client(
        addr,
        "POST /filter HTTP/1.1\r\nHost: x\r\nX-Padding: ",
        Some(b'a'),
    ));
    // Meanwhile others are served.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let healthz = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_eq!(exchange(addr, healthz).await, (200, "ok\n".to_owned()));

    let slow = slowloris.await.unwrap();
    assert_cut_off_at(&slow, TIGHT.header_read_timeout);
    assert_eq!(slow.answer, "", "no answer to a request never complete");
    assert_eq!(exchange(addr, healthz).await, (200, "ok\n".to_owned()));

    // So is a connection kept alive after an answer, and idle since.
    let idle = slow_client(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", None).await;
    assert!(
        idle.answer.starts_with("HTTP/1.1 200 "),
        "{:?}",
        idle.answer
    );
    assert_cut_off_at(&idle, TIGHT.header_read_timeout);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_body_that_never_finishes_is_answered_408_at_the_body_timeout() {
    let (addr, stop, server) = start(TIGHT).await;
    // 900 bytes promised, well within the limit, sent one per 100 ms:
    // it would take 90 s.
    let slowloris = tokio::spawn(slow_client(
        addr,
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n{",
        Some(b' '),
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let args = String::from_utf8(extender_args()).unwrap();
    let request = format!(
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{args}",
        args.len()
    );
    let (status, body) = exchange(addr, &request).await;
    assert_eq!(status, 200, "{body}");

    let slow = slowloris.await.unwrap();
    assert_cut_off_at(&slow, TIGHT.body_read_timeout);
    assert!(
        slow.answer.starts_with("HTTP/1.1 408 "),
        "{:?}",
        slow.answer
    );
    assert!(
        slow.answer
            .contains("request body not complete within 500ms"),
        "{:?}",
        slow.answer
    );
    assert_eq!(exchange(addr, &request).await.0, 200);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn bodies_over_the_configured_limit_are_refused_declared_or_not() {
    let (addr, stop, server) = start(TIGHT).await;
    let declared = "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n";
    let (status, body) = exchange(addr, declared).await;
    assert_eq!(status, 413);
    assert_eq!(body, "request body is over the limit of 1000 bytes\n");

    // Chunked: no length to judge by, so the limit applies while reading.
    let chunk = "x".repeat(600);
    let chunked = format!(
        "POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n{chunk}\r\n258\r\n{chunk}\r\n0\r\n\r\n"
    );
    let (status, body) = exchange(addr, &chunked).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.starts_with("request body is over the limit of 1000 bytes or unreadable"),
        "{body}"
    );

    // Exactly the limit is read.
    let at_limit = format!(
        "POST /prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{}",
        " ".repeat(1000)
    );
    assert_eq!(exchange(addr, &at_limit).await.0, 400, "read, not JSON");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[test]
fn timeouts_are_positive_seconds() {
    assert_eq!(parse_timeout("10").unwrap(), Duration::from_secs(10));
    assert_eq!(parse_timeout("0.25").unwrap(), Duration::from_millis(250));
    for bad in ["0", "-1", "abc", "", "inf", "NaN", "1e30"] {
        assert_eq!(
            parse_timeout(bad).unwrap_err().to_string(),
            format!(
                "{bad:?} is not a timeout in seconds (a number more than 0, such as 10 or 0.5)"
            )
        );
    }
}

/// With four connections held open (idle, within the header timeout), a
/// fifth is not served until one of them ends; then it is.
#[tokio::test]
async fn connections_beyond_the_cap_wait_until_one_ends() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(30),
        ..TIGHT
    };
    let (addr, stop, server) = start(limits).await;
    let mut held = Vec::new();
    for _ in 0..limits.max_connections {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        // One answered request proves the connection was accepted.
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        held.push(s);
    }
    let request = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let waiting = tokio::spawn(exchange(addr, request));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!waiting.is_finished(), "a fifth connection was served");
    drop(held.pop());
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once a connection ended")
        .unwrap();
    assert_eq!(status, 200);
    stop.send(()).unwrap();
    let _ = server.await;
}

/// The view with reservations counted is reused, and follows every
/// reservation made or released (judged by the GPU's committed memory
/// the filter would see).
#[tokio::test]
async fn the_counted_view_follows_every_reservation() {
    use crate::annotations::GpuPolicy;
    use crate::bind::reserve::Reservations;
    use crate::placement::Workload;
    use crate::request::PodRequest;
    use crate::resources::{GpuShare, Memory};

    let (service, _handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    let client = kube::Client::new(service, "default");
    let state = AppState {
        binder: Some(Binder::new(client, Reservations::default())),
        ..state()
    };
    let used = |state: &AppState| state.current().view.node("gpu-1").unwrap().gpus[0].used_mib;
    assert_eq!(used(&state), 0);
    let request = |mib| PodRequest {
        shares: vec![GpuShare {
            container: "c".into(),
            count: 1,
            memory: Some(Memory::Mib(mib)),
            cores: Some(10),
            priority: None,
        }],
        policy: GpuPolicy::default(),
    };
    let table = state.binder.as_ref().unwrap().table();
    let node = state.view.now().view.node("gpu-1").unwrap().clone();
    table
        .reserve("p1", &node, &request(4000), &Workload::default())
        .unwrap()
        .confirm();
    assert_eq!(used(&state), 4000);
    assert_eq!(used(&state), 4000, "reused");
    let second = table
        .reserve("p2", &node, &request(1000), &Workload::default())
        .unwrap();
    assert_eq!(used(&state), 5000);
    drop(second);
    assert_eq!(used(&state), 4000, "a released reservation is gone");
    table.rebuild(Vec::new(), table.begin_refresh());
    assert_eq!(used(&state), 0, "a rebuild that lists nothing empties it");
}
