//! Telemetry: the node's `GpuNode` (`tessera_api::gpunode`) written to the API server
//! from the control loop's latest view, for the scheduler.
//!
//! - [`build`]: the status of one period (pure);
//! - [`publish`]: the writer task (create if missing, server-side apply of
//!   `/status`, rate limit, only on change, heartbeat, retries).
//!
//! The writer is its own task: it reads the latest `Arc<View>` from
//! [`Status`] and never holds anything the control loop waits for.
//!
//! Config file section (the keys [`TelemetryFile`] reads):
//!
//! ```toml
//! [telemetry]
//! # Publish the GpuNode at all (default true).
//! enabled = true
//! # At most one write per this many ms; a change is written within one
//! # interval (1000 to 600000, default 10000).
//! interval_ms = 10000
//! # A write at least this often even when nothing changed, so the
//! # scheduler can tell a live node from a dead one (interval_ms to
//! # 3600000, default 60000).
//! heartbeat_ms = 60000
//! ```

pub mod build;
pub mod publish;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::gpu::Inventory;
use crate::view::status::Status;

pub use publish::PublishError;

/// The default [`Settings::interval`] (ms).
pub const DEFAULT_INTERVAL_MS: u64 = 10_000;
/// The default [`Settings::heartbeat`] (ms).
pub const DEFAULT_HEARTBEAT_MS: u64 = 60_000;
/// Accepted intervals (ms).
pub const INTERVAL_RANGE_MS: std::ops::RangeInclusive<u64> = 1_000..=600_000;
/// The longest accepted heartbeat (ms).
pub const MAX_HEARTBEAT_MS: u64 = 3_600_000;

/// The `[telemetry]` section as written (every key optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryFile {
    /// See [`Settings::enabled`].
    pub enabled: Option<bool>,
    /// See [`Settings::interval`] (ms).
    pub interval_ms: Option<u64>,
    /// See [`Settings::heartbeat`] (ms).
    pub heartbeat_ms: Option<u64>,
}

/// The writer's settings, checked ([`Settings::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    enabled: bool,
    interval: Duration,
    heartbeat: Duration,
}

/// A `[telemetry]` value out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("telemetry.{key}: {problem}")]
pub struct SettingsError {
    /// The key, e.g. `interval_ms`.
    pub key: &'static str,
    /// What is wrong and what is accepted.
    pub problem: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_millis(DEFAULT_INTERVAL_MS),
            heartbeat: Duration::from_millis(DEFAULT_HEARTBEAT_MS),
        }
    }
}

impl Settings {
    /// Checks the section: interval within [`INTERVAL_RANGE_MS`], heartbeat
    /// from the interval to [`MAX_HEARTBEAT_MS`].
    pub fn new(file: &TelemetryFile) -> Result<Self, SettingsError> {
        let interval_ms = file.interval_ms.unwrap_or(DEFAULT_INTERVAL_MS);
        if !INTERVAL_RANGE_MS.contains(&interval_ms) {
            return Err(SettingsError {
                key: "interval_ms",
                problem: format!(
                    "is {interval_ms}; accepted: {} to {} (milliseconds)",
                    INTERVAL_RANGE_MS.start(),
                    INTERVAL_RANGE_MS.end()
                ),
            });
        }
        let heartbeat_ms = file
            .heartbeat_ms
            .unwrap_or(DEFAULT_HEARTBEAT_MS.max(interval_ms));
        if !(interval_ms..=MAX_HEARTBEAT_MS).contains(&heartbeat_ms) {
            return Err(SettingsError {
                key: "heartbeat_ms",
                problem: format!(
                    "is {heartbeat_ms}; accepted: interval_ms ({interval_ms}) to {MAX_HEARTBEAT_MS} (milliseconds)"
                ),
            });
        }
        Ok(Self {
            enabled: file.enabled.unwrap_or(true),
            interval: Duration::from_millis(interval_ms),
            heartbeat: Duration::from_millis(heartbeat_ms),
        })
    }

    /// Whether the agent publishes its `GpuNode`.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// At most one write per interval; a change is written within one.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// A write at least this often, changed or not.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }
}

/// Starts the writer of node `node_name`'s `GpuNode`: it runs until
/// `shutdown` completes. With telemetry disabled the task ends at once.
/// Must be called within a tokio runtime.
pub fn spawn(
    settings: Settings,
    node_name: String,
    client: kube::Client,
    inventory: &Inventory,
    status: Arc<Status>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, PublishError> {
    let publisher = publish::Publisher::new(settings, node_name, client, inventory)?;
    Ok(tokio::spawn(async move {
        if settings.enabled() {
            publisher.run(status, shutdown).await;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_ranges() {
        let s = Settings::new(&TelemetryFile::default()).expect("defaults");
        assert_eq!(s, Settings::default());
        assert_eq!(
            (s.interval(), s.heartbeat()),
            (Duration::from_secs(10), Duration::from_secs(60))
        );
        let e = Settings::new(&TelemetryFile {
            interval_ms: Some(999),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.key, "interval_ms");
        assert!(e.to_string().contains("1000 to 600000"), "{e}");
        let e = Settings::new(&TelemetryFile {
            interval_ms: Some(20_000),
            heartbeat_ms: Some(10_000),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.key, "heartbeat_ms");
        assert!(e.to_string().contains("interval_ms (20000)"), "{e}");
        // A long interval alone raises the default heartbeat to it.
        let s = Settings::new(&TelemetryFile {
            interval_ms: Some(120_000),
            ..Default::default()
        })
        .expect("long interval");
        assert_eq!(s.heartbeat(), Duration::from_secs(120));
        let e = toml::from_str::<TelemetryFile>("interval = 5\n").unwrap_err();
        assert!(e.to_string().contains("interval"), "{e}");
    }
}
