//! A pod's GPU requests, read from its containers' resources.
//!
//! Resource names are HAMi's, so existing manifests run unchanged:
//!
//! | resource | meaning | accepted |
//! |---|---|---|
//! | `nvidia.com/gpu` | number of GPU shares; more than 1 means distinct physical GPUs | 0..=16 (0 = no GPU) |
//! | `nvidia.com/gpumem` | memory per GPU, MiB | 1..=1048576 |
//! | `nvidia.com/gpumem-percentage` | memory per GPU, percent of the card | 1..=100 |
//! | `nvidia.com/gpucores` | percent of one GPU's SMs | 0..=100 |
//! | `nvidia.com/priority` | 0 = high, 1 = low | 0..=1 |
//!
//! Values are Kubernetes quantities that must be whole numbers (see
//! [`crate::quantity`]). Limits are authoritative; a request alone is read
//! too, and a request that differs from its limit is refused, as the API
//! server does for every extended resource. `gpumem` and
//! `gpumem-percentage` exclude each other. Memory or cores without
//! `nvidia.com/gpu` ask for one GPU (as HAMi reads them; the webhook
//! writes the `1` into the pod); `nvidia.com/gpu: 0` alongside them, or
//! `nvidia.com/priority` alone, is refused. GPU resources in init
//! containers are refused: their lifetime does not fit a share that lives
//! as long as the pod.

use thiserror::Error;

use crate::pod::{Container, Pod, Quantity};
use crate::quantity::{self, QuantityError};

pub use tessera_api::resources::{ALL, GPU, GPU_CORES, GPU_MEM, GPU_MEM_PERCENTAGE, PRIORITY};

/// Memory percentage of a request that names no memory: the whole card.
pub const DEFAULT_MEM_PERCENT: u8 = 100;
/// GPUs a request gets that gives memory or cores but no `nvidia.com/gpu`.
pub const IMPLIED_GPUS: u64 = 1;
/// Most GPUs one container may ask for.
pub const MAX_GPUS: u64 = 16;
/// Most memory per GPU, MiB (1 TiB: above any GPU made).
pub const MAX_GPU_MEM_MIB: u64 = 1 << 20;

/// What one rejected value or combination was, naming container and field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResourceError {
    /// The value is not an acceptable quantity.
    #[error("container {container:?}: {field} {value:?} {problem}; accepted: {accepted}")]
    Quantity {
        /// Container name.
        container: String,
        /// Resource name.
        field: &'static str,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        problem: QuantityError,
        /// The accepted values, in words.
        accepted: &'static str,
    },
    /// A whole number outside the field's range.
    #[error("container {container:?}: {field} is {value}, out of range; accepted: {accepted}")]
    OutOfRange {
        /// Container name.
        container: String,
        /// Resource name.
        field: &'static str,
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
        field: &'static str,
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
    /// A GPU resource on an init container.
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

/// How much memory each GPU of a share gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Memory {
    /// A fixed amount, MiB.
    Mib(u64),
    /// A percentage of the card's memory.
    Percent(u8),
}

impl Memory {
    /// MiB this takes on a card of `total_mib`; a percentage rounds up, so
    /// two 50 % shares of an odd-sized card never both fit by rounding.
    pub fn mib_on(self, total_mib: u64) -> u64 {
        match self {
            Memory::Mib(mib) => mib,
            Memory::Percent(p) => (total_mib * u64::from(p)).div_ceil(100),
        }
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
    /// Memory per GPU once defaults apply: the whole card when unspecified.
    pub fn effective_memory(&self) -> Memory {
        self.memory.unwrap_or(Memory::Percent(DEFAULT_MEM_PERCENT))
    }

    /// Cores once defaults apply: a request naming neither memory nor cores
    /// asks for whole cards (100 %); one naming memory only reserves no SMs
    /// (0 %: it shares the card's compute with its neighbours).
    pub fn effective_cores(&self) -> u8 {
        match (self.cores, self.memory) {
            (Some(cores), _) => cores,
            (None, None) => 100,
            (None, Some(_)) => 0,
        }
    }
}

/// Reads every container's GPU request. Containers without GPU resources
/// are left out, so an empty result means the pod asks for no GPU.
///
/// # Errors
/// Every problem found, not just the first, so one round trip fixes all.
pub fn pod_gpu_shares(pod: &Pod) -> Result<Vec<GpuShare>, Vec<ResourceError>> {
    let mut errors = Vec::new();
    let mut shares = Vec::new();
    for container in &pod.spec.init_containers {
        for field in ALL {
            if lookup(container, field).is_some() {
                errors.push(ResourceError::InitContainer {
                    container: container.name.clone(),
                    field,
                });
            }
        }
    }
    for container in &pod.spec.containers {
        match container_share(container) {
            Ok(Some(share)) => shares.push(share),
            Ok(None) => {}
            Err(mut found) => errors.append(&mut found),
        }
    }
    if errors.is_empty() {
        Ok(shares)
    } else {
        Err(errors)
    }
}

/// Reads one container's GPU request; `None` when it asks for no GPU.
///
/// # Errors
/// Every problem found in this container.
pub fn container_share(container: &Container) -> Result<Option<GpuShare>, Vec<ResourceError>> {
    let mut errors = Vec::new();
    let mut read =
        |field, min, max, accepted| match read_field(container, field, min, max, accepted) {
            Ok(value) => value,
            Err(error) => {
                errors.push(error);
                None
            }
        };
    let count = read(GPU, 0, MAX_GPUS, "whole number of GPUs, 0..=16");
    let gpu_rejected = count.is_none() && lookup(container, GPU).is_some();
    let mem = read(
        GPU_MEM,
        1,
        MAX_GPU_MEM_MIB,
        "whole MiB per GPU, 1..=1048576 (e.g. 4000; 1Gi means 1Gi MiB)",
    );
    let percent = read(
        GPU_MEM_PERCENTAGE,
        1,
        100,
        "whole percent of each GPU's memory, 1..=100",
    );
    let cores = read(GPU_CORES, 0, 100, "whole percent of one GPU's SMs, 0..=100");
    let priority = read(PRIORITY, 0, 1, "0 (high) or 1 (low)");

    let name = || container.name.clone();
    if mem.is_some() && percent.is_some() {
        errors.push(ResourceError::MemoryTwice { container: name() });
    }
    let sizes_a_share = [GPU_MEM, GPU_MEM_PERCENTAGE, GPU_CORES]
        .iter()
        .any(|field| lookup(container, field).is_some());
    let count = match count {
        None if sizes_a_share && !gpu_rejected => IMPLIED_GPUS,
        other => other.unwrap_or(0),
    };
    // A rejected GPU count already has its error; "needs nvidia.com/gpu"
    // on top would only mislead.
    if count == 0 && !gpu_rejected {
        for field in [GPU_MEM, GPU_MEM_PERCENTAGE, GPU_CORES, PRIORITY] {
            if lookup(container, field).is_some() {
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

/// The value of `field`: the limit, else the request.
fn lookup<'a>(container: &'a Container, field: &str) -> Option<&'a Quantity> {
    let res = &container.resources;
    res.limits.get(field).or_else(|| res.requests.get(field))
}

fn read_field(
    container: &Container,
    field: &'static str,
    min: u64,
    max: u64,
    accepted: &'static str,
) -> Result<Option<u64>, ResourceError> {
    let Some(text) = lookup(container, field) else {
        return Ok(None);
    };
    let parse = |q: &Quantity| {
        quantity::parse_whole(&q.0).map_err(|problem| ResourceError::Quantity {
            container: container.name.clone(),
            field,
            value: q.0.clone(),
            problem,
            accepted,
        })
    };
    let value = parse(text)?;
    let res = &container.resources;
    if let (Some(limit), Some(request)) = (res.limits.get(field), res.requests.get(field))
        && parse(request)? != value
    {
        return Err(ResourceError::RequestNotLimit {
            container: container.name.clone(),
            field,
            request: request.0.clone(),
            limit: limit.0.clone(),
        });
    }
    if !(min..=max).contains(&value) {
        return Err(ResourceError::OutOfRange {
            container: container.name.clone(),
            field,
            value,
            accepted,
        });
    }
    Ok(Some(value))
}

#[cfg(test)]
mod tests;
