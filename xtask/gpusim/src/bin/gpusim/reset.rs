//! `gpusim reset`: clear the simulated GPUs, or remove the state file.

use std::io;

use anyhow::{Context, Result, bail};
use gpusim::state::{Config, StateError};
use gpusim::{Sim, SimError};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Clear only this GPU.
    #[arg(long, conflicts_with = "remove")]
    gpu: Option<usize>,
    /// Remove the state file without reading it: the way out when it was
    /// written by another gpusim version. Processes that have it open keep
    /// their copy; new ones create a fresh file.
    #[arg(long)]
    remove: bool,
}

pub fn run(cfg: &Config, args: &Args) -> Result<()> {
    let path = &cfg.state_path;
    if args.remove {
        return remove(cfg);
    }
    let sim = match Sim::open(cfg) {
        Ok(sim) => sim,
        // A file this build cannot use (or made for another node) cannot
        // be cleared in place; a whole-node reset replaces it.
        Err(SimError::State(
            e @ (StateError::Incompatible { .. } | StateError::NodeMismatch { .. }),
        )) if args.gpu.is_none() => {
            remove(cfg)?;
            println!("(it was unusable: {e})");
            return Ok(());
        }
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot open the simulated node (state file {}); `gpusim reset --remove` deletes it",
                    path.display()
                )
            });
        }
    };
    let gpus: Vec<usize> = match args.gpu {
        Some(g) if g >= sim.gpu_count() => {
            bail!(
                "there is no GPU {g} on the simulated node ({} GPUs)",
                sim.gpu_count()
            )
        }
        Some(g) => vec![g],
        None => (0..sim.gpu_count()).collect(),
    };
    for &g in &gpus {
        sim.reset_gpu(g)
            .with_context(|| format!("cannot reset GPU {g}"))?;
    }
    sim.state().bump_generation();
    match args.gpu {
        Some(g) => println!("reset GPU {g} in {}", path.display()),
        None => println!("reset {} GPUs in {}", gpus.len(), path.display()),
    }
    Ok(())
}

fn remove(cfg: &Config) -> Result<()> {
    let path = &cfg.state_path;
    match std::fs::remove_file(path) {
        Ok(()) => println!("removed state file {}", path.display()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            println!("no state file at {}", path.display())
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cannot remove state file {}", path.display()));
        }
    }
    Ok(())
}
