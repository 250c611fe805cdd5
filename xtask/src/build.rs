//! `cargo xtask build`: every artifact into `target/tessera/<profile>/`.

use std::fs;

use anyhow::{Context, Result};

use crate::artifacts::Artifacts;
use crate::ebpf;
use crate::files::{copy_replacing, replace_symlink};
use crate::setup::{self, Tools};
use crate::sh::{self, workspace_root};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct Args {
    /// Build with the release profile (optimised).
    #[arg(long)]
    pub release: bool,
    /// Skip the eBPF object (no nightly or bpf-linker needed).
    #[arg(long)]
    pub no_ebpf: bool,
}

/// Builds everything and returns where the artifacts are. The eBPF build
/// uses `tools` when given (e.g. from `setup::run`), else checks them with
/// `setup::ensure`.
pub fn run(args: &Args, tools: Option<&Tools>) -> Result<Artifacts> {
    let profile = if args.release { "release" } else { "debug" };
    let mut cmd = sh::cargo();
    cmd.args(["build", "--workspace", "--bins", "--lib"]);
    if args.release {
        cmd.arg("--release");
    }
    sh::run(&mut cmd)?;

    let target = workspace_root().join("target").join(profile);
    let out = Artifacts::for_profile(profile);
    for dir in [out.bin(), out.lib(), out.sim(), out.ebpf()] {
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    for bin in ["gpusim", "tessera-agent", "tessera-scheduler"] {
        copy_replacing(&target.join(bin), &out.bin().join(bin))?;
    }
    copy_replacing(
        &target.join("libtessera.so"),
        &out.lib().join("libtessera.so"),
    )?;
    copy_replacing(&target.join("libcuda.so"), &out.sim().join("libcuda.so.1"))?;
    copy_replacing(
        &target.join("libnvidia_ml.so"),
        &out.sim().join("libnvidia-ml.so.1"),
    )?;
    replace_symlink("libcuda.so.1", &out.sim().join("libcuda.so"))?;
    replace_symlink("libnvidia-ml.so.1", &out.sim().join("libnvidia-ml.so"))?;

    if !args.no_ebpf {
        let ensured;
        let tools = match tools {
            Some(tools) => tools,
            None => {
                ensured = setup::ensure()?;
                &ensured
            }
        };
        ebpf::build(tools, &out.ebpf())?;
    }
    eprintln!("artifacts in {}", out.path().display());
    Ok(out)
}
