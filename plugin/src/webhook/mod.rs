//! The mutating admission webhook, as a pure function of the pod JSON.
//!
//! For a pod that asks for GPU shares it:
//! - refuses what can never be honoured: invalid resource values or
//!   `tessera.dev/` annotations, a privileged container with a GPU share
//!   (it sees every device and can lift its own limits), a preset
//!   `spec.nodeName` (no scheduler would check the GPUs), another
//!   scheduler's name (device-plugin mode only);
//! - otherwise patches `spec.schedulerName` to Tessera's scheduler and
//!   writes the defaults into each GPU container's limits (and requests,
//!   when they name GPU resources), so the stored pod says what it gets:
//!   `nvidia.com/gpu: 1` when only memory or cores are given,
//!   `gpumem-percentage: 100` when no memory is given, and `gpucores` (100
//!   for a whole-card request, 0 when only memory is given). A GPU
//!   resource given only as a request is copied to the limits, as
//!   Kubernetes requires limits for extended resources.
//!
//! Pods without GPU resources pass untouched.
//!
//! In DRA mode ([`WebhookConfig::dra`], [`dra`]) the same checks run, but
//! a GPU share becomes a ResourceClaimTemplate and a claim instead of
//! limits, no scheduler is named, and [`Admitted::templates`] lists the
//! templates that must exist before the pod is admitted (the server makes
//! them: `crate::claim_templates`).

pub mod dra;
mod review;

pub use review::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, GroupVersionKind, Reviewed, Status,
    review,
};

use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;

use crate::annotations;
use crate::pod::Pod;
use crate::request::PodRequest;
use crate::resources::{self, GpuShare};

/// The scheduler name the chart deploys.
pub const DEFAULT_SCHEDULER_NAME: &str = "tessera-scheduler";

/// Why a pod is refused.
#[derive(Debug, Error)]
pub enum WebhookError {
    /// The object is not a pod this crate can read.
    #[error("object is not a readable pod")]
    Decode(#[source] serde_json::Error),
    /// Invalid resource values or annotations; one message per problem.
    #[error("{}", .0.join("; "))]
    Invalid(Vec<String>),
    /// A privileged container with a GPU share.
    #[error(
        "container {container:?} is privileged and asks for GPU shares; a privileged container sees every GPU and can lift its own limits; accepted: securityContext.privileged unset or false on GPU containers"
    )]
    Privileged {
        /// Container name.
        container: String,
    },
    /// `spec.nodeName` preset on a GPU pod.
    #[error(
        "pod sets spec.nodeName to {node:?} and asks for GPU shares, which bypasses GPU scheduling; accepted: no spec.nodeName (use a nodeSelector or node affinity)"
    )]
    NodeName {
        /// The preset node.
        node: String,
    },
    /// Another scheduler named on a GPU pod.
    #[error(
        "pod names scheduler {name:?} and asks for GPU shares; accepted: schedulerName unset, default-scheduler or {ours}"
    )]
    OtherScheduler {
        /// The scheduler the pod names.
        name: String,
        /// Tessera's scheduler name.
        ours: String,
    },
    /// What DRA mode cannot turn into a claim; one message per problem.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Dra(Vec<dra::DraError>),
    /// An AdmissionReview without a request.
    #[error("admission review has no request")]
    NoRequest,
}

impl WebhookError {
    /// HTTP-style status code for the AdmissionResponse: 422 for values
    /// that fail validation, 403 for requests refused by policy.
    pub fn code(&self) -> u16 {
        match self {
            WebhookError::Decode(_) | WebhookError::NoRequest => 400,
            WebhookError::Invalid(_) | WebhookError::Dra(_) => 422,
            _ => 403,
        }
    }

    /// The message with its causes, for a person to read.
    pub fn full_message(&self) -> String {
        crate::error_chain::with_causes(self)
    }
}

/// Settings of the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// The scheduler GPU pods are handed to (device-plugin mode).
    pub scheduler_name: String,
    /// DRA mode: GPU shares become ResourceClaimTemplates ([`dra`]).
    pub dra: bool,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            scheduler_name: DEFAULT_SCHEDULER_NAME.to_owned(),
            dra: false,
        }
    }
}

/// One RFC 6902 JSON patch operation (`add` only: it also replaces).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatchOp {
    /// Always `add`.
    pub op: &'static str,
    /// JSON pointer.
    pub path: String,
    /// The value set there.
    pub value: Value,
}

impl PatchOp {
    fn add(path: String, value: Value) -> Self {
        Self {
            op: "add",
            path,
            value,
        }
    }
}

/// An allowed pod: the patch to apply, warnings for the user, and the
/// templates the patched pod names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Admitted {
    /// Operations to apply; empty when the pod is left as it is.
    pub patch: Vec<PatchOp>,
    /// Shown by kubectl; nothing is refused for them.
    pub warnings: Vec<String>,
    /// DRA mode: the ResourceClaimTemplates the patch names, one per
    /// distinct request, in the pod's namespace; they must exist before
    /// the pod is admitted. Empty in device-plugin mode.
    pub templates: Vec<ResourceClaimTemplate>,
}

/// Decides admission for a pod given as JSON.
///
/// # Errors
/// A [`WebhookError`] saying why the pod is refused.
pub fn admit_pod(object: &Value, config: &WebhookConfig) -> Result<Admitted, WebhookError> {
    let pod = Pod::from_json(object).map_err(WebhookError::Decode)?;
    let has_policy = pod
        .metadata
        .annotations
        .keys()
        .any(|k| k.starts_with(annotations::PREFIX));
    let shares = PodRequest::from_pod(&pod)
        .map_err(WebhookError::Invalid)?
        .shares;
    if shares.is_empty() {
        let mut admitted = Admitted::default();
        if has_policy {
            admitted.warnings.push(
                "tessera.dev/ annotations have no effect on a pod without GPU resources".to_owned(),
            );
        }
        return Ok(admitted);
    }
    check_policy(&pod, &shares, config)?;
    if config.dra {
        return dra::admit(object, &pod, &shares, config).map_err(WebhookError::Dra);
    }
    let mut patch = Vec::new();
    if pod.spec.scheduler_name != config.scheduler_name {
        patch.push(PatchOp::add(
            "/spec/schedulerName".to_owned(),
            Value::from(config.scheduler_name.clone()),
        ));
    }
    for (index, container) in pod.spec.containers.iter().enumerate() {
        if let Some(share) = shares.iter().find(|s| s.container == container.name) {
            let raw = object.pointer(&format!("/spec/containers/{index}"));
            patch.extend(container_defaults(index, raw, share));
        }
    }
    Ok(Admitted {
        patch,
        warnings: Vec::new(),
        templates: Vec::new(),
    })
}

fn check_policy(
    pod: &Pod,
    shares: &[GpuShare],
    config: &WebhookConfig,
) -> Result<(), WebhookError> {
    for share in shares {
        let privileged = pod
            .spec
            .containers
            .iter()
            .any(|c| c.name == share.container && c.is_privileged());
        if privileged {
            return Err(WebhookError::Privileged {
                container: share.container.clone(),
            });
        }
    }
    if !pod.spec.node_name.is_empty() {
        return Err(WebhookError::NodeName {
            node: pod.spec.node_name.clone(),
        });
    }
    // DRA mode: any scheduler allocates claims ([`dra`]).
    let name = pod.spec.scheduler_name.as_str();
    let allowed = name.is_empty() || name == "default-scheduler" || name == config.scheduler_name;
    if !(config.dra || allowed) {
        return Err(WebhookError::OtherScheduler {
            name: name.to_owned(),
            ours: config.scheduler_name.clone(),
        });
    }
    Ok(())
}

/// The GPU resource values one GPU container should carry, in both its
/// limits and its requests: what it gives (the limit, else the request),
/// `nvidia.com/gpu: 1` when it gives only memory or cores, and the memory
/// and cores defaults.
fn wanted_resources(raw: Option<&Value>, share: &GpuShare) -> Vec<(&'static str, Value)> {
    let given = |map: &str, name: &str| raw?.pointer(&format!("/resources/{map}"))?.get(name);
    let mut wanted: Vec<(&'static str, Value)> = resources::ALL
        .iter()
        .filter_map(|&name| {
            let value = given("limits", name).or_else(|| given("requests", name))?;
            let text = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            Some((name, Value::from(text)))
        })
        .collect();
    if !wanted.iter().any(|(name, _)| *name == resources::GPU) {
        wanted.push((resources::GPU, Value::from(share.count.to_string())));
    }
    if share.memory.is_none() {
        let percent = resources::DEFAULT_MEM_PERCENT.to_string();
        wanted.push((resources::GPU_MEM_PERCENTAGE, Value::from(percent)));
    }
    if share.cores.is_none() {
        let cores = share.effective_cores().to_string();
        wanted.push((resources::GPU_CORES, Value::from(cores)));
    }
    wanted
}

/// Patch operations that give container `index` its GPU resources.
///
/// Kubernetes requires a limit for every extended resource and a request,
/// when present, equal to it; requests left out are defaulted from the
/// limits. So every wanted value goes into the limits, and into the
/// requests too when they already name a GPU resource (as they do in what
/// the API server sends: it has defaulted them from the limits before
/// admission), keeping the two equal. Values are written as quantity
/// strings, as the API server stores them.
fn container_defaults(index: usize, raw: Option<&Value>, share: &GpuShare) -> Vec<PatchOp> {
    let wanted = wanted_resources(raw, share);
    let base = format!("/spec/containers/{index}/resources");
    let as_object = |pairs: &[(&str, Value)]| -> Value {
        Value::Object(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect::<Map<String, Value>>(),
        )
    };
    let resources = raw
        .and_then(|c| c.get("resources"))
        .filter(|r| r.is_object());
    let Some(resources) = resources else {
        let mut whole = Map::new();
        whole.insert("limits".to_owned(), as_object(&wanted));
        return vec![PatchOp::add(base, Value::Object(whole))];
    };
    let mut patch = Vec::new();
    for map in ["limits", "requests"] {
        let present = resources.get(map).and_then(Value::as_object);
        let names_gpu = present.is_some_and(|m| resources::ALL.iter().any(|n| m.contains_key(*n)));
        if map == "requests" && !names_gpu {
            continue;
        }
        let missing: Vec<(&str, Value)> = wanted
            .iter()
            .filter(|(name, _)| present.is_none_or(|m| !m.contains_key(*name)))
            .cloned()
            .collect();
        if missing.is_empty() {
            continue;
        }
        if present.is_none() {
            patch.push(PatchOp::add(format!("{base}/{map}"), as_object(&missing)));
            continue;
        }
        patch.extend(missing.into_iter().map(|(name, value)| {
            PatchOp::add(format!("{base}/{map}/{}", escape_pointer(name)), value)
        }));
    }
    patch
}

/// RFC 6901 escaping of one pointer segment.
fn escape_pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests;
