//! Tessera as a DRA driver (`gpu.tessera.dev`): the node's ResourceSlice
//! ([`slice`]) and, in later modules, the kubelet plugin that prepares
//! claims. The vocabulary is [`tessera_api::dra`]'s.

pub mod cdi;
pub mod slice;
