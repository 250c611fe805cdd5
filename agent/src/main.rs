//! `tessera-agent`: the Tessera node agent.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tessera_agent::gpu::{GpuArgs, Inventory};

/// The Tessera node agent: one per GPU node.
#[derive(Debug, Parser)]
#[command(name = "tessera-agent", version)]
struct Cli {
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the node's GPUs as NVML reports them.
    Inventory {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn inventory(cli: &Cli, json: bool) -> Result<()> {
    let backend = cli.gpu.backend()?;
    let inventory = Inventory::collect(&backend).context("cannot take the GPU inventory")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&inventory)?);
    } else {
        print!("{}", inventory.table());
    }
    Ok(())
}

/// The error and its causes on one line, leaving out a cause whose text
/// the previous message already quotes (nvml-wrapper repeats its
/// libloading error).
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if last.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        last = text;
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Inventory { json } => inventory(&cli, *json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-agent: error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}
