//! Pod annotation keys under `tessera.dev/`, and the values of the one the
//! node agent reads too ([`COMPUTE_MODE`]). What the others accept is
//! decided by the scheduler (`plugin/src/annotations.rs`); the keys live
//! here so the agent and the scheduler spell them once.

use std::str::FromStr;

use thiserror::Error;

use crate::gpunode::ComputeMode;

/// The annotation prefix Tessera owns.
pub const PREFIX: &str = "tessera.dev/";
/// `hard` | `elastic` compute.
pub const COMPUTE_MODE: &str = "tessera.dev/compute-mode";
/// `fragmentation` (default) | `binpack` | `spread` placement.
pub const PLACEMENT: &str = "tessera.dev/placement";
/// Model names a GPU must match one of.
pub const MODEL_INCLUDE: &str = "tessera.dev/gpu-model-include";
/// Model names a GPU must match none of.
pub const MODEL_EXCLUDE: &str = "tessera.dev/gpu-model-exclude";
/// UUIDs a GPU must be one of.
pub const UUID_INCLUDE: &str = "tessera.dev/gpu-uuid-include";
/// UUIDs a GPU must be none of.
pub const UUID_EXCLUDE: &str = "tessera.dev/gpu-uuid-exclude";
/// `true`: each container's GPUs on one NUMA node.
pub const NUMA_BIND: &str = "tessera.dev/numa-bind";

/// The scheduler's assignment, written at bind (never by the pod; see
/// [`crate::assignment`]).
pub const ASSIGNMENT: &str = "tessera.dev/assignment";
/// The containers the node agent has allocated (written by the agent
/// only; see [`crate::assignment`]).
pub const ALLOCATED: &str = "tessera.dev/allocated";
/// Every pod annotation key a pod may set.
pub const KNOWN: [&str; 7] = [
    COMPUTE_MODE,
    PLACEMENT,
    MODEL_INCLUDE,
    MODEL_EXCLUDE,
    UUID_INCLUDE,
    UUID_EXCLUDE,
    NUMA_BIND,
];

/// The values [`COMPUTE_MODE`] accepts, in words.
pub const COMPUTE_MODE_VALUES: &str = "hard or elastic";

/// A [`COMPUTE_MODE`] value that is neither `hard` nor `elastic`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("compute mode {0:?} is not known; accepted: {COMPUTE_MODE_VALUES}")]
pub struct ComputeModeError(pub String);

impl FromStr for ComputeMode {
    type Err = ComputeModeError;

    /// `hard` or `elastic`, surrounding blanks ignored.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.trim() {
            "hard" => Ok(ComputeMode::Hard),
            "elastic" => Ok(ComputeMode::Elastic),
            other => Err(ComputeModeError(other.to_owned())),
        }
    }
}

impl std::fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ComputeMode::Hard => "hard",
            ComputeMode::Elastic => "elastic",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_modes_read_and_print_the_same_words() {
        for mode in [ComputeMode::Hard, ComputeMode::Elastic] {
            assert_eq!(mode.to_string().parse::<ComputeMode>(), Ok(mode));
        }
        assert_eq!(" elastic ".parse::<ComputeMode>(), Ok(ComputeMode::Elastic));
        assert_eq!(
            "soft".parse::<ComputeMode>().unwrap_err().to_string(),
            "compute mode \"soft\" is not known; accepted: hard or elastic"
        );
        assert!("Hard".parse::<ComputeMode>().is_err());
    }
}
