//! What the loop tells the HTTP endpoint: liveness, readiness and the last
//! period's view of the containers.

use std::sync::{Arc, Mutex};

use super::View;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shared between the loop (writer) and the HTTP endpoint (reader).
#[derive(Debug)]
pub struct Status {
    started: Instant,
    /// Periods completed.
    ticks: AtomicU64,
    /// When the last period completed (ms after `started`).
    last_tick_ms: AtomicU64,
    /// Whether NVML is initialised.
    nvml_ready: AtomicBool,
    /// Why NVML is not (empty when it is).
    nvml_error: Mutex<String>,
    /// The last period's view, for `/containers` (turned into JSON only
    /// when asked for).
    view: Mutex<Option<Arc<View>>>,
    /// Liveness fails after this long without a completed period.
    stall_after: Duration,
    /// Whether the device plugin runs (then readiness waits for it).
    plugin_required: AtomicBool,
    /// Whether the device plugin is registered with kubelet now.
    plugin_registered: AtomicBool,
}

/// A health answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Healthy / ready.
    pub ok: bool,
    /// Why (one line).
    pub detail: String,
}

impl Status {
    /// A status for a loop that has not run yet.
    pub fn new(stall_after: Duration) -> Self {
        Self {
            started: Instant::now(),
            ticks: AtomicU64::new(0),
            last_tick_ms: AtomicU64::new(0),
            nvml_ready: AtomicBool::new(false),
            nvml_error: Mutex::new("not initialised yet".to_owned()),
            view: Mutex::new(None),
            stall_after,
            plugin_required: AtomicBool::new(false),
            plugin_registered: AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The loop completed a period.
    pub fn tick_done(&self, view: Arc<View>) {
        // The previous view is dropped after the lock is released.
        let _previous = self
            .view
            .lock()
            .map(|mut v| v.replace(view))
            .unwrap_or_default();
        self.last_tick_ms.store(self.now_ms(), Ordering::Release);
        self.ticks.fetch_add(1, Ordering::AcqRel);
    }

    /// NVML came up (`Ok`) or failed (`Err(reason)`).
    pub fn set_nvml(&self, state: Result<(), String>) {
        if let Ok(mut e) = self.nvml_error.lock() {
            *e = state.as_ref().err().cloned().unwrap_or_default();
        }
        self.nvml_ready.store(state.is_ok(), Ordering::Release);
    }

    /// The device plugin runs: `/readyz` fails until it is registered.
    pub fn require_device_plugin(&self) {
        self.plugin_required.store(true, Ordering::Release);
    }

    /// The device plugin is (`true`) or is not registered with kubelet.
    pub fn set_device_plugin(&self, registered: bool) {
        self.plugin_registered.store(registered, Ordering::Release);
    }

    /// Periods completed.
    pub fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::Acquire)
    }

    /// `/healthz`: the process answers and the loop is not wedged (a
    /// period completed within `stall_after`, or the agent started less
    /// than that ago).
    pub fn health(&self) -> Verdict {
        let since = if self.ticks() == 0 {
            self.now_ms()
        } else {
            self.now_ms()
                .saturating_sub(self.last_tick_ms.load(Ordering::Acquire))
        };
        let limit = self.stall_after.as_millis() as u64;
        if since > limit {
            Verdict {
                ok: false,
                detail: format!(
                    "control loop stalled: no period completed for {since} ms (limit {limit} ms)"
                ),
            }
        } else {
            Verdict {
                ok: true,
                detail: format!("ok: {} periods", self.ticks()),
            }
        }
    }

    /// `/readyz`: NVML initialised, the first period done and, where the
    /// device plugin runs, it registered with kubelet.
    pub fn ready(&self) -> Verdict {
        let mut why = Vec::new();
        if !self.nvml_ready.load(Ordering::Acquire) {
            let e = self
                .nvml_error
                .lock()
                .map(|e| e.clone())
                .unwrap_or_default();
            why.push(format!("NVML is not initialised: {e}"));
        }
        if self.ticks() == 0 {
            why.push("the first control period has not completed".to_owned());
        }
        if self.plugin_required.load(Ordering::Acquire)
            && !self.plugin_registered.load(Ordering::Acquire)
        {
            why.push("the device plugin is not registered with kubelet".to_owned());
        }
        let health = self.health();
        if !health.ok {
            why.push(health.detail);
        }
        if why.is_empty() {
            Verdict {
                ok: true,
                detail: "ready".to_owned(),
            }
        } else {
            Verdict {
                ok: false,
                detail: format!("not ready: {}", why.join("; ")),
            }
        }
    }

    /// The last period's view (none before the first period), shared: the
    /// lock is held only to clone the `Arc`.
    pub fn latest_view(&self) -> Option<Arc<View>> {
        self.view.lock().ok().and_then(|v| v.clone())
    }

    /// The last period's view as JSON (null before the first period).
    pub fn view(&self) -> serde_json::Value {
        let view = self.view.lock().ok().and_then(|v| v.clone());
        view.and_then(|v| serde_json::to_value(&*v).ok())
            .unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_nvml_and_a_period() {
        let s = Status::new(Duration::from_secs(5));
        assert!(s.health().ok, "young agents are alive");
        let r = s.ready();
        assert!(
            !r.ok && r.detail.contains("NVML") && r.detail.contains("first"),
            "{r:?}"
        );
        s.set_nvml(Ok(()));
        assert!(!s.ready().ok);
        s.tick_done(Arc::default());
        assert!(s.ready().ok, "{:?}", s.ready());
        // With the device plugin: ready only while it is registered.
        s.require_device_plugin();
        let r = s.ready();
        assert!(!r.ok && r.detail.contains("device plugin"), "{r:?}");
        s.set_device_plugin(true);
        assert!(s.ready().ok, "{:?}", s.ready());
        s.set_device_plugin(false);
        assert!(!s.ready().ok);
        s.set_device_plugin(true);
        s.set_nvml(Err("gone".into()));
        assert!(s.ready().detail.contains("gone"));
    }

    #[test]
    fn a_wedged_loop_fails_liveness() {
        let s = Status::new(Duration::from_millis(30));
        s.tick_done(Arc::default());
        assert!(s.health().ok);
        std::thread::sleep(Duration::from_millis(60));
        let h = s.health();
        assert!(!h.ok && h.detail.contains("stalled"), "{h:?}");
    }
}
