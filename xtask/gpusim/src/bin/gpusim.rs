//! `gpusim`: look at and steer the simulated GPU node.
//!
//! Every subcommand works on the node's shared state file, the one the
//! stand-in `libcuda.so.1` and `libnvidia-ml.so.1` of every process on the
//! node use; see the `gpusim` library for the model.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gpusim::Sim;
use gpusim::state::Config;

// The crate root is `src/bin/gpusim.rs`, so its modules are named by path.
#[path = "gpusim/faults.rs"]
mod faults;
#[path = "gpusim/node.rs"]
mod node;
#[path = "gpusim/reset.rs"]
mod reset;
#[path = "gpusim/show.rs"]
mod show;

/// Look at and steer the simulated GPU node (the GPUs that the stand-in
/// libcuda.so.1 and libnvidia-ml.so.1 present).
#[derive(Debug, Parser)]
#[command(name = "gpusim", version)]
struct Cli {
    /// Node description (TOML) [env: GPUSIM_NODE]; without it, the
    /// description stored in the state file, or the default node (two
    /// H100s).
    #[arg(long, global = true, value_name = "FILE")]
    node: Option<PathBuf>,
    /// Shared state file [env: GPUSIM_STATE; default:
    /// /dev/shm/gpusim-<uid>.state].
    #[arg(long, global = true, value_name = "FILE")]
    state: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the GPUs and the processes using them, like nvidia-smi.
    Show(show::Args),
    /// Inject an Xid error on a GPU (delivered as an NVML Xid event).
    Xid(faults::XidArgs),
    /// Mark a GPU lost (fallen off the bus, Xid 79), or healthy again.
    Lost(faults::LostArgs),
    /// Clear the simulated GPUs' state, or remove the state file.
    Reset(reset::Args),
    /// Print the effective node description as TOML.
    Node,
}

impl Cli {
    /// Flags first, then the environment as the libraries read it (an empty
    /// variable counts as unset).
    fn config(&self) -> Config {
        let env = Config::from_env();
        Config {
            node_path: self.node.clone().or(env.node_path),
            state_path: self.state.clone().unwrap_or(env.state_path),
        }
    }
}

/// Opens the simulated node (creating the state file if there is none).
fn open(cfg: &Config) -> Result<Sim> {
    Sim::open(cfg).with_context(|| {
        format!(
            "cannot open the simulated node (state file {})",
            cfg.state_path.display()
        )
    })
}

fn run(cli: &Cli) -> Result<()> {
    let cfg = cli.config();
    match &cli.command {
        Command::Show(args) => show::run(&cfg, args),
        Command::Xid(args) => faults::xid(&cfg, args),
        Command::Lost(args) => faults::lost(&cfg, args),
        Command::Reset(args) => reset::run(&cfg, args),
        Command::Node => node::run(&cfg),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpusim: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
