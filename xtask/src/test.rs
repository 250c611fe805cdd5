//! `cargo xtask test`: the one command CI runs.
//!
//! As root, `cargo test` runs in a private mount namespace without bpffs,
//! tracefs and debugfs ([`private_mounts`]): every privileged test meets
//! a new node, and nothing it mounts or pins reaches the host. Its output
//! is printed as it comes and scanned for skips ([`skips`]); under
//! `CI=true` any skip fails the run.

use std::path::Path;

use anyhow::{Result, bail};

use crate::{build, ebpf, private_mounts, setup, sh, skips};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct Args {
    /// Extra arguments for the test binaries (`cargo test -- ARGS`).
    #[arg(last = true)]
    pub cargo_test_args: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let tools = setup::run(&setup::Args::default())?;
    warn_if_disk_is_short(&sh::workspace_root().join("target"));

    sh::run(sh::cargo().args(["fmt", "--all", "--", "--check"]))?;
    ebpf::fmt_check(&tools)?;
    sh::run(sh::cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    ebpf::clippy(&tools)?;

    let artifacts = build::run(&build::Args::default(), Some(&tools))?;

    let mut cmd = if sh::is_root() {
        eprintln!("tests run in a private mount namespace without bpffs, tracefs and debugfs");
        private_mounts::wrap(sh::cargo_program())
    } else {
        eprintln!("not root: the privileged tests will skip");
        std::process::Command::new(sh::cargo_program())
    };
    sh::cargo_env(&mut cmd)
        .current_dir(sh::workspace_root())
        // Every failing binary is reported in one run, not only the first.
        .args(["test", "--workspace", "--no-fail-fast"])
        .env("TESSERA_ARTIFACTS", artifacts.path())
        // Shows what passing tests printed, and so their skip lines.
        .args(["--", "--show-output"])
        .args(&args.cargo_test_args);
    let (status, found) = skips::run_teed(&mut cmd)?;
    let skipped = &found.skips;
    let listed: String = skipped.iter().map(|s| format!("\n  {s}")).collect();
    if !status.success() {
        // Again at the end, where a long log's tail shows it: why each
        // test failed.
        if !found.failures.is_empty() {
            eprintln!("\nwhy the failing tests failed (their last output and panic):");
            for f in &found.failures {
                eprint!("{f}");
            }
        }
        bail!("the tests failed ({status}){listed}");
    }
    if !skipped.is_empty() {
        if sh::in_ci() {
            bail!(
                "{} test(s) skipped under CI=true (CI runs as root with everything `cargo xtask setup` installs, so a skip is a broken install step):{listed}",
                skipped.len(),
            );
        }
        eprintln!("{} test(s) skipped:{listed}", skipped.len());
    }
    eprintln!("all checks passed");
    Ok(())
}

/// What `cargo xtask test` from a clean clone writes into `target/`, with
/// room: 3.7 GB measured on 2026-12-05 (`du -s target` during
/// `CI=true bash .ci/run` in a fresh clone; 19.9 GB before the dev
/// profile dropped dependencies' debug info and CI its incremental
/// caches).
const CLEAN_RUN_BYTES: u64 = 6 << 30;

/// Says so, before anything is built, when the file system of `target`
/// has less free space than a run from a clean target needs: a disk that
/// fills midway fails the build with a linker's bus error or an LLVM I/O
/// error that does not name the cause. Only a warning: a target built
/// before needs far less.
fn warn_if_disk_is_short(target: &Path) {
    let probe = if target.exists() {
        target
    } else {
        target.parent().unwrap_or(target)
    };
    match rustix::fs::statvfs(probe) {
        Ok(fs) => {
            let free = fs.f_bavail.saturating_mul(fs.f_frsize);
            if free < CLEAN_RUN_BYTES {
                eprintln!(
                    "warning: {:.1} GiB free on the file system of {}; a run from a clean target needs about {} GiB there",
                    free as f64 / f64::from(1u32 << 30),
                    target.display(),
                    CLEAN_RUN_BYTES >> 30,
                );
            }
        }
        Err(e) => eprintln!(
            "warning: cannot read the free space of {}: {e}",
            probe.display()
        ),
    }
}
