//! The agent as the writer of container regions (`tessera_region`): create a
//! region directory, publish new limits to it, show its limits and usage
//! (`tessera-agent region create|set|show`). The region ABI itself is
//! crate `tessera-region`; this module only drives it.

use std::path::{Path, PathBuf};

use tessera_region::RegionError;
use tessera_region::control::ControlSpec;
use tessera_region::file::{
    CONTROL_FILE, USAGE_FILE, create_control, create_usage, open_control, open_control_rw,
    read_usage_bytes,
};
use tessera_region::layout::{FLAG_FAIL_OPEN, UNLIMITED};
use tessera_region::reader::read_usage;
use tessera_region::spec::{SpecError, format_uuid, parse_gpu};

/// `tessera-agent region …`.
#[derive(Debug, clap::Subcommand)]
pub enum RegionCommand {
    /// Create DIR with a control region (these limits) and a usage region.
    /// An existing control file is replaced by a new one (processes that
    /// mapped the old one keep its limits); use `set` to change the limits
    /// of running processes.
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

/// A region directory and the limits to write to it.
#[derive(Debug, clap::Args)]
pub struct Limits {
    /// The region directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// A GPU and its limits:
    /// GPU-<uuid>[,memory=<MiB>][,overhead=<MiB>][,rate=<warps/s>][,burst=<warps>].
    /// Repeat for several GPUs.
    #[arg(long = "gpu", required = true)]
    pub gpus: Vec<String>,
    /// Let GPU calls pass through unlimited if the region becomes unusable.
    #[arg(long)]
    pub fail_open: bool,
}

/// Why a region command failed.
#[derive(Debug, thiserror::Error)]
pub enum RegionCommandError {
    /// A `--gpu` value is malformed.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The directory could not be created.
    #[error("cannot create region directory {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A region file could not be written or read.
    #[error("region directory {dir}")]
    Region {
        /// The directory.
        dir: PathBuf,
        /// Cause.
        #[source]
        source: RegionError,
    },
}

fn in_dir(dir: &Path) -> impl FnOnce(RegionError) -> RegionCommandError + '_ {
    move |source| RegionCommandError::Region {
        dir: dir.to_path_buf(),
        source,
    }
}

/// The control spec `limits` describe.
pub fn spec(limits: &Limits) -> Result<ControlSpec, RegionCommandError> {
    Ok(ControlSpec {
        flags: if limits.fail_open { FLAG_FAIL_OPEN } else { 0 },
        gpus: limits
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

/// DIR's limits and usage, as `show` prints them.
pub fn show(dir: &Path) -> Result<serde_json::Value, RegionCommandError> {
    let c = open_control(&dir.join(CONTROL_FILE)).map_err(in_dir(dir))?;
    c.validate(c.mapped_len()).map_err(in_dir(dir))?;
    let snap = c.snapshot();
    let usage = read_usage_bytes(&dir.join(USAGE_FILE))
        .and_then(|b| read_usage(&b))
        .map_err(in_dir(dir))?;
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
                "launch_floor": g.launch_floor,
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
        .map(|s| {
            serde_json::json!({
                "pid": s.pid,
                "state": format!("{:?}", s.state),
                "used": &s.used[..snap.gpus.len()],
            })
        })
        .collect();
    Ok(serde_json::json!({
        "epoch": snap.epoch,
        "fail_open": snap.flags & FLAG_FAIL_OPEN != 0,
        "gpus": gpus,
        "processes": procs,
        "anomalies": usage.anomalies,
    }))
}

/// Runs `command`; returns what to print.
pub fn run(command: &RegionCommand) -> Result<String, RegionCommandError> {
    match command {
        RegionCommand::Create(l) => {
            let s = spec(l)?;
            std::fs::create_dir_all(&l.dir).map_err(|source| RegionCommandError::Dir {
                path: l.dir.clone(),
                source,
            })?;
            create_control(&l.dir, &s).map_err(in_dir(&l.dir))?;
            create_usage(&l.dir).map_err(in_dir(&l.dir))?;
            Ok(format!("created {}", l.dir.display()))
        }
        RegionCommand::Set(l) => {
            let s = spec(l)?;
            open_control_rw(&l.dir)
                .and_then(|c| c.write(&s))
                .map_err(in_dir(&l.dir))?;
            Ok(format!("updated {}", l.dir.display()))
        }
        RegionCommand::Show { dir } => {
            let v = show(dir)?;
            Ok(serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string()))
        }
    }
}
