//! Placement quality on every Alibaba openb trace: runs binpack (best
//! fit), FGD and Tessera's default by workload inflation over several
//! seeds, prints the figures, and fails if the default leaves more GPUs
//! unallocated than best fit or FGD on any trace (means over the seeds).
//!
//! `cargo bench -p tessera-scheduler --bench openb`; the trace folder is
//! `TESSERA_OPENB` (default: `shared/data/openb` beside the worktree, as in
//! this project's layout), the number of seeds `TESSERA_OPENB_RUNS`
//! (default 3, seeds 1..).

use std::path::PathBuf;
use std::process::ExitCode;

use tessera_scheduler::placement::Policy;
use tessera_scheduler::simulate::{self, Options};

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
    for pod_list in &pods {
        let options = Options {
            nodes: nodes.clone(),
            pods: pod_list.clone(),
            policies: vec![Policy::Binpack, Policy::Fgd, Policy::Tessera],
            seeds: (1..=runs).collect(),
            latency_pods: 0,
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
        let figure = |p: Policy| {
            outcome
                .policies
                .iter()
                .find(|r| r.policy == p)
                .map_or(f64::NAN, |r| r.unallocated_gpus())
        };
        let (binpack, fgd, tessera) = (
            figure(Policy::Binpack),
            figure(Policy::Fgd),
            figure(Policy::Tessera),
        );
        let verdict = if tessera < binpack && tessera <= fgd {
            "ok"
        } else {
            ok = false;
            "FAIL"
        };
        println!(
            "{name}: unallocated GPUs (mean of {runs} seeds): binpack {binpack:.1}, fgd {fgd:.1}, tessera {tessera:.1} [{verdict}]"
        );
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        println!("the default policy lost to best fit or FGD on a trace");
        ExitCode::FAILURE
    }
}
