//! The scheduler's Prometheus metrics, served at `/metrics` on the plain
//! listener.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `tessera_scheduler_verb_seconds` | `verb` | latency of each extender verb (histogram) |
//! | `tessera_scheduler_decisions_total` | `verb`, `outcome` | filter: `schedulable`/`unschedulable`/`error`; bind: `bound`/`refused` |
//! | `tessera_scheduler_failures_total` | `verb`, `reason` | failures by reason (bind: [`crate::bind::BindError::reason`]) |
//! | `tessera_scheduler_gpu_allocated` | `node`, `gpu`, `resource` | what bound pods take of a GPU, per `memory_mib`, `cores_percent`, `shares` |
//! | `tessera_scheduler_gpu_capacity` | `node`, `gpu`, `resource` | the GPU's capacity in the same units |
//!
//! The GPU gauges are set from the reservation table at each scrape, so a
//! GPU the table forgot loses its series.

use prometheus::{
    Encoder as _, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

use crate::bind::reserve::Reservations;

/// The registry and its metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Verb latency.
    pub verb_seconds: HistogramVec,
    /// Decisions by outcome.
    pub decisions: IntCounterVec,
    /// Failures by reason.
    pub failures: IntCounterVec,
    gpu_allocated: GaugeVec,
    gpu_capacity: GaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    ///
    /// # Panics
    /// Never: the names and labels are constants that register once.
    #[allow(clippy::expect_used, reason = "constant metric definitions")]
    pub fn new() -> Self {
        let registry = Registry::new();
        let verb_seconds = HistogramVec::new(
            HistogramOpts::new(
                "tessera_scheduler_verb_seconds",
                "Latency of each extender verb, seconds.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            &["verb"],
        )
        .expect("histogram");
        let decisions = IntCounterVec::new(
            Opts::new(
                "tessera_scheduler_decisions_total",
                "Extender decisions by verb and outcome.",
            ),
            &["verb", "outcome"],
        )
        .expect("counter");
        let failures = IntCounterVec::new(
            Opts::new(
                "tessera_scheduler_failures_total",
                "Extender failures by verb and reason.",
            ),
            &["verb", "reason"],
        )
        .expect("counter");
        let gpu_allocated = GaugeVec::new(
            Opts::new(
                "tessera_scheduler_gpu_allocated",
                "What bound pods take of a GPU, by resource (memory_mib, cores_percent, shares).",
            ),
            &["node", "gpu", "resource"],
        )
        .expect("gauge");
        let gpu_capacity = GaugeVec::new(
            Opts::new(
                "tessera_scheduler_gpu_capacity",
                "A GPU's capacity, by resource (memory_mib, cores_percent, shares).",
            ),
            &["node", "gpu", "resource"],
        )
        .expect("gauge");
        for c in [
            Box::new(verb_seconds.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(decisions.clone()),
            Box::new(failures.clone()),
            Box::new(gpu_allocated.clone()),
            Box::new(gpu_capacity.clone()),
        ] {
            registry.register(c).expect("register");
        }
        Self {
            registry,
            verb_seconds,
            decisions,
            failures,
            gpu_allocated,
            gpu_capacity,
        }
    }

    /// The text exposition, with the GPU gauges set from `table`.
    pub fn render(&self, table: Option<&Reservations>) -> String {
        self.gpu_allocated.reset();
        self.gpu_capacity.reset();
        if let Some(table) = table {
            for g in table.snapshot() {
                let rows = [
                    ("memory_mib", g.used.mib as f64, g.capacity_mib as f64),
                    ("cores_percent", f64::from(g.used.cores), 100.0),
                    (
                        "shares",
                        f64::from(g.used.shares),
                        f64::from(table.max_shares()),
                    ),
                ];
                for (resource, used, capacity) in rows {
                    let labels = [g.node.as_str(), g.uuid.as_str(), resource];
                    self.gpu_allocated.with_label_values(&labels).set(used);
                    self.gpu_capacity.with_label_values(&labels).set(capacity);
                }
            }
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            return format!("# encoding metrics failed: {e}\n");
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}
