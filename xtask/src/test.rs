//! `cargo xtask test`: the one command CI runs.
//!
//! As root, `cargo test` runs in a private mount namespace without bpffs,
//! tracefs and debugfs ([`private_mounts`]): every privileged test meets
//! a new node, and nothing it mounts or pins reaches the host. Its output
//! is printed as it comes and scanned for skips ([`skips`]); under
//! `CI=true` any skip fails the run.

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
    cmd.current_dir(sh::workspace_root())
        .args(["test", "--workspace"])
        .env("TESSERA_ARTIFACTS", artifacts.path())
        // Shows what passing tests printed, and so their skip lines.
        .args(["--", "--show-output"])
        .args(&args.cargo_test_args);
    let (status, skipped) = skips::run_teed(&mut cmd)?;
    let listed: String = skipped.iter().map(|s| format!("\n  {s}")).collect();
    if !status.success() {
        bail!("the tests failed ({status}){listed}");
    }
    if !skipped.is_empty() {
        if skips::in_ci() {
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
