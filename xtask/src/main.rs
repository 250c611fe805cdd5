//! `cargo xtask <command>`: everything a developer or CI runs, from a machine
//! that has nothing but the stable Rust toolchain.
//!
//! - `setup`  installs what the build needs beyond stable Rust (idempotent)
//! - `build`  builds every artifact into `target/tessera/<profile>/`
//! - `test`   setup + build + fmt + clippy + all tests
//! - `demo`   runs workloads on a simulated GPU node
//! - `bench`  prints the benchmark figures quoted in the README
//! - `gpu-bundle` builds a folder to run on a real NVIDIA GPU with PyTorch
//! - `images` writes the container images as OCI archives

mod artifacts;
mod bench;
mod build;
mod bundle;
mod cluster;
mod demo;
mod ebpf;
mod files;
mod headers;
mod images;
mod private_mounts;
mod setup;
mod sh;
mod skips;
mod sys;
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
    /// Install the nightly toolchain, bpf-linker and the Debian and Python packages the tests need.
    ///
    /// Installs a nightly with rust-src, rustfmt and clippy (where rustup
    /// cannot, stable with rust-src, whose eBPF build then runs under
    /// RUSTC_BOOTSTRAP=1); bpf-linker built against that toolchain's LLVM
    /// (under target/tools/); as root, the Debian packages strace, gcc and
    /// libc6-dev; and, where python3 is present, the Helm SDK the chart
    /// tests use (pip). Set TESSERA_NIGHTLY to use a given toolchain
    /// (TESSERA_NIGHTLY=stable forces the stable path); build and test
    /// read it too.
    Setup(setup::Args),
    /// Build every artifact into target/tessera/<profile>/.
    ///
    /// The eBPF objects need the nightly and bpf-linker that `setup`
    /// installs (TESSERA_NIGHTLY picks the nightly, as for setup).
    Build(build::Args),
    /// Set up, build, check formatting and lints, and run all tests.
    ///
    /// TESSERA_NIGHTLY picks the nightly, as for setup.
    Test(test::Args),
    /// Run workloads on a simulated GPU node under Tessera's limits (--cluster: as pods on the local Kubernetes).
    Demo(demo::Args),
    /// Print the benchmark figures quoted in the README.
    Bench(bench::Args),
    /// Build a folder that shows the limits on a real NVIDIA GPU with PyTorch.
    GpuBundle(bundle::Args),
    /// Run a real single-node Kubernetes here: `cluster up | down | status`.
    ///
    /// Builds (once, cached) Kubernetes v1.37.2, containerd 2.x, runc and
    /// the CNI plugins from the Go modules under xtask/cluster/, and runs
    /// them as root with everything under target/cluster/ (kubeconfig,
    /// logs/). `down` stops only what `up` started.
    Cluster(cluster::Args),
    /// Write the container images as OCI archives into target/images/.
    ///
    /// tessera-agent and tessera-scheduler (from the release build), the
    /// upstream kube-scheduler the chart runs beside the extender (built
    /// from xtask/cluster/kube), and the simulator's CUDA workload; named
    /// as the chart's defaults name them. No Docker daemon or registry is
    /// needed; push the archives with e.g. `skopeo copy oci-archive:...`.
    /// `--import` imports them into the cluster of `cargo xtask cluster`.
    Images(images::Args),
    /// Run a command in a private mount namespace without bpffs, tracefs
    /// and debugfs (as root; `test` runs `cargo test` so).
    #[command(name = private_mounts::SUBCOMMAND, hide = true)]
    InPrivateMounts(private_mounts::Args),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Setup(args) => setup::run(&args).map(|_| ()),
        Command::Build(args) => build::run(&args, None).map(|_| ()),
        Command::Test(args) => test::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::GpuBundle(args) => bundle::run(&args),
        Command::Cluster(args) => cluster::run(&args),
        Command::Images(args) => images::run(&args),
        Command::InPrivateMounts(args) => private_mounts::run(&args),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_nightly_is_chosen_by_environment_only() {
        // A setup-only flag would not reach build and test, which read
        // TESSERA_NIGHTLY alone.
        assert!(Cli::try_parse_from(["xtask", "setup", "--nightly", "nightly"]).is_err());
        let help = Cli::command()
            .find_subcommand_mut("setup")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains(crate::setup::NIGHTLY_ENV), "{help}");
    }
}
