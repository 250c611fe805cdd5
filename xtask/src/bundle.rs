//! `cargo xtask gpu-bundle`: a folder that shows the limits on a real
//! NVIDIA GPU with PyTorch, without Rust on that machine: the release
//! `libtessera.so` and `tessera-agent` plus the scripts in
//! `xtask/gpu-bundle/`.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::build;
use crate::sh::workspace_root;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct Args {
    /// Where to put the bundle (default: target/tessera/gpu-bundle).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<()> {
    let artifacts = build::run(
        &build::Args {
            release: true,
            no_ebpf: true,
        },
        None,
    )?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| workspace_root().join("target/tessera/gpu-bundle"));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let copy = |from: PathBuf, name: &str| -> Result<()> {
        std::fs::copy(&from, out.join(name))
            .with_context(|| format!("cannot copy {} into {}", from.display(), out.display()))
            .map(|_| ())
    };
    copy(artifacts.lib().join("libtessera.so"), "libtessera.so")?;
    copy(artifacts.bin().join("tessera-agent"), "tessera-agent")?;
    let src = workspace_root().join("xtask/gpu-bundle");
    for f in [
        "run.sh",
        "controller.sh",
        "tessera_region.py",
        "torch_limits.py",
        "driver_pages.py",
        "README.md",
    ] {
        copy(src.join(f), f)?;
    }
    println!("gpu bundle in {} (run ./run.sh there)", out.display());
    Ok(())
}
