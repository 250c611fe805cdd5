//! The extender's `bind` verb: places the pod's shares on the chosen
//! node, writes the `tessera.dev/assignment` the node agent's `Allocate`
//! reads ([`tessera_api::assignment`]), then creates the pod's Binding.
//!
//! One bind, in order:
//! 1. read the pod; refuse it if its UID is not the one scheduled, or it
//!    is bound already;
//! 2. place its shares on the node's GPUs with the filter's fit code
//!    ([`crate::extender::place`]) against the telemetry *and* the
//!    [`reserve::Reservations`] table, and reserve them there (the table's
//!    invariant: no GPU over-committed, whatever binds run at once);
//! 3. write the assignment with a merge patch conditioned on the
//!    `resourceVersion` read in 1; on 409 Conflict (the pod changed),
//!    release and start again from 1, at most [`MAX_CONFLICTS`] times;
//! 4. create the Binding. If that fails, remove the assignment again
//!    (conditioned on the patched version) and release; when even that
//!    fails, the reservation stays (counting a share too many is safe,
//!    one too few is not) until the next [`Binder::refresh`].
//!
//! Pods bound before this process started (or by another replica) are
//! counted by [`Binder::refresh`] from their assignment annotations. A
//! binder made with [`Binder::awaiting_count`] (the server's) refuses
//! every bind until that first count has succeeded: before it, the table
//! does not know the shares of pods bound but not yet reported by their
//! agents, and a bind could over-commit their GPUs.
//!
//! Limits written: what the container's resources name explicitly
//! (`memoryMiB` or `memoryPercent`, `coresPercent`), nothing more, so the
//! agent's check that an assignment grants no more than the spec holds;
//! absent values take the contract's defaults (whole card memory, no
//! compute cap), which the table counts as the fit code does
//! ([`crate::resources::GpuShare::effective_memory`] and `effective_cores`).

pub mod api;
pub mod reserve;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod as KubePod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tessera_api::UuidError;
use tessera_api::assignment::{
    ASSIGNMENT, Assignment, ContainerAssignment, GpuAssignment, VERSION,
};
use thiserror::Error;

use crate::extender::{ClusterView, ExtenderBindingArgs, ExtenderBindingResult};
use crate::pod::Pod;
use crate::request::PodRequest;
use crate::resources::{GPU, GpuShare, Memory};

use reserve::{Held, Reservations, ReserveError};

/// Conflicting writes (409) tolerated before a bind gives up.
pub const MAX_CONFLICTS: usize = 5;

/// Why a pod was not bound; each names the pod.
#[derive(Debug, Error)]
pub enum BindError {
    /// The pod could not be read from the API server.
    #[error("reading pod {pod} failed")]
    Read {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The pod's JSON is not one this crate reads.
    #[error("pod {pod} could not be read as a pod")]
    Decode {
        /// `namespace/name`.
        pod: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The pod of that name is another pod now.
    #[error("pod {pod} has UID {found}, not the {wanted} being scheduled (it was re-created)")]
    Replaced {
        /// `namespace/name`.
        pod: String,
        /// UID in the request.
        wanted: String,
        /// UID found.
        found: String,
    },
    /// The pod has a node already.
    #[error("pod {pod} is already bound to node {node}")]
    AlreadyBound {
        /// `namespace/name`.
        pod: String,
        /// Its node.
        node: String,
    },
    /// Its GPU resources or annotations are invalid.
    #[error("pod {pod}: {}", .problems.join("; "))]
    Invalid {
        /// `namespace/name`.
        pod: String,
        /// One message per problem.
        problems: Vec<String>,
    },
    /// The node has no GPU telemetry.
    #[error("pod {pod}: node {node} has no tessera GPU telemetry (no GpuNode status)")]
    NoTelemetry {
        /// `namespace/name`.
        pod: String,
        /// The node.
        node: String,
    },
    /// The pod no longer fits the node.
    #[error("pod {pod} does not fit node {node} now")]
    NoFit {
        /// `namespace/name`.
        pod: String,
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: ReserveError,
    },
    /// The pod kept changing under the conditioned write.
    #[error("pod {pod} changed under each of {attempts} assignment writes (409 Conflict)")]
    Conflicts {
        /// `namespace/name`.
        pod: String,
        /// Writes tried.
        attempts: usize,
    },
    /// Writing the assignment failed.
    #[error("writing the assignment of pod {pod} failed")]
    Patch {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The pods bound before this process started are not counted yet.
    #[error(
        "pod {pod}: not bound yet; the GPU assignments of pods bound before this scheduler started are still being counted (retried by the scheduler)"
    )]
    NotCounted {
        /// `namespace/name`.
        pod: String,
    },
    /// The node's telemetry names a GPU by something not a GPU UUID.
    #[error("node {node}: GPU {uuid:?} in its telemetry is not a GPU UUID")]
    BadUuid {
        /// The node.
        node: String,
        /// The UUID as given.
        uuid: String,
    },
    /// Creating the Binding failed.
    #[error("binding pod {pod} to node {node} failed")]
    Binding {
        /// `namespace/name`.
        pod: String,
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl BindError {
    /// The metrics label for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Read { .. } => "read_pod",
            Self::Decode { .. } => "decode_pod",
            Self::Replaced { .. } => "pod_replaced",
            Self::AlreadyBound { .. } => "already_bound",
            Self::Invalid { .. } => "invalid_pod",
            Self::NoTelemetry { .. } => "no_telemetry",
            Self::NoFit { .. } => "no_fit",
            Self::Conflicts { .. } => "conflicts",
            Self::Patch { .. } => "write_assignment",
            Self::BadUuid { .. } => "bad_telemetry",
            Self::NotCounted { .. } => "not_counted",
            Self::Binding { .. } => "create_binding",
        }
    }

    /// The message with its causes.
    pub fn full_message(&self) -> String {
        crate::error_chain::with_causes(self)
    }
}

/// Why the bound pods could not be counted.
#[derive(Debug, Error)]
#[error("listing pods to count their GPU assignments failed")]
pub struct RefreshError(#[source] pub kube::Error);

/// Binds pods; shared by every request of the server.
#[derive(Clone)]
pub struct Binder {
    client: kube::Client,
    table: std::sync::Arc<Reservations>,
    /// Whether a [`Binder::refresh`] has succeeded (or none is awaited).
    counted: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for Binder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binder")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// What a successful bind wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// The assignment annotation (absent for a pod without GPU shares).
    pub assignment: Option<Assignment>,
}

impl Binder {
    /// A binder talking to `client`, with `table` as the whole truth (no
    /// count awaited: the caller has filled it or knows nothing is bound).
    pub fn new(client: kube::Client, table: Reservations) -> Self {
        Self {
            client,
            table: std::sync::Arc::new(table),
            counted: std::sync::Arc::new(true.into()),
        }
    }

    /// A binder that refuses every bind with [`BindError::NotCounted`]
    /// until its first successful [`Binder::refresh`].
    pub fn awaiting_count(client: kube::Client, table: Reservations) -> Self {
        let binder = Self::new(client, table);
        binder
            .counted
            .store(false, std::sync::atomic::Ordering::SeqCst);
        binder
    }

    /// Whether binds are served (see [`Binder::awaiting_count`]).
    pub fn is_counted(&self) -> bool {
        self.counted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The reservation table (for metrics).
    pub fn table(&self) -> &Reservations {
        &self.table
    }

    /// The `bind` verb's answer.
    pub async fn answer(
        &self,
        args: &ExtenderBindingArgs,
        view: &ClusterView,
    ) -> ExtenderBindingResult {
        match self.bind(args, view).await {
            Ok(_) => ExtenderBindingResult::default(),
            Err(e) => ExtenderBindingResult {
                error: e.full_message(),
            },
        }
    }

    /// Binds the pod to `args.node`; see the module docs.
    ///
    /// # Errors
    /// A [`BindError`] naming the pod; nothing stays reserved or written
    /// unless said there.
    pub async fn bind(
        &self,
        args: &ExtenderBindingArgs,
        view: &ClusterView,
    ) -> Result<Bound, BindError> {
        let (ns, name) = (&args.pod_namespace, &args.pod_name);
        let key = format!("{ns}/{name}");
        if !self.is_counted() {
            return Err(BindError::NotCounted { pod: key });
        }
        for _ in 0..MAX_CONFLICTS {
            let pod = api::get_pod(&self.client, ns, name)
                .await
                .map_err(|source| BindError::Read {
                    pod: key.clone(),
                    source,
                })?;
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if !args.pod_uid.is_empty() && uid != args.pod_uid {
                return Err(BindError::Replaced {
                    pod: key,
                    wanted: args.pod_uid.clone(),
                    found: uid,
                });
            }
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                return Err(BindError::AlreadyBound { pod: key, node });
            }
            let request = read_request(&pod, &key)?;
            if request.shares.is_empty() {
                self.binding(ns, name, &uid, &args.node, &key).await?;
                return Ok(Bound { assignment: None });
            }
            let node = view
                .node(&args.node)
                .ok_or_else(|| BindError::NoTelemetry {
                    pod: key.clone(),
                    node: args.node.clone(),
                })?;
            let task = crate::extender::fit::task_of(&request.shares, &request.policy);
            let workload = view.workload_for(&task);
            let reservation = self
                .table
                .reserve(&uid, node, &request, &workload)
                .map_err(|source| BindError::NoFit {
                    pod: key.clone(),
                    node: args.node.clone(),
                    source,
                })?;
            let assignment = assignment_of(&args.node, &request.shares, &reservation.containers)
                .map_err(|e| BindError::BadUuid {
                    node: args.node.clone(),
                    uuid: e.text,
                })?;
            let rv = pod.metadata.resource_version.clone().unwrap_or_default();
            let patched = match api::patch_assignment(
                &self.client,
                ns,
                name,
                &rv,
                Some(&assignment.to_json()),
            )
            .await
            {
                Ok(p) => p,
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    tracing::debug!(pod = %key, "pod changed since read; reading again");
                    drop(reservation);
                    continue;
                }
                // The server answered: nothing was written.
                Err(source @ kube::Error::Api(_)) => {
                    return Err(BindError::Patch { pod: key, source });
                }
                // No answer: the write may have landed; keep counting it.
                Err(source) => {
                    reservation.confirm();
                    return Err(BindError::Patch { pod: key, source });
                }
            };
            match self.binding(ns, name, &uid, &args.node, &key).await {
                Ok(()) => {
                    reservation.confirm();
                    return Ok(Bound {
                        assignment: Some(assignment),
                    });
                }
                Err(error) => {
                    let rv = patched.metadata.resource_version.unwrap_or_default();
                    match api::patch_assignment(&self.client, ns, name, &rv, None).await {
                        Ok(_) => drop(reservation),
                        Err(e) => {
                            tracing::warn!(pod = %key, error = %e, "removing the assignment after a failed binding failed; its reservation stays until the next refresh");
                            reservation.confirm();
                        }
                    }
                    return Err(error);
                }
            }
        }
        Err(BindError::Conflicts {
            pod: key,
            attempts: MAX_CONFLICTS,
        })
    }

    async fn binding(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        node: &str,
        key: &str,
    ) -> Result<(), BindError> {
        api::create_binding(&self.client, ns, name, uid, node)
            .await
            .map_err(|source| BindError::Binding {
                pod: key.to_owned(),
                node: node.to_owned(),
                source,
            })
    }

    /// Recounts the table from the API server: every pod not yet ended
    /// holding an assignment annotation for a node of `view` counts what
    /// the annotation names, with limits it omits taken from the pod's
    /// spec as the fit code does. Annotations that do not parse are
    /// skipped with a warning (the agent refuses them too).
    ///
    /// # Errors
    /// [`RefreshError`] when the pods cannot be listed; the table is left
    /// as it was.
    pub async fn refresh(&self, view: &ClusterView) -> Result<usize, RefreshError> {
        let since = self.table.begin_refresh();
        let pods = api::list_pods(&self.client).await.map_err(RefreshError)?;
        let mut bound = Vec::new();
        let mut counted = 0;
        for pod in &pods {
            let held = held_by(pod, view);
            counted += usize::from(!held.is_empty());
            bound.extend(held);
        }
        self.table.rebuild(bound, since);
        self.counted
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(counted)
    }
}

fn read_request(pod: &KubePod, key: &str) -> Result<PodRequest, BindError> {
    let value = serde_json::to_value(pod).map_err(|source| BindError::Decode {
        pod: key.to_owned(),
        source,
    })?;
    let ours = Pod::from_json(&value).map_err(|source| BindError::Decode {
        pod: key.to_owned(),
        source,
    })?;
    PodRequest::from_pod(&ours).map_err(|problems| BindError::Invalid {
        pod: key.to_owned(),
        problems,
    })
}

/// The assignment for `placed` (container → GPUs, in `shares` order), or
/// the first UUID that does not parse.
fn assignment_of(
    node: &str,
    shares: &[GpuShare],
    placed: &[(String, Vec<String>)],
) -> Result<Assignment, UuidError> {
    let mut containers = Vec::with_capacity(placed.len());
    for (share, (name, uuids)) in shares.iter().zip(placed) {
        let mut gpus = Vec::with_capacity(uuids.len());
        for u in uuids {
            gpus.push(GpuAssignment {
                uuid: u.parse()?,
                memory_mib: match share.memory {
                    Some(Memory::Mib(m)) => Some(m),
                    _ => None,
                },
                memory_percent: match share.memory {
                    Some(Memory::Percent(p)) => Some(u32::from(p)),
                    _ => None,
                },
                cores_percent: share.cores.filter(|c| *c > 0).map(u32::from),
            });
        }
        containers.push(ContainerAssignment {
            name: name.clone(),
            resource: GPU.to_owned(),
            gpus,
        });
    }
    Ok(Assignment {
        version: VERSION,
        node: node.to_owned(),
        bound_at: Time(k8s_openapi::jiff::Timestamp::now()),
        containers,
    })
}

/// What `pod` holds per GPU by its assignment annotation: (pod UID, node,
/// GPU, card memory, held). Empty for a pod without one, an ended pod,
/// or a node outside `view`.
fn held_by(pod: &KubePod, view: &ClusterView) -> Vec<(String, String, String, u64, Held)> {
    let ended = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    let Some(text) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ASSIGNMENT))
    else {
        return Vec::new();
    };
    if ended {
        return Vec::new();
    }
    let key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let assignment = match Assignment::parse(text) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(pod = %key, error = %e, "assignment not counted");
            return Vec::new();
        }
    };
    let Some(node) = view.node(&assignment.node) else {
        return Vec::new();
    };
    let shares: BTreeMap<String, GpuShare> = read_request(pod, &key)
        .map(|r| {
            r.shares
                .into_iter()
                .map(|s| (s.container.clone(), s))
                .collect()
        })
        .unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut per_gpu: BTreeMap<String, (u64, Held)> = BTreeMap::new();
    for c in &assignment.containers {
        let share = shares.get(&c.name);
        for g in &c.gpus {
            let uuid = g.uuid.to_string();
            let Some(gpu) = node.gpus.iter().find(|v| v.uuid == uuid) else {
                continue;
            };
            let memory = match (g.memory_mib, g.memory_percent) {
                (Some(m), _) => Memory::Mib(m),
                (None, Some(p)) => Memory::Percent(u8::try_from(p.min(100)).unwrap_or(100)),
                (None, None) => share.map_or(Memory::Percent(100), GpuShare::effective_memory),
            };
            let cores = g
                .cores_percent
                .unwrap_or_else(|| share.map_or(100, |s| u32::from(s.effective_cores())));
            let e = per_gpu.entry(uuid).or_insert((
                gpu.memory_mib,
                Held {
                    mib: 0,
                    cores: 0,
                    shares: 0,
                },
            ));
            e.1.mib += memory.mib_on(gpu.memory_mib);
            e.1.cores += cores;
            e.1.shares += 1;
        }
    }
    per_gpu
        .into_iter()
        .map(|(uuid, (cap, held))| (uid.clone(), assignment.node.clone(), uuid, cap, held))
        .collect()
}
