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
//!   service) answering with [`prepare`].
//!
//! Not yet here: the daemon task that runs the plugin and publishes the
//! slice.

pub mod cdi;
pub mod plugin;
pub mod prepare;
pub mod slice;
