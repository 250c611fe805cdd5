//! `tessera-region`: create, update and inspect a container's region
//! directory by hand (development, demos, the real-GPU bundle). On a node
//! the agent does this.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tessera_region::control::ControlSpec;
use tessera_region::file::{CONTROL_FILE, USAGE_FILE, create_control, create_usage, open_control};
use tessera_region::layout::{FLAG_FAIL_OPEN, UNLIMITED};
use tessera_region::reader::read_usage;
use tessera_region::spec::{format_uuid, parse_gpu};

#[derive(Parser)]
#[command(
    name = "tessera-region",
    about = "Create, update and inspect a Tessera region directory"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create DIR with a control region (these limits) and a usage region.
    Create(Limits),
    /// Publish new limits to an existing DIR (running processes see them).
    Set(Limits),
    /// Print DIR's limits and usage as JSON.
    Show {
        /// The region directory.
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct Limits {
    /// The region directory.
    #[arg(long)]
    dir: PathBuf,
    /// A GPU and its limits:
    /// GPU-<uuid>[,memory=<MiB>][,overhead=<MiB>][,rate=<warps/s>][,burst=<warps>].
    /// Repeat for several GPUs.
    #[arg(long = "gpu", required = true)]
    gpus: Vec<String>,
    /// Let GPU calls pass through unlimited if the region becomes unusable.
    #[arg(long)]
    fail_open: bool,
}

fn spec(l: &Limits) -> Result<ControlSpec> {
    Ok(ControlSpec {
        flags: if l.fail_open { FLAG_FAIL_OPEN } else { 0 },
        gpus: l
            .gpus
            .iter()
            .map(|g| parse_gpu(g))
            .collect::<Result<_, _>>()?,
    })
}

fn limit(v: u64) -> serde_json::Value {
    if v == UNLIMITED {
        "unlimited".into()
    } else {
        v.into()
    }
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Create(l) => {
            let s = spec(&l)?;
            std::fs::create_dir_all(&l.dir)
                .with_context(|| format!("cannot create {}", l.dir.display()))?;
            create_control(&l.dir, &s)?;
            create_usage(&l.dir)?;
            println!("created {}", l.dir.display());
        }
        Command::Set(l) => {
            let s = spec(&l)?;
            tessera_region::file::open_control_rw(&l.dir)?.write(&s)?;
            println!("updated {}", l.dir.display());
        }
        Command::Show { dir } => {
            let c = open_control(&dir.join(CONTROL_FILE))?;
            c.validate(c.mapped_len())?;
            let snap = c.snapshot();
            let usage = read_usage(&tessera_region::file::read_usage_bytes(
                &dir.join(USAGE_FILE),
            )?)?;
            let gpus: Vec<serde_json::Value> = snap
                .gpus
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    serde_json::json!({
                        "uuid": format_uuid(&g.uuid),
                        "memory_limit": limit(g.memory_limit),
                        "context_overhead": g.context_overhead,
                        "launch_rate": limit(g.launch_rate),
                        "launch_burst": g.launch_burst,
                        "used": usage.used[i],
                        "launches": usage.buckets[i].launches,
                        "warps": usage.buckets[i].warps,
                        "throttled_ns": usage.buckets[i].throttled_ns,
                    })
                })
                .collect();
            let procs: Vec<serde_json::Value> = usage
                .slots
                .iter()
                .map(|s| serde_json::json!({"pid": s.pid, "state": format!("{:?}", s.state), "used": &s.used[..snap.gpus.len()]}))
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "epoch": snap.epoch,
                    "fail_open": snap.flags & FLAG_FAIL_OPEN != 0,
                    "gpus": gpus,
                    "processes": procs,
                    "anomalies": usage.anomalies,
                }))?
            );
        }
    }
    Ok(())
}
