//! Placement quality on every Alibaba openb trace: runs binpack (best
//! fit), FGD and Tessera's default by workload inflation over several
//! seeds, with the lower bound on unallocated GPUs, and prints the figures.
//! Besides the shared pod lists it runs `gpuspec33`, derived from
//! `default` and `gpuspec20` with a third of the tasks model-constrained
//! ([`tessera_scheduler::simulate::derive`]). Fails if the default leaves
//! more GPUs unallocated than best fit or FGD on any trace (means over the
//! seeds), if any run beats the bound (the bound would be wrong), or if
//! the extender's filter + prioritize p99 on the default trace exceeds
//! 10 ms (unless the machine is loaded beyond its cores: then the p99 is
//! printed, not judged).
//!
//! `cargo bench -p tessera-scheduler --bench openb`; the trace folder is
//! `TESSERA_OPENB` (default: `shared/data/openb` beside the worktree, as in
//! this project's layout), the number of seeds `TESSERA_OPENB_RUNS`
//! (default 3, seeds 1..).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessera_scheduler::placement::Policy;
use tessera_scheduler::simulate::{self, Options, derive, trace};

/// The extender's latency aim, p99 per pod on the 1213-node cluster.
const P99_AIM_MS: f64 = 10.0;

fn main() -> ExitCode {
    let dir = std::env::var_os("TESSERA_OPENB").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/openb"),
        PathBuf::from,
    );
    let nodes = dir.join("openb_node_list_gpu_node.csv");
    if !nodes.exists() {
        println!(
            "skipped: no openb trace at {} (set TESSERA_OPENB)",
            dir.display()
        );
        return ExitCode::SUCCESS;
    }
    let runs: u64 = std::env::var("TESSERA_OPENB_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut pods: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    pods.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("openb_pod_list_") && n.ends_with(".csv"))
    });
    pods.sort();
    let mut ok = true;
    match gpuspec33(&dir) {
        Ok(Some(path)) => pods.push(path),
        Ok(None) => println!("gpuspec33 skipped: no default or gpuspec20 pod list"),
        Err(e) => {
            println!("gpuspec33: {e}");
            ok = false;
        }
    }
    for pod_list in &pods {
        let default = pod_list.ends_with("openb_pod_list_default.csv");
        let options = Options {
            nodes: nodes.clone(),
            pods: pod_list.clone(),
            policies: vec![Policy::Binpack, Policy::Fgd, Policy::Tessera],
            seeds: (1..=runs).collect(),
            latency_pods: if default { 1000 } else { 0 },
            bound: true,
        };
        let outcome = match simulate::simulate(&options) {
            Ok(outcome) => outcome,
            Err(e) => {
                println!("{}: {e}", pod_list.display());
                ok = false;
                continue;
            }
        };
        let name = pod_list.file_name().unwrap_or_default().to_string_lossy();
        let report = |p: Policy| outcome.policies.iter().find(|r| r.policy == p);
        let figure = |p: Policy| report(p).map_or(f64::NAN, |r| r.unallocated_gpus());
        let (binpack, fgd, tessera) = (
            figure(Policy::Binpack),
            figure(Policy::Fgd),
            figure(Policy::Tessera),
        );
        let mut verdict = if tessera < binpack && tessera <= fgd {
            "ok"
        } else {
            ok = false;
            "FAIL"
        };
        let bound = outcome.bound.as_ref();
        let lowest = bound.map_or(f64::NAN, |b| b.unallocated_gpus());
        // Every run, of every policy, at or above its seed's bound.
        let below = outcome.policies.iter().flat_map(|r| &r.runs).any(|run| {
            bound
                .and_then(|b| b.runs.iter().find(|(seed, _)| *seed == run.seed))
                .is_none_or(|&(_, b)| run.unallocated_gpus() < b - 1e-9)
        });
        if below {
            ok = false;
            verdict = "FAIL: a run beat the bound";
        }
        println!(
            "{name}: unallocated GPUs (mean of {runs} seeds): binpack {binpack:.1}, fgd {fgd:.1}, tessera {tessera:.1}, bound {lowest:.1} (tessera {:.1} above it) [{verdict}]",
            tessera - lowest
        );
        if let Some(l) = outcome.latency {
            let (load, cores) = load();
            let verdict = if l.p99_ms <= P99_AIM_MS {
                "ok"
            } else if load > cores {
                "not judged: more runnable work than cores"
            } else {
                ok = false;
                "FAIL"
            };
            println!(
                "{name}: filter+prioritize per pod ({} pods, {} nodes, load average {load:.1} on {cores} cores): p50 {:.3} ms, p99 {:.3} ms (aim ≤ {P99_AIM_MS} ms) [{verdict}]",
                l.pods, l.nodes, l.p50_ms, l.p99_ms
            );
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        println!(
            "the default policy lost to best fit or FGD on a trace, a run beat the bound, or latency missed its aim"
        );
        ExitCode::FAILURE
    }
}

/// The one-minute load average (0 where unknown) and the cores: a p99
/// measured while other work outnumbers the cores says more about the
/// machine than about the extender, and is reported but not judged.
fn load() -> (f64, f64) {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (load, cores as f64)
}

/// Writes `gpuspec33` (a third of `default`'s tasks model-constrained,
/// rules drawn from `gpuspec20`, seed 1) under the target's temporary
/// folder; `None` without the two pod lists.
fn gpuspec33(dir: &Path) -> Result<Option<PathBuf>, Box<dyn std::error::Error>> {
    let (base, source) = (
        dir.join("openb_pod_list_default.csv"),
        dir.join("openb_pod_list_gpuspec20.csv"),
    );
    if !base.exists() || !source.exists() {
        return Ok(None);
    }
    let derived = derive::constrain_models(
        &trace::read_pods(&base)?,
        &trace::read_pods(&source)?,
        1.0 / 3.0,
        1,
    );
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("openb_pod_list_gpuspec33.csv");
    std::fs::write(&path, derive::write_pods(&derived))?;
    Ok(Some(path))
}
