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
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}}}]}});
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
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
