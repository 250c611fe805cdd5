//! `gpusim xid` and `gpusim lost`: fault injection.

use anyhow::{Context, Result};
use gpusim::state::Config;

#[derive(Debug, clap::Args)]
pub struct XidArgs {
    /// GPU index.
    gpu: usize,
    /// Xid code (e.g. 13 graphics engine exception, 31 memory page fault,
    /// 48 double-bit ECC error, 79 fallen off the bus).
    code: u64,
}

#[derive(Debug, clap::Args)]
pub struct LostArgs {
    /// GPU index.
    gpu: usize,
    /// Mark the GPU healthy again instead.
    #[arg(long)]
    clear: bool,
}

pub fn xid(cfg: &Config, args: &XidArgs) -> Result<()> {
    let sim = crate::open(cfg)?;
    let seq = sim
        .inject_xid(args.gpu, args.code)
        .with_context(|| format!("cannot inject Xid {} on GPU {}", args.code, args.gpu))?;
    println!(
        "injected Xid {} on GPU {} (event {seq})",
        args.code, args.gpu
    );
    Ok(())
}

pub fn lost(cfg: &Config, args: &LostArgs) -> Result<()> {
    let sim = crate::open(cfg)?;
    let what = if args.clear { "healthy" } else { "lost" };
    sim.set_lost(args.gpu, !args.clear)
        .with_context(|| format!("cannot mark GPU {} {what}", args.gpu))?;
    println!("GPU {} is {what}", args.gpu);
    Ok(())
}
