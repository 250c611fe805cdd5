//! The kubelet plugin of the DRA driver: `pluginregistration.Registration`
//! on a socket in kubelet's plugin registry (kubelet finds it there, asks
//! [`Registration::get_info`] and reports the outcome) and the
//! `v1.DRAPlugin` service on the driver's own socket, whose calls are
//! answered by [`Preparer`] for each claim read from the API server.
//!
//! Every claim in a request gets an entry in the answer: a claim that
//! cannot be prepared carries its error there (kubelet retries it and
//! shows the message in the pod's events); the others are prepared.
//! Host work runs on the blocking pool, one claim after another, so two
//! calls never prepare the same claim at once on different threads.

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_api::dra::DRIVER;
use tessera_kubelet_api::dra::{SERVICE_V1, v1 as api};
use tessera_kubelet_api::pluginregistration::{DRA_PLUGIN, v1 as reg};
use tokio::sync::{Mutex, watch};
use tonic::{Request, Response, Status};

use super::prepare::Preparer;

/// Reads claims from the API server (a trait so tests can answer).
#[tonic::async_trait]
pub trait Claims: Send + Sync + 'static {
    /// Claim `namespace/name`; the error is a message for kubelet.
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String>;
}

/// [`Claims`] from the API server.
#[derive(Clone)]
pub struct ApiClaims(pub kube::Client);

#[tonic::async_trait]
impl Claims for ApiClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        kube::Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| {
                format!(
                    "cannot read claim {namespace}/{name} from the API server: {}",
                    crate::error_chain::with_causes(&e)
                )
            })
    }
}

/// `pluginregistration.Registration`: who we are, and kubelet's verdict.
#[derive(Clone, Debug)]
pub struct Registration {
    /// The DRA service's socket (absolute, as kubelet dials it).
    pub endpoint: PathBuf,
    /// Set to kubelet's verdict (`true` once registered).
    pub registered: watch::Sender<bool>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: DRA_PLUGIN.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: vec![SERVICE_V1.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = DRIVER, "registered with kubelet as a DRA driver");
        } else {
            tracing::error!(driver = DRIVER, error = %status.error, "kubelet refused the DRA driver's registration");
        }
        self.registered.send_replace(status.plugin_registered);
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// `v1.DRAPlugin`.
#[derive(Clone)]
pub struct DraPlugin {
    /// Prepares on the host.
    pub preparer: Arc<Preparer>,
    /// Reads claims.
    pub claims: Arc<dyn Claims>,
    /// One host operation at a time.
    pub serial: Arc<Mutex<()>>,
}

impl DraPlugin {
    async fn prepare_one(&self, claim: &api::Claim) -> api::NodePrepareResourceResponse {
        let failed = |error: String| api::NodePrepareResourceResponse {
            devices: vec![],
            error,
        };
        let object = match self.claims.get(&claim.namespace, &claim.name).await {
            Ok(o) => o,
            Err(e) => return failed(e),
        };
        let preparer = Arc::clone(&self.preparer);
        let uid = claim.uid.clone();
        let _one = self.serial.lock().await;
        match tokio::task::spawn_blocking(move || preparer.prepare(&object, &uid)).await {
            Ok(Ok(devices)) => api::NodePrepareResourceResponse {
                devices,
                error: String::new(),
            },
            Ok(Err(e)) => {
                let message = crate::error_chain::with_causes(&e);
                tracing::warn!(error = %message, "claim not prepared");
                failed(message)
            }
            Err(e) => failed(format!(
                "claim {}/{}: the prepare task failed: {e}",
                claim.namespace, claim.name
            )),
        }
    }

    async fn unprepare_one(&self, claim: &api::Claim) -> api::NodeUnprepareResourceResponse {
        let preparer = Arc::clone(&self.preparer);
        let uid = claim.uid.clone();
        let _one = self.serial.lock().await;
        let error = match tokio::task::spawn_blocking(move || preparer.unprepare(&uid)).await {
            Ok(Ok(())) => {
                tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), "claim unprepared");
                String::new()
            }
            Ok(Err(e)) => crate::error_chain::with_causes(&e),
            Err(e) => format!(
                "claim {}/{}: the unprepare task failed: {e}",
                claim.namespace, claim.name
            ),
        };
        api::NodeUnprepareResourceResponse { error }
    }
}

#[tonic::async_trait]
impl api::dra_plugin_server::DraPlugin for DraPlugin {
    async fn node_prepare_resources(
        &self,
        request: Request<api::NodePrepareResourcesRequest>,
    ) -> Result<Response<api::NodePrepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let answer = self.prepare_one(&claim).await;
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(api::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<api::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<api::NodeUnprepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let answer = self.unprepare_one(&claim).await;
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(api::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

/// Where the plugin's sockets go.
#[derive(Clone, Debug)]
pub struct Sockets {
    /// kubelet's plugin registry (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// kubelet's plugin directory (`/var/lib/kubelet/plugins`); the DRA
    /// socket is `<dir>/gpu.tessera.dev/dra.sock`.
    pub plugins_dir: PathBuf,
}

impl Sockets {
    /// The registration socket.
    pub fn registration(&self) -> PathBuf {
        self.registry_dir.join(format!("{DRIVER}-reg.sock"))
    }
    /// The DRA service's socket.
    pub fn service(&self) -> PathBuf {
        self.plugins_dir.join(DRIVER).join("dra.sock")
    }
}

/// Why the plugin cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// A socket's directory cannot be made.
    #[error("cannot create {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A socket cannot be bound.
    #[error(transparent)]
    Socket(#[from] crate::kubelet::socket::SocketError),
    /// A server failed.
    #[error("the DRA plugin's gRPC server failed")]
    Serve(#[source] tonic::transport::Error),
}

/// Serves both services until `shutdown` completes, then removes the
/// sockets (the registration socket first, so kubelet drops the plugin
/// before its service goes).
pub async fn serve(
    sockets: &Sockets,
    plugin: DraPlugin,
    registered: watch::Sender<bool>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), PluginError> {
    use tokio_stream::wrappers::UnixListenerStream;

    use crate::kubelet::socket;

    let service = sockets.service();
    let registration = sockets.registration();
    for path in [&service, &registration] {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| PluginError::Dir {
                path: dir.to_owned(),
                source,
            })?;
        }
    }
    // The service first: kubelet dials it as soon as it sees the
    // registration socket.
    let service_listener = socket::bind(&service)?;
    let registration_listener = socket::bind(&registration)?;
    tracing::info!(driver = DRIVER, socket = %service.display(), registration = %registration.display(), "DRA plugin serving");
    let (stop, stop_rx) = watch::channel(false);
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let dra = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(api::dra_plugin_server::DraPluginServer::new(plugin))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(service_listener),
                wait(stop_rx.clone()),
            ),
    );
    // kubelet's plugin watcher sends an authority tonic refuses: relayed
    // with it rewritten (super::authority).
    let (registration_incoming, accepting) = super::authority::incoming(registration_listener);
    let reg = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(reg::registration_server::RegistrationServer::new(
                Registration {
                    endpoint: service.clone(),
                    registered,
                },
            ))
            .serve_with_incoming_shutdown(registration_incoming, wait(stop_rx)),
    );
    shutdown.await;
    accepting.abort();
    let _ = std::fs::remove_file(&registration);
    let _ = stop.send(true);
    let mut result = Ok(());
    for task in [reg, dra] {
        if let Ok(Ok(Err(e))) = tokio::time::timeout(std::time::Duration::from_secs(2), task).await
        {
            result = Err(PluginError::Serve(e));
        }
    }
    let _ = std::fs::remove_file(&service);
    result
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::containers::Store;
    use crate::gpu::{FakeBackend, FakeGpu, Inventory};
    use crate::kubelet::allocate::HostPaths;
    use crate::kubelet::socket::channel;

    struct Fixed(HashMap<String, ResourceClaim>);

    #[tonic::async_trait]
    impl Claims for Fixed {
        async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
            self.0
                .get(&format!("{namespace}/{name}"))
                .cloned()
                .ok_or_else(|| format!("claim {namespace}/{name} not found"))
        }
    }

    fn claim(uid: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c1", "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"driver": "gpu.tessera.dev", "pool": "n1", "device": "gpu-0", "request": "gpu",
                 "consumedCapacity": {"memory": "4Gi", "cores": "30"}}
            ]}}},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn kubelet_registers_the_driver_then_prepares_and_unprepares_claims() {
        let dir = tempfile::tempdir().unwrap();
        let gpus = Inventory::collect(&FakeBackend::new(vec![FakeGpu::new(0, "H100", 81559)]))
            .unwrap()
            .gpus;
        let preparer = Preparer {
            node: "n1".into(),
            store: Store::new(dir.path().join("containers")),
            paths: HostPaths {
                library_dir: "/var/lib/tessera/lib/0.1.0".into(),
                dev_dir: dir.path().join("dev"),
            },
            cdi_dir: dir.path().join("cdi"),
            gpus,
            minors: vec![Some(0)],
        };
        let uid = "0e0c6d3c-1b7e-4b8e-9c1d-4f3a2b1c0d9e";
        let plugin = DraPlugin {
            preparer: Arc::new(preparer),
            claims: Arc::new(Fixed([("ns/c1".to_owned(), claim(uid))].into())),
            serial: Arc::default(),
        };
        let sockets = Sockets {
            registry_dir: dir.path().join("plugins_registry"),
            plugins_dir: dir.path().join("plugins"),
        };
        let (registered, mut registered_rx) = watch::channel(false);
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = {
            let sockets = sockets.clone();
            tokio::spawn(async move {
                serve(&sockets, plugin, registered, async {
                    let _ = stop_rx.await;
                })
                .await
            })
        };
        let timeout = Duration::from_secs(5);
        let mut tries = 0;
        while !sockets.registration().exists() {
            tries += 1;
            assert!(tries < 500, "no registration socket");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // As kubelet's plugin watcher does.
        let mut r = reg::registration_client::RegistrationClient::new(
            channel(&sockets.registration(), timeout).await.unwrap(),
        );
        let info = r.get_info(reg::InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "gpu.tessera.dev");
        assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
        assert_eq!(PathBuf::from(&info.endpoint), sockets.service());
        r.notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
        registered_rx.wait_for(|r| *r).await.unwrap();

        let mut d = api::dra_plugin_client::DraPluginClient::new(
            channel(PathBuf::from(&info.endpoint).as_path(), timeout)
                .await
                .unwrap(),
        );
        let ours = api::Claim {
            namespace: "ns".into(),
            uid: uid.into(),
            name: "c1".into(),
        };
        let missing = api::Claim {
            namespace: "ns".into(),
            uid: "u2".into(),
            name: "gone".into(),
        };
        let answer = d
            .node_prepare_resources(api::NodePrepareResourcesRequest {
                claims: vec![ours.clone(), missing.clone()],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.claims.len(), 2, "every claim has an entry");
        let good = &answer.claims[uid];
        assert_eq!(good.error, "");
        assert_eq!(
            good.devices[0].cdi_device_ids,
            [format!("gpu.tessera.dev/claim={uid}")]
        );
        assert!(
            answer.claims["u2"]
                .error
                .contains("claim ns/gone not found")
        );
        let spec = super::super::cdi::spec_path(&dir.path().join("cdi"), uid);
        assert!(spec.exists());

        let undone = d
            .node_unprepare_resources(api::NodeUnprepareResourcesRequest { claims: vec![ours] })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(undone.claims[uid].error, "");
        assert!(!spec.exists());

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert!(!sockets.registration().exists() && !sockets.service().exists());
    }
}
