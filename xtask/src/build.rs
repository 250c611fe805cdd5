//! `cargo xtask build`: every artifact into `target/tessera/<profile>/`.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

use crate::artifacts::Artifacts;
use crate::sh::{self, workspace_root};
use crate::{ebpf, setup};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct Args {
    /// Build with the release profile (optimised).
    #[arg(long)]
    pub release: bool,
    /// Skip the eBPF object (no nightly or bpf-linker needed).
    #[arg(long)]
    pub no_ebpf: bool,
}

/// Builds everything and returns where the artifacts are.
pub fn run(args: &Args) -> Result<Artifacts> {
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
    for bin in [
        "gpusim",
        "tessera-agent",
        "tessera-scheduler",
        "tessera-region",
    ] {
        copy(&target.join(bin), &out.bin().join(bin))?;
    }
    copy(
        &target.join("libtessera.so"),
        &out.lib().join("libtessera.so"),
    )?;
    copy(&target.join("libcuda.so"), &out.sim().join("libcuda.so.1"))?;
    copy(
        &target.join("libnvidia_ml.so"),
        &out.sim().join("libnvidia-ml.so.1"),
    )?;
    symlink("libcuda.so.1", &out.sim().join("libcuda.so"))?;
    symlink("libnvidia-ml.so.1", &out.sim().join("libnvidia-ml.so"))?;

    if !args.no_ebpf {
        let tools = setup::ensure()?;
        ebpf::build(&tools, args.release, &out.ebpf())?;
    }
    eprintln!("artifacts in {}", out.path().display());
    Ok(out)
}

/// Copies through a temporary name and renames, so a process that has the
/// old file mapped keeps a consistent image.
fn copy(from: &Path, to: &Path) -> Result<()> {
    let tmp = to.with_extension("tmp-copy");
    fs::copy(from, &tmp)
        .with_context(|| format!("cannot copy {} to {}", from.display(), tmp.display()))?;
    fs::rename(&tmp, to)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), to.display()))
}

fn symlink(target: &str, link: &Path) -> Result<()> {
    match fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", link.display())),
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot link {} -> {target}", link.display()))
}
