//! `Allocate`, end to end: find the pod and container through the API
//! server ([`super::pods`]), turn its assignment into limits
//! ([`super::grant`]), create its region directory, record it as
//! allocated on the pod, answer kubelet ([`super::allocate`]).
//!
//! Concurrency without a node-wide lock: the pods on the node are listed
//! afresh by every call; a call claims its `(pod UID, container)` in an
//! in-process set for the time of the call (held only while choosing, no
//! I/O under it), so concurrent calls of this agent pick different
//! containers; the pod's `tessera.dev/allocated` is patched conditioned on
//! the `resourceVersion` read, so a writer elsewhere (or any change of the
//! pod in between) makes the patch fail with a conflict: the pod is read
//! again and, if it still picks the same container with the same
//! assignment, the patch is retried on the new version; otherwise the
//! call starts over from a fresh list (each at most [`MAX_ATTEMPTS`]
//! times). Nothing
//! serialises calls for different pods beyond that set.
//!
//! Order of effects, so a failure leaves nothing half-done: the region
//! directory is created first (atomically, by the store), then the pod is
//! marked; if marking fails, the directory is removed again. A retry of a
//! container whose directory exists (same pod UID) replaces it.
//!
//! The region directory's id is `<pod UID>_<container>` (a pod UID is 36
//! characters, a container name at most 63: a valid
//! [`ContainerId`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use tessera_api::assignment::ALLOCATED;
use tessera_kubelet_api::deviceplugin::v1beta1 as dp;

use crate::containers::meta::{IdentityError, check_pod_uid};
use crate::containers::{ContainerId, IdError, Store, StoreError};
use crate::gpu::InventoryGpu;

use super::allocate::{AllocateError, HostPaths, LD_SO_PRELOAD_FILE, LIBRARY_FILE, gpus_response};
use super::grant::{GrantError, grant};
use super::pods::{Choice, choose};
use super::vgpu::{VgpuId, VgpuIdError};

/// Most list → choose → patch rounds per call.
pub const MAX_ATTEMPTS: usize = 8;

/// What `Allocate` needs besides the GPUs.
#[derive(Clone)]
pub struct AllocateSetup {
    /// The API server.
    pub client: kube::Client,
    /// This node's name (`NODE_NAME`).
    pub node: String,
    /// The root of the region directories.
    pub root: PathBuf,
    /// The directory holding the preload libraries by version
    /// (`<preload_dir>/<version>/libtessera.so`).
    pub preload_dir: PathBuf,
    /// The library version mounted (this agent's).
    pub version: String,
    /// Where the device nodes are (`/dev`).
    pub dev_dir: PathBuf,
}

impl std::fmt::Debug for AllocateSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocateSetup")
            .field("node", &self.node)
            .field("root", &self.root)
            .field("preload_dir", &self.preload_dir)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Why one container's `Allocate` failed; the message is what kubelet
/// shows in the pod's events.
#[derive(Debug, thiserror::Error)]
pub enum AllocatorError {
    /// No device ID.
    #[error("the container request names no device")]
    NoDevices,
    /// A device ID is not ours.
    #[error("cannot allocate")]
    BadId(#[source] VgpuIdError),
    /// A device ID names a GPU that is not here.
    #[error("device {id} names a GPU that is not on node {node}")]
    UnknownDevice {
        /// The ID.
        id: String,
        /// This node.
        node: String,
    },
    /// The preload library is not installed.
    #[error(
        "the preload library {path} is missing on node {node} (the agent's install step has not run)"
    )]
    Library {
        /// The missing file.
        path: PathBuf,
        /// This node.
        node: String,
    },
    /// The pods could not be listed.
    #[error("cannot list the pods of node {node} from the API server")]
    List {
        /// This node.
        node: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// No pod matches.
    #[error("{0}")]
    NoMatch(String),
    /// The assignment cannot be granted.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The pod UID or container name makes no region id.
    #[error("pod {pod} container {container}: {problem}")]
    Id {
        /// `namespace/name`.
        pod: String,
        /// The container.
        container: String,
        /// What is wrong.
        problem: RegionIdError,
    },
    /// The region directory could not be made.
    #[error("pod {pod} container {container}: cannot create its region directory")]
    Region {
        /// `namespace/name`.
        pod: String,
        /// The container.
        container: String,
        /// Cause.
        #[source]
        source: StoreError,
    },
    /// The pod could not be marked.
    #[error("pod {pod} container {container}: cannot record it in {ALLOCATED}")]
    Patch {
        /// `namespace/name`.
        pod: String,
        /// The container.
        container: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Every attempt met a conflicting change.
    #[error(
        "the pods of node {node} kept changing: {MAX_ATTEMPTS} attempts to record an allocation met a conflict"
    )]
    Conflicts {
        /// This node.
        node: String,
    },
    /// The answer could not be built.
    #[error("pod {pod} container {container}")]
    Response {
        /// `namespace/name`.
        pod: String,
        /// The container.
        container: String,
        /// Cause.
        #[source]
        source: AllocateError,
    },
    /// A blocking task died.
    #[error("the region directory task failed")]
    Join(#[source] tokio::task::JoinError),
}

/// Why a pod UID and container name make no region id
/// ([`Allocator::region_id`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionIdError {
    /// The pod UID is not one.
    #[error(transparent)]
    PodUid(#[from] IdentityError),
    /// `<uid>_<container>` is not a container id.
    #[error(transparent)]
    Id(#[from] IdError),
}

/// Serves `Allocate` for one resource on one node.
pub struct Allocator {
    setup: AllocateSetup,
    resource: String,
    store: Store,
    paths: HostPaths,
    gpus: Arc<Vec<InventoryGpu>>,
    minors: Vec<Option<u32>>,
    in_flight: Mutex<HashSet<(String, String)>>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("setup", &self.setup)
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

/// A `(pod UID, container)` claimed by a call; released on drop.
struct Claim<'a> {
    set: &'a Mutex<HashSet<(String, String)>>,
    key: (String, String),
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.key);
    }
}

/// What one attempt ended with.
enum Attempt {
    Done(Box<dp::ContainerAllocateResponse>),
    /// The pod changed under us: list again.
    Conflict,
}

impl Allocator {
    /// An allocator for `resource` over `gpus` (`minors[i]` the device
    /// minor of `gpus[i]`).
    pub fn new(
        setup: AllocateSetup,
        resource: String,
        gpus: Arc<Vec<InventoryGpu>>,
        minors: Vec<Option<u32>>,
    ) -> Self {
        let paths = HostPaths {
            library_dir: setup.preload_dir.join(&setup.version),
            dev_dir: setup.dev_dir.clone(),
        };
        Self {
            store: Store::new(setup.root.clone()),
            setup,
            resource,
            paths,
            gpus,
            minors,
            in_flight: Mutex::new(HashSet::new()),
        }
    }

    /// The region id of a pod's container.
    pub fn region_id(uid: &str, container: &str) -> Result<ContainerId, RegionIdError> {
        check_pod_uid(uid)?;
        Ok(ContainerId::new(&format!("{uid}_{container}"))?)
    }

    /// Allocates the container that `ids` (kubelet's device IDs) are for.
    pub async fn allocate(
        &self,
        ids: &[String],
    ) -> Result<dp::ContainerAllocateResponse, AllocatorError> {
        if ids.is_empty() {
            return Err(AllocatorError::NoDevices);
        }
        for id in ids {
            let v: VgpuId = id.parse().map_err(AllocatorError::BadId)?;
            if !self.gpus.iter().any(|g| g.uuid == v.uuid) {
                return Err(AllocatorError::UnknownDevice {
                    id: id.clone(),
                    node: self.setup.node.clone(),
                });
            }
        }
        for file in [LIBRARY_FILE, LD_SO_PRELOAD_FILE] {
            let path = self.paths.library_dir.join(file);
            if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                return Err(AllocatorError::Library {
                    path,
                    node: self.setup.node.clone(),
                });
            }
        }
        for _ in 0..MAX_ATTEMPTS {
            match self.attempt(ids.len()).await? {
                Attempt::Done(r) => return Ok(*r),
                Attempt::Conflict => continue,
            }
        }
        Err(AllocatorError::Conflicts {
            node: self.setup.node.clone(),
        })
    }

    async fn attempt(&self, count: usize) -> Result<Attempt, AllocatorError> {
        let node = &self.setup.node;
        let pods: Api<Pod> = Api::all(self.setup.client.clone());
        let list = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(|source| AllocatorError::List {
                node: node.clone(),
                source,
            })?;
        let (choice, _claim) = {
            let mut busy = self
                .in_flight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let choice = choose(&list.items, node, &self.resource, count, &busy)
                .map_err(|no| AllocatorError::NoMatch(no.message(node, &self.resource, count)))?;
            let key = (choice.uid.clone(), choice.container.name.clone());
            busy.insert(key.clone());
            (
                choice,
                Claim {
                    set: &self.in_flight,
                    key,
                },
            )
        };
        let g = grant(&choice, &self.gpus)?;
        let id = Self::region_id(&choice.uid, &choice.container.name).map_err(|problem| {
            AllocatorError::Id {
                pod: choice.pod(),
                container: choice.container.name.clone(),
                problem,
            }
        })?;
        let dir = self.create_region(&choice, &id, g.meta).await?;
        if let Err(e) = self.mark_retrying(choice.clone(), count).await {
            self.remove_region(&id).await;
            return match e {
                Mark::Conflict => Ok(Attempt::Conflict),
                Mark::Failed(source) => Err(AllocatorError::Patch {
                    pod: choice.pod(),
                    container: choice.container.name.clone(),
                    source,
                }),
            };
        }
        let response = gpus_response(&g.gpus, &self.gpus, &self.minors, &self.paths, &dir)
            .map_err(|source| AllocatorError::Response {
                pod: choice.pod(),
                container: choice.container.name.clone(),
                source,
            })?;
        tracing::info!(
            pod = %choice.pod(),
            container = %choice.container.name,
            region = %dir.display(),
            gpus = ?g.gpus.iter().map(|i| self.gpus[*i].uuid.as_str()).collect::<Vec<_>>(),
            "allocated"
        );
        Ok(Attempt::Done(Box::new(response)))
    }

    /// Creates (or, for a retry of the same pod's container, replaces) the
    /// region directory.
    async fn create_region(
        &self,
        choice: &Choice,
        id: &ContainerId,
        meta: crate::containers::Metadata,
    ) -> Result<PathBuf, AllocatorError> {
        let store = self.store.clone();
        let id = id.clone();
        let uid = choice.uid.clone();
        let made = tokio::task::spawn_blocking(move || {
            match store.add(&id, &meta) {
                Err(StoreError::Exists { .. }) => {
                    // Same id: same pod UID and container (a retry).
                    let old = store.load(&id)?;
                    if old.meta.pod_uid.as_deref() != Some(uid.as_str()) {
                        return Err(StoreError::Refused {
                            id,
                            problem: "exists and belongs to another pod".into(),
                        });
                    }
                    store.remove(&id)?;
                    store.add(&id, &meta)
                }
                other => other,
            }
            .map(|c| c.dir)
        })
        .await
        .map_err(AllocatorError::Join)?;
        made.map_err(|source| AllocatorError::Region {
            pod: choice.pod(),
            container: choice.container.name.clone(),
            source,
        })
    }

    async fn remove_region(&self, id: &ContainerId) {
        let store = self.store.clone();
        let id = id.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = store.remove(&id) {
                tracing::warn!(error = %crate::error_chain::with_causes(&e), "cannot remove a region directory after a failed allocation");
            }
        })
        .await;
    }

    /// Marks the container allocated. A conflict (the pod changed since it
    /// was read) is retried on the pod read afresh as long as that pod
    /// still picks the same container with the same assignment; otherwise
    /// the conflict is returned (and the caller lists again).
    async fn mark_retrying(&self, mut choice: Choice, count: usize) -> Result<(), Mark> {
        let pods: Api<Pod> = Api::namespaced(self.setup.client.clone(), &choice.namespace);
        for _ in 0..MAX_ATTEMPTS {
            match self.mark(&choice).await {
                Err(Mark::Conflict) => {}
                other => return other,
            }
            let fresh = match pods.get(&choice.name).await {
                Ok(p) => p,
                Err(kube::Error::Api(s)) if s.is_not_found() => return Err(Mark::Conflict),
                Err(e) => return Err(Mark::Failed(e)),
            };
            if fresh.metadata.uid.as_deref() != Some(choice.uid.as_str()) {
                return Err(Mark::Conflict);
            }
            match choose(
                &[fresh],
                &self.setup.node,
                &self.resource,
                count,
                &HashSet::new(),
            ) {
                Ok(again)
                    if again.container.name == choice.container.name
                        && again.assignment == choice.assignment =>
                {
                    choice = again;
                }
                _ => return Err(Mark::Conflict),
            }
        }
        Err(Mark::Conflict)
    }

    /// Adds the container to the pod's `tessera.dev/allocated`, on the
    /// condition that the pod is still at the version read.
    async fn mark(&self, choice: &Choice) -> Result<(), Mark> {
        let mut allocated = choice.allocated.clone();
        allocated.0.insert(choice.container.name.clone());
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": choice.resource_version,
                "annotations": { ALLOCATED: allocated.to_json() },
            }
        });
        let pods: Api<Pod> = Api::namespaced(self.setup.client.clone(), &choice.namespace);
        match pods
            .patch(&choice.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                tracing::debug!(pod = %choice.pod(), "the pod changed since it was listed; listing again");
                Err(Mark::Conflict)
            }
            Err(e) => Err(Mark::Failed(e)),
        }
    }

    /// The host paths of the answers.
    pub fn paths(&self) -> &HostPaths {
        &self.paths
    }

    /// The root of the region directories.
    pub fn root(&self) -> &Path {
        self.store.root()
    }
}

enum Mark {
    Conflict,
    Failed(kube::Error),
}
