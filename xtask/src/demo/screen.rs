//! The live view, from the agent's `/containers` JSON (see
//! `agent/src/view/`): a table redrawn in place on a terminal,
//! `key=value` lines without escape codes otherwise.

use serde_json::Value;

use super::plan::{MIB, Plan};

/// One container's row, from the view.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Row {
    pub(super) name: String,
    pub(super) gpu: usize,
    pub(super) mode: String,
    pub(super) used_mib: Option<u64>,
    pub(super) limit_mib: Option<u64>,
    pub(super) sm: Option<f64>,
    pub(super) target: Option<u64>,
    pub(super) cap: Option<f64>,
    /// The launch rate in force (warps/s; `None`: unlimited).
    pub(super) rate: Option<u64>,
    /// Kernel launches admitted (cumulative).
    pub(super) launches: u64,
    pub(super) state: String,
    pub(super) problems: usize,
}

/// One GPU's row.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Device {
    pub(super) index: u64,
    pub(super) used_mib: Option<u64>,
    pub(super) total_mib: Option<u64>,
    pub(super) sm: Option<f64>,
}

fn mib(v: &Value) -> Option<u64> {
    v.as_u64().map(|b| b / MIB)
}

/// The rows of `plans` (in their order; `ids[i]` is the agent's id of
/// `plans[i]`'s container) and the devices in a view; a container the view
/// does not list yet has an empty row.
pub(super) fn rows(view: &Value, plans: &[Plan], ids: &[String]) -> (Vec<Device>, Vec<Row>) {
    let devices = view["devices"]
        .as_array()
        .map(|ds| {
            ds.iter()
                .map(|d| Device {
                    index: d["index"].as_u64().unwrap_or(0),
                    used_mib: mib(&d["memory_used_bytes"]),
                    total_mib: mib(&d["memory_total_bytes"]),
                    sm: d["sm_percent"].as_f64(),
                })
                .collect()
        })
        .unwrap_or_default();
    let empty = Vec::new();
    let containers = view["containers"].as_array().unwrap_or(&empty);
    let rows = plans
        .iter()
        .zip(ids)
        .map(|(p, id)| {
            let mut row = Row {
                name: p.name.to_owned(),
                gpu: p.gpu,
                mode: p.mode.as_str().to_owned(),
                state: "not listed yet".to_owned(),
                ..Row::default()
            };
            let Some(c) = containers.iter().find(|c| c["id"] == id.as_str()) else {
                return row;
            };
            let g = &c["gpus"][0];
            row.mode = c["meta"]["mode"].as_str().unwrap_or("?").to_owned();
            row.target = c["meta"]["sm_target"].as_u64();
            row.used_mib = mib(&g["nvml_used_bytes"]).or_else(|| mib(&g["preload_used_bytes"]));
            row.limit_mib = mib(&g["memory_limit_bytes"]);
            row.sm = g["sm_percent"].as_f64();
            row.cap = g["cap_percent"].as_f64();
            row.rate = g["launch_rate"].as_u64();
            row.launches = g["launches"].as_u64().unwrap_or(0);
            row.state = c["enforcement"]["state"].as_str().unwrap_or("?").to_owned();
            row.problems = c["problems"].as_array().map_or(0, Vec::len);
            row
        })
        .collect();
    (devices, rows)
}

/// The ids of `ids` that the view does not list yet with a launch rate
/// written for each of its GPUs (until the agent takes a new container
/// over in its next period, its workload would launch unlimited).
pub(super) fn not_taken_over<'a>(view: &Value, ids: &'a [String]) -> Vec<&'a str> {
    let taken = |id: &str| {
        view["containers"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["id"] == id
                    && c["gpus"]
                        .as_array()
                        .is_some_and(|g| g.iter().all(|g| g["launch_rate"].is_u64()))
            })
        })
    };
    ids.iter()
        .map(String::as_str)
        .filter(|id| !taken(id))
        .collect()
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn pct(v: Option<f64>) -> String {
    // `+ 0.0` turns a -0.0 into 0.0.
    v.map_or_else(|| "-".to_owned(), |v| format!("{:.1}", v + 0.0))
}

fn rate(v: Option<u64>) -> String {
    v.map_or_else(|| "unlimited".to_owned(), |v| v.to_string())
}

/// The table (no escape codes; the caller redraws it in place).
pub(super) fn table(devices: &[Device], rows: &[Row], per_s: &[f64]) -> Vec<String> {
    let mut out = vec![format!(
        "{:<4} {:>20} {:>9}",
        "GPU", "memory MiB (total)", "SM busy %"
    )];
    for d in devices {
        out.push(format!(
            "{:<4} {:>8} ({:>9}) {:>9}",
            d.index,
            opt(d.used_mib),
            opt(d.total_mib),
            pct(d.sm)
        ));
    }
    out.push(String::new());
    out.push(format!(
        "{:<9} {:>3} {:<7} {:>18} {:>18} {:>14} {:>11} {}",
        "container",
        "gpu",
        "mode",
        "memory MiB (limit)",
        "SM % (target/cap)",
        "rate warps/s",
        "launches/s",
        "state"
    ));
    for (r, per_s) in rows.iter().zip(per_s) {
        let problems = if r.problems > 0 {
            format!(" ({} problems)", r.problems)
        } else {
            String::new()
        };
        out.push(format!(
            "{:<9} {:>3} {:<7} {:>7} ({:>8}) {:>6} ({:>3}/{:>5}) {:>14} {:>11.0} {}{problems}",
            r.name,
            r.gpu,
            r.mode,
            opt(r.used_mib),
            opt(r.limit_mib),
            pct(r.sm),
            opt(r.target),
            pct(r.cap),
            rate(r.rate),
            per_s,
            r.state
        ));
    }
    out
}

/// One line per device and container, for a log or a pipe.
pub(super) fn plain(t: u64, devices: &[Device], rows: &[Row], per_s: &[f64]) -> Vec<String> {
    let mut out: Vec<String> = devices
        .iter()
        .map(|d| {
            format!(
                "t={t}s gpu={} memory={}/{}MiB sm_busy={}%",
                d.index,
                opt(d.used_mib),
                opt(d.total_mib),
                pct(d.sm)
            )
        })
        .collect();
    for (r, per_s) in rows.iter().zip(per_s) {
        out.push(format!(
            "t={t}s container={} gpu={} mode={} memory={}/{}MiB sm={}% target={} cap={} rate={} launches_per_s={per_s:.0} state={} problems={}",
            r.name,
            r.gpu,
            r.mode,
            opt(r.used_mib),
            opt(r.limit_mib),
            pct(r.sm),
            opt(r.target),
            pct(r.cap),
            rate(r.rate),
            r.state.replace(' ', "_"),
            r.problems
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::plan::plans;
    use super::*;

    #[test]
    fn rows_come_from_the_agents_view_in_plan_order() {
        let view = serde_json::json!({
            "devices": [{"index": 0, "memory_used_bytes": 3 * MIB, "memory_total_bytes": 8 * MIB, "sm_percent": 70.0}],
            "containers": [{
                "id": "serve-b",
                "meta": {"mode": "hard", "sm_target": 20},
                "gpus": [{"nvml_used_bytes": 2 * MIB, "memory_limit_bytes": 8000 * MIB,
                          "sm_percent": 19.5, "cap_percent": 20.0, "launch_rate": 1234, "launches": 99}],
                "problems": [],
                "enforcement": {"state": "running"},
            }],
        });
        let plans = plans();
        let ids: Vec<String> = plans.iter().map(|p| p.name.to_owned()).collect();
        let (d, r) = rows(&view, &plans, &ids);
        assert_eq!(d[0].total_mib, Some(8));
        assert_eq!(r.len(), plans.len());
        assert_eq!(r[0].state, "not listed yet");
        let b = &r[1];
        assert_eq!(
            (
                b.used_mib,
                b.limit_mib,
                b.sm,
                b.target,
                b.rate,
                b.state.as_str()
            ),
            (
                Some(2),
                Some(8000),
                Some(19.5),
                Some(20),
                Some(1234),
                "running"
            )
        );
        let per_s = vec![0.0; r.len()];
        let lines = plain(4, &d, &r, &per_s);
        assert!(lines.iter().all(|l| !l.contains('\x1b')));
        assert!(
            lines.contains(&"t=4s container=serve-b gpu=0 mode=hard memory=2/8000MiB sm=19.5% target=20 cap=20.0 rate=1234 launches_per_s=0 state=running problems=0".to_owned()),
            "{lines:#?}"
        );
        assert_eq!(table(&d, &r, &per_s).len(), 1 + 1 + 1 + 1 + plans.len());
        // Only serve-b has its rate; by its agent id, whatever that is.
        assert_eq!(not_taken_over(&view, &ids[..2]), vec!["train-a"]);
        let (_, r) = rows(&view, &plans[1..2], &["other".to_owned()]);
        assert_eq!(r[0].state, "not listed yet");
    }
}
