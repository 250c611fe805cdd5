//! Tessera's scheduling side: the mutating admission webhook and the
//! kube-scheduler extender, as pure functions over Kubernetes JSON.
//!
//! - [`resources`] and [`annotations`] read what a pod asks for, in the
//!   vocabulary of `tessera_api::resources` ([`pod`] is the Pod subset
//!   read),
//!   and [`request`] puts the two together for the webhook and extender;
//! - [`webhook`] decides admission and builds the JSON patch (in DRA
//!   mode also the ResourceClaimTemplates it names, which
//!   [`claim_templates`] makes before the pod is admitted);
//! - [`extender`] filters and scores nodes from a [`extender::ClusterView`]
//!   of GPU telemetry;
//! - [`placement`] is the fit and scoring both the extender and the
//!   placement simulator ([`simulate`]) run;
//! - [`manifest`] finds pods in manifest files for `check-pod`;
//! - [`bind`] binds pods through the API server (assignment annotation,
//!   reservation table, Binding), and [`metrics`] is what `/metrics` serves;
//! - [`server`] routes HTTP requests to the above for `serve`;
//! - [`telemetry`] keeps a reflector cache of the `GpuNode`s and leaves
//!   nodes with stale telemetry out of GPU placements;
//! - [`error_chain`] writes an error and its causes as one line.
//!
//! [`bind`], [`claim_templates`] and [`telemetry`]'s cache (a watch of
//! `GpuNode`s) talk to the API server.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod annotations;
pub mod bind;
pub mod claim_templates;
pub mod error_chain;
pub mod extender;
pub mod manifest;
pub mod metrics;
pub mod placement;
pub mod pod;
pub mod request;
pub mod resources;
pub mod server;
pub mod simulate;
pub mod telemetry;
pub mod webhook;
