//! Waiting for a condition, and asking a local HTTP endpoint (the agent's,
//! a Prometheus server's) — what tests of long-running processes share.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Polls `f` every `every` until it returns `Some` or `timeout` passes.
pub fn wait_for_every<T>(
    every: Duration,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Polls `f` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    wait_for_every(Duration::from_millis(20), timeout, f)
}

/// `GET path` over a fresh TCP connection, in HTTP/1.0 so that no server
/// answers chunked: (status, body). Waits up to 20 s for the answer.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_get_within(addr, path, Duration::from_secs(20))
}

/// [`http_get`] waiting at most `timeout` to connect and for each read.
pub fn http_get_within(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}
