//! A real Prometheus server (the Debian `prometheus` binary, temp config
//! and storage, a free port, 1 s scrapes) scrapes the agent running on the
//! simulator with workloads in two containers. Per-pod series are read
//! back through Prometheus's HTTP API and judged by the simulator's own
//! NVML record; every query of the Grafana dashboard in
//! `deploy/dashboards/` is evaluated against that Prometheus and must
//! return data.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;
mod metrics_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use metrics_support::{MIB_F, Prometheus, Scene, sample_value};
use serde_json::Value;
use tessera_testkit::programs::on_path;
use tessera_testkit::promtool::NOT_INSTALLED;

/// Series that exist only while the agent's eBPF observer runs.
const EBPF_SERIES: [&str; 4] = [
    "tessera_container_ioctls_total",
    "tessera_container_device_opens_total",
    "tessera_container_bypass_events_total",
    r#"source="ebpf""#,
];

/// Grafana's built-in variables the dashboard may use.
const BUILTIN: [&str; 3] = ["__rate_interval", "__interval", "__range"];

fn dashboard() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/dashboards/tessera.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every panel, rows' nested panels included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// (panel title, expr) of every query target.
fn targets(d: &Value) -> Vec<(String, String)> {
    panels(d)
        .into_iter()
        .filter(|p| p["type"] != "row")
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap().to_owned();
            p["targets"]
                .as_array()
                .unwrap_or_else(|| panic!("panel {title} has no targets"))
                .iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap_or("").to_owned()))
        })
        .collect()
}

/// `$name` and `${name}` references in `s`.
fn references(s: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let name: String = rest
            .trim_start_matches('{')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

/// `expr` with each variable replaced by `values[name]` and Grafana's
/// interval variables by 10 s (ten scrapes).
fn substitute(expr: &str, values: &BTreeMap<&str, String>) -> String {
    let mut e = expr
        .replace("$__rate_interval", "10s")
        .replace("$__interval", "10s")
        .replace("$__range", "10s");
    for (name, v) in values {
        e = e
            .replace(&format!("${{{name}}}"), v)
            .replace(&format!("${name}"), v);
    }
    e
}

/// The query variables: (name, label_values query).
fn variables(d: &Value) -> Vec<(String, String)> {
    d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_owned(),
                v["query"]["query"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `label_values(selector, label)` as PromQL: `group by (label) (selector)`.
fn label_values(q: &str) -> (String, String) {
    let inner = q
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("variable query {q} is not label_values(selector, label)"));
    let (selector, label) = inner.rsplit_once(',').unwrap();
    let label = label.trim().to_owned();
    (format!("group by ({label}) ({})", selector.trim()), label)
}

#[test]
fn the_dashboard_is_valid_grafana_json() {
    let d = dashboard();
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    let mut ids = BTreeSet::new();
    for p in panels(&d) {
        let id = p["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("panel without id: {p}"));
        assert!(ids.insert(id), "panel id {id} used twice");
        assert!(
            p["gridPos"]["w"].as_u64().is_some(),
            "panel {id} has no gridPos"
        );
    }
    let defined: BTreeSet<String> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect();
    for want in ["instance", "namespace", "pod", "gpu", "datasource"] {
        assert!(defined.contains(want), "no template variable {want}");
    }
    let all = targets(&d);
    assert!(all.len() >= 10, "{all:?}");
    for (title, expr) in &all {
        assert!(!expr.trim().is_empty(), "panel {title} has an empty query");
        for r in references(expr) {
            assert!(
                defined.contains(&r) || BUILTIN.contains(&r.as_str()),
                "panel {title} uses ${r}, which is not defined: {expr}"
            );
        }
    }
    for (name, q) in variables(&d) {
        label_values(&q);
        for r in references(&q) {
            assert!(defined.contains(&r), "variable {name} uses undefined ${r}");
        }
    }
}

#[test]
fn prometheus_scrapes_per_pod_series_and_every_dashboard_query_has_data() {
    let Some(bin) = on_path("prometheus") else {
        println!("skipped: {NOT_INSTALLED}");
        return;
    };
    let scene = Scene::start();
    let prom = Prometheus::start(&bin, scene.agent.addr);
    let long = Duration::from_secs(60);

    // Memory: the container's NVML figure as Prometheus stored it against
    // the simulator's own per-process record.
    for w in [&scene.busy, &scene.idle] {
        let q = format!(
            r#"tessera_container_memory_used_bytes{{namespace="{}",pod="{}",source="nvml"}}"#,
            w.namespace, w.pod
        );
        let r = prom.wait_query(&q, long);
        assert_eq!(r.len(), 1, "{q}: {r:?}; prometheus log: {}", prom.log());
        let got = sample_value(&r[0]);
        let want = scene.sim_memory(w) as f64;
        eprintln!(
            "{}: prometheus {:.1} MiB, simulator {:.1} MiB",
            w.pod,
            got / MIB_F,
            want / MIB_F
        );
        assert!(want > 0.0, "the simulator shows no memory for {}", w.pod);
        assert!((got - want).abs() <= MIB_F, "{}: {got} vs {want}", w.pod);
        assert_eq!(r[0]["metric"]["gpu"], scene.gpu.as_str(), "{r:?}");
        assert_eq!(r[0]["metric"]["container"], "main", "{r:?}");
    }

    // SM use: the busy pod's over 5 s is above zero, the idle pod's is
    // zero, as the simulator's per-process samples show.
    let busy = prom.wait_query(
        r#"avg_over_time(tessera_container_sm_utilization_ratio{pod="trainer"}[5s]) > 0"#,
        long,
    );
    assert_eq!(busy.len(), 1, "no SM use for the busy pod: {}", prom.log());
    let idle = prom.wait_query(
        r#"max_over_time(tessera_container_sm_utilization_ratio{pod="notebook"}[5s])"#,
        long,
    );
    assert_eq!(idle.len(), 1, "no SM series for the idle pod");
    assert_eq!(sample_value(&idle[0]), 0.0, "{idle:?}");
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
        - 5_000_000;
    let sim = scene.node.sim().process_samples(0, since).unwrap();
    let share = |pid: i32| -> u32 {
        sim.iter()
            .filter(|s| s.pid == pid)
            .map(|s| s.sm_percent)
            .sum()
    };
    assert!(
        share(scene.busy.running.pid()) > 0,
        "the simulator saw no kernels of the busy pod"
    );
    assert_eq!(
        share(scene.idle.running.pid()),
        0,
        "the simulator saw kernels of the idle pod"
    );

    // Every dashboard query, with every variable at "all" and at the busy
    // pod's concrete values, returns data.
    let d = dashboard();
    let ebpf = prom.wait_query("tessera_agent_ebpf_up", long);
    let ebpf_up = ebpf.first().is_some_and(|s| sample_value(s) == 1.0);
    let instance = scene.agent.addr.to_string();
    let everything: BTreeMap<&str, String> = ["instance", "namespace", "pod", "gpu"]
        .into_iter()
        .map(|v| (v, ".*".to_owned()))
        .collect();
    let concrete: BTreeMap<&str, String> = [
        ("instance", instance.clone()),
        ("namespace", "ml".to_owned()),
        ("pod", "trainer".to_owned()),
        ("gpu", scene.gpu.clone()),
    ]
    .into_iter()
    .collect();
    for (name, q) in variables(&d) {
        let (promql, label) = label_values(&substitute(&q, &everything));
        let r = prom.wait_query(&promql, long);
        let values: Vec<&str> = r
            .iter()
            .filter_map(|s| s["metric"][&label].as_str())
            .collect();
        assert!(
            values.contains(&concrete[name.as_str()].as_str()),
            "variable {name} ({promql}) offers {values:?}"
        );
    }
    let mut empty = Vec::new();
    let mut not_evaluated = Vec::new();
    for (title, expr) in targets(&d) {
        let needs_ebpf = EBPF_SERIES.iter().any(|s| expr.contains(s));
        for values in [&everything, &concrete] {
            let q = substitute(&expr, values);
            if needs_ebpf && !ebpf_up {
                // Still a valid query (an error answer fails the test).
                prom.query(&q);
                not_evaluated.push(format!("{title}: {q}"));
                continue;
            }
            if prom.wait_query(&q, Duration::from_secs(30)).is_empty() {
                empty.push(format!("{title}: {q}"));
            }
        }
    }
    if !not_evaluated.is_empty() {
        eprintln!(
            "the agent's eBPF observer is not running, so these queries were checked for validity only:\n  {}",
            not_evaluated.join("\n  ")
        );
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n  {}",
        empty.join("\n  ")
    );
}
