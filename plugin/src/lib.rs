//! Tessera's scheduling side: the mutating admission webhook and the
//! kube-scheduler extender, as pure functions over Kubernetes JSON.
//!
//! - [`resources`] and [`annotations`] read what a pod asks for
//!   ([`quantity`] parses the values, [`pod`] is the Pod subset read),
//!   and [`request`] puts the two together for the webhook and extender;
//! - [`webhook`] decides admission and builds the JSON patch;
//! - [`extender`] filters and scores nodes from a [`extender::ClusterView`]
//!   of GPU telemetry;
//! - [`manifest`] finds pods in manifest files for `check-pod`;
//! - [`server`] routes HTTP requests to the above for `serve`;
//! - [`telemetry`] keeps a reflector cache of the `GpuNode`s and leaves
//!   nodes with stale telemetry out of GPU placements;
//! - [`error_chain`] writes an error and its causes as one line.
//!
//! Only [`telemetry`]'s cache talks to the API server (a watch of
//! `GpuNode`s); the bind verb is planned.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod annotations;
pub mod error_chain;
pub mod extender;
pub mod manifest;
pub mod pod;
pub mod quantity;
pub mod request;
pub mod resources;
pub mod server;
pub mod telemetry;
pub mod webhook;
