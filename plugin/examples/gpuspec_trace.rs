//! Writes a pod list in which a share of the tasks constrain the GPU
//! model, derived from two openb pod lists
//! ([`tessera_scheduler::simulate::derive`]):
//!
//! `cargo run -p tessera-scheduler --example gpuspec_trace -- BASE.csv SOURCE.csv SHARE SEED > OUT.csv`
//!
//! e.g. `openb_pod_list_default.csv openb_pod_list_gpuspec20.csv 0.3333 1`
//! for a third of the tasks model-constrained (the benchmark's `gpuspec33`).

use std::path::Path;
use std::process::ExitCode;

use tessera_scheduler::simulate::{derive, trace};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [base, source, share, seed] = args.as_slice() else {
        eprintln!("usage: gpuspec_trace BASE.csv SOURCE.csv SHARE SEED");
        return ExitCode::FAILURE;
    };
    let (Ok(share), Ok(seed)) = (share.parse::<f64>(), seed.parse::<u64>()) else {
        eprintln!("SHARE is a number in 0..=1, SEED a whole number");
        return ExitCode::FAILURE;
    };
    let read = |p: &str| trace::read_pods(Path::new(p));
    match (read(base), read(source)) {
        (Ok(base), Ok(source)) => {
            print!(
                "{}",
                derive::write_pods(&derive::constrain_models(&base, &source, share, seed))
            );
            ExitCode::SUCCESS
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
