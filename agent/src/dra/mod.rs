//! Tessera as a DRA driver (`gpu.tessera.dev`), in the vocabulary of
//! [`tessera_api::dra`]:
//!
//! - [`slice`]: the node's ResourceSlice, one shared device per GPU with
//!   consumable `memory` and `cores`;
//! - [`prepare`]: a claim's allocation on this node turned into its region
//!   directory (the limits its containers share) and
//! - [`cdi`]: its CDI spec, the device plugin's answer in the form the
//!   container runtime applies;
//! - [`plugin`]: the kubelet plugin (registration and the `v1.DRAPlugin`
//!   service) answering with [`prepare`], its registration socket
//!   relayed through [`authority`] (kubelet's plugin watcher sends an
//!   `:authority` tonic refuses);
//! - [`bind`]: a prepared claim's pod, labels and cgroup, once its
//!   containers run, for the control loop and the watchdog.
//!
//! The daemon runs them (its `dra` task).

pub mod authority;
pub mod bind;
pub mod cdi;
pub mod plugin;
pub mod prepare;
pub mod slice;
