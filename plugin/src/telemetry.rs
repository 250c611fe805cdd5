//! GpuNode telemetry in the scheduler: a reflector cache of every
//! `GpuNode` ([`Cache`]) and the staleness rule ([`Staleness`]).
//!
//! The agent writes its node's status at least once per heartbeat (60 s
//! by default), so `status.updatedAt` older than the limit means the agent
//! — or the node — is gone and what the status says can no longer be
//! trusted. Such a node is unschedulable for new GPU pods: filter puts it
//! in `FailedAndUnresolvableNodes` (preempting pods there cannot help) with
//! the age and the limit in the reason. Pods that ask for no GPU are not
//! affected. A timestamp further in the future than the limit (a node
//! clock far ahead) counts as stale too, so a dead node with such a clock
//! cannot stay fresh for ever.
//!
//! The fresh nodes' view is built once and reused by every request until
//! the watch delivers any event (a change, a relist) or the clock reaches
//! the next instant at which some node's staleness flips (and at most
//! [`MAX_VIEW_REUSE`] after it was built); stale reasons, which name an
//! age, are worked out for each request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::TryStreamExt as _;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tessera_api::GpuNode;

use crate::extender::{self, ClusterView, ExtenderArgs, ExtenderFilterResult, NodeView};

/// The default [`Staleness`] limit: two heartbeats and a half of the
/// agent's default 60 s.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(150);
/// Longest a built view is reused without any watch event.
pub const MAX_VIEW_REUSE: Duration = Duration::from_secs(10);
/// Accepted limits (seconds).
pub const MAX_AGE_RANGE_S: std::ops::RangeInclusive<u64> = 10..=86_400;

/// How old telemetry may be before its node takes no new GPU pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staleness {
    max_age: Duration,
}

/// A staleness limit out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("telemetry max age {got_s} s is out of range; accepted: 10 to 86400 (seconds)")]
pub struct StalenessError {
    /// The value given.
    pub got_s: u64,
}

impl Default for Staleness {
    fn default() -> Self {
        Self {
            max_age: DEFAULT_MAX_AGE,
        }
    }
}

impl Staleness {
    /// A limit of `max_age_s` seconds (within [`MAX_AGE_RANGE_S`]).
    pub fn new(max_age_s: u64) -> Result<Self, StalenessError> {
        if MAX_AGE_RANGE_S.contains(&max_age_s) {
            Ok(Self {
                max_age: Duration::from_secs(max_age_s),
            })
        } else {
            Err(StalenessError { got_s: max_age_s })
        }
    }

    /// The limit.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// The first instant after `now` (ms since the epoch) at which
    /// [`Self::stale_reason`] may answer otherwise for `node`; `None` when
    /// it never will without a new status.
    fn flips_after(&self, node: &GpuNode, now: Timestamp) -> Option<i64> {
        let updated = node.status.as_ref()?.updated_at.0.as_millisecond();
        let limit_ms = i64::try_from(self.max_age.as_millis()).unwrap_or(i64::MAX);
        let age_ms = now.as_millisecond().saturating_sub(updated);
        if age_ms < -limit_ms {
            Some(updated.saturating_sub(limit_ms))
        } else if age_ms <= limit_ms {
            Some(updated.saturating_add(limit_ms).saturating_add(1))
        } else {
            None
        }
    }

    /// Why `node`'s telemetry cannot be used at `now`, if it cannot.
    pub fn stale_reason(&self, node: &GpuNode, now: Timestamp) -> Option<String> {
        let limit = self.max_age.as_secs();
        let Some(status) = &node.status else {
            return Some("no tessera GPU telemetry for this node (no GpuNode status)".to_owned());
        };
        let age_ms = now.as_millisecond() - status.updated_at.0.as_millisecond();
        let limit_ms = i64::try_from(self.max_age.as_millis()).unwrap_or(i64::MAX);
        if age_ms > limit_ms {
            Some(format!(
                "tessera GPU telemetry is stale: GpuNode status updated {} s ago (at {}), limit {limit} s; the node's agent is not reporting",
                age_ms / 1000,
                status.updated_at.0
            ))
        } else if age_ms < -limit_ms {
            Some(format!(
                "tessera GPU telemetry is unusable: GpuNode status updated {} s in the future (at {}), more than the {limit} s limit; the node's clock is off",
                -age_ms / 1000,
                status.updated_at.0
            ))
        } else {
            None
        }
    }
}

/// The telemetry at one instant: the fresh nodes as the extender sees
/// them, and why each other node is left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Nodes with fresh telemetry.
    pub view: ClusterView,
    /// Node → why its telemetry is not used.
    pub stale: BTreeMap<String, String>,
}

impl Snapshot {
    /// Sorts `nodes` into fresh and stale at `now`.
    pub fn new<'a>(
        nodes: impl IntoIterator<Item = &'a GpuNode>,
        staleness: Staleness,
        now: Timestamp,
    ) -> Self {
        let mut fresh = Vec::new();
        let mut stale = BTreeMap::new();
        for node in nodes {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            match staleness.stale_reason(node, now) {
                Some(reason) => {
                    stale.insert(name, reason);
                }
                None => fresh.push(NodeView::from_gpu_node(node)),
            }
        }
        Self {
            view: ClusterView::new(fresh),
            stale,
        }
    }

    /// The extender's `filter` over the fresh nodes; a stale node a GPU pod
    /// could not use carries the staleness reason.
    pub fn filter(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let mut result = extender::filter(args, &self.view);
        for (name, reason) in &mut result.failed_and_unresolvable_nodes {
            if let Some(why) = self.stale.get(name) {
                reason.clone_from(why);
            }
        }
        result
    }
}

/// Every `GpuNode` of the cluster, kept current by a watch.
#[derive(Clone)]
pub struct Cache {
    store: Store<GpuNode>,
    /// Bumped for every watch event, after the store has applied it.
    generation: Arc<AtomicU64>,
    /// The last fresh view built (see the module docs).
    memo: Arc<Mutex<Option<Memo>>>,
}

/// A built view and when it may be reused.
struct Memo {
    generation: u64,
    staleness: Staleness,
    /// Built at, ms since the epoch.
    built_ms: i64,
    /// Reused until before this instant, ms since the epoch.
    until_ms: i64,
    view: ClusterView,
}

impl Cache {
    /// Starts watching `GpuNode`s through `client` until `shutdown`
    /// completes. Watch errors are logged and retried with the watcher's
    /// default backoff; the cache keeps the last known objects meanwhile
    /// (their age shows through [`Staleness`]). Must be called within a
    /// tokio runtime.
    pub fn spawn(
        client: kube::Client,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (store, writer) = reflector::store();
        let api = kube::Api::<GpuNode>::all(client);
        // Every event counts, relists included: a relist can drop nodes
        // without touching them.
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff();
        let generation = Arc::new(AtomicU64::new(0));
        let bumped = generation.clone();
        let task = tokio::spawn(async move {
            tokio::pin!(shutdown);
            tokio::pin!(stream);
            loop {
                tokio::select! {
                    () = &mut shutdown => return,
                    next = stream.try_next() => match next {
                        Ok(Some(_)) => {
                            bumped.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(None) => return,
                        Err(e) => tracing::warn!(
                            error = %crate::error_chain::with_causes(&e),
                            "GpuNode watch failed; retrying"
                        ),
                    },
                }
            }
        });
        (
            Self {
                store,
                generation,
                memo: Arc::default(),
            },
            task,
        )
    }

    /// Waits until the first list has been read.
    pub async fn ready(&self) {
        let _ = self.store.wait_until_ready().await;
    }

    /// The cached nodes sorted at `now`, the fresh ones' view reused while
    /// it is valid (see the module docs).
    pub fn snapshot(&self, staleness: Staleness, now: Timestamp) -> Snapshot {
        // The generation is read before the store: a view built from a
        // newer store under an older generation is only rebuilt once more.
        let generation = self.generation.load(Ordering::SeqCst);
        let nodes = self.store.state();
        let now_ms = now.as_millisecond();
        let mut memo = self.memo.lock().unwrap_or_else(PoisonError::into_inner);
        let reusable = memo.as_ref().filter(|m| {
            m.generation == generation
                && m.staleness == staleness
                && (m.built_ms..m.until_ms).contains(&now_ms)
        });
        let view = match reusable {
            Some(m) => m.view.clone(),
            None => {
                let built = Snapshot::new(nodes.iter().map(|n| &**n), staleness, now);
                let reuse_ms = i64::try_from(MAX_VIEW_REUSE.as_millis()).unwrap_or(i64::MAX);
                let until_ms = nodes
                    .iter()
                    .filter_map(|n| staleness.flips_after(n, now))
                    .fold(now_ms.saturating_add(reuse_ms), i64::min);
                *memo = Some(Memo {
                    generation,
                    staleness,
                    built_ms: now_ms,
                    until_ms,
                    view: built.view.clone(),
                });
                return built;
            }
        };
        drop(memo);
        let stale = nodes
            .iter()
            .filter(|n| {
                n.metadata
                    .name
                    .as_ref()
                    .is_some_and(|name| view.node(name).is_none())
            })
            .filter_map(|n| Some((n.metadata.name.clone()?, staleness.stale_reason(n, now)?)))
            .collect();
        Snapshot { view, stale }
    }
}

#[cfg(test)]
mod tests;
