//! Pod annotations under `tessera.dev/` that choose GPU policy.
//!
//! | annotation | accepted |
//! |---|---|
//! | `tessera.dev/compute-mode` | `hard` (always capped) or `elastic` (lends idle SMs, capped under contention) |
//! | `tessera.dev/placement` | `fragmentation` (the default: where the cluster's expected workload loses least usable GPU capacity, fullest on ties), `binpack` (fill used GPUs and nodes first) or `spread` (least used first) |
//! | `tessera.dev/numa-bind` | `true` (each container's GPUs on one NUMA node, else the node is refused) or `false` (the default: one NUMA node preferred) |
//! | `tessera.dev/gpu-model-include` | comma-separated model names; a GPU qualifies if its model contains one (case-insensitive), e.g. `A100,H100` |
//! | `tessera.dev/gpu-model-exclude` | same form; a GPU whose model contains one is skipped |
//! | `tessera.dev/gpu-uuid-include` | comma-separated `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` UUIDs; only these qualify |
//! | `tessera.dev/gpu-uuid-exclude` | same form; these never qualify |
//!
//! Any other `tessera.dev/` key is refused, so a typo cannot silently drop
//! a policy. Annotations outside the prefix are not looked at.

use std::collections::BTreeMap;

use tessera_api::GpuUuid;
use thiserror::Error;

pub use tessera_api::annotations::{
    ALLOCATED, ASSIGNMENT, COMPUTE_MODE, COMPUTE_MODE_VALUES, KNOWN, MODEL_EXCLUDE, MODEL_INCLUDE,
    NUMA_BIND, PLACEMENT, PREFIX, UUID_EXCLUDE, UUID_INCLUDE,
};
/// How a container's compute limit behaves (the type the `GpuNode` status
/// reports too).
pub use tessera_api::gpunode::ComputeMode;

const UUID_FORM: &str = "comma-separated GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex)";
const MODEL_FORM: &str = "comma-separated model names, e.g. A100,H100";

/// A refused annotation, naming the key and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AnnotationError {
    /// A `tessera.dev/` key this version does not know.
    #[error("annotation {key} is not known; accepted: {}", KNOWN.join(", "))]
    Unknown {
        /// The key as written.
        key: String,
    },
    /// A key only Tessera writes (the assignment at bind, the allocation
    /// record at Allocate), set on the pod by its author.
    #[error(
        "annotation {key} is written by Tessera (the scheduler at bind, the node agent at Allocate), never by the pod: it names the pod's GPUs and limits; accepted: remove it"
    )]
    Reserved {
        /// The key.
        key: &'static str,
    },
    /// A value outside the key's choices.
    #[error("annotation {key} is {value:?}; accepted: {accepted}")]
    Value {
        /// The key.
        key: &'static str,
        /// The value as written.
        value: String,
        /// The accepted values, in words.
        accepted: &'static str,
    },
    /// A list with no item.
    #[error("annotation {key} lists nothing; accepted: {accepted}")]
    EmptyList {
        /// The key.
        key: &'static str,
        /// The accepted form, in words.
        accepted: &'static str,
    },
    /// A list item that is not a GPU UUID.
    #[error("annotation {key} lists {item:?}, not a GPU UUID; accepted: {UUID_FORM}")]
    Uuid {
        /// The key.
        key: &'static str,
        /// The offending item.
        item: String,
    },
    /// The same item both included and excluded.
    #[error(
        "annotations {include} and {exclude} both list {item:?}; accepted: an item in at most one of them"
    )]
    Conflict {
        /// The include key.
        include: &'static str,
        /// The exclude key.
        exclude: &'static str,
        /// The item in both.
        item: String,
    },
}

/// Which GPUs and nodes to prefer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Fragmentation-aware (Tessera's default): the node and GPUs where the
    /// workload the cluster runs loses least usable GPU capacity, ties to
    /// the fullest ([`crate::placement::Policy::Tessera`]).
    #[default]
    Fragmentation,
    /// Most used first: keeps whole GPUs and nodes free.
    Binpack,
    /// Least used first: fewer neighbours per workload.
    Spread,
}

/// Include/exclude lists; empty include means "any".
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Selector {
    /// Items of which one must match; empty = all match.
    pub include: Vec<String>,
    /// Items of which none may match.
    pub exclude: Vec<String>,
}

/// A pod's GPU policy from its annotations; absent keys stay at defaults.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuPolicy {
    /// Compute mode; `None` leaves it to the node's policy file.
    pub compute_mode: Option<ComputeMode>,
    /// Placement; absent means fragmentation-aware.
    pub placement: Placement,
    /// Each container's GPUs must share one NUMA node.
    pub numa_bind: bool,
    /// Model names (matched as case-insensitive substrings).
    pub models: Selector,
    /// GPU UUIDs (matched case-insensitively).
    pub uuids: Selector,
}

impl GpuPolicy {
    /// Whether a GPU with this UUID and model may take the pod's shares.
    pub fn admits(&self, uuid: &str, model: &str) -> bool {
        crate::placement::fit::admits(
            &crate::placement::fit::Models::Matching(self.models.clone()),
            &self.uuids,
            uuid,
            model,
        )
    }
}

/// Reads the policy from a pod's annotations.
///
/// # Errors
/// Every refused annotation.
pub fn parse(annotations: &BTreeMap<String, String>) -> Result<GpuPolicy, Vec<AnnotationError>> {
    let mut errors = Vec::new();
    for key in annotations.keys() {
        if let Some(reserved) = [ASSIGNMENT, ALLOCATED].into_iter().find(|r| r == key) {
            errors.push(AnnotationError::Reserved { key: reserved });
        } else if key.starts_with(PREFIX) && !KNOWN.contains(&key.as_str()) {
            errors.push(AnnotationError::Unknown { key: key.clone() });
        }
    }
    let get = |key: &str| annotations.get(key).map(|v| v.trim());
    let mut policy = GpuPolicy::default();
    match get(COMPUTE_MODE).map(|v| (v, v.parse::<ComputeMode>())) {
        None => {}
        Some((_, Ok(mode))) => policy.compute_mode = Some(mode),
        Some((other, Err(_))) => {
            errors.push(value_error(COMPUTE_MODE, other, COMPUTE_MODE_VALUES));
        }
    }
    match get(PLACEMENT) {
        None | Some("fragmentation") => {}
        Some("binpack") => policy.placement = Placement::Binpack,
        Some("spread") => policy.placement = Placement::Spread,
        Some(other) => errors.push(value_error(
            PLACEMENT,
            other,
            "fragmentation, binpack or spread",
        )),
    }
    match get(NUMA_BIND) {
        None | Some("false") => {}
        Some("true") => policy.numa_bind = true,
        Some(other) => errors.push(value_error(NUMA_BIND, other, "true or false")),
    }
    let mut list = |key, form, check: fn(&'static str, &str) -> Option<AnnotationError>| {
        let items = get(key).map(|text| split_list(key, text, form, check));
        match items {
            None => Vec::new(),
            Some(Ok(items)) => items,
            Some(Err(mut found)) => {
                errors.append(&mut found);
                Vec::new()
            }
        }
    };
    policy.models.include = list(MODEL_INCLUDE, MODEL_FORM, |_, _| None);
    policy.models.exclude = list(MODEL_EXCLUDE, MODEL_FORM, |_, _| None);
    policy.uuids.include = list(UUID_INCLUDE, UUID_FORM, check_uuid);
    policy.uuids.exclude = list(UUID_EXCLUDE, UUID_FORM, check_uuid);
    conflicts(&policy.models, MODEL_INCLUDE, MODEL_EXCLUDE, &mut errors);
    conflicts(&policy.uuids, UUID_INCLUDE, UUID_EXCLUDE, &mut errors);
    if errors.is_empty() {
        Ok(policy)
    } else {
        Err(errors)
    }
}

fn value_error(key: &'static str, value: &str, accepted: &'static str) -> AnnotationError {
    AnnotationError::Value {
        key,
        value: value.to_owned(),
        accepted,
    }
}

fn split_list(
    key: &'static str,
    text: &str,
    form: &'static str,
    check: fn(&'static str, &str) -> Option<AnnotationError>,
) -> Result<Vec<String>, Vec<AnnotationError>> {
    let items: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect();
    if items.is_empty() {
        return Err(vec![AnnotationError::EmptyList {
            key,
            accepted: form,
        }]);
    }
    let errors: Vec<_> = items.iter().filter_map(|item| check(key, item)).collect();
    if errors.is_empty() {
        Ok(items)
    } else {
        Err(errors)
    }
}

/// A GPU UUID as [`GpuUuid`] reads it (`GPU-` and the hex in any case).
fn check_uuid(key: &'static str, item: &str) -> Option<AnnotationError> {
    let well_formed = item.parse::<GpuUuid>().is_ok();
    (!well_formed).then(|| AnnotationError::Uuid {
        key,
        item: item.to_owned(),
    })
}

fn conflicts(
    selector: &Selector,
    include: &'static str,
    exclude: &'static str,
    errors: &mut Vec<AnnotationError>,
) {
    for item in &selector.include {
        if selector
            .exclude
            .iter()
            .any(|e| e.eq_ignore_ascii_case(item))
        {
            errors.push(AnnotationError::Conflict {
                include,
                exclude,
                item: item.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests;
