//! `cargo xtask <command>`: everything a developer or CI runs, from a machine
//! that has nothing but the stable Rust toolchain.
//!
//! - `setup`  installs what the build needs beyond stable Rust (idempotent)
//! - `build`  builds every artifact into `target/tessera/<profile>/`
//! - `test`   setup + build + fmt + clippy + all tests
//! - `demo`   runs workloads on a simulated GPU node
//! - `bench`  prints the benchmark figures quoted in the README
//! - `gpu-bundle` builds a folder to run on a real NVIDIA GPU with PyTorch

mod artifacts;
mod bench;
mod build;
mod bundle;
mod demo;
mod ebpf;
mod files;
mod setup;
mod sh;
mod test;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Tessera developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install nightly rust-src, bpf-linker and the Debian packages the tests need.
    Setup(setup::Args),
    /// Build every artifact into target/tessera/<profile>/.
    Build(build::Args),
    /// Set up, build, check formatting and lints, and run all tests.
    Test(test::Args),
    /// Run workloads on a simulated GPU node under Tessera's limits.
    Demo(demo::Args),
    /// Print the benchmark figures quoted in the README.
    Bench(bench::Args),
    /// Build a folder that shows the limits on a real NVIDIA GPU with PyTorch.
    GpuBundle(bundle::Args),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Setup(args) => setup::run(&args),
        Command::Build(args) => build::run(&args).map(|_| ()),
        Command::Test(args) => test::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::GpuBundle(args) => bundle::run(&args),
    }
}
