//! `tessera-agent run` with `[kubelet] enabled = true`, as a process on
//! the simulated node: it refuses to start without `NODE_NAME`; with it,
//! the device plugin serves beside the loop, `/readyz` fails until a
//! (fake) kubelet has registered it, `Allocate` is wired to the
//! Kubernetes API named by `KUBECONFIG`, and SIGTERM stops everything and
//! removes the plugin's socket.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;
mod kubelet_support;

use std::time::{Duration, Instant};

use daemon_support::{Agent, Node, agent_bin, get, nvml_lib};
use kubelet_support::{FakeKubelet, plugin_client, runtime};
use tessera_kubelet_api::deviceplugin::v1beta1 as dp;

fn config(node: &Node) -> std::path::PathBuf {
    let plugins = node.dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let path = node.dir.path().join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "[kubelet]\nenabled = true\nplugin_dir = \"{}\"\nsplit = 2\nplacement = \"spread\"\npreload_dir = \"{}\"\n",
            plugins.display(),
            node.dir.path().join("lib").display()
        ),
    )
    .unwrap();
    path
}

/// A kubeconfig naming an API server that is not there.
fn absent_api_server(node: &Node) -> std::path::PathBuf {
    let kubeconfig = node.dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: default\ncurrent-context: x\n",
    )
    .unwrap();
    kubeconfig
}

#[test]
fn enabled_without_node_name_is_refused_naming_it() {
    let node = Node::small();
    let out = node
        .command(&agent_bin())
        .env_remove("NODE_NAME")
        .arg("--nvml-lib")
        .arg(nvml_lib())
        .arg("run")
        .arg("--config")
        .arg(config(&node))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("kubelet.enabled") && e.contains("NODE_NAME is not set"),
        "{e}"
    );
}

#[test]
fn run_serves_the_plugin_gates_readyz_and_removes_its_socket_on_sigterm() {
    let node = Node::small();
    let root = node.dir.path().join("containers");
    // An API server that is not there: the client is built at start, used
    // at Allocate.
    let kubeconfig = absent_api_server(&node);
    let mut c = node.command(&agent_bin());
    c.env_remove("TESSERA_NVML_LIB")
        .env_remove("RUST_LOG")
        .env("NODE_NAME", "gpu-node-7")
        .env("KUBECONFIG", &kubeconfig)
        .arg("--nvml-lib")
        .arg(nvml_lib())
        .args(["run", "--listen", "127.0.0.1:0", "--root"])
        .arg(&root)
        .arg("--config")
        .arg(config(&node));
    let mut agent = Agent::spawn(c);
    let plugins = node.dir.path().join("plugins");
    runtime().block_on(async {
        // No kubelet yet: not ready, and the reason says so.
        let t = Instant::now();
        loop {
            let (code, body) = get(agent.addr, "/readyz").unwrap();
            if body.trim() == "not ready: the device plugin is not registered with kubelet" {
                assert_eq!(code, 503);
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{code} {body}; log {:?}",
                agent.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut kubelet = FakeKubelet::start(&plugins);
        let r = kubelet.registration(Duration::from_secs(5)).await;
        assert_eq!(r.request.resource_name, "nvidia.com/gpu");
        assert_eq!(r.request.endpoint, "tessera.sock");
        let t = Instant::now();
        loop {
            let (code, body) = get(agent.addr, "/readyz").unwrap();
            if code == 200 {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "{code} {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut client = plugin_client(&plugins, &r).await;
        let list = client
            .list_and_watch(dp::Empty {})
            .await
            .unwrap()
            .into_inner()
            .message()
            .await
            .unwrap()
            .unwrap();
        // Node::small's GPUs, split 2.
        assert_eq!(list.devices.len() % 2, 0);
        assert!(!list.devices.is_empty());
        // Allocate goes to the API server named by KUBECONFIG (absent here)
        // and says so, naming the node. The library is not installed yet:
        // that is checked first.
        let lib = node.dir.path().join("lib").join(env!("CARGO_PKG_VERSION"));
        let e = client
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: vec![list.devices[0].id.clone()],
                }],
            })
            .await
            .unwrap_err();
        assert!(
            e.message()
                .contains("libtessera.so is missing on node gpu-node-7"),
            "{e:?}"
        );
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libtessera.so"), b"").unwrap();
        std::fs::write(lib.join("ld.so.preload"), b"").unwrap();
        let e = client
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: vec![list.devices[0].id.clone()],
                }],
            })
            .await
            .unwrap_err();
        assert!(
            e.message()
                .contains("cannot list the pods of node gpu-node-7 from the API server"),
            "{e:?}"
        );
        drop(client);
        // Blocking is fine here: stopping needs nothing from the fake kubelet.
        let status = agent.signal_and_wait(libc::SIGTERM);
        assert_eq!(status.code(), Some(0), "{status:?}; log {:?}", agent.log());
        assert!(
            !plugins.join("tessera.sock").exists(),
            "the plugin socket is left: {:?}",
            agent.log()
        );
        assert!(plugins.join("kubelet.sock").exists());
        kubelet.stop().await;
    });
}

/// Without NVML, the control loop, the device plugin and the telemetry
/// writer wait on one loader: the library is tried once per
/// `nvml_retry_ms` whoever asks (counted by the dynamic loader itself,
/// `LD_DEBUG=files`, one `file=` line per `dlopen` of it), and the failure
/// is logged once, not once per part and retry.
#[test]
fn without_nvml_the_loop_plugin_and_telemetry_share_one_retry() {
    const MISSING: &str = "/nonexistent/tessera-test/libnvidia-ml.so.1";
    const RETRY_MS: u64 = 250;
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let kubeconfig = absent_api_server(&node);
    let config = config(&node);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("nvml_retry_ms = {RETRY_MS}\n{text}")).unwrap();
    let mut c = node.command(&agent_bin());
    c.env_remove("TESSERA_NVML_LIB")
        .env_remove("RUST_LOG")
        .env("LD_DEBUG", "files")
        .env("NODE_NAME", "gpu-node-7")
        .env("KUBECONFIG", &kubeconfig)
        .args(["--nvml-lib", MISSING])
        .args(["run", "--listen", "127.0.0.1:0", "--root"])
        .arg(&root)
        .arg("--config")
        .arg(&config);
    let started = Instant::now();
    let mut agent = Agent::spawn(c);
    std::thread::sleep(Duration::from_secs(3));
    let status = agent.signal_and_wait(libc::SIGTERM);
    let ran = started.elapsed();
    assert_eq!(status.code(), Some(0), "{status:?}; log {:?}", agent.log());
    let log = agent.log();
    let tries = log
        .iter()
        .filter(|l| l.contains(&format!("file={MISSING}")))
        .count() as u128;
    // One try at start, then one per interval at most.
    let most = ran.as_millis() / u128::from(RETRY_MS) + 1;
    println!("figure: {tries} tries of NVML in {ran:?} (retry {RETRY_MS} ms)");
    assert!(
        (2..=most).contains(&tries),
        "{tries} tries of NVML in {ran:?} at one per {RETRY_MS} ms (at most {most})"
    );
    let warned: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("NVML unavailable"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains(MISSING), "{}", warned[0]);
}
