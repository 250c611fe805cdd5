//! HAMi's resource vocabulary: the extended resources a pod asks for, what
//! each value means, the defaults, and the one reading of a container's
//! values that the webhook, the extender, bind and the agent's `Allocate`
//! share. The names are HAMi's, so HAMi manifests run unchanged.
//!
//! | resource | meaning | accepted |
//! |---|---|---|
//! | `nvidia.com/gpu` | vGPUs; more than one means distinct physical GPUs | 0..=16 (0 = no GPU) |
//! | `nvidia.com/gpumem` | memory per GPU, MiB | 1..=1048576 |
//! | `nvidia.com/gpumem-percentage` | memory per GPU, percent of the GPU | 1..=100 |
//! | `nvidia.com/gpucores` | percent of one GPU's SMs; 0 = no reservation, no cap | 0..=100 |
//! | `nvidia.com/priority` | 0 = high, 1 = low | 0..=1 |
//!
//! Values are Kubernetes quantities that must be whole numbers
//! ([`crate::quantity`]): the API server stores them canonicalised, so
//! `4000` is read back as `4k`. Limits are authoritative; a request alone
//! is read too, and a request that differs from its limit is refused, as
//! the API server does for every extended resource. `gpumem` and
//! `gpumem-percentage` exclude each other. Memory or cores without
//! `nvidia.com/gpu` ask for one GPU (as HAMi reads them); `nvidia.com/gpu:
//! 0` alongside them, or `nvidia.com/priority` alone, is refused.
//!
//! Defaults (HAMi's `defaultMem: 0`, `defaultCores: 0`): no memory
//! resource means the whole GPU's memory; no `gpucores` (or 0) reserves no
//! SMs when placing and sets no compute cap.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::quantity::{self, QuantityError};

/// vGPUs per container.
pub const GPU: &str = "nvidia.com/gpu";
/// Memory per GPU, MiB.
pub const GPU_MEM: &str = "nvidia.com/gpumem";
/// Memory per GPU, percent of the device.
pub const GPU_MEM_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
/// Percent of one GPU's SMs.
pub const GPU_CORES: &str = "nvidia.com/gpucores";
/// Compute priority.
pub const PRIORITY: &str = "nvidia.com/priority";

/// Every resource name above.
pub const ALL: [&str; 5] = [GPU, GPU_MEM, GPU_MEM_PERCENTAGE, GPU_CORES, PRIORITY];

/// Memory percentage of a request that names no memory: the whole card.
pub const DEFAULT_MEM_PERCENT: u8 = 100;
/// GPUs a request gets that gives memory or cores but no `nvidia.com/gpu`.
pub const IMPLIED_GPUS: u64 = 1;
/// Most GPUs one container may ask for.
pub const MAX_GPUS: u64 = 16;
/// Most memory per GPU, MiB (1 TiB: above any GPU made).
pub const MAX_GPU_MEM_MIB: u64 = 1 << 20;
/// The SM target of a container that sets no `gpucores` (or 0): 100 %,
/// no cap.
pub const UNCAPPED_SM_PERCENT: u32 = 100;
/// The node agent's priority (0 to 100, higher served first) of HAMi's
/// `nvidia.com/priority: 0` (high).
pub const HAMI_HIGH: u32 = 100;
/// The node agent's priority of HAMi's `nvidia.com/priority: 1` (low).
pub const HAMI_LOW: u32 = 0;

/// The accepted values of one resource: a range and its words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// Least value.
    pub min: u64,
    /// Greatest value.
    pub max: u64,
    /// The accepted values, in words, for messages.
    pub words: &'static str,
}

/// What `resource` accepts: HAMi's ranges for its names, any whole number
/// for another extended resource (a device plugin's own vGPU name).
pub fn accepted(resource: &str) -> Accepted {
    let (min, max, words) = match resource {
        GPU => (0, MAX_GPUS, "whole number of GPUs, 0..=16"),
        GPU_MEM => (
            1,
            MAX_GPU_MEM_MIB,
            "whole MiB per GPU, 1..=1048576 (e.g. 4000; 1Gi means 1Gi MiB)",
        ),
        GPU_MEM_PERCENTAGE => (1, 100, "whole percent of each GPU's memory, 1..=100"),
        GPU_CORES => (0, 100, "whole percent of one GPU's SMs, 0..=100"),
        PRIORITY => (0, 1, "0 (high) or 1 (low)"),
        _ => (0, u64::MAX, "a whole number"),
    };
    Accepted { min, max, words }
}

/// What one rejected value or combination was, naming container and
/// resource.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResourceError {
    /// The value is not an acceptable quantity.
    #[error("container {container:?}: {field} {value:?} {problem}; accepted: {accepted}")]
    Quantity {
        /// Container name.
        container: String,
        /// Resource name.
        field: String,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        problem: QuantityError,
        /// The accepted values, in words.
        accepted: &'static str,
    },
    /// A whole number outside the resource's range.
    #[error("container {container:?}: {field} is {value}, out of range; accepted: {accepted}")]
    OutOfRange {
        /// Container name.
        container: String,
        /// Resource name.
        field: String,
        /// The parsed value.
        value: u64,
        /// The accepted values, in words.
        accepted: &'static str,
    },
    /// Request and limit disagree.
    #[error(
        "container {container:?}: {field} request {request:?} differs from limit {limit:?}; accepted: equal values, or the limit alone"
    )]
    RequestNotLimit {
        /// Container name.
        container: String,
        /// Resource name.
        field: String,
        /// The request as written.
        request: String,
        /// The limit as written.
        limit: String,
    },
    /// Both ways of sizing memory at once.
    #[error(
        "container {container:?}: {GPU_MEM} and {GPU_MEM_PERCENTAGE} are both set; accepted: one of them"
    )]
    MemoryTwice {
        /// Container name.
        container: String,
    },
    /// A share parameter with `nvidia.com/gpu: 0`, or a priority alone.
    #[error(
        "container {container:?}: {field} needs {GPU} (the number of GPUs); accepted: {GPU} of 1..={MAX_GPUS} alongside it, or unset with {GPU_MEM}, {GPU_MEM_PERCENTAGE} or {GPU_CORES} (one GPU)"
    )]
    NeedsGpu {
        /// Container name.
        container: String,
        /// Resource name.
        field: &'static str,
    },
    /// A GPU resource on an init container: its lifetime does not fit a
    /// share that lives as long as the pod.
    #[error(
        "init container {container:?}: {field} is not supported in init containers; accepted: GPU resources on regular containers only"
    )]
    InitContainer {
        /// Container name.
        container: String,
        /// Resource name.
        field: &'static str,
    },
}

/// One container's resource lists as text (resource name → quantity),
/// taken from whichever pod type the caller holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerResources<'a> {
    /// The container's name.
    pub name: &'a str,
    /// `resources.limits`.
    pub limits: BTreeMap<&'a str, &'a str>,
    /// `resources.requests`.
    pub requests: BTreeMap<&'a str, &'a str>,
}

impl<'a> From<&'a k8s_openapi::api::core::v1::Container> for ContainerResources<'a> {
    fn from(c: &'a k8s_openapi::api::core::v1::Container) -> Self {
        let list = |l: Option<
            &'a BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| {
            l.into_iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.0.as_str()))
                .collect()
        };
        let r = c.resources.as_ref();
        Self {
            name: &c.name,
            limits: list(r.and_then(|r| r.limits.as_ref())),
            requests: list(r.and_then(|r| r.requests.as_ref())),
        }
    }
}

impl ContainerResources<'_> {
    /// Whether the container names `resource` at all (limit or request).
    pub fn names(&self, resource: &str) -> bool {
        self.limits.contains_key(resource) || self.requests.contains_key(resource)
    }

    /// The whole number the container asks for of `resource` (the limit,
    /// else the request, which must agree with the limit), within
    /// [`accepted`]`(resource)`; `None` when it names none.
    ///
    /// # Errors
    /// The value is not a whole-number quantity, request and limit differ,
    /// or it is out of range.
    pub fn whole(&self, resource: &str) -> Result<Option<u64>, ResourceError> {
        let Some(text) = self
            .limits
            .get(resource)
            .or_else(|| self.requests.get(resource))
        else {
            return Ok(None);
        };
        let accepted = accepted(resource);
        let parse = |q: &str| {
            quantity::parse_whole(q).map_err(|problem| ResourceError::Quantity {
                container: self.name.to_owned(),
                field: resource.to_owned(),
                value: q.to_owned(),
                problem,
                accepted: accepted.words,
            })
        };
        let value = parse(text)?;
        if let (Some(limit), Some(request)) =
            (self.limits.get(resource), self.requests.get(resource))
            && parse(request)? != value
        {
            return Err(ResourceError::RequestNotLimit {
                container: self.name.to_owned(),
                field: resource.to_owned(),
                request: (*request).to_owned(),
                limit: (*limit).to_owned(),
            });
        }
        if !(accepted.min..=accepted.max).contains(&value) {
            return Err(ResourceError::OutOfRange {
                container: self.name.to_owned(),
                field: resource.to_owned(),
                value,
                accepted: accepted.words,
            });
        }
        Ok(Some(value))
    }
}

/// How much memory each GPU of a share gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Memory {
    /// A fixed amount, MiB.
    Mib(u64),
    /// A percentage of the card's memory.
    Percent(u8),
}

impl Memory {
    /// MiB this takes on a card of `total_mib`. A percentage is the whole
    /// MiB at or below that share of the card, so shares whose percentages
    /// add up to 100 fit on any card, and the scheduler reserves exactly
    /// the limit the agent grants.
    pub fn mib_on(self, total_mib: u64) -> u64 {
        match self {
            Memory::Mib(mib) => mib,
            Memory::Percent(p) => percent_of_mib(total_mib, u64::from(p)),
        }
    }
}

/// `percent` of `total_mib`, rounded down to a whole MiB.
pub fn percent_of_mib(total_mib: u64, percent: u64) -> u64 {
    let whole = u128::from(total_mib) * u128::from(percent) / 100;
    u64::try_from(whole).unwrap_or(u64::MAX)
}

/// HAMi's `nvidia.com/priority` (0 high, 1 low) on the agent's scale (0
/// to 100, higher served first); `None` for any other value.
pub fn agent_priority(hami: u8) -> Option<u32> {
    match hami {
        0 => Some(HAMI_HIGH),
        1 => Some(HAMI_LOW),
        _ => None,
    }
}

/// The SM target of `gpucores`: the percent, or [`UNCAPPED_SM_PERCENT`]
/// for none or 0.
pub fn sm_target(cores: Option<u8>) -> u32 {
    match cores {
        Some(c) if c > 0 => u32::from(c),
        _ => UNCAPPED_SM_PERCENT,
    }
}

/// One container's GPU request, as written (absent fields stay `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuShare {
    /// Container name.
    pub container: String,
    /// Number of distinct physical GPUs, 1..=16.
    pub count: u32,
    /// Memory per GPU, if given.
    pub memory: Option<Memory>,
    /// Percent of one GPU's SMs, if given.
    pub cores: Option<u8>,
    /// Priority (0 high, 1 low), if given.
    pub priority: Option<u8>,
}

impl GpuShare {
    /// Reads one container's GPU request; `None` when it asks for no GPU.
    ///
    /// # Errors
    /// Every problem found in this container, not just the first, so one
    /// round trip fixes all.
    pub fn read(c: &ContainerResources<'_>) -> Result<Option<GpuShare>, Vec<ResourceError>> {
        let mut errors = Vec::new();
        let mut read = |field| match c.whole(field) {
            Ok(value) => value,
            Err(error) => {
                errors.push(error);
                None
            }
        };
        let count = read(GPU);
        let gpu_rejected = count.is_none() && c.names(GPU);
        let mem = read(GPU_MEM);
        let percent = read(GPU_MEM_PERCENTAGE);
        let cores = read(GPU_CORES);
        let priority = read(PRIORITY);

        let name = || c.name.to_owned();
        if mem.is_some() && percent.is_some() {
            errors.push(ResourceError::MemoryTwice { container: name() });
        }
        let sizes_a_share = [GPU_MEM, GPU_MEM_PERCENTAGE, GPU_CORES]
            .iter()
            .any(|field| c.names(field));
        let count = match count {
            None if sizes_a_share && !gpu_rejected => IMPLIED_GPUS,
            other => other.unwrap_or(0),
        };
        // A rejected GPU count already has its error; "needs
        // nvidia.com/gpu" on top would only mislead.
        if count == 0 && !gpu_rejected {
            for field in [GPU_MEM, GPU_MEM_PERCENTAGE, GPU_CORES, PRIORITY] {
                if c.names(field) {
                    errors.push(ResourceError::NeedsGpu {
                        container: name(),
                        field,
                    });
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        if count == 0 {
            return Ok(None);
        }
        // Every value is within its range, so these never saturate.
        let narrow = |v: u64| u8::try_from(v).unwrap_or(u8::MAX);
        Ok(Some(GpuShare {
            container: name(),
            count: u32::try_from(count).unwrap_or(u32::MAX),
            memory: mem
                .map(Memory::Mib)
                .or(percent.map(|p| Memory::Percent(narrow(p)))),
            cores: cores.map(narrow),
            priority: priority.map(narrow),
        }))
    }

    /// Memory per GPU once defaults apply: the whole card when unspecified.
    pub fn effective_memory(&self) -> Memory {
        self.memory.unwrap_or(Memory::Percent(DEFAULT_MEM_PERCENT))
    }

    /// Cores the scheduler reserves once defaults apply: a request naming
    /// neither memory nor cores asks for whole cards (100 %); one naming
    /// memory only reserves no SMs (0 %: it shares the card's compute with
    /// its neighbours).
    pub fn effective_cores(&self) -> u8 {
        match (self.cores, self.memory) {
            (Some(cores), _) => cores,
            (None, None) => 100,
            (None, Some(_)) => 0,
        }
    }

    /// The agent's priority for this share, when the pod sets one.
    pub fn agent_priority(&self) -> Option<u32> {
        self.priority.and_then(agent_priority)
    }
}

#[cfg(test)]
mod tests;
