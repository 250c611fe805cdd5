//! The device plugin: vGPUs registered with kubelet (step 4 of
//! "The path of a GPU pod" in ARCHITECTURE.md).
//!
//! [`serve`] runs the `v1beta1.DevicePlugin` service on a Unix socket in
//! kubelet's device plugin directory and registers it with kubelet, in
//! that order. It then watches the directory every
//! [`KubeletConfig::watch_interval`]:
//! - when `kubelet.sock` appears or is recreated (a kubelet restart), it
//!   registers again; kubelet absent at start is the same case;
//! - when our own socket disappears (a new kubelet deletes every socket
//!   there), it listens anew and registers again;
//! - a failed registration is retried at the next look.
//!
//! On shutdown the server stops (open `ListAndWatch` streams end) and our
//! socket is removed (only if it is still ours).
//!
//! Parts: [`allocator`] (Allocate end to end: [`pods`] picks the pod and
//! container, [`grant`] its limits, [`allocate`] the answer's shape),
//! [`vgpu`] (device IDs and list), [`health`] (NVML Xid events and
//! GPU loss), [`preferred`] (GetPreferredAllocation), [`device_plugin`] (the
//! service), [`registration`], [`socket`]; [`podresources`] (kubelet's
//! PodResources client) and [`gc_task`] (the garbage collection of
//! departed pods' region directories: [`gc`] decides, [`gc_task`] runs it).

pub mod allocate;
pub mod allocator;
pub mod bind;
pub mod device_plugin;
pub mod gc;
pub mod gc_task;
pub mod grant;
pub mod health;
pub mod podresources;
pub mod pods;
pub mod preferred;
pub mod registration;
pub mod socket;
pub mod vgpu;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tessera_kubelet_api::deviceplugin::v1beta1::device_plugin_server::DevicePluginServer;
use tessera_kubelet_api::deviceplugin::{DEVICE_PLUGIN_PATH, KUBELET_SOCKET_NAME};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

use crate::gpu::{GpuError, Health, Inventory, NvmlBackend};

pub use allocator::{AllocateSetup, Allocator};
pub use device_plugin::DevicePlugin;
pub use health::HealthWatch;
pub use preferred::Placement;
pub use vgpu::VgpuId;

/// Settings of the device plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletConfig {
    /// Kubelet's device plugin directory (holds `kubelet.sock` and our
    /// socket).
    pub plugin_dir: PathBuf,
    /// Our socket's file name in `plugin_dir`.
    pub endpoint: String,
    /// The extended resource advertised.
    pub resource_name: String,
    /// vGPUs per physical GPU.
    pub split: u32,
    /// Placement of single-vGPU requests.
    pub placement: Placement,
    /// How long a GPU stays unhealthy after a critical Xid.
    pub xid_quarantine: Duration,
    /// How often the directory is looked at.
    pub watch_interval: Duration,
}

/// Most vGPUs per GPU.
pub const MAX_SPLIT: u32 = 1024;

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            plugin_dir: PathBuf::from(DEVICE_PLUGIN_PATH),
            endpoint: "tessera.sock".into(),
            resource_name: "nvidia.com/gpu".into(),
            split: 10,
            placement: Placement::Binpack,
            xid_quarantine: Duration::from_secs(60),
            watch_interval: Duration::from_millis(100),
        }
    }
}

impl KubeletConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), KubeletError> {
        let bad = |field: &'static str, why: String| Err(KubeletError::Config { field, why });
        let e = &self.endpoint;
        if e.is_empty() || e.contains('/') || e == "." || e == ".." || e.contains('\0') {
            return bad("endpoint", format!("{e:?} is not a plain file name"));
        }
        if e == KUBELET_SOCKET_NAME {
            return bad("endpoint", format!("{e:?} is kubelet's own socket"));
        }
        let r = &self.resource_name;
        let ok_part = |p: &str| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        };
        match r.split_once('/') {
            Some((domain, name)) if ok_part(domain) && ok_part(name) && domain.contains('.') => {}
            _ => {
                return bad(
                    "resource_name",
                    format!("{r:?} is not <domain>/<name> (e.g. nvidia.com/gpu)"),
                );
            }
        }
        if !(1..=MAX_SPLIT).contains(&self.split) {
            return bad(
                "split",
                format!("{} is outside 1..={MAX_SPLIT}", self.split),
            );
        }
        if self.watch_interval.is_zero() || self.watch_interval > Duration::from_secs(1) {
            return bad(
                "watch_interval",
                format!(
                    "{:?} is outside (0, 1 s] (re-registration must follow a kubelet restart within 1 s)",
                    self.watch_interval
                ),
            );
        }
        Ok(())
    }

    fn kubelet_socket(&self) -> PathBuf {
        self.plugin_dir.join(KUBELET_SOCKET_NAME)
    }

    fn our_socket(&self) -> PathBuf {
        self.plugin_dir.join(&self.endpoint)
    }
}

/// What stops the device plugin.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// A setting is out of range.
    #[error("device plugin setting {field}: {why}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The GPUs could not be listed.
    #[error("cannot list the GPUs for the device plugin")]
    Inventory(#[source] GpuError),
    /// Our socket could not be set up.
    #[error("cannot serve the device plugin")]
    Socket(#[source] socket::SocketError),
    /// The health thread could not start.
    #[error("cannot start the GPU health thread")]
    Health(#[source] std::io::Error),
}

/// What [`serve`] is wired to besides its settings.
#[derive(Debug, Default)]
pub struct Wiring {
    /// `Allocate`'s API server, node and paths; `None`: every `Allocate`
    /// is refused with the reason.
    pub allocate: Option<AllocateSetup>,
    /// Told `true` while the plugin is registered with the kubelet whose
    /// socket is there now, `false` otherwise (the agent's `/readyz`).
    pub registered: Option<watch::Sender<bool>>,
}

/// Runs the device plugin for the GPUs of `nvml` until `shutdown`
/// completes; see the module documentation.
pub async fn serve(
    config: KubeletConfig,
    nvml: Arc<NvmlBackend>,
    wiring: Wiring,
    shutdown: impl Future<Output = ()>,
) -> Result<(), KubeletError> {
    config.validate()?;
    let inventory = Inventory::collect(&*nvml).map_err(KubeletError::Inventory)?;
    let count = inventory.gpus.len();
    let minors: Vec<Option<u32>> = inventory
        .gpus
        .iter()
        .map(|g| match nvml.minor_number(g.index) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(gpu = %g.uuid, error = %crate::error_chain::with_causes(&e), "no device minor number: Allocate refuses this GPU");
                None
            }
        })
        .collect();
    let report = |on: bool| {
        if let Some(r) = &wiring.registered {
            r.send_replace(on);
        }
    };
    // Lost GPUs start unhealthy; the health thread publishes every change.
    let initial = inventory
        .gpus
        .iter()
        .map(|g| g.health == Health::Healthy)
        .collect();
    let (health_tx, health_rx) = watch::channel(initial);
    let _health = HealthWatch::start(nvml, count, config.xid_quarantine, health_tx)
        .map_err(KubeletError::Health)?;
    let gpus = Arc::new(inventory.gpus);
    let allocator = wiring.allocate.map(|setup| {
        Arc::new(Allocator::new(
            setup,
            config.resource_name.clone(),
            Arc::clone(&gpus),
            minors,
        ))
    });
    let ours = config.our_socket();
    let kubelet = config.kubelet_socket();
    tracing::info!(
        socket = %ours.display(),
        resource = %config.resource_name,
        gpus = count,
        split = config.split,
        "device plugin starting"
    );

    tokio::pin!(shutdown);
    let mut server: Option<Server> = None;
    // The kubelet socket we registered with.
    let mut registered: Option<socket::FileId> = None;
    let mut tick = tokio::time::interval(config.watch_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        // Serve first: (re)listen when our socket is not (or no longer) ours.
        let alive = server
            .as_ref()
            .is_some_and(|s| socket::socket_id(&ours) == Some(s.id) && !s.task.is_finished());
        if !alive {
            if let Some(old) = server.take() {
                tracing::warn!(socket = %ours.display(), "our socket is gone: listening anew");
                old.stop(&ours).await;
            }
            let plugin = DevicePlugin {
                gpus: Arc::clone(&gpus),
                split: config.split,
                placement: config.placement,
                health: health_rx.clone(),
                stop: watch::channel(false).1,
                allocator: allocator.clone(),
            };
            server = Some(Server::start(&ours, plugin).map_err(KubeletError::Socket)?);
            registered = None;
            report(false);
        }
        // Then register, once per kubelet socket.
        let Some(k) = socket::socket_id(&kubelet) else {
            if registered.take().is_some() {
                tracing::warn!(socket = %kubelet.display(), "kubelet socket gone");
                report(false);
            }
            continue;
        };
        if registered == Some(k) {
            continue;
        }
        if registered.take().is_some() {
            // A new kubelet: not registered with it yet.
            report(false);
        }
        match registration::register(&kubelet, &config.endpoint, &config.resource_name).await {
            Ok(()) => {
                tracing::info!(kubelet = %kubelet.display(), resource = %config.resource_name, "registered with kubelet");
                registered = Some(k);
                report(true);
            }
            Err(e) => tracing::warn!(
                error = %crate::error_chain::with_causes(&e),
                "registration failed; retrying"
            ),
        }
    }
    report(false);
    if let Some(s) = server.take() {
        s.stop(&ours).await;
    }
    tracing::info!(socket = %ours.display(), "device plugin stopped");
    Ok(())
}

/// One listening instance of the service.
struct Server {
    id: socket::FileId,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Server {
    fn start(path: &Path, mut plugin: DevicePlugin) -> Result<Self, socket::SocketError> {
        let listener = socket::bind(path)?;
        let id = socket::socket_id(path).ok_or_else(|| socket::SocketError::Bind {
            path: path.to_owned(),
            source: std::io::Error::other("the socket vanished right after bind"),
        })?;
        let (stop, stop_rx) = watch::channel(false);
        plugin.stop = stop_rx.clone();
        let mut rx = stop_rx;
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = rx.wait_for(|s| *s).await;
                }),
        );
        Ok(Self { id, stop, task })
    }

    /// Stops serving (2 s grace for open calls) and removes the socket if
    /// it is still this instance's.
    async fn stop(self, path: &Path) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        match tokio::time::timeout(Duration::from_secs(2), &mut task).await {
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %crate::error_chain::with_causes(&e), "device plugin server failed")
            }
            Ok(_) => {}
            Err(_) => task.abort(),
        }
        if socket::socket_id(path) == Some(self.id) {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_checks_name_the_field() {
        assert!(KubeletConfig::default().validate().is_ok());
        type Edit = fn(&mut KubeletConfig);
        let cases: [(&str, Edit); 7] = [
            ("endpoint", |c| c.endpoint = "../x.sock".into()),
            ("endpoint", |c| c.endpoint = "kubelet.sock".into()),
            ("endpoint", |c| c.endpoint = String::new()),
            ("resource_name", |c| c.resource_name = "gpu".into()),
            ("resource_name", |c| {
                c.resource_name = "nvidia.com/g pu".into()
            }),
            ("split", |c| c.split = 0),
            ("watch_interval", |c| {
                c.watch_interval = Duration::from_secs(2)
            }),
        ];
        for (field, f) in cases {
            let mut c = KubeletConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("device plugin setting {field}:")),
                "{e}"
            );
        }
    }
}
