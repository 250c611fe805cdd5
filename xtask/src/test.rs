//! `cargo xtask test`: the one command CI runs.

use anyhow::Result;

use crate::sh;
use crate::{build, ebpf, setup};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct Args {
    /// Extra arguments passed to `cargo test` (after `--`).
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

    let mut cmd = sh::cargo();
    cmd.args(["test", "--workspace"])
        .env("TESSERA_ARTIFACTS", artifacts.path());
    if !args.cargo_test_args.is_empty() {
        cmd.arg("--").args(&args.cargo_test_args);
    }
    sh::run(&mut cmd)?;
    eprintln!("all checks passed");
    Ok(())
}
