//! Shared by the device plugin tests: the simulated node, the child
//! process that loads its NVML, a fake kubelet (the `Registration`
//! service on `kubelet.sock` in a temp directory, and kubelet's client to
//! our socket), and a scripted fake API server ([`apiserver`]).

#![allow(dead_code, clippy::unwrap_used)]

pub mod allocate;
pub mod apiserver;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_agent::gpu::NvmlBackend;
use tessera_agent::kubelet::{KubeletConfig, Placement, socket};
use tessera_kubelet_api::deviceplugin::v1beta1 as dp;
use tessera_testkit::sim::{Gpu, NodeSpec, artifact};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

pub const CHILD: &str = "TESSERA_KUBELET_CHILD";

/// GPUs 0 and 1 NVLinked on NUMA 0, GPU 2 alone on NUMA 1.
pub fn node_spec() -> NodeSpec {
    let h100 = |uuid| Gpu::h100().numa(0).uuid(uuid);
    NodeSpec::new()
        .gpu(h100(UUIDS[0]).nvlink(&[1]))
        .gpu(h100(UUIDS[1]).nvlink(&[0]))
        .gpu(
            Gpu::new("NVIDIA A100-PCIE-40GB", 40960)
                .sms(108)
                .numa(1)
                .uuid(UUIDS[2]),
        )
}

pub const UUIDS: [&str; 3] = [
    "GPU-0a0a0a0a-1111-2222-3333-444444444444",
    "GPU-0b0b0b0b-1111-2222-3333-444444444444",
    "GPU-0c0c0c0c-1111-2222-3333-444444444444",
];
pub const NUMA: [i64; 3] = [0, 0, 1];
pub const SPLIT: u32 = 4;

/// Runs `body` in a child process on a fresh simulated node (see the
/// module documentation).
pub fn on_node(name: &str, body: fn()) {
    on_node_with(&node_spec(), name, body);
}

/// [`on_node`] on the node described by `spec`.
pub fn on_node_with(spec: &NodeSpec, name: &str, body: fn()) {
    if std::env::var_os(CHILD).is_some() {
        return body();
    }
    let node = spec.build();
    let out = node
        .command(&std::env::current_exe().unwrap())
        .env(CHILD, artifact("sim/libnvidia-ml.so.1"))
        .env("RUST_LOG", "tessera_agent=debug")
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "the child ran nothing:\n{stdout}"
    );
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub fn nvml() -> Arc<NvmlBackend> {
    Arc::new(NvmlBackend::load(&std::env::var_os(CHILD).unwrap()).unwrap())
}

pub fn config(dir: &Path) -> KubeletConfig {
    KubeletConfig {
        plugin_dir: dir.to_owned(),
        endpoint: "tessera-test.sock".into(),
        resource_name: "nvidia.com/gpu".into(),
        split: SPLIT,
        placement: Placement::Binpack,
        xid_quarantine: Duration::from_millis(700),
        watch_interval: Duration::from_millis(100),
    }
}

/// A registration as the fake kubelet received it.
pub struct Registered {
    pub at: Instant,
    pub request: dp::RegisterRequest,
}

struct FakeRegistration(mpsc::UnboundedSender<Registered>);

#[tonic::async_trait]
impl dp::registration_server::Registration for FakeRegistration {
    async fn register(
        &self,
        request: Request<dp::RegisterRequest>,
    ) -> Result<Response<dp::Empty>, Status> {
        let _ = self.0.send(Registered {
            at: Instant::now(),
            request: request.into_inner(),
        });
        Ok(Response::new(dp::Empty {}))
    }
}

/// A fake kubelet: the Registration service on `dir/kubelet.sock`.
pub struct FakeKubelet {
    pub created: Instant,
    pub registrations: mpsc::UnboundedReceiver<Registered>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeKubelet {
    /// Starts like a new kubelet: every socket in `dir` is removed first.
    pub fn start(dir: &Path) -> Self {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if socket::socket_id(&p).is_some() {
                std::fs::remove_file(&p).unwrap();
            }
        }
        let listener = tokio::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
        let created = Instant::now();
        let (tx, registrations) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(dp::registration_server::RegistrationServer::new(
                    FakeRegistration(tx),
                ))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            created,
            registrations,
            stop: Some(stop),
            task,
        }
    }

    /// The next registration, within `within`.
    pub async fn registration(&mut self, within: Duration) -> Registered {
        tokio::time::timeout(within, self.registrations.recv())
            .await
            .unwrap_or_else(|_| panic!("no registration within {within:?}"))
            .unwrap()
    }

    /// Stops like a kubelet process ending (the socket file stays).
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }
}

/// Kubelet's client to the plugin socket named by `r`.
pub async fn plugin_client(
    dir: &Path,
    r: &Registered,
) -> dp::device_plugin_client::DevicePluginClient<tonic::transport::Channel> {
    let path: PathBuf = dir.join(&r.request.endpoint);
    let ch = socket::channel(&path, Duration::from_secs(5))
        .await
        .unwrap();
    dp::device_plugin_client::DevicePluginClient::new(ch)
}
