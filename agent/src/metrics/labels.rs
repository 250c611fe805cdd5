//! The labels that name a container in every per-container series.
//!
//! Kubernetes containers carry their `namespace`, `pod` and `container`
//! from the metadata the device plugin writes. A container outside
//! Kubernetes (made with `tessera-agent container add` without
//! `--namespace/--pod/--container`) gets an empty `namespace` and its
//! container id as `pod` and `container`. The `id` label (the container's
//! directory name under the agent's root) is always set, so two
//! containers never share a series even when their metadata collides.
//! `claim` names the DRA ResourceClaim a container's limits come from
//! (empty for the device plugin's and the CLI's containers).

use crate::containers::Metadata;

/// Label names of a per-container series, in [`container`]'s order.
pub const CONTAINER: [&str; 5] = ["namespace", "pod", "container", "id", "claim"];

/// The values for [`CONTAINER`].
pub fn container(id: &str, meta: &Metadata) -> [String; 5] {
    [
        meta.namespace.clone().unwrap_or_default(),
        meta.pod.clone().unwrap_or_else(|| id.to_owned()),
        meta.container.clone().unwrap_or_else(|| id.to_owned()),
        id.to_owned(),
        meta.claim.clone().unwrap_or_default(),
    ]
}

/// [`CONTAINER`] followed by `more`.
pub fn names(more: &[&'static str]) -> Vec<&'static str> {
    CONTAINER.iter().chain(more).copied().collect()
}
