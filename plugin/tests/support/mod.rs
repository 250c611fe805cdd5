//! Shared by the test crates that talk to `tessera-scheduler serve` over
//! TLS: the running server and a rustls client (ring provider).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// `tessera-scheduler serve` with both listeners, its log collected.
pub struct Server {
    child: Child,
    /// Address of the HTTPS (webhook) listener.
    pub webhook: String,
    /// Address of the plain (extender) listener.
    pub plain: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts serve with the pair at `cert`/`key` and `extra` flags.
    pub fn start(cert: &Path, key: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--webhook-listen",
                "127.0.0.1:0",
            ])
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .args(extra)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("serving") {
            line.clear();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "serve exited before listening"
            );
        }
        let field = |name: &str| {
            line.split(&format!("{name}="))
                .nth(1)
                .unwrap_or_else(|| panic!("no {name}= in {line}"))
                .split_whitespace()
                .next()
                .unwrap()
                .to_owned()
        };
        let (webhook, plain) = (field("webhook"), field("listen"));
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        Self {
            child,
            webhook,
            plain,
            log,
        }
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that trusts only `root`.
pub fn client_config(root: CertificateDer<'static>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(root).unwrap();
    Arc::new(
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS connection.
pub type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A finished handshake with `addr`, the server verified as `name`.
pub fn connect(config: Arc<ClientConfig>, addr: &str, name: &str) -> Tls {
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let conn = ClientConnection::new(config, name).unwrap();
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut tls = StreamOwned::new(conn, sock);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).unwrap();
    }
    tls
}

/// The leaf certificate the server presented.
pub fn leaf_der(tls: &Tls) -> Vec<u8> {
    tls.conn.peer_certificates().unwrap()[0].to_vec()
}

/// Sends one request and reads one response (status, body) by its
/// Content-Length, so the connection can carry the next one.
pub fn exchange(tls: &mut Tls, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).unwrap();
    tls.write_all(body).unwrap();
    tls.flush().unwrap();
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        assert_eq!(tls.read(&mut byte).unwrap(), 1, "closed mid-headers");
        raw.push(byte[0]);
    }
    let head = String::from_utf8(raw).unwrap();
    let status: u16 = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap();
    let mut body = vec![0u8; length];
    tls.read_exact(&mut body).unwrap();
    (status, body)
}
