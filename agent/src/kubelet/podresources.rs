//! Kubelet's PodResources v1 API as the agent reads it: which (namespace,
//! pod, container) holds which of our vGPUs.
//!
//! [`Client::list`] calls `v1.PodResourcesLister/List` (and
//! `GetAllocatableResources`, which older kubelets may lack) on kubelet's
//! socket and returns a typed [`Snapshot`]. The client is pull-based and
//! keeps no state a kubelet restart can break:
//! - before every call it looks at the socket file; when the file is gone
//!   the call fails at once ([`PodResourcesError::Absent`]), when it was
//!   recreated (another inode or change time: a kubelet restart) the old
//!   connection is dropped and a new one made;
//! - a failed call drops the connection, so the next call connects anew;
//! - an answer is used only if the socket is the same file after the call
//!   as before the connection ([`PodResourcesError::Restarted`] otherwise);
//! - every connect and call is bounded by the client's timeout, so a hung
//!   kubelet (a socket that accepts and never answers) costs at most that
//!   long and never wedges the agent.
//!
//! Each snapshot names the kubelet instance that answered
//! ([`KubeletInstance`]: the socket's identity and creation time), which
//! is what the garbage collector weighs its evidence by
//! ([`crate::kubelet::gc`]).
//!
//! Kubelet's answer is untrusted input: entries with an empty name are left
//! out (and reported), device IDs of our resource that are not
//! `<GPU-UUID>::<n>` are reported and kept as text.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tessera_kubelet_api::podresources::v1 as pr;
use tessera_kubelet_api::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tonic::transport::Channel;

use super::socket::{self, FileId, SocketError};
use super::vgpu::VgpuId;

/// Default bound of one connect or call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a PodResources call gave no snapshot.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// Kubelet's socket does not exist (kubelet absent or restarting).
    #[error("kubelet's PodResources socket {path} does not exist")]
    Absent {
        /// The socket.
        path: PathBuf,
    },
    /// Connecting failed.
    #[error("cannot connect to kubelet's PodResources socket")]
    Connect(#[source] SocketError),
    /// Kubelet answered with an error.
    #[error("kubelet at {path} refused {rpc}: {message}")]
    Call {
        /// The socket.
        path: PathBuf,
        /// The RPC.
        rpc: &'static str,
        /// Kubelet's message.
        message: String,
        /// Cause.
        #[source]
        source: tonic::Status,
    },
    /// Kubelet's socket was recreated while the call was under way: the
    /// answer may be either kubelet's, so it is not used.
    #[error(
        "kubelet's PodResources socket {path} was recreated during the call (kubelet restarted)"
    )]
    Restarted {
        /// The socket.
        path: PathBuf,
    },
    /// Kubelet did not answer in time.
    #[error("kubelet at {path} did not answer {rpc} within {timeout:?}")]
    Timeout {
        /// The socket.
        path: PathBuf,
        /// The RPC.
        rpc: &'static str,
        /// The bound.
        timeout: Duration,
    },
}

/// One container as kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerKey {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
}

impl fmt::Display for ContainerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.pod, self.container)
    }
}

/// The kubelet that answered: its socket's identity and the time the
/// socket was created (its change time; a new kubelet creates a new one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeletInstance {
    /// The socket file's identity.
    pub socket: FileId,
    /// When the socket was created (or last changed).
    pub since: SystemTime,
}

impl KubeletInstance {
    /// The kubelet now serving `path`, `None` when no socket is there.
    pub fn at(path: &Path) -> Option<Self> {
        let id = socket::socket_id(path)?;
        let m = std::fs::symlink_metadata(path).ok()?;
        let secs = u64::try_from(m.ctime()).unwrap_or(0);
        let nanos = u32::try_from(m.ctime_nsec()).unwrap_or(0);
        Some(Self {
            socket: id,
            since: UNIX_EPOCH + Duration::new(secs, nanos.min(999_999_999)),
        })
    }
}

/// What kubelet's `List` (and `GetAllocatableResources`) said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The kubelet that answered.
    pub kubelet: KubeletInstance,
    /// Every container kubelet lists, with the device IDs of our resource
    /// it holds (empty for a container without our devices).
    pub containers: BTreeMap<ContainerKey, Vec<Device>>,
    /// The devices of our resource kubelet can allocate; `None` when
    /// kubelet does not serve `GetAllocatableResources`.
    pub allocatable: Option<Vec<Device>>,
    /// Entries left out or not understood, as text for the log.
    pub problems: Vec<String>,
}

impl Snapshot {
    /// Whether kubelet lists `key`.
    pub fn lists(&self, key: &ContainerKey) -> bool {
        self.containers.contains_key(key)
    }

    /// The container holding vGPU `id`, if kubelet lists one.
    pub fn holder_of(&self, id: &VgpuId) -> Option<&ContainerKey> {
        self.containers
            .iter()
            .find(|(_, d)| d.iter().any(|d| matches!(d, Device::Vgpu(v) if v == id)))
            .map(|(k, _)| k)
    }

    /// The containers holding at least one device of our resource.
    pub fn holders(&self) -> impl Iterator<Item = (&ContainerKey, &[Device])> {
        self.containers
            .iter()
            .filter(|(_, d)| !d.is_empty())
            .map(|(k, d)| (k, d.as_slice()))
    }
}

/// A device ID of our resource: a vGPU, or text that is not one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Device {
    /// `<GPU-UUID>::<n>`.
    Vgpu(VgpuId),
    /// An ID that is not `<GPU-UUID>::<n>` (reported in
    /// [`Snapshot::problems`]).
    Other(String),
}

/// A PodResources client; see the module documentation.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    resource_name: String,
    timeout: Duration,
    conn: Option<Conn>,
}

#[derive(Debug)]
struct Conn {
    kubelet: KubeletInstance,
    client: PodResourcesListerClient<Channel>,
}

impl Client {
    /// A client of the kubelet at `path` reading the devices of
    /// `resource_name`; connects and calls within `timeout` each. Nothing is
    /// connected until the first call.
    pub fn new(
        path: impl Into<PathBuf>,
        resource_name: impl Into<String>,
        timeout: Duration,
    ) -> Self {
        Self {
            path: path.into(),
            resource_name: resource_name.into(),
            timeout,
            conn: None,
        }
    }

    /// The socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a connection is held now (to the socket that existed at the
    /// last call).
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// A connection to the kubelet serving the socket now.
    async fn connection(&mut self) -> Result<&mut Conn, PodResourcesError> {
        let Some(now) = KubeletInstance::at(&self.path) else {
            self.conn = None;
            return Err(PodResourcesError::Absent {
                path: self.path.clone(),
            });
        };
        if self
            .conn
            .as_ref()
            .is_some_and(|c| c.kubelet.socket != now.socket)
        {
            tracing::info!(socket = %self.path.display(), "kubelet's PodResources socket was recreated: reconnecting");
            self.conn = None;
        }
        if self.conn.is_none() {
            let channel =
                tokio::time::timeout(self.timeout, socket::channel(&self.path, self.timeout))
                    .await
                    .map_err(|_| PodResourcesError::Timeout {
                        path: self.path.clone(),
                        rpc: "connect",
                        timeout: self.timeout,
                    })?
                    .map_err(PodResourcesError::Connect)?;
            self.conn = Some(Conn {
                kubelet: now,
                client: PodResourcesListerClient::new(channel),
            });
        }
        // Just set when it was None.
        self.conn.as_mut().ok_or_else(|| PodResourcesError::Absent {
            path: self.path.clone(),
        })
    }

    /// Calls `List` (and `GetAllocatableResources`) and returns the
    /// snapshot; any failure drops the connection.
    pub async fn list(&mut self) -> Result<Snapshot, PodResourcesError> {
        let out = self.list_once().await;
        if out.is_err() {
            self.conn = None;
        }
        out
    }

    async fn list_once(&mut self) -> Result<Snapshot, PodResourcesError> {
        let timeout = self.timeout;
        let path = self.path.clone();
        let conn = self.connection().await?;
        let kubelet = conn.kubelet;
        let listed = call(
            &path,
            "List",
            timeout,
            conn.client.list(pr::ListPodResourcesRequest {}),
        )
        .await?
        .into_inner();
        let allocatable = match call(
            &path,
            "GetAllocatableResources",
            timeout,
            conn.client
                .get_allocatable_resources(pr::AllocatableResourcesRequest {}),
        )
        .await
        {
            Ok(r) => Some(r.into_inner()),
            // An older kubelet without the RPC (or the feature gate off).
            Err(PodResourcesError::Call { source, .. })
                if source.code() == tonic::Code::Unimplemented =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        // The answer is labelled with the kubelet whose socket was there
        // before the connection and is still there after the call: a
        // kubelet restarting in between (the channel may reconnect on its
        // own) cannot pass a new kubelet's answer off as the old one's.
        if KubeletInstance::at(&path).map(|k| k.socket) != Some(kubelet.socket) {
            return Err(PodResourcesError::Restarted { path });
        }
        Ok(snapshot(kubelet, &self.resource_name, listed, allocatable))
    }
}

async fn call<T>(
    path: &Path,
    rpc: &'static str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, PodResourcesError> {
    match tokio::time::timeout(timeout, fut).await {
        Err(_) => Err(PodResourcesError::Timeout {
            path: path.to_owned(),
            rpc,
            timeout,
        }),
        // The channel's own bound (tonic turns it into `Cancelled` with
        // the text of `TimeoutExpired`), or a deadline the server saw.
        Ok(Err(source))
            if source.code() == tonic::Code::DeadlineExceeded
                || (source.code() == tonic::Code::Cancelled
                    && source.message() == tonic::TimeoutExpired(()).to_string()) =>
        {
            Err(PodResourcesError::Timeout {
                path: path.to_owned(),
                rpc,
                timeout,
            })
        }
        Ok(Err(source)) => Err(PodResourcesError::Call {
            path: path.to_owned(),
            rpc,
            message: source.message().to_owned(),
            source,
        }),
        Ok(Ok(r)) => Ok(r),
    }
}

fn devices(
    resource: &str,
    of: &[pr::ContainerDevices],
    problems: &mut Vec<String>,
    whose: &dyn Fn() -> String,
) -> Vec<Device> {
    let mut out: Vec<Device> = of
        .iter()
        .filter(|d| d.resource_name == resource)
        .flat_map(|d| d.device_ids.iter())
        .map(|id| match id.parse::<VgpuId>() {
            Ok(v) => Device::Vgpu(v),
            Err(e) => {
                problems.push(format!("{}: {e}", whose()));
                Device::Other(id.clone())
            }
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The typed snapshot of kubelet's answers (devices of `resource` only).
pub fn snapshot(
    kubelet: KubeletInstance,
    resource: &str,
    listed: pr::ListPodResourcesResponse,
    allocatable: Option<pr::AllocatableResourcesResponse>,
) -> Snapshot {
    let mut problems = Vec::new();
    let mut containers = BTreeMap::new();
    for pod in &listed.pod_resources {
        if pod.name.is_empty() || pod.namespace.is_empty() {
            problems.push(format!(
                "a pod without a name or namespace ({:?}/{:?}) was left out",
                pod.namespace, pod.name
            ));
            continue;
        }
        for c in &pod.containers {
            if c.name.is_empty() {
                problems.push(format!(
                    "a container without a name in pod {}/{} was left out",
                    pod.namespace, pod.name
                ));
                continue;
            }
            let key = ContainerKey {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: c.name.clone(),
            };
            let whose = || format!("container {key}");
            let mut d = devices(resource, &c.devices, &mut problems, &whose);
            // A container listed twice: the union of its devices.
            let e: &mut Vec<Device> = containers.entry(key.clone()).or_default();
            e.append(&mut d);
            e.sort();
            e.dedup();
        }
    }
    let allocatable = allocatable.map(|a| {
        devices(resource, &a.devices, &mut problems, &|| {
            "the allocatable devices".to_owned()
        })
    });
    Snapshot {
        kubelet,
        containers,
        allocatable,
        problems,
    }
}
