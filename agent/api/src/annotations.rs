//! Pod annotation keys under `tessera.dev/`. What each accepts is decided
//! by the scheduler (`plugin/src/annotations.rs`); the keys live here so
//! the agent and the scheduler spell them once.

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
