//! The per-GPU and per-container families, built from the latest view at
//! scrape time ([`ViewCollector`]), one family at a time.
//!
//! Nothing here outlives a scrape: [`ViewCollector::family`] builds one
//! `prometheus` [`MetricFamily`] from the view and the exported counter
//! totals, [`super::Metrics::render`] encodes it with the crate's text
//! encoder and drops it before building the next, so the transient memory
//! of a scrape is the text plus one family, and the agent keeps no metric
//! object per (container, GPU) between scrapes.
//!
//! Invariants (as the registry the families replaced kept them):
//! - label pairs are sorted by label name and the series of a family by
//!   their label values, so two scrapes of the same view are identical;
//! - a family without a series is left out (the text format has no empty
//!   family);
//! - counter values are the monotonic totals of [`super::counters`],
//!   never a raw reading of a usage region.

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use super::counters::Counters;
use super::families::ViewFamily;
use super::labels;
use crate::policy::Action;
use crate::view::{ContainerView, Reason, View};

fn ratio(percent: Option<f64>) -> Option<f64> {
    percent.filter(|p| p.is_finite()).map(|p| p / 100.0)
}

/// A byte count or rate as the integer families exported it (capped at
/// `i64::MAX`).
fn int(v: u64) -> f64 {
    i64::try_from(v).unwrap_or(i64::MAX) as f64
}

/// The series of one family being built.
struct Series {
    kind: MetricType,
    names: &'static [&'static str],
    /// Indexes into `names`, in label-name order.
    order: Vec<usize>,
    metrics: Vec<Metric>,
}

impl Series {
    fn new(family: ViewFamily) -> Self {
        let (_, _, kind, names) = family.def();
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_by_key(|&i| names[i]);
        Self {
            kind,
            names,
            order,
            metrics: Vec::new(),
        }
    }

    /// One series: `values` in the order of the family's label names.
    fn push(&mut self, values: &[&str], value: f64) {
        debug_assert_eq!(values.len(), self.names.len(), "label cardinality");
        let label = self
            .order
            .iter()
            .map(|&i| {
                let mut p = LabelPair::default();
                p.set_name(self.names[i].to_owned());
                p.set_value(values.get(i).copied().unwrap_or_default().to_owned());
                p
            })
            .collect();
        let mut m = Metric::from_label(label);
        if self.kind == MetricType::COUNTER {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        self.metrics.push(m);
    }
}

/// The view-built families of one scrape.
pub struct ViewCollector<'a> {
    descs: &'a [Desc],
    view: Option<&'a View>,
    counters: &'a Counters,
    /// [`labels::container`] of each container of the view, in its order.
    names: Vec<[String; 5]>,
}

impl<'a> ViewCollector<'a> {
    /// The families of `view` (none before the first period), counters
    /// from `counters`; `descs` are [`ViewFamily::ALL`]'s, in that order.
    pub fn new(descs: &'a [Desc], view: Option<&'a View>, counters: &'a Counters) -> Self {
        let names = view.map_or_else(Vec::new, |v| {
            v.containers
                .iter()
                .map(|c| labels::container(&c.id, &c.meta))
                .collect()
        });
        Self {
            descs,
            view,
            counters,
            names,
        }
    }

    /// Family `f` built from the view; no series: none to write.
    pub fn family(&self, f: ViewFamily) -> Option<MetricFamily> {
        let view = self.view?;
        let mut s = Series::new(f);
        if matches!(
            f,
            ViewFamily::GpuMemoryUsed
                | ViewFamily::GpuMemoryTotal
                | ViewFamily::GpuSmUtilization
                | ViewFamily::GpuUp
        ) {
            for d in &view.devices {
                let index = d.index.to_string();
                let l = [d.uuid.as_str(), index.as_str()];
                let v = match f {
                    ViewFamily::GpuMemoryUsed => d.memory_used_bytes.map(int),
                    ViewFamily::GpuMemoryTotal => d.memory_total_bytes.map(int),
                    ViewFamily::GpuSmUtilization => ratio(d.sm_percent),
                    _ => Some(f64::from(u8::from(d.healthy))),
                };
                if let Some(v) = v {
                    s.push(&l, v);
                }
            }
        } else {
            for (c, names) in view.containers.iter().zip(&self.names) {
                let base = [
                    names[0].as_str(),
                    names[1].as_str(),
                    names[2].as_str(),
                    names[3].as_str(),
                    names[4].as_str(),
                ];
                container(&mut s, f, self.counters, c, base);
            }
        }
        if s.metrics.is_empty() {
            return None;
        }
        // As the registry sorted them: by label values, pair by pair.
        s.metrics.sort_by(|a, b| {
            a.get_label()
                .iter()
                .map(LabelPair::value)
                .cmp(b.get_label().iter().map(LabelPair::value))
        });
        let (name, help, kind, _) = f.def();
        let mut mf = MetricFamily::default();
        mf.set_name(name.to_owned());
        mf.set_help(help.to_owned());
        mf.set_field_type(kind);
        mf.set_metric(s.metrics);
        Some(mf)
    }
}

/// Container `c`'s series of family `f` (labels `base` first).
fn container(
    s: &mut Series,
    f: ViewFamily,
    counters: &Counters,
    c: &ContainerView,
    base: [&str; 5],
) {
    // A container gets series once its counters exist (the period that
    // put it in the view created them).
    let Some(cc) = counters.container(&c.id) else {
        return;
    };
    let [ns, pod, name, id, claim] = base;
    match f {
        ViewFamily::Problems => s.push(&base, c.problems.len() as f64),
        ViewFamily::Ioctls | ViewFamily::Opens | ViewFamily::Bypass => {
            if c.ebpf.is_some() {
                let v = match f {
                    ViewFamily::Ioctls => cc.ioctls.total(),
                    ViewFamily::Opens => cc.opens.total(),
                    _ => cc.bypass.total(),
                };
                s.push(&base, v as f64);
            }
        }
        ViewFamily::Enforcement => {
            for reason in Reason::ALL {
                for action in Action::ALL {
                    let l = [ns, pod, name, id, claim, reason.as_str(), action.as_str()];
                    s.push(&l, cc.enforcement(reason, action) as f64);
                }
            }
        }
        _ => {
            let target = f64::from(c.meta.sm_target) / 100.0;
            for g in &c.gpus {
                let l = [ns, pod, name, id, claim, g.uuid.as_str()];
                let counted = cc.gpu(&g.uuid);
                let v = match f {
                    ViewFamily::MemoryUsed => {
                        let by_source = [
                            ("nvml", g.nvml_used_bytes),
                            ("preload", Some(g.preload_used_bytes)),
                            ("ebpf", g.ebpf_used_bytes),
                        ];
                        for (source, bytes) in by_source {
                            if let Some(b) = bytes {
                                let l = [ns, pod, name, id, claim, g.uuid.as_str(), source];
                                s.push(&l, int(b));
                            }
                        }
                        None
                    }
                    ViewFamily::MemoryLimit => g.memory_limit_bytes.map(int),
                    ViewFamily::LaunchRateLimit => g.launch_rate.map(int),
                    ViewFamily::SmUtilization => ratio(g.sm_percent),
                    ViewFamily::SmTarget => Some(target),
                    ViewFamily::SmCap => ratio(g.cap_percent),
                    ViewFamily::ControlError => ratio(g.error_pp),
                    ViewFamily::Launches => counted.map(|gc| gc.launches.total() as f64),
                    ViewFamily::Warps => counted.map(|gc| gc.warps.total() as f64),
                    ViewFamily::Throttled => counted.map(|gc| gc.throttled_ns.total() as f64 / 1e9),
                    _ => None,
                };
                if let Some(v) = v {
                    s.push(&l, v);
                }
            }
        }
    }
}

impl Collector for ViewCollector<'_> {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    /// Every family at once (what a registry would gather); `/metrics`
    /// encodes them one by one instead ([`ViewCollector::family`]).
    fn collect(&self) -> Vec<MetricFamily> {
        ViewFamily::ALL
            .iter()
            .filter_map(|&f| self.family(f))
            .collect()
    }
}
