//! The writer task of the node's `GpuNode`.
//!
//! Every interval it builds the status from the latest view
//! ([`super::build`]) and writes it when its content (the timestamp aside)
//! differs from what it last wrote, or when the heartbeat is due. So there
//! is at most one write per interval, a change reaches the API server
//! within one interval, and a live agent writes at least once per
//! heartbeat: the scheduler treats `updatedAt` older than its staleness
//! limit as a dead node.
//!
//! How it writes: the first write reads the object, creates it (empty
//! spec) if it is missing, then writes `/status` by server-side apply
//! (field manager [`FIELD_MANAGER`], forced). Apply, not a JSON merge
//! patch, because the agent sends its whole status every time and fields
//! it no longer sends must go: with a merge patch an omitted key (e.g.
//! `allocations`, left out when the last share is gone) would keep its old
//! value, with apply the server drops the fields this manager owned and
//! no longer sets. A `404` on the status write (someone deleted the
//! object) makes the next attempt create it again.
//!
//! A failed write is retried after a backoff (1 s, doubling, at most the
//! heartbeat) with the then latest view; each attempt has [`WRITE_TIMEOUT`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tessera_api::gpunode::{Device, GpuNode, GpuNodeSpec, GpuNodeStatus};
use tokio::time::Instant;

use super::Settings;
use super::build::{self, Quantum};
use crate::gpu::{GpuError, Inventory};
use crate::view::status::Status;

/// The field manager of the agent's status writes.
pub const FIELD_MANAGER: &str = "tessera-agent";
/// Longest one write (read, create, status) may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The first retry delay after a failed write.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// Why the node's `GpuNode` could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The node name is no valid object name.
    #[error("node name {name:?} is not a valid GpuNode name: {problem}")]
    NodeName {
        /// The name.
        name: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// The inventory has a GPU whose UUID does not parse.
    #[error("cannot list the GPUs of node {node} for its GpuNode")]
    Inventory {
        /// The node.
        node: String,
        /// Cause.
        #[source]
        source: GpuError,
    },
    /// Reading the object failed.
    #[error("cannot read GpuNode {node}")]
    Get {
        /// The node.
        node: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Creating the object failed.
    #[error("cannot create GpuNode {node}")]
    Create {
        /// The node.
        node: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Writing its status failed.
    #[error("cannot write the status of GpuNode {node}")]
    Status {
        /// The node.
        node: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The API server did not answer in time.
    #[error("writing GpuNode {node} took longer than {timeout:?}")]
    Timeout {
        /// The node.
        node: String,
        /// The limit.
        timeout: Duration,
    },
}

/// Checks `name` as Kubernetes checks node (and so `GpuNode`) names: a DNS
/// subdomain (RFC 1123), at most 253 characters.
pub fn check_node_name(name: &str) -> Result<(), PublishError> {
    let bad = |problem| {
        Err(PublishError::NodeName {
            name: name.to_owned(),
            problem,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 253 {
        return bad("longer than 253 characters");
    }
    for label in name.split('.') {
        let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        if label.is_empty()
            || !label.chars().all(ok_char)
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return bad(
                "accepted: lower-case letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit",
            );
        }
    }
    Ok(())
}

/// The writer of one node's `GpuNode`.
pub struct Publisher {
    settings: Settings,
    name: String,
    api: Api<GpuNode>,
    devices: Vec<Device>,
    quantum: Quantum,
}

impl Publisher {
    /// A writer of node `name`'s `GpuNode` through `client`.
    pub fn new(
        settings: Settings,
        name: String,
        client: kube::Client,
        inventory: &Inventory,
    ) -> Result<Self, PublishError> {
        check_node_name(&name)?;
        let devices = inventory
            .api_devices()
            .map_err(|source| PublishError::Inventory {
                node: name.clone(),
                source,
            })?;
        Ok(Self {
            settings,
            name,
            api: Api::all(client),
            devices,
            quantum: Quantum::default(),
        })
    }

    /// Writes until `shutdown` completes (a write in flight is dropped).
    pub async fn run(self, status: Arc<Status>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut exists = false;
        let mut written: Option<GpuNodeStatus> = None;
        let mut written_at: Option<Instant> = None;
        let mut failures: u32 = 0;
        let mut next = Instant::now();
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep_until(next) => {}
            }
            let started = next;
            next = started + self.settings.interval();
            let Some(view) = status.latest_view() else {
                continue;
            };
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            let fresh = build::status(&view, &self.devices, written.as_ref(), self.quantum, now);
            drop(view);
            let changed = written
                .as_ref()
                .is_none_or(|w| !build::same_content(w, &fresh));
            let heartbeat_due =
                written_at.is_none_or(|t| started.duration_since(t) >= self.settings.heartbeat());
            if !changed && !heartbeat_due {
                continue;
            }
            let attempt = tokio::select! {
                () = &mut shutdown => return,
                r = tokio::time::timeout(WRITE_TIMEOUT, self.write(&fresh, &mut exists)) => r,
            };
            match attempt.unwrap_or_else(|_| {
                Err(PublishError::Timeout {
                    node: self.name.clone(),
                    timeout: WRITE_TIMEOUT,
                })
            }) {
                Ok(()) => {
                    tracing::debug!(node = %self.name, changed, "GpuNode status written");
                    written = Some(fresh);
                    written_at = Some(started);
                    failures = 0;
                }
                Err(e) => {
                    let delay = backoff(failures, self.settings.heartbeat());
                    failures = failures.saturating_add(1);
                    tracing::warn!(
                        error = %crate::error_chain::with_causes(&e),
                        retry_in_ms = delay.as_millis() as u64,
                        "cannot publish the node's GpuNode"
                    );
                    next = Instant::now() + delay;
                }
            }
        }
    }

    /// One write: the object created if it is not known to exist, then its
    /// status applied.
    async fn write(&self, status: &GpuNodeStatus, exists: &mut bool) -> Result<(), PublishError> {
        if !*exists {
            let found = self
                .api
                .get_opt(&self.name)
                .await
                .map_err(|source| PublishError::Get {
                    node: self.name.clone(),
                    source,
                })?;
            if found.is_none() {
                let object = GpuNode::new(&self.name, GpuNodeSpec {});
                match self.api.create(&PostParams::default(), &object).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.is_already_exists() => {}
                    Err(source) => {
                        return Err(PublishError::Create {
                            node: self.name.clone(),
                            source,
                        });
                    }
                }
            }
            *exists = true;
        }
        let body = GpuNode {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: GpuNodeSpec {},
            status: Some(status.clone()),
        };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match self
            .api
            .patch_status(&self.name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(source) => {
                if matches!(&source, kube::Error::Api(s) if s.is_not_found()) {
                    *exists = false;
                }
                Err(PublishError::Status {
                    node: self.name.clone(),
                    source,
                })
            }
        }
    }
}

/// The delay before retry `failures + 1`: [`FIRST_BACKOFF`] doubled per
/// earlier failure, at most `cap`.
fn backoff(failures: u32, cap: Duration) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX))
        .min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap() {
        let cap = Duration::from_secs(60);
        let got: Vec<u64> = (0..9).map(|f| backoff(f, cap).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(u32::MAX, cap), cap);
    }

    #[test]
    fn node_names_are_checked() {
        for ok in ["gpu-node-1", "a", "node.example.com", "10.0.0.1"] {
            assert!(check_node_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Node1",
            "-a",
            "a-",
            "a..b",
            "a_b",
            "a/b",
            &"a".repeat(254),
        ] {
            let e = check_node_name(bad).unwrap_err().to_string();
            assert!(e.contains("not a valid GpuNode name"), "{bad}: {e}");
        }
    }
}
