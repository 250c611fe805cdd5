//! The eBPF programs in `agent-ebpf/programs`: a cargo workspace of its own,
//! built with nightly (or, where setup could not install one, stable under
//! `RUSTC_BOOTSTRAP=1`: [`Tools::command`]) for `bpfel-unknown-none`
//! (`-Z build-std=core`, set in its `.cargo/config.toml`) and linked by
//! bpf-linker into two objects that the agent loads: `tessera.bpf.o`
//! (observers) and `tessera-guard.bpf.o` (the per-pod device guard, loaded
//! once per pod).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::files::copy_replacing;
use crate::setup::Tools;
use crate::sh::{self, workspace_root};

/// The target triple of the programs.
const TARGET: &str = "bpfel-unknown-none";
/// The binary targets of `agent-ebpf/programs` and the object file name
/// the agent looks for of each.
const OBJECTS: [(&str, &str); 2] = [
    ("tessera", "tessera.bpf.o"),
    ("tessera-guard", "tessera-guard.bpf.o"),
];

fn programs_dir() -> PathBuf {
    workspace_root().join("agent-ebpf/programs")
}

/// Builds the programs and writes `out_dir/tessera.bpf.o` and
/// `out_dir/tessera-guard.bpf.o`.
///
/// The programs always build with the release profile, whatever the
/// profile of the other artifacts: the verifier rejects the unoptimised
/// code of a debug build.
pub fn build(tools: &Tools, out_dir: &Path) -> Result<()> {
    let dir = programs_dir();
    let target_dir = dir.join("target");
    let mut cmd = tools.command("cargo");
    cmd.current_dir(&dir)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            TARGET,
            "--target-dir",
        ])
        .arg(&target_dir);
    sh::run(&mut cmd).context("cannot build the eBPF programs in agent-ebpf/programs")?;

    fs::create_dir_all(out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    for (bin, object) in OBJECTS {
        let built = target_dir.join(TARGET).join("release").join(bin);
        let dest = out_dir.join(object);
        copy_replacing(&built, &dest)?;
        eprintln!("ebpf object: {}", dest.display());
    }
    Ok(())
}

/// `cargo fmt --check` of the programs (and nothing else) with the eBPF
/// toolchain's rustfmt.
pub fn fmt_check(tools: &Tools) -> Result<()> {
    let mut cmd = tools.command("cargo");
    cmd.current_dir(programs_dir())
        .args(["fmt", "--", "--check"]);
    sh::run(&mut cmd).context(
        "the eBPF programs are not formatted: run `cargo +nightly fmt` in agent-ebpf/programs",
    )
}

/// Clippy with `-D warnings` on the programs, for the bpf target.
pub fn clippy(tools: &Tools) -> Result<()> {
    let dir = programs_dir();
    let mut cmd = tools.command("cargo");
    cmd.current_dir(&dir)
        .args([
            "clippy",
            "--release",
            "--locked",
            "--target",
            TARGET,
            "--target-dir",
        ])
        .arg(dir.join("target"))
        .args(["--", "-D", "warnings"]);
    sh::run(&mut cmd).context("clippy found problems in the eBPF programs")
}
