//! A pod's GPU requests, read from its containers' resources with HAMi's
//! vocabulary ([`tessera_api::resources`], which says what each resource
//! and value means and how a container's values are read). This module
//! adds what is particular to a whole pod: every container is read and
//! every problem reported at once, and GPU resources in init containers
//! are refused (their lifetime does not fit a share that lives as long as
//! the pod).

use std::collections::BTreeMap;

use tessera_api::resources::ContainerResources;

use crate::pod::{Container, Pod, Quantity};

pub use tessera_api::resources::{
    ALL, DEFAULT_MEM_PERCENT, GPU, GPU_CORES, GPU_MEM, GPU_MEM_PERCENTAGE, GpuShare, IMPLIED_GPUS,
    MAX_GPU_MEM_MIB, MAX_GPUS, Memory, PRIORITY, ResourceError,
};

/// Reads every container's GPU request. Containers without GPU resources
/// are left out, so an empty result means the pod asks for no GPU.
///
/// # Errors
/// Every problem found, not just the first, so one round trip fixes all.
pub fn pod_gpu_shares(pod: &Pod) -> Result<Vec<GpuShare>, Vec<ResourceError>> {
    let mut errors = Vec::new();
    let mut shares = Vec::new();
    for container in &pod.spec.init_containers {
        let resources = resources_of(container);
        for field in ALL {
            if resources.names(field) {
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
    GpuShare::read(&resources_of(container))
}

fn resources_of(container: &Container) -> ContainerResources<'_> {
    fn list(l: &BTreeMap<String, Quantity>) -> BTreeMap<&str, &str> {
        l.iter().map(|(k, v)| (k.as_str(), v.0.as_str())).collect()
    }
    ContainerResources {
        name: &container.name,
        limits: list(&container.resources.limits),
        requests: list(&container.resources.requests),
    }
}

#[cfg(test)]
mod tests;
