//! The garbage-collection task of `tessera-agent run`: every
//! [`GcConfig::interval`] it asks kubelet's PodResources ([`super::podresources`])
//! which containers exist and lets the collector
//! ([`crate::kubelet::gc`]) remove the region directories of those that
//! are gone.
//!
//! Each round's file system work runs on the blocking pool; a kubelet that
//! hangs costs at most [`GcConfig::timeout`] per call; a round in flight
//! completes before the task stops.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tessera_kubelet_api::podresources::KUBELET_SOCKET;
use tokio::task::JoinHandle;

use crate::containers::Store;
use crate::containers::live::Probe;
use crate::kubelet::gc::{Action, Collector, GcSettings, Observation};

use super::podresources::Client;

/// Settings of the garbage-collection task (the `[kubelet]` section's
/// `pod_resources_socket`, `resource_name` and `gc_*` keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcConfig {
    /// Kubelet's PodResources socket.
    pub pod_resources_socket: PathBuf,
    /// Our extended resource (its device IDs are read from kubelet).
    pub resource_name: String,
    /// Time between rounds (`gc_interval_s`, default 30 s).
    pub interval: Duration,
    /// Bound of one connect or call to kubelet (`gc_timeout_s`, default 5 s).
    pub timeout: Duration,
    /// The evidence a removal needs (`gc_grace_s` 120, `gc_settle_s` 60,
    /// `gc_confirm_s` 60 by default).
    pub settings: GcSettings,
}

impl Default for GcConfig {
    fn default() -> Self {
        Self {
            pod_resources_socket: PathBuf::from(KUBELET_SOCKET),
            resource_name: "nvidia.com/gpu".into(),
            interval: Duration::from_secs(30),
            timeout: super::podresources::DEFAULT_TIMEOUT,
            settings: GcSettings::default(),
        }
    }
}

/// A garbage-collection setting out of range.
#[derive(Debug, thiserror::Error)]
#[error("garbage collection setting {field}: {why}")]
pub struct GcConfigError {
    /// The field.
    pub field: &'static str,
    /// What is wrong and what is accepted.
    pub why: String,
}

/// Longest accepted interval and confirmation time.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Longest accepted call bound.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

impl GcConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), GcConfigError> {
        let bad = |field, why: String| Err(GcConfigError { field, why });
        let p = &self.pod_resources_socket;
        if !p.is_absolute() {
            return bad(
                "pod_resources_socket",
                format!("{} is not an absolute path", p.display()),
            );
        }
        if self
            .resource_name
            .split_once('/')
            .is_none_or(|(d, n)| d.is_empty() || n.is_empty())
        {
            return bad(
                "resource_name",
                format!("{:?} is not <domain>/<name>", self.resource_name),
            );
        }
        if self.interval.is_zero() || self.interval > MAX_INTERVAL {
            return bad(
                "gc_interval_s",
                format!("{:?} is outside (0, {MAX_INTERVAL:?}]", self.interval),
            );
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return bad(
                "gc_timeout_s",
                format!("{:?} is outside (0, {MAX_TIMEOUT:?}]", self.timeout),
            );
        }
        let s = &self.settings;
        if s.confirm < self.interval || s.confirm > MAX_INTERVAL * 24 {
            return bad(
                "gc_confirm_s",
                format!(
                    "{:?} is outside [gc_interval_s ({:?}), 24 h]: an absence must be seen in two answers",
                    s.confirm, self.interval
                ),
            );
        }
        if s.grace > MAX_INTERVAL * 24 || s.settle > MAX_INTERVAL * 24 {
            return bad(
                "gc_grace_s/gc_settle_s",
                "above 24 h; accepted: 0 to 24 h".to_owned(),
            );
        }
        Ok(())
    }
}

/// Runs the garbage collection of the region directories under `root`
/// until `shutdown` completes (see the module documentation). Returns
/// `Err` at once if `config` is out of range.
pub fn spawn_gc(
    config: GcConfig,
    root: PathBuf,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<JoinHandle<()>, GcConfigError> {
    config.validate()?;
    Ok(tokio::spawn(run(config, root, shutdown)))
}

async fn run(config: GcConfig, root: PathBuf, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut client = Client::new(
        config.pod_resources_socket.clone(),
        config.resource_name.clone(),
        config.timeout,
    );
    let fresh = || Collector::new(Store::new(root.clone()), config.settings, Probe::host());
    let mut collector = Some(fresh());
    // Kubelet's problems already logged at warning level.
    let mut told: HashSet<String> = HashSet::new();
    tracing::info!(
        socket = %config.pod_resources_socket.display(),
        root = %root.display(),
        interval_s = config.interval.as_secs_f64(),
        "region garbage collection running"
    );
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        let listed = tokio::select! {
            () = &mut shutdown => break,
            r = client.list() => r,
        };
        if let Ok(s) = &listed {
            for p in &s.problems {
                if !told.contains(p) {
                    tracing::warn!(problem = %p, "kubelet's PodResources answer");
                }
            }
            told = s.problems.iter().cloned().collect();
        }
        let mut c = collector.take().unwrap_or_else(fresh);
        let round = tokio::task::spawn_blocking(move || {
            let failed;
            let obs = match &listed {
                Ok(s) => Observation::Listed(s),
                Err(e) => {
                    failed = crate::error_chain::with_causes(e);
                    tracing::warn!(error = %failed, "PodResources List failed: nothing is collected this round");
                    Observation::Failed(&failed)
                }
            };
            let decisions = c.round(obs);
            let removed = decisions
                .iter()
                .filter(|d| d.action == Action::Removed)
                .count();
            (c, removed)
        });
        // A round that panicked leaves `collector` empty: the next starts
        // afresh (its absences are counted anew: only later, never sooner).
        match round.await {
            Ok((c, removed)) => {
                if removed > 0 {
                    tracing::info!(removed, "garbage collection round");
                }
                collector = Some(c);
            }
            Err(e) => tracing::error!(error = %e, "a garbage collection round panicked"),
        }
    }
    tracing::info!("region garbage collection stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_checks_name_the_key() {
        assert!(GcConfig::default().validate().is_ok());
        type Edit = fn(&mut GcConfig);
        let cases: [(&str, Edit); 7] = [
            ("pod_resources_socket", |c| {
                c.pod_resources_socket = "kubelet.sock".into()
            }),
            ("resource_name", |c| c.resource_name = "gpu".into()),
            ("gc_interval_s", |c| c.interval = Duration::ZERO),
            ("gc_interval_s", |c| c.interval = MAX_INTERVAL * 2),
            ("gc_timeout_s", |c| c.timeout = Duration::ZERO),
            ("gc_confirm_s", |c| c.settings.confirm = c.interval / 2),
            ("gc_grace_s/gc_settle_s", |c| {
                c.settings.grace = MAX_INTERVAL * 25
            }),
        ];
        for (key, edit) in cases {
            let mut c = GcConfig::default();
            edit(&mut c);
            let e = c.validate().unwrap_err();
            assert_eq!(e.field, key, "{e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("garbage collection setting {key}:"))
            );
        }
    }
}
