//! `tessera-scheduler serve` end to end: flags, node file, HTTP, SIGTERM.
#![allow(clippy::unwrap_used)] // helpers of a test crate

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

fn post(addr: &str, path: &str, body: &Value) -> Value {
    let body = body.to_string();
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    serde_json::from_str(raw.split_once("\r\n\r\n").unwrap().1).unwrap()
}

#[test]
fn serve_filters_against_the_node_file_and_stops_on_sigterm() {
    let nodes =
        std::env::temp_dir().join(format!("tessera-serve-test-{}.json", std::process::id()));
    // As `kubectl get gpunodes -o json` prints it: a T4 with 10000 of its
    // 15360 MiB granted to another pod.
    let uuid = "GPU-5e1a0000-0000-4000-8000-000051510000";
    let node = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "gpu-1"}, "spec": {},
        "status": {"updatedAt": "2026-12-01T09:00:00Z",
            "devices": [{"uuid": uuid, "index": 0, "model": "Tesla T4", "memoryMiB": 15360,
                         "smCount": 40, "health": "Healthy"}],
            "allocations": [{"device": uuid, "namespace": "ml", "pod": "other",
                             "container": "c", "memoryMiB": 10000, "coresPercent": 30}]}});
    std::fs::write(
        &nodes,
        json!({"apiVersion": "v1", "kind": "List", "items": [node]}).to_string(),
    )
    .unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .args(["serve", "--listen", "127.0.0.1:0", "--nodes"])
        .arg(&nodes)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("serving") {
        line.clear();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "serve exited before listening"
        );
    }
    assert!(line.contains("nodes=1"), "{line}");
    let addr = line
        .split("listen=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();

    let pod = json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8k"}}}]}});
    let result = post(
        &addr,
        "/filter",
        &json!({"Pod": pod, "NodeNames": ["gpu-1"]}),
    );
    assert_eq!(result["NodeNames"], json!([]));
    // Memory other pods hold may be freed: a failure, not unresolvable.
    let reason = result["FailedNodes"]["gpu-1"].as_str();
    assert!(reason.is_some_and(|r| r.contains("8000 MiB")), "{result}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let mut rest = String::new();
    log.read_to_string(&mut rest).unwrap();
    std::fs::remove_file(&nodes).unwrap();
    assert!(status.success(), "exit {status:?}; log: {rest}");
    assert!(rest.contains("stopped"), "{rest}");
}

#[test]
fn serve_refuses_a_bad_node_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--nodes",
            "/nonexistent/nodes.json",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("reading /nonexistent/nodes.json"),
        "{stderr}"
    );
}

/// `serve` started with `args`, and the address it reports listening on.
fn start_serve(args: &[&str]) -> (std::process::Child, String) {
    start_serve_with(args, |_| {})
}

/// [`start_serve`] with `env` changing its command first (its environment).
fn start_serve_with(
    args: &[&str],
    env: impl FnOnce(&mut Command),
) -> (std::process::Child, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"));
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info");
    env(&mut command);
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("serving") {
        line.clear();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "serve exited before listening"
        );
    }
    // Keep draining the log so the server never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    let addr = line
        .split("listen=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    (child, addr)
}

#[test]
fn serve_cuts_off_a_slow_client_at_the_header_timeout_it_is_given() {
    let (mut child, addr) = start_serve(&["--header-read-timeout", "0.5"]);
    let mut stream = TcpStream::connect(&addr).unwrap();
    let start = std::time::Instant::now();
    stream
        .write_all(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut seen = Vec::new();
    let read = stream.read_to_end(&mut seen);
    let at = start.elapsed();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(read.is_ok(), "not closed by the server: {read:?}");
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        at >= std::time::Duration::from_millis(500) && at < std::time::Duration::from_secs(4),
        "closed after {at:?}"
    );
}

#[test]
fn serve_refuses_bad_limits_naming_the_flag() {
    for (flag, value) in [
        ("--header-read-timeout", "0"),
        ("--body-read-timeout", "soon"),
        ("--max-body", "0"),
        ("--telemetry-max-age-s", "9"),
        ("--telemetry-max-age-s", "86401"),
        ("--telemetry-max-age-s", "2m"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
            .args(["serve", "--listen", "127.0.0.1:0", flag, value])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains(&format!("invalid value '{value}' for '{flag} <")),
            "{stderr}"
        );
    }
}

/// A one-route fake API server on a plain socket: lists `nodes` as
/// GpuNodes, answers watches with no event after a pause (the watcher then
/// asks again), and 404 for anything else. Returns its address.
fn fake_gpunode_api(nodes: Value) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let nodes = nodes.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let target = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                let (code, body) = if !target.starts_with("/apis/tessera.dev/v1alpha1/gpunodes") {
                    (
                        "404 Not Found",
                        json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "reason": "NotFound", "code": 404})
                        .to_string(),
                    )
                } else if target.contains("watch=true") {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    ("200 OK", String::new())
                } else {
                    (
                        "200 OK",
                        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNodeList",
                        "metadata": {"resourceVersion": "5"}, "items": nodes})
                        .to_string(),
                    )
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

#[test]
fn serve_without_a_node_file_filters_against_the_watched_gpunodes() {
    let uuid = "GPU-5e1a0000-0000-4000-8000-000051510001";
    let now = k8s_openapi::jiff::Timestamp::now();
    let old = k8s_openapi::jiff::Timestamp::from_second(now.as_second() - 600).unwrap();
    let node = |name: &str, at: &k8s_openapi::jiff::Timestamp| {
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": name, "resourceVersion": "4", "uid": format!("uid-{name}")},
            "spec": {},
            "status": {"updatedAt": at.to_string(),
                "devices": [{"uuid": uuid, "index": 0, "model": "Tesla T4", "memoryMiB": 15360,
                             "smCount": 40, "health": "Healthy"}]}})
    };
    let api = fake_gpunode_api(json!([node("live", &now), node("gone", &old)]));
    let kubeconfig = std::env::temp_dir().join(format!(
        "tessera-serve-kubeconfig-{}.yaml",
        std::process::id()
    ));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"http://{api}\"}}}}]\nusers: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: fake, user: u}}}}]\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let (mut child, addr) = start_serve_with(&["--telemetry-max-age-s", "300"], |c| {
        c.env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST");
    });
    let pod = json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8k"}}}]}});
    let request = json!({"Pod": pod, "NodeNames": ["live", "gone"]});
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let result = loop {
        let r = post(&addr, "/filter", &request);
        if r["NodeNames"] == json!(["live"]) || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    std::fs::remove_file(&kubeconfig).unwrap();
    assert_eq!(result["NodeNames"], json!(["live"]), "{result}");
    let gone = result["FailedAndUnresolvableNodes"]["gone"]
        .as_str()
        .unwrap();
    // Written 600 s before the test began: that age, plus the seconds the
    // test took.
    let age: u64 = gone
        .split(" s ago")
        .next()
        .and_then(|h| h.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no age in {gone}"));
    assert!((600..=630).contains(&age), "{gone}");
    assert!(gone.contains("limit 300 s"), "{gone}");
}
