//! The plugin with `Allocate` wired to a fake API server, as the Allocate
//! tests and the end-to-end test use it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tessera_agent::kubelet::{self, AllocateSetup, Wiring};
use tessera_kubelet_api::deviceplugin::v1beta1 as dp;
use tokio::sync::oneshot;

use super::apiserver::{FakeApi, fixture};
use super::{FakeKubelet, config, nvml, plugin_client};

pub const NODE_NAME: &str = "gpu-node-7";
pub const MIB: u64 = 1 << 20;
/// The simulated GPUs' memory (MiB), as the node description says.
pub const GPU_MIB: [u64; 3] = [81559, 81559, 40960];

pub type Client = dp::device_plugin_client::DevicePluginClient<tonic::transport::Channel>;

pub struct Env {
    pub dir: tempfile::TempDir,
    pub api: FakeApi,
    kubelet: Option<FakeKubelet>,
    pub client: Client,
    stop: Option<oneshot::Sender<()>>,
    plugin: tokio::task::JoinHandle<Result<(), kubelet::KubeletError>>,
}

impl Env {
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("containers")
    }

    pub fn library_dir(&self) -> PathBuf {
        self.dir.path().join("lib").join(env!("CARGO_PKG_VERSION"))
    }

    pub fn dev(&self) -> PathBuf {
        self.dir.path().join("dev")
    }

    /// The region directories under the root.
    pub fn regions(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.root())
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(5), &mut self.plugin)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        self.api.assert_all_supported();
        self.kubelet.take().unwrap().stop().await;
    }
}

/// The plugin with Allocate wired to a fake API server holding `pods`, a
/// fake kubelet registered with it, kubelet's client to it.
pub async fn start(pods: Vec<Value>) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let lib = dir.path().join("lib").join(env!("CARGO_PKG_VERSION"));
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libtessera.so"), b"\x7fELF").unwrap();
    std::fs::write(
        lib.join("ld.so.preload"),
        b"/usr/local/lib/tessera/libtessera.so\n",
    )
    .unwrap();
    let dev = dir.path().join("dev");
    std::fs::create_dir(&dev).unwrap();
    for n in ["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2"] {
        std::fs::write(dev.join(n), b"").unwrap();
    }
    let (api, kube) = FakeApi::start(pods);
    let mut kubelet = FakeKubelet::start(&plugins);
    let (stop, stopped) = oneshot::channel::<()>();
    let wiring = Wiring {
        allocate: Some(AllocateSetup {
            client: kube,
            node: NODE_NAME.into(),
            root: dir.path().join("containers"),
            preload_dir: dir.path().join("lib"),
            version: env!("CARGO_PKG_VERSION").into(),
            dev_dir: dev.clone(),
        }),
        registered: None,
    };
    let plugin = tokio::spawn(kubelet::serve(config(&plugins), nvml(), wiring, async {
        let _ = stopped.await;
    }));
    let r = kubelet.registration(Duration::from_secs(5)).await;
    let client = plugin_client(&plugins, &r).await;
    Env {
        dir,
        api,
        kubelet: Some(kubelet),
        client,
        stop: Some(stop),
        plugin,
    }
}

pub fn uid(i: usize) -> String {
    format!("6f1c2a4e-3b5d-4c7e-9a10-{i:012x}")
}

pub fn bound(second: usize) -> String {
    format!("2026-12-01T15:{:02}:{:02}Z", second / 60, second % 60)
}

/// `n` as kube-apiserver stores a whole-number quantity it was given in
/// plain digits: trailing thousands become a decimal suffix (`4000` reads
/// back as `4k`, `1500` stays `1500`).
pub fn as_stored(n: u64) -> String {
    let (mut n, mut suffix) = (n, "");
    for next in ["k", "M", "G", "T", "P", "E"] {
        if n == 0 || n % 1000 != 0 {
            break;
        }
        n /= 1000;
        suffix = next;
    }
    format!("{n}{suffix}")
}

/// `single.json`: one container `main` with one GPU; its spec holds `mib`
/// as the API server stores it ([`as_stored`]), its assignment `mib`
/// itself.
pub fn single(name: &str, i: usize, gpu: &str, mib: u64, cores: u32, at: usize) -> Value {
    fixture(
        "single.json",
        &[
            ("NAME", name),
            ("UID", &uid(i)),
            ("NODE", NODE_NAME),
            ("BOUND", &bound(at)),
            ("GPU", gpu),
            ("MIB", &mib.to_string()),
            ("SPEC_MIB", &as_stored(mib)),
            ("CORES", &cores.to_string()),
        ],
    )
}

/// Kubelet's Allocate for one container with `ids`.
pub async fn allocate(
    client: &mut Client,
    ids: &[String],
) -> Result<dp::ContainerAllocateResponse, tonic::Status> {
    let r = client
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        })
        .await?
        .into_inner();
    assert_eq!(r.container_responses.len(), 1);
    Ok(r.container_responses.into_iter().next().unwrap())
}

/// (container path, host path, read-only) of every mount.
pub fn mounts(r: &dp::ContainerAllocateResponse) -> BTreeMap<String, (String, bool)> {
    r.mounts
        .iter()
        .map(|m| (m.container_path.clone(), (m.host_path.clone(), m.read_only)))
        .collect()
}
