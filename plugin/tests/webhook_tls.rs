//! The webhook over HTTPS, end to end: a real rustls client that trusts
//! only a CA made at test time posts AdmissionReview fixtures (shaped like
//! what the API server sends: defaulted pods with service-account volumes,
//! tolerations, managed fields, init containers) to the running
//! `tessera-scheduler serve`; certificate rotation through the kubelet's
//! `..data` symlink swap; slow and oversized clients.
#![allow(clippy::unwrap_used)] // helpers of a test crate

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SerialNumber};
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};

// ---- certificates and the secret directory ----------------------------

/// A CA made for one test; only its certificate is trusted by the client.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
}

fn new_ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        issuer: Issuer::new(params, key),
        der: cert.der().clone(),
    }
}

/// A serving pair for `localhost`: PEM certificate, PEM key, leaf DER.
struct Pair {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
}

fn leaf(ca: &Ca, serial: u64) -> Pair {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.serial_number = Some(SerialNumber::from(serial));
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        der: cert.der().to_vec(),
    }
}

/// A directory laid out as the kubelet mounts a secret: `tls.crt` and
/// `tls.key` link through `..data` to a timestamped directory.
struct SecretDir {
    root: PathBuf,
    generation: u32,
}

impl SecretDir {
    fn new(test: &str, pair: &Pair) -> Self {
        let root =
            std::env::temp_dir().join(format!("tessera-webhook-tls-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let mut dir = Self {
            root,
            generation: 0,
        };
        dir.publish(&pair.cert_pem, &pair.key_pem);
        for file in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{file}"), dir.root.join(file)).unwrap();
        }
        dir
    }

    /// Writes a new timestamped directory and swaps `..data` to it in one
    /// rename, then removes the old one, as the kubelet's atomic writer does.
    fn publish(&mut self, cert: &str, key: &str) {
        self.generation += 1;
        let name = format!("..2026_12_01_10_00_{:02}.{:09}", self.generation, 1);
        let dir = self.root.join(&name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), cert).unwrap();
        std::fs::write(dir.join("tls.key"), key).unwrap();
        let old = std::fs::read_link(self.root.join("..data")).ok();
        let tmp = self.root.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.root.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.root.join(old)).unwrap();
        }
    }

    fn cert(&self) -> PathBuf {
        self.root.join("tls.crt")
    }

    fn key(&self) -> PathBuf {
        self.root.join("tls.key")
    }
}

impl Drop for SecretDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

// ---- the server and client ---------------------------------------------

#[allow(dead_code)] // not every test crate uses every helper
mod support;

use support::{Server, Tls, exchange, leaf_der};

fn start(secret: &SecretDir, extra: &[&str]) -> Server {
    Server::start(&secret.cert(), &secret.key(), extra)
}

/// A finished handshake, the server verified as `localhost` against `ca`.
fn connect(ca: &Ca, addr: &str) -> Tls {
    support::connect(support::client_config(ca.der.clone()), addr, "localhost")
}

fn post_review(ca: &Ca, addr: &str, review: &Value) -> Value {
    let mut tls = connect(ca, addr);
    let (status, body) = exchange(&mut tls, "POST", "/webhook", review.to_string().as_bytes());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/admission")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

// ---- fixtures -----------------------------------------------------------

/// The pod the API server would store: the fixture's object with the
/// response's patch applied by an independent RFC 6902 implementation.
fn patched(review: &Value, response: &Value) -> Value {
    let mut pod = review["request"]["object"].clone();
    if let Some(patch) = response.get("patch") {
        assert_eq!(response["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch.as_str().unwrap())
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut pod, &patch).unwrap();
    } else {
        assert!(response.get("patchType").is_none(), "{response}");
    }
    pod
}

/// Kubernetes' rule for extended resources: a limit for every request,
/// and requests equal to limits.
fn assert_extended_resources_valid(pod: &Value) {
    for container in pod["spec"]["containers"].as_array().unwrap() {
        let limits = container.pointer("/resources/limits");
        let requests = container.pointer("/resources/requests");
        for (name, value) in requests.and_then(Value::as_object).into_iter().flatten() {
            if name.starts_with("nvidia.com/") {
                assert_eq!(limits.and_then(|l| l.get(name)), Some(value), "{container}");
            }
        }
        for (name, value) in limits.and_then(Value::as_object).into_iter().flatten() {
            if name.starts_with("nvidia.com/") {
                assert_eq!(
                    requests.and_then(|r| r.get(name)),
                    Some(value),
                    "{container}"
                );
            }
        }
    }
}

fn set(pod: &mut Value, parent: &str, key: &str, value: Value) {
    pod.pointer_mut(parent)
        .unwrap_or_else(|| panic!("no {parent}"))
        .as_object_mut()
        .unwrap()
        .insert(key.to_owned(), value);
}

/// What the webhook should do to a fixture's pod, done by hand.
type Edit = dyn Fn(&mut Value);

#[test]
fn fixtures_from_the_api_server_get_the_right_answers_over_tls() {
    let ca = new_ca("fixtures-ca");
    let secret = SecretDir::new("fixtures", &leaf(&ca, 1));
    let server = start(&secret, &[]);

    // Allowed, with the pod the API server would store.
    let allowed: [(&str, &Edit); 4] = [
        ("share.json", &|pod| {
            set(pod, "/spec", "schedulerName", json!("tessera-scheduler"));
        }),
        ("memory-only.json", &|pod| {
            set(pod, "/spec", "schedulerName", json!("tessera-scheduler"));
            for map in ["limits", "requests"] {
                let at = format!("/spec/containers/0/resources/{map}");
                set(pod, &at, "nvidia.com/gpu", json!("1"));
                set(pod, &at, "nvidia.com/gpucores", json!("0"));
            }
        }),
        ("cores-requests-only.json", &|pod| {
            set(pod, "/spec", "schedulerName", json!("tessera-scheduler"));
            let at = "/spec/containers/0/resources";
            set(
                pod,
                at,
                "limits",
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50",
                       "nvidia.com/gpumem-percentage": "100"}),
            );
            let at = format!("{at}/requests");
            set(pod, &at, "nvidia.com/gpu", json!("1"));
            set(pod, &at, "nvidia.com/gpumem-percentage", json!("100"));
        }),
        // No GPU: untouched, even privileged and pinned to a node.
        ("cpu-only.json", &|_| {}),
    ];
    for (name, edit) in allowed {
        let review = fixture(name);
        let answer = post_review(&ca, &server.webhook, &review);
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "{name}");
        assert_eq!(answer["kind"], "AdmissionReview", "{name}");
        let response = &answer["response"];
        assert_eq!(response["uid"], review["request"]["uid"], "{name}");
        assert_eq!(response["allowed"], true, "{name}: {response}");
        let got = patched(&review, response);
        let mut want = review["request"]["object"].clone();
        edit(&mut want);
        assert_eq!(got, want, "{name}");
        assert_extended_resources_valid(&got);
    }

    // Refused, each saying what and why.
    for (name, code, says) in [
        (
            "privileged.json",
            403,
            "container \"train\" is privileged and asks for GPU shares",
        ),
        (
            "node-name.json",
            403,
            "pod sets spec.nodeName to \"gpu-node-7\" and asks for GPU shares",
        ),
        (
            "init-gpu.json",
            422,
            "init container \"warmup\": nvidia.com/gpu is not supported in init containers",
        ),
        (
            "out-of-range.json",
            422,
            "container \"train\": nvidia.com/gpumem-percentage is 150, out of range; accepted: whole percent of each GPU's memory, 1..=100",
        ),
    ] {
        let review = fixture(name);
        let response = post_review(&ca, &server.webhook, &review)["response"].clone();
        assert_eq!(response["uid"], review["request"]["uid"], "{name}");
        assert_eq!(response["allowed"], false, "{name}");
        assert!(response.get("patch").is_none(), "{name}");
        assert_eq!(response["status"]["code"], code, "{name}");
        assert_eq!(response["status"]["status"], "Failure", "{name}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{name}: {message}");
        assert!(message.contains("accepted: "), "{name}: {message}");
    }
}

#[test]
fn the_https_listener_has_only_the_webhook_and_bounds_bodies() {
    let ca = new_ca("routes-ca");
    let secret = SecretDir::new("routes", &leaf(&ca, 1));
    let server = start(&secret, &["--max-body", "4096"]);
    let mut tls = connect(&ca, &server.webhook);
    assert_eq!(exchange(&mut tls, "GET", "/healthz", b"").0, 200);
    // The extender verbs stay off the cluster-facing listener...
    for path in ["/filter", "/prioritize", "/bind"] {
        let mut tls = connect(&ca, &server.webhook);
        let (status, body) = exchange(&mut tls, "POST", path, b"{}");
        assert_eq!(status, 404, "{path}: {}", String::from_utf8_lossy(&body));
    }
    // ...and are on the plain one.
    let mut plain = TcpStream::connect(&server.plain).unwrap();
    plain
        .write_all(b"POST /prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        .unwrap();
    let mut raw = String::new();
    plain.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.ends_with("[]"), "{raw}");

    let big = vec![b' '; 8192];
    let mut tls = connect(&ca, &server.webhook);
    assert_eq!(exchange(&mut tls, "POST", "/webhook", &big).0, 413);

    // A plain-HTTP client on the TLS port gets no answer.
    let mut sock = TcpStream::connect(&server.webhook).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    sock.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut seen = Vec::new();
    let _ = sock.read_to_end(&mut seen);
    assert!(!seen.starts_with(b"HTTP/1.1 200"), "{seen:?}");
}

#[test]
fn a_rotated_secret_serves_new_handshakes_and_a_broken_one_is_ignored() {
    let ca = new_ca("rotation-ca");
    let first = leaf(&ca, 1);
    let mut secret = SecretDir::new("rotation", &first);
    let interval = Duration::from_millis(300);
    let server = start(&secret, &["--tls-reload-interval", "0.3"]);

    let mut kept = connect(&ca, &server.webhook);
    assert_eq!(leaf_der(&kept), first.der);
    assert_eq!(exchange(&mut kept, "GET", "/healthz", b"").0, 200);

    // Rotation: a new handshake sees the new certificate.
    let second = leaf(&ca, 2);
    secret.publish(&second.cert_pem, &second.key_pem);
    let swapped = Instant::now();
    let wait_for = |want: &[u8]| loop {
        let tls = connect(&ca, &server.webhook);
        if leaf_der(&tls) == want {
            return swapped.elapsed();
        }
        assert!(
            swapped.elapsed() < interval * 10,
            "not rotated after {:?}; log: {}",
            swapped.elapsed(),
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = wait_for(&second.der);
    eprintln!("new certificate served {took:?} after the swap (interval {interval:?})");
    // The connection made before the swap goes on with its own.
    assert_eq!(exchange(&mut kept, "GET", "/healthz", b"").0, 200);
    assert_eq!(leaf_der(&kept), first.der);

    // Broken pairs are refused, and the second one keeps being served.
    let other = leaf(&ca, 3);
    let stranger = leaf(&ca, 4);
    for (cert, key, reason) in [
        (
            &other.cert_pem,
            &stranger.key_pem,
            "does not fit certificate",
        ),
        (
            &"not a certificate\n".to_owned(),
            &other.key_pem,
            "holds no readable PEM certificate",
        ),
        (
            &other.cert_pem,
            &String::new(),
            "holds no readable PEM private key",
        ),
    ] {
        secret.publish(cert, key);
        let deadline = Instant::now() + interval * 10;
        while !server.log().contains(reason) {
            assert!(
                Instant::now() < deadline,
                "no {reason:?} in {}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let tls = connect(&ca, &server.webhook);
        assert_eq!(leaf_der(&tls), second.der, "{reason}");
    }
    assert!(server.log().contains("keeping the previous certificate"));

    // A good pair after the broken ones is taken up again.
    let third = leaf(&ca, 5);
    secret.publish(&third.cert_pem, &third.key_pem);
    let swapped = Instant::now();
    loop {
        let tls = connect(&ca, &server.webhook);
        if leaf_der(&tls) == third.der {
            break;
        }
        assert!(swapped.elapsed() < interval * 10, "{}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_broken_pair_at_start_is_refused_naming_the_files() {
    let ca = new_ca("start-ca");
    let (good, other) = (leaf(&ca, 1), leaf(&ca, 2));
    let mut secret = SecretDir::new("start", &good);
    secret.publish(&good.cert_pem, &other.key_pem);
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--webhook-listen",
            "127.0.0.1:0",
        ])
        .arg("--tls-cert")
        .arg(secret.cert())
        .arg("--tls-key")
        .arg(secret.key())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(&format!(
            "private key {} does not fit certificate {}",
            secret.key().display(),
            secret.cert().display()
        )),
        "{stderr}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .args(["serve", "--webhook-listen", "127.0.0.1:0"])
        .env_remove("TESSERA_TLS_CERT")
        .env_remove("TESSERA_TLS_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("--tls-cert <FILE>"), "{stderr}");
}

/// Whether the server has closed `tls`: a write fails, or a read sees the
/// end. Panics if the server answers.
fn closed_by_server(tls: &mut Tls) -> bool {
    tls.sock
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 256];
    match tls.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!("answered: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
        Err(_) => true,
    }
}

#[test]
fn slow_clients_are_cut_off_while_others_are_served() {
    let ca = new_ca("slow-ca");
    let secret = SecretDir::new("slow", &leaf(&ca, 1));
    let server = start(&secret, &["--header-read-timeout", "1"]);
    let timeout = Duration::from_secs(1);

    // A client that never sends its ClientHello.
    let mut silent = TcpStream::connect(&server.webhook).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let silent_start = Instant::now();
    let silent_thread = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let read = silent.read_to_end(&mut seen);
        (read.is_ok(), seen, silent_start.elapsed())
    });

    // A client that trickles its headers one byte every 100 ms.
    let mut slow = connect(&ca, &server.webhook);
    let slow_start = Instant::now();
    let request = b"POST /webhook HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let slow_thread = std::thread::spawn(move || {
        for byte in request {
            if slow
                .write_all(&[*byte])
                .and_then(|()| slow.flush())
                .is_err()
                || closed_by_server(&mut slow)
            {
                return Some(slow_start.elapsed());
            }
        }
        None
    });

    // Meanwhile another client is served promptly, more than once.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let served = Instant::now();
        let answer = post_review(&ca, &server.webhook, &fixture("share.json"));
        assert_eq!(answer["response"]["allowed"], true);
        assert!(
            served.elapsed() < timeout,
            "served after {:?}",
            served.elapsed()
        );
    }

    let cut = slow_thread.join().unwrap();
    let cut = cut.unwrap_or_else(|| panic!("the trickling client sent all its headers unhindered"));
    assert!(
        cut >= timeout && cut < timeout * 4,
        "trickling client closed after {cut:?}"
    );
    let (closed, seen, at) = silent_thread.join().unwrap();
    assert!(closed, "silent client not closed by the server");
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        at >= timeout && at < timeout * 4,
        "silent client closed after {at:?}"
    );
    eprintln!("trickling client cut after {cut:?}, silent one after {at:?}");
}
