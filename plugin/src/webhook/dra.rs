//! The webhook's DRA mode (`serve --dra`, the chart's `dra.enabled`):
//! HAMi's pod specs reach the DRA driver `gpu.tessera.dev`
//! ([`tessera_api::dra`]) unchanged on the user's side.
//!
//! **A container that sizes its share** (`nvidia.com/gpumem`,
//! `gpumem-percentage` or `gpucores`, with or without `nvidia.com/gpu: N`)
//! loses its `nvidia.com/*` resources (limits and requests) and gets a
//! claim instead: the pod gains `spec.resourceClaims` entry
//! `{name: gpu-<container>, resourceClaimTemplateName: <template>}`
//! (`gpu-<index>` when the container's name is too long for a DNS label)
//! and the container `resources.claims: [{name: gpu-<container>}]`. The
//! template, made in the pod's namespace before the pod is admitted
//! (`crate::claim_templates`), is named by its content, so every pod
//! asking the same gets the same one: `tessera-gpu-<N>x[-<M>mi][-<C>c]`
//! (`tessera-gpu-1x-4000mi-30c`), labelled
//! `app.kubernetes.io/managed-by: tessera-webhook`, and asks for `N`
//! devices of DeviceClass `gpu.tessera.dev` with `capacity.requests`
//! `memory: <M>Mi` and `cores: "<C>"`, and, for `N` > 1, distinct GPUs
//! (`distinctAttribute: gpu.tessera.dev/uuid`: a shared device could
//! otherwise serve one request twice, where HAMi's `nvidia.com/gpu: 2`
//! means two physical GPUs).
//!
//! What each HAMi value becomes:
//! - `gpumem: M` → `memory: <M>Mi`; `gpumem-percentage: 100` or no memory
//!   resource → no memory request, which DRA reads as the device's
//!   default, the whole memory (HAMi's default too). Any other
//!   percentage is refused: a capacity request is an absolute amount and
//!   GPUs differ in memory, so the percentage has no one DRA spelling;
//!   the message says to use `nvidia.com/gpumem`.
//! - `gpucores: C` (1 to 99) → `cores: "<C>"`; 100 → no cores request
//!   (the default, all of them).
//! - Memory given as a share (`gpumem`) with no `gpucores` (or 0) is
//!   refused. HAMi books no SMs for it and caps nothing; a claim's
//!   `cores` is both what kube-scheduler books and the SM cap the agent
//!   holds (1 to 100), so "none booked, none capped" cannot be asked for.
//!   Booking 1 would cap the pod at 1 % of the GPU (the node policy's
//!   default mode is hard), and booking the default 100 would let no
//!   other claim share the GPU; either silently changes what the pod
//!   gets, so the message asks for `nvidia.com/gpucores`. Where the
//!   memory is the whole GPU's (`gpumem-percentage: 100`, or `gpucores:
//!   0` alone) nothing else fits on that GPU anyway, so no cores are
//!   requested: all of them, uncapped, as HAMi gives.
//! - `nvidia.com/priority` is refused: a claim carries no priority (the
//!   agent takes a claim's priority and compute mode from its node policy,
//!   whose rules match pod labels).
//!
//! **A container asking only `nvidia.com/gpu: N`** (whole GPUs) is left as
//! it is (a GPU request without a limit is copied to the limits, which
//! Kubernetes requires): the DeviceClass's `extendedResourceName` maps it
//! to a claim for whole devices, which kube-scheduler makes itself.
//!
//! **Schedulers**: the pod's `schedulerName` is never set or checked in
//! DRA mode. Claims are allocated by whichever scheduler places the pod,
//! and every kube-scheduler since 1.34 does (a second profile, or the
//! chart's own scheduler named explicitly, works as well as the
//! default); handing the pod to Tessera's extender would gain nothing,
//! since after the patch it names none of the extender's resources.
//!
//! **`tessera.dev/` annotations** mean nothing to a pod whose GPUs the
//! extender does not place (any converted container, or a scheduler
//! other than Tessera's): the extender reads the placement ones, and the
//! agent takes a claim's compute mode from its node policy, not from the
//! pod. Those that constrain which GPUs the pod may get
//! (`gpu-model-include`/`-exclude`, `gpu-uuid-include`/`-exclude`,
//! `numa-bind: "true"`) are refused, since dropping them would place the
//! pod where its author said not to (a ResourceClaim's CEL selectors
//! choose GPUs in DRA); the others (`placement`, `compute-mode`,
//! `numa-bind: "false"`) only earn a warning that they have no effect.
//! A preset `spec.nodeName` and privileged GPU containers stay refused,
//! as in device-plugin mode.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value, json};
use tessera_api::dra::{self, CORES, DEVICE_CLASS, MEMORY};
use thiserror::Error;

use super::{Admitted, PatchOp, WebhookConfig, escape_pointer};
use crate::annotations::{
    COMPUTE_MODE, MODEL_EXCLUDE, MODEL_INCLUDE, NUMA_BIND, PLACEMENT, PREFIX, UUID_EXCLUDE,
    UUID_INCLUDE,
};
use crate::pod::Pod;
use crate::resources::{self, GPU, GPU_MEM, GPU_MEM_PERCENTAGE, GpuShare, Memory};

/// The label every template the webhook makes carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tessera-webhook");
/// The one device request of a template.
pub const REQUEST: &str = "gpu";
/// Prefix of the templates' names.
pub const TEMPLATE_PREFIX: &str = "tessera-gpu";
/// Prefix of the pod's claim entries (`gpu-<container>`).
pub const ENTRY_PREFIX: &str = "gpu";
/// Longest DNS label (claim entry names are labels).
const MAX_LABEL: usize = 63;

/// What DRA mode cannot turn into a claim; each names the container (or
/// the annotation, or the entry) and says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DraError {
    /// A memory percentage other than 100.
    #[error(
        "container {container:?}: {GPU_MEM_PERCENTAGE} is {percent}, which a DRA claim cannot ask for (capacity requests are absolute amounts and GPUs differ in memory); accepted in DRA mode: {GPU_MEM} (MiB per GPU), or {GPU_MEM_PERCENTAGE} 100 (the whole memory)"
    )]
    MemoryPercentage {
        /// Container name.
        container: String,
        /// The percentage asked for.
        percent: u8,
    },
    /// A memory share without cores.
    #[error(
        "container {container:?}: {field} without {cores} (or with 0) has no DRA equivalent: a claim's cores are both what the scheduler books and the SM cap the agent holds (1..=100), so HAMi's \"no SMs booked, no cap\" cannot be asked for; accepted in DRA mode: {cores} of 1..=100 alongside it (100: all of the GPU's SMs)",
        cores = resources::GPU_CORES
    )]
    MemoryWithoutCores {
        /// Container name.
        container: String,
        /// The memory resource given.
        field: &'static str,
    },
    /// A priority, which claims do not carry.
    #[error(
        "container {container:?}: {priority} is not carried by DRA claims (the node agent takes a claim's priority from its node policy, whose rules match pod labels); accepted in DRA mode: no {priority}",
        priority = resources::PRIORITY
    )]
    Priority {
        /// Container name.
        container: String,
    },
    /// A GPU constraint annotation on a pod the extender does not place.
    #[error(
        "annotation {key} constrains which GPUs the pod may get, which only Tessera's scheduler extender reads, and it does not place this pod's GPUs in DRA mode; accepted in DRA mode: no GPU constraint annotations (a ResourceClaim's CEL selectors choose GPUs)"
    )]
    Annotation {
        /// The annotation key.
        key: String,
    },
    /// The claim entry name the webhook would add is taken.
    #[error(
        "pod already has a resourceClaims entry named {name:?}, which the webhook names the claim of container {container:?}; accepted: another name for that entry"
    )]
    EntryTaken {
        /// The entry name.
        name: String,
        /// Container name.
        container: String,
    },
}

/// What one converted container's claim asks for (absent capacities take
/// the device's defaults: all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimShape {
    /// Distinct GPUs, 1 to 16.
    pub count: u32,
    /// Memory per GPU, MiB; `None`: the whole memory.
    pub memory_mib: Option<u64>,
    /// Percent of each GPU's SMs, 1 to 99; `None`: all of them.
    pub cores: Option<u8>,
}

impl ClaimShape {
    /// The claim for `share`; `None` for whole GPUs only (`nvidia.com/gpu`
    /// and nothing else), which the extended-resource mapping serves.
    ///
    /// # Errors
    /// Every value of the share that has no DRA spelling.
    pub fn of(share: &GpuShare) -> Result<Option<Self>, Vec<DraError>> {
        if share.memory.is_none() && share.cores.is_none() && share.priority.is_none() {
            return Ok(None);
        }
        let container = || share.container.clone();
        let mut errors = Vec::new();
        if share.priority.is_some() {
            errors.push(DraError::Priority {
                container: container(),
            });
        }
        // The memory resource that asks for part of a GPU, if any.
        let (memory_mib, partial) = match share.memory {
            Some(Memory::Mib(mib)) => (Some(mib), Some(GPU_MEM)),
            Some(Memory::Percent(100)) | None => (None, None),
            Some(Memory::Percent(percent)) => {
                errors.push(DraError::MemoryPercentage {
                    container: container(),
                    percent,
                });
                (None, Some(GPU_MEM_PERCENTAGE))
            }
        };
        let cores = match share.cores.filter(|c| *c > 0) {
            Some(c) if c >= 100 => None,
            Some(c) => Some(c),
            None => {
                if let Some(field) = partial {
                    errors.push(DraError::MemoryWithoutCores {
                        container: container(),
                        field,
                    });
                }
                None
            }
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Some(Self {
            count: share.count,
            memory_mib,
            cores,
        }))
    }

    /// The template's name, from its content: `tessera-gpu-<N>x`, then
    /// `-<M>mi` and `-<C>c` when memory and cores are asked for. At most 30
    /// characters, a DNS label.
    pub fn template_name(&self) -> String {
        let mut name = format!("{TEMPLATE_PREFIX}-{}x", self.count);
        if let Some(mib) = self.memory_mib {
            name.push_str(&format!("-{mib}mi"));
        }
        if let Some(cores) = self.cores {
            name.push_str(&format!("-{cores}c"));
        }
        name
    }

    /// The template, in `namespace` (none: the one it is applied in).
    pub fn template(&self, namespace: Option<&str>) -> res::ResourceClaimTemplate {
        let mut requests = BTreeMap::new();
        if let Some(mib) = self.memory_mib {
            requests.insert(MEMORY.to_owned(), Quantity(format!("{mib}Mi")));
        }
        if let Some(cores) = self.cores {
            requests.insert(CORES.to_owned(), Quantity(cores.to_string()));
        }
        let exactly = res::ExactDeviceRequest {
            device_class_name: DEVICE_CLASS.to_owned(),
            allocation_mode: Some("ExactCount".to_owned()),
            count: Some(i64::from(self.count)),
            capacity: (!requests.is_empty()).then_some(res::CapacityRequirements {
                requests: Some(requests),
            }),
            ..res::ExactDeviceRequest::default()
        };
        let constraints = (self.count > 1).then(|| {
            vec![res::DeviceConstraint {
                requests: Some(vec![REQUEST.to_owned()]),
                distinct_attribute: Some(dra::qualified(dra::attribute::UUID)),
                match_attribute: None,
            }]
        });
        res::ResourceClaimTemplate {
            metadata: ObjectMeta {
                name: Some(self.template_name()),
                namespace: namespace.filter(|n| !n.is_empty()).map(str::to_owned),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY.0.to_owned(),
                    MANAGED_BY.1.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(res::ResourceClaimTemplateSpec {
                metadata: None,
                spec: Some(res::ResourceClaimSpec {
                    devices: Some(res::DeviceClaim {
                        requests: Some(vec![res::DeviceRequest {
                            name: REQUEST.to_owned(),
                            exactly: Some(exactly),
                            first_available: None,
                        }]),
                        constraints,
                        config: None,
                    }),
                }),
            }),
        }
    }
}

/// The claim entry name of container `name` at `index`: `gpu-<name>`, or
/// `gpu-<index>` when that is longer than a DNS label.
pub fn entry_name(name: &str, index: usize) -> String {
    let named = format!("{ENTRY_PREFIX}-{name}");
    if named.len() <= MAX_LABEL {
        named
    } else {
        format!("{ENTRY_PREFIX}-{index}")
    }
}

/// Admission of a pod with GPU shares in DRA mode (the pod's values and
/// the device-plugin policy checks have passed): the patch and the
/// templates it names.
pub(super) fn admit(
    object: &Value,
    pod: &Pod,
    shares: &[GpuShare],
    config: &WebhookConfig,
) -> Result<Admitted, Vec<DraError>> {
    let mut errors = Vec::new();
    let mut plans = Vec::new();
    for share in shares {
        match ClaimShape::of(share) {
            Ok(shape) => plans.push((share, shape)),
            Err(mut found) => errors.append(&mut found),
        }
    }
    let converts = plans.iter().any(|(_, shape)| shape.is_some()) || !errors.is_empty();
    let mut warnings = Vec::new();
    if converts || pod.spec.scheduler_name != config.scheduler_name {
        for (key, value) in &pod.metadata.annotations {
            match annotation_in_dra(key, value) {
                Some(Ok(warning)) => warnings.push(warning),
                Some(Err(error)) => errors.push(error),
                None => {}
            }
        }
    }
    let taken: BTreeSet<&str> = object
        .pointer("/spec/resourceClaims")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("name")?.as_str())
        .collect();
    let mut entries: Vec<(usize, String, ClaimShape)> = Vec::new();
    for (share, shape) in &plans {
        let (Some(shape), Some(index)) = (shape, container_index(pod, &share.container)) else {
            continue;
        };
        let name = entry_name(&share.container, index);
        if taken.contains(name.as_str()) || entries.iter().any(|(_, n, _)| *n == name) {
            errors.push(DraError::EntryTaken {
                name,
                container: share.container.clone(),
            });
            continue;
        }
        entries.push((index, name, *shape));
    }
    if !errors.is_empty() {
        return Err(errors);
    }

    let mut patch = Vec::new();
    if !entries.is_empty() {
        let new: Vec<Value> = entries
            .iter()
            .map(|(_, name, shape)| {
                json!({"name": name, "resourceClaimTemplateName": shape.template_name()})
            })
            .collect();
        if object
            .pointer("/spec/resourceClaims")
            .is_some_and(Value::is_array)
        {
            patch.extend(
                new.into_iter()
                    .map(|e| PatchOp::add("/spec/resourceClaims/-".to_owned(), e)),
            );
        } else {
            patch.push(PatchOp::add(
                "/spec/resourceClaims".to_owned(),
                Value::Array(new),
            ));
        }
    }
    for (share, shape) in &plans {
        let Some(index) = container_index(pod, &share.container) else {
            continue;
        };
        let raw = object.pointer(&format!("/spec/containers/{index}"));
        match entries.iter().find(|(i, _, _)| *i == index) {
            Some((_, name, _)) => patch.extend(claim_instead(index, raw, name)),
            None if shape.is_none() => patch.extend(gpu_limit_from_request(index, raw)),
            None => {}
        }
    }
    let namespace = Some(pod.metadata.namespace.as_str());
    let shapes: BTreeSet<ClaimShape> = entries.iter().map(|(_, _, shape)| *shape).collect();
    Ok(Admitted {
        patch,
        warnings,
        templates: shapes.iter().map(|s| s.template(namespace)).collect(),
    })
}

/// What a `tessera.dev/` annotation (already validated) becomes on a pod
/// the extender does not place: a refusal for a GPU constraint, a
/// warning for a preference; `None` for other keys.
fn annotation_in_dra(key: &str, value: &str) -> Option<Result<String, DraError>> {
    let no_effect = |why: &str| Ok(format!("annotation {key} has no effect in DRA mode: {why}"));
    Some(match key {
        MODEL_INCLUDE | MODEL_EXCLUDE | UUID_INCLUDE | UUID_EXCLUDE => Err(DraError::Annotation {
            key: key.to_owned(),
        }),
        NUMA_BIND if value == "true" => Err(DraError::Annotation {
            key: key.to_owned(),
        }),
        NUMA_BIND | PLACEMENT => no_effect("the pod's scheduler places its claims"),
        COMPUTE_MODE => {
            no_effect("the node agent takes a claim's compute mode from its node policy")
        }
        other if other.starts_with(PREFIX) => {
            no_effect("only Tessera's scheduler extender reads it")
        }
        _ => return None,
    })
}

fn container_index(pod: &Pod, name: &str) -> Option<usize> {
    pod.spec.containers.iter().position(|c| c.name == name)
}

/// Patch operations that take container `index`'s `nvidia.com/*` GPU
/// resources out of its limits and requests (each map rewritten whole, its
/// other resources kept) and name claim entry `entry` in its
/// `resources.claims`.
fn claim_instead(index: usize, raw: Option<&Value>, entry: &str) -> Vec<PatchOp> {
    let base = format!("/spec/containers/{index}/resources");
    let resources = raw.and_then(|c| c.get("resources"));
    let mut patch = Vec::new();
    for map in ["limits", "requests"] {
        let Some(present) = resources
            .and_then(|r| r.get(map))
            .and_then(Value::as_object)
        else {
            continue;
        };
        if !resources::ALL.iter().any(|n| present.contains_key(*n)) {
            continue;
        }
        let kept: Map<String, Value> = present
            .iter()
            .filter(|(name, _)| !resources::ALL.contains(&name.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        patch.push(PatchOp::add(format!("{base}/{map}"), Value::Object(kept)));
    }
    let reference = json!({"name": entry});
    let claims = resources.and_then(|r| r.get("claims"));
    if claims.is_some_and(Value::is_array) {
        patch.push(PatchOp::add(format!("{base}/claims/-"), reference));
    } else if resources.is_some_and(Value::is_object) {
        patch.push(PatchOp::add(format!("{base}/claims"), json!([reference])));
    } else {
        patch.push(PatchOp::add(base, json!({"claims": [reference]})));
    }
    patch
}

/// For a whole-GPU container: its `nvidia.com/gpu` request copied to the
/// limits when they lack it (Kubernetes requires a limit for an extended
/// resource); nothing otherwise.
fn gpu_limit_from_request(index: usize, raw: Option<&Value>) -> Option<PatchOp> {
    let resources = raw?.get("resources")?;
    let limits = resources.get("limits").filter(|l| l.is_object());
    if limits.is_some_and(|l| l.get(GPU).is_some()) {
        return None;
    }
    let value = match resources.get("requests")?.get(GPU)? {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let base = format!("/spec/containers/{index}/resources/limits");
    Some(match limits {
        Some(_) => PatchOp::add(
            format!("{base}/{}", escape_pointer(GPU)),
            Value::from(value),
        ),
        None => PatchOp::add(base, json!({ GPU: value })),
    })
}
