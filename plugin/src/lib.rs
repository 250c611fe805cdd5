//! Tessera's scheduling side: the mutating admission webhook and the
//! kube-scheduler extender, as pure functions over Kubernetes JSON.
//!
//! - [`resources`] and [`annotations`] read what a pod asks for;
//! - [`webhook`] decides admission and builds the JSON patch;
//! - [`extender`] filters and scores nodes from a [`extender::ClusterView`]
//!   of GPU telemetry.
//!
//! Nothing here talks to the API server; the binary wires these to I/O.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod annotations;
pub mod extender;
pub mod manifest;
pub mod pod;
pub mod quantity;
pub mod resources;
pub mod server;
pub mod webhook;
