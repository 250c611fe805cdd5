//! Prometheus series of the agent, served at `/metrics` (text format
//! 0.0.4): the latest control period's [`View`] as per-GPU, per-container
//! and agent-health series.
//!
//! Each period only advances the counters ([`counters`]) and keeps the
//! view; the series are built when `/metrics` is read, so the agent's
//! period costs the same however many series it exports.
//!
//! Invariants:
//! - A container or GPU missing from the latest view is missing from
//!   `/metrics`: every labelled family is rebuilt from that view at each
//!   scrape (under one lock, so a scrape never sees half of two periods).
//! - Counters never go backwards, whatever a container writes in its usage
//!   region ([`monotonic`]).

pub mod counters;
pub mod families;
pub mod labels;
pub mod monotonic;
pub mod scrape;

use std::sync::Mutex;

use prometheus::core::Desc;
use prometheus::{Registry, TextEncoder};

use crate::view::View;
use counters::Counters;
use families::{Families, ViewFamily};
use scrape::ViewCollector;

/// The content type of `/metrics`.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Why the metrics could not be defined or rendered.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A family could not be defined (a programming error).
    #[error("cannot define metric {name}")]
    Define {
        /// The family.
        name: &'static str,
        /// Cause.
        #[source]
        source: prometheus::Error,
    },
    /// The text format could not be written.
    #[error("cannot render the metrics")]
    Render(#[source] prometheus::Error),
}

struct Inner {
    /// The agent's own series.
    registry: Registry,
    f: Families,
    /// [`ViewFamily::ALL`]'s descriptors, in that order.
    descs: Vec<Desc>,
    counters: Counters,
    /// The latest period's view (none before the first period).
    view: Option<std::sync::Arc<View>>,
    /// The length of the previous scrape's text (the next one is sized
    /// for it, so the text is not copied as it grows).
    last_len: usize,
}

/// The agent's metrics (shared by the loop and the endpoint).
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    /// Every family defined, no series yet.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let f = Families::new(&registry)?;
        let descs = ViewFamily::ALL
            .iter()
            .map(|v| v.desc())
            .collect::<Result<_, _>>()?;
        Ok(Self {
            inner: Mutex::new(Inner {
                registry,
                f,
                descs,
                counters: Counters::default(),
                view: None,
                last_len: 0,
            }),
        })
    }

    /// Takes in one period's view (cheap: counters and the period
    /// histogram; the series are built by [`Metrics::render`]).
    pub fn observe(&self, view: impl Into<std::sync::Arc<View>>) {
        let view = view.into();
        let mut guard = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let inner = &mut *guard;
        inner.counters.update(&view);
        inner
            .f
            .period_duration
            .observe(view.duration_us as f64 / 1_000_000.0);
        inner.f.periods.inc();
        inner.view = Some(view);
    }

    /// The text format of every series of the latest period: the agent's
    /// own families, then each view family, built, encoded and dropped
    /// one at a time.
    pub fn render(&self) -> Result<String, MetricsError> {
        let mut guard = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        guard.fill();
        let mut out = String::with_capacity(guard.last_len + guard.last_len / 8);
        let encoder = TextEncoder::new();
        encoder
            .encode_utf8(&guard.registry.gather(), &mut out)
            .map_err(MetricsError::Render)?;
        let inner = &*guard;
        let collector = ViewCollector::new(&inner.descs, inner.view.as_deref(), &inner.counters);
        for f in ViewFamily::ALL {
            if let Some(mf) = collector.family(f) {
                encoder
                    .encode_utf8(std::slice::from_ref(&mf), &mut out)
                    .map_err(MetricsError::Render)?;
            }
        }
        drop(collector);
        guard.last_len = out.len();
        Ok(out)
    }
}

impl Inner {
    /// Sets the agent's own gauges from the latest view.
    fn fill(&self) {
        let f = &self.f;
        let Some(view) = &self.view else {
            return;
        };
        f.containers.set(view.containers.len() as i64);
        f.skipped.set(view.skipped.len() as i64);
        f.nvml_up.set(i64::from(view.nvml == "ready"));
        f.ebpf_up.set(i64::from(view.ebpf.starts_with("running")));
        let loads = self.counters.policy_loads.total();
        f.policy_loads
            .inc_by(loads.saturating_sub(f.policy_loads.get()));
        f.policy_error.set(i64::from(view.policy.error.is_some()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Action;
    use crate::policy::Policy;
    use crate::view::{ActionCount, ContainerView, EbpfView, EnforcementView, GpuView, Reason};

    const GPU: &str = "GPU-00000000-0000-0000-0000-000000000001";

    fn container(id: &str, warps: u64, pod: Option<&str>) -> ContainerView {
        let meta = serde_json::json!({
            "version": 1, "sm_target": 30, "namespace": pod.map(|_| "ml"),
            "pod": pod, "container": pod.map(|_| "main"), "gpus": [{"uuid": GPU}],
        });
        ContainerView {
            id: id.to_owned(),
            dir: id.into(),
            meta: serde_json::from_value(meta).unwrap(),
            epoch: 1,
            since_period: Some(0),
            gpus: vec![GpuView {
                uuid: GPU.to_owned(),
                memory_limit_bytes: Some(1 << 30),
                preload_used_bytes: 5 << 20,
                nvml_used_bytes: Some(7 << 20),
                sm_percent: Some(25.0),
                warps,
                launches: warps / 2,
                throttled_ns: 1_500_000_000,
                ..GpuView::default()
            }],
            processes: Vec::new(),
            problems: vec!["one".into()],
            policy: Policy::default().defaults,
            ebpf: Some(EbpfView {
                ioctls: warps,
                opens: 1,
                bypass_events: 0,
            }),
            enforcement: EnforcementView {
                state: "running".into(),
                actions: vec![ActionCount {
                    reason: Reason::Bypass,
                    action: Action::Alert,
                    count: 2,
                }],
                last_event: None,
            },
        }
    }

    fn view(containers: Vec<ContainerView>) -> View {
        View {
            period: 0,
            root: "/r".into(),
            containers: containers.into_iter().map(std::sync::Arc::new).collect(),
            skipped: Vec::new(),
            nvml: "ready".into(),
            duration_us: 1500,
            devices: Vec::new(),
            ebpf: "running (tracepoint)".into(),
            policy: Default::default(),
        }
    }

    /// The value of the sample of `name` whose labels include `labels`
    /// (`k=v` pairs; test values hold no `,` or `"`).
    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        text.lines().find_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            let pairs: Vec<(&str, &str)> = rest
                .trim_end_matches('}')
                .split(',')
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .collect();
            (n == name && labels.iter().all(|l| pairs.contains(l))).then(|| v.parse().ok())?
        })
    }

    fn count(text: &str, name: &str, labels: &[(&str, &str)]) -> usize {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| value(l, name, labels).is_some())
            .count()
    }

    #[test]
    fn a_claim_s_series_name_the_claim_and_others_an_empty_one() {
        let m = Metrics::new().unwrap();
        let mut shared = container("claim_c-1", 10, None);
        let mut meta = (*shared.meta).clone();
        meta.namespace = Some("ml".into());
        meta.pod = Some("train".into());
        meta.claim = Some("gpu-30".into());
        shared.meta = std::sync::Arc::new(meta);
        m.observe(view(vec![shared, container("a", 100, Some("serve"))]));
        let t = m.render().unwrap();
        let claim = [
            ("namespace", "ml"),
            ("pod", "train"),
            ("container", "claim_c-1"),
            ("claim", "gpu-30"),
            ("gpu", GPU),
        ];
        let limit = value(&t, "tessera_container_memory_limit_bytes", &claim);
        assert_eq!(limit, Some(f64::from(1 << 30)), "{t}");
        let plain = [("pod", "serve"), ("claim", ""), ("gpu", GPU)];
        let warps = value(&t, "tessera_container_warps_total", &plain);
        assert_eq!(warps, Some(100.0), "{t}");
    }

    #[test]
    fn series_follow_the_view_and_gone_containers_disappear() {
        let m = Metrics::new().unwrap();
        m.observe(view(vec![
            container("a", 100, Some("train")),
            container("b", 10, None),
        ]));
        let t = m.render().unwrap();
        let a = [
            ("namespace", "ml"),
            ("pod", "train"),
            ("container", "main"),
            ("id", "a"),
        ];
        let ag = [a.as_slice(), &[("gpu", GPU)]].concat();
        let nvml = [ag.as_slice(), &[("source", "nvml")]].concat();
        let used = value(&t, "tessera_container_memory_used_bytes", &nvml);
        assert_eq!(used, Some(f64::from(7 << 20)), "{t}");
        let warps = value(&t, "tessera_container_warps_total", &ag);
        assert_eq!(warps, Some(100.0), "{t}");
        let throttled = value(&t, "tessera_container_throttled_seconds_total", &ag);
        assert_eq!(throttled, Some(1.5), "{t}");
        let sm = value(&t, "tessera_container_sm_utilization_ratio", &ag);
        assert_eq!(sm, Some(0.25), "{t}");
        // Outside Kubernetes: empty namespace, the id as pod and container.
        let b = [
            ("namespace", ""),
            ("pod", "b"),
            ("container", "b"),
            ("id", "b"),
        ];
        assert_eq!(
            value(&t, "tessera_container_problems", &b),
            Some(1.0),
            "{t}"
        );
        // Every reason x action, zero until something happens.
        let n = count(&t, "tessera_container_enforcement_actions_total", &a);
        assert_eq!(n, Reason::ALL.len() * Action::ALL.len(), "{t}");
        let done = [a.as_slice(), &[("reason", "bypass"), ("action", "alert")]].concat();
        assert_eq!(
            value(&t, "tessera_container_enforcement_actions_total", &done),
            Some(2.0)
        );
        let none = [
            a.as_slice(),
            &[("reason", "memory_overage"), ("action", "kill")],
        ]
        .concat();
        assert_eq!(
            value(&t, "tessera_container_enforcement_actions_total", &none),
            Some(0.0)
        );

        m.observe(view(vec![container("b", 11, None)]));
        let t = m.render().unwrap();
        assert!(!t.contains(r#"id="a""#), "a is gone: {t}");
        assert!(t.contains("tessera_agent_periods_total 2"), "{t}");
        assert!(
            t.contains("tessera_agent_period_duration_seconds_count 2"),
            "{t}"
        );
    }

    #[test]
    fn a_rewritten_usage_region_never_lowers_a_counter() {
        let m = Metrics::new().unwrap();
        let mut last = 0.0;
        for reading in [100, 150, 0, 20, u64::MAX, 3] {
            m.observe(view(vec![container("a", reading, None)]));
            let t = m.render().unwrap();
            let v = value(&t, "tessera_container_warps_total", &[("id", "a")]).unwrap();
            assert!(v >= last, "{reading}: {v} < {last}");
            last = v;
        }
        // 100, +50, reset (0), +20, +huge (saturated), 3 adds nothing.
        assert_eq!(last, u64::MAX as f64);
    }

    #[test]
    fn a_container_that_comes_back_starts_again() {
        let m = Metrics::new().unwrap();
        let warps = |m: &Metrics| {
            let t = m.render().unwrap();
            value(&t, "tessera_container_warps_total", &[("id", "a")])
        };
        m.observe(view(vec![container("a", 100, None)]));
        assert_eq!(warps(&m), Some(100.0));
        m.observe(view(Vec::new()));
        assert_eq!(warps(&m), None, "gone");
        m.observe(view(vec![container("a", 5, None)]));
        assert_eq!(warps(&m), Some(5.0), "a new series, not the old total");
    }

    #[test]
    fn no_ebpf_no_ebpf_series() {
        let m = Metrics::new().unwrap();
        let mut c = container("a", 1, None);
        c.ebpf = None;
        m.observe(view(vec![c]));
        let t = m.render().unwrap();
        assert!(!t.contains("tessera_container_ioctls_total{"), "{t}");
        assert!(t.contains("tessera_container_warps_total{"), "{t}");
    }

    #[test]
    fn the_collector_gathers_what_the_scrape_writes_sorted_as_a_registry_would() {
        let m = Metrics::new().unwrap();
        // Ids out of order, pods in reverse: the text must still be sorted.
        m.observe(view(vec![
            container("c", 30, Some("a")),
            container("a", 10, Some("c")),
            container("b", 20, None),
        ]));
        let text = m.render().unwrap();
        let inner = m.inner.lock().unwrap();
        let c = ViewCollector::new(&inner.descs, inner.view.as_deref(), &inner.counters);
        assert_eq!(
            prometheus::core::Collector::desc(&c).len(),
            ViewFamily::ALL.len()
        );
        let families = prometheus::core::Collector::collect(&c);
        let gathered = TextEncoder::new().encode_to_string(&families).unwrap();
        assert!(text.ends_with(&gathered), "{text}\n---\n{gathered}");
        for mf in &families {
            assert!(!mf.get_metric().is_empty(), "{}", mf.name());
            let values: Vec<Vec<&str>> = mf
                .get_metric()
                .iter()
                .map(|m| {
                    let names: Vec<&str> = m.get_label().iter().map(|l| l.name()).collect();
                    let mut sorted = names.clone();
                    sorted.sort_unstable();
                    assert_eq!(names, sorted, "{}", mf.name());
                    m.get_label().iter().map(|l| l.value()).collect()
                })
                .collect();
            let mut sorted = values.clone();
            sorted.sort();
            assert_eq!(values, sorted, "{}", mf.name());
        }
    }

    /// The text the former registry of labelled children wrote for this
    /// view (`tests/fixtures/metrics_registry_golden.prom`, rendered by it
    /// before it was replaced; the compute-overage reason and the throttle
    /// action since added in the registry's sorted order): the
    /// scrape-time families write the same bytes — names, help, types,
    /// label order, series order, values.
    #[test]
    fn the_scrape_writes_what_the_registry_of_labelled_children_wrote() {
        let m = Metrics::new().unwrap();
        let mut a = container("c", 30, Some("a"));
        a.gpus.push(GpuView {
            uuid: "GPU-00000000-0000-0000-0000-000000000002".into(),
            cap_percent: Some(30.0),
            error_pp: Some(-1.5),
            launch_rate: Some(77),
            ebpf_used_bytes: Some(9),
            ..GpuView::default()
        });
        let mut v = view(vec![
            a,
            container("a", 10, Some("c")),
            container("b", 20, None),
        ]);
        v.devices = vec![crate::view::DeviceView {
            index: 0,
            uuid: GPU.into(),
            memory_used_bytes: Some(5),
            memory_total_bytes: Some(10),
            sm_percent: Some(12.5),
            healthy: true,
        }];
        m.observe(v.clone());
        m.observe(v);
        let golden = include_str!("../../tests/fixtures/metrics_registry_golden.prom");
        assert_eq!(m.render().unwrap(), golden);
    }
}
