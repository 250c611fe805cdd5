//! Accuracy of the compute controller on the simulated node: 1, 2 and 3
//! saturating containers on one GPU at targets 30, 50 and 20, hard and
//! elastic, and the same under a bang-bang limiter (a fixed ±10 % rate
//! step per period, as HAMi's limiter works) for comparison.
//!
//! Per container it prints the target, the share it should get (the
//! target when hard; the allocation when elastic), what it got over the
//! steady state (4 s to the end) by the simulator's own record, the error,
//! the settling time (the first time after which the use, averaged over 3
//! periods, stays within 2 pp of the share), the jitter of the launch
//! rate in the steady state (standard deviation over mean), and the
//! largest excess the watchdog's compute-overage rule could reckon for it
//! over the whole run, from its first period, without the credit it
//! earns ("excess": ms of GPU time above the caps in force a period
//! earlier plus the margin, over any stretch of periods,
//! `watchdog::compute`; a compute overage is an excess above the
//! tolerance, which must stay above it). The simulator's
//! timeline runs on wall-clock time, so a loaded machine (load average
//! printed) shows as noise.
//!
//! Run: `cargo xtask build --no-ebpf && TESSERA_ARTIFACTS=$PWD/target/tessera/debug
//! cargo bench -p tessera-agent --bench control_accuracy`; arguments after
//! `--`: `quick` (6 s runs instead of 10), `trace` (every period), and
//! words that select cases by name (`elastic`, `bang`).
#![allow(
    clippy::unwrap_used,
    reason = "a benchmark binary: failing loudly is fine"
)]

#[path = "../tests/control_support/mod.rs"]
mod control_support;

use control_support::{
    Limiter, Run, Scenario, Spec, huge_kernels, in_child, spin_kernels, wide_kernels,
};
use tessera_agent::control::Mode;

const STEADY_FROM_S: f64 = 4.0;

struct Case {
    name: &'static str,
    limiter: Limiter,
    mode: Mode,
    targets: Vec<f64>,
    /// The share each should get.
    expected: Vec<f64>,
}

fn workload(i: usize, secs: f64) -> String {
    // Three kernel shapes: 200 µs kernels of 8 warps, 23 µs kernels of
    // 6400 warps, 5 ms kernels of one warp.
    match i % 3 {
        0 => spin_kernels(secs),
        1 => wide_kernels(secs),
        _ => huge_kernels(secs),
    }
}

/// The largest excess (ms) the watchdog's compute-overage rule could
/// reckon for container `i` over the run, had it no credit: the most GPU
/// time above the caps in force a period earlier plus the margin, over
/// any stretch of periods (the rule's credit only lowers it).
fn over_cap(run: &Run, i: usize) -> f64 {
    use tessera_agent::watchdog::compute::MARGIN_PP;
    let (mut best, mut here) = (f64::NEG_INFINITY, 0.0_f64);
    let mut last: Option<(f64, f64)> = None;
    for p in &run.periods {
        let cap = p.cap.get(i).copied();
        if let (Some(m), Some((t, lagged))) = (p.used[i], last) {
            let ms = ((p.t - t) * 1000.0).clamp(0.0, 1000.0);
            let x = (m - lagged - MARGIN_PP) / 100.0 * ms;
            here = x.max(here + x);
            best = best.max(here);
        }
        if let Some(c) = cap {
            last = Some((p.t, c));
        }
    }
    best
}

/// The first time after which the 3-period mean of container `i` stays
/// within `tol` of `want`.
fn settled(run: &Run, i: usize, want: f64, tol: f64) -> Option<f64> {
    let used: Vec<f64> = run
        .periods
        .iter()
        .map(|p| p.used[i].unwrap_or(0.0))
        .collect();
    let mut at = None;
    for k in 2..used.len() {
        let mean = (used[k] + used[k - 1] + used[k - 2]) / 3.0;
        if (mean - want).abs() <= tol {
            at.get_or_insert(run.periods[k - 2].t);
        } else {
            at = None;
        }
    }
    at
}

fn jitter(run: &Run, i: usize) -> f64 {
    let r: Vec<f64> = run
        .periods
        .iter()
        .filter(|p| p.t >= STEADY_FROM_S)
        .map(|p| p.rate[i] as f64)
        .collect();
    let n = r.len().max(1) as f64;
    let mean = r.iter().sum::<f64>() / n;
    let var = r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    100.0 * var.sqrt() / mean.max(1e-9)
}

fn main() {
    if control_support::child_main() {
        return;
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let quick = args.iter().any(|a| a == "quick");
    let trace = args.iter().any(|a| a == "trace");
    let only: Vec<&String> = args
        .iter()
        .filter(|a| *a != "quick" && *a != "trace")
        .collect();
    let seconds = if quick { 6.0 } else { 10.0 };
    let hard = |name, targets: Vec<f64>, limiter| Case {
        name,
        limiter,
        mode: Mode::Hard,
        expected: targets.clone(),
        targets,
    };
    let elastic = |name, targets: Vec<f64>, expected| Case {
        name,
        limiter: Limiter::Tessera,
        mode: Mode::Elastic,
        targets,
        expected,
    };
    let cases = vec![
        hard("hard 1", vec![30.0], Limiter::Tessera),
        hard("hard 2", vec![30.0, 50.0], Limiter::Tessera),
        hard("hard 3", vec![30.0, 50.0, 20.0], Limiter::Tessera),
        hard("hard 30/70", vec![30.0, 70.0], Limiter::Tessera),
        elastic("elastic 1", vec![30.0], vec![100.0]),
        elastic("elastic 2", vec![30.0, 50.0], vec![37.5, 62.5]),
        elastic("elastic 3", vec![30.0, 50.0, 20.0], vec![30.0, 50.0, 20.0]),
        hard("bang-bang 3", vec![30.0, 50.0, 20.0], Limiter::BangBang),
        hard("bang-bang 30/70", vec![30.0, 70.0], Limiter::BangBang),
    ];
    println!(
        "{:<16} {:>3} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7}",
        "case", "#", "target", "share", "got", "error", "settle", "jitter", "excess"
    );
    let mut worst_error: f64 = 0.0;
    let mut worst_settle: f64 = 0.0;
    let mut worst_over: f64 = f64::NEG_INFINITY;
    for case in cases {
        if !only.is_empty() && !only.iter().any(|o| case.name.contains(o.as_str())) {
            continue;
        }
        let scenario = Scenario {
            containers: case
                .targets
                .iter()
                .enumerate()
                .map(|(i, &t)| {
                    Spec::new(&format!("c{i}"), t, case.mode, workload(i, seconds + 3.0))
                })
                .collect(),
            changes: vec![],
            seconds,
            limiter: case.limiter,
            windows: vec![(STEADY_FROM_S, seconds)],
        };
        let run = in_child(&scenario, &[]);
        if trace {
            println!("{}", control_support::table(&run));
        }
        for (i, (&t, &want)) in case.targets.iter().zip(&case.expected).enumerate() {
            let got = run.oracle[0][i];
            let settle = settled(&run, i, want, 2.0);
            println!(
                "{:<16} {:>3} {:>7.1} {:>7.1} {:>7.1} {:>+7.1} {:>8} {:>7.1}% {:>+7.0}",
                case.name,
                i,
                t,
                want,
                got,
                got - want,
                settle.map_or("never".into(), |s| format!("{s:.1} s")),
                jitter(&run, i),
                over_cap(&run, i),
            );
            if case.limiter == Limiter::Tessera {
                worst_error = worst_error.max((got - want).abs());
                worst_settle = worst_settle.max(settle.unwrap_or(f64::INFINITY));
                worst_over = worst_over.max(over_cap(&run, i));
            }
        }
        println!(
            "{:<16}     device busy {:.0} %, load average {:.1}, late ticks {}",
            "", run.oracle_busy[0], run.load, run.late_ticks
        );
    }
    println!(
        "tessera: worst steady-state error {worst_error:.1} pp, worst settling {worst_settle:.1} s, largest excess by the watchdog's rule {worst_over:+.0} ms (tolerance {} ms)",
        tessera_agent::watchdog::compute::TOLERANCE_MS
    );
}
