//! What a pod asks of Tessera: its GPU shares and its `tessera.dev/`
//! policy, read the same way by the webhook and the extender.

use crate::annotations::{self, GpuPolicy};
use crate::pod::Pod;
use crate::resources::{self, GpuShare};

/// A pod's GPU request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRequest {
    /// Its GPU containers; empty for a pod without GPU resources.
    pub shares: Vec<GpuShare>,
    /// Its `tessera.dev/` policy.
    pub policy: GpuPolicy,
}

impl PodRequest {
    /// Reads the pod's resources and annotations.
    ///
    /// # Errors
    /// One message per problem: the resource problems first, then the
    /// annotation problems, so one round trip fixes all.
    pub fn from_pod(pod: &Pod) -> Result<Self, Vec<String>> {
        let shares = resources::pod_gpu_shares(pod);
        let policy = annotations::parse(&pod.metadata.annotations);
        match (shares, policy) {
            (Ok(shares), Ok(policy)) => Ok(Self { shares, policy }),
            (shares, policy) => {
                let mut problems = Vec::new();
                if let Err(errors) = shares {
                    problems.extend(errors.iter().map(ToString::to_string));
                }
                if let Err(errors) = policy {
                    problems.extend(errors.iter().map(ToString::to_string));
                }
                Err(problems)
            }
        }
    }
}
