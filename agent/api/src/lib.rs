//! Tessera's Kubernetes-facing contract, shared by the node agent (which
//! writes it) and the scheduler (which reads it). Types and encodings only:
//! nothing here does I/O, in the manner of `kube-core`.
//!
//! - [`gpunode`]: the cluster-scoped `GpuNode` resource (group
//!   `tessera.dev`, version `v1alpha1`), one per GPU node, whose status the
//!   agent writes; [`crd`] renders its CustomResourceDefinition, the one
//!   committed at `deploy/crds/gpunodes.tessera.dev.yaml` (a test fails when
//!   the two drift apart);
//! - [`resources`]: HAMi's vocabulary, so HAMi manifests run unchanged:
//!   the extended resources pods ask for, what each value means, the
//!   defaults, and the one reading of a container's values that the
//!   webhook, the extender, bind and the agent's `Allocate` share;
//! - [`quantity`]: the Kubernetes quantity grammar for whole numbers, in
//!   every spelling the API server accepts or stores (`4000` reads back as
//!   `4k`);
//! - [`annotations`]: the `tessera.dev/` pod annotation keys and the
//!   compute-mode values;
//! - [`assignment`]: the scheduler's per-container GPU assignment
//!   (`tessera.dev/assignment`) and the agent's allocation progress
//!   (`tessera.dev/allocated`);
//! - [`dra`]: the DRA driver's vocabulary (driver and device names,
//!   attributes, consumable capacities) and the reading of a claim's
//!   consumed capacity;
//! - [`uuid`]: GPU UUIDs as NVML prints them.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod annotations;
pub mod assignment;
pub mod crd;
pub mod dra;
pub mod gpunode;
pub mod quantity;
pub mod resources;
pub mod uuid;

pub use gpunode::{GpuNode, GpuNodeSpec, GpuNodeStatus};
pub use uuid::{GpuUuid, UuidError};
