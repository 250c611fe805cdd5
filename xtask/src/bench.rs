//! `cargo xtask bench`: the benchmark figures quoted in the README.
//!
//! - `libtessera.so` overhead per launch and per allocation/free pair
//!   (`preload/benches/interpose.rs`, release build);
//! - the eBPF observer's cost per ioctl and on unrelated syscalls
//!   (`agent/benches/ebpf_overhead.rs`; needs root).

use anyhow::Result;

use crate::{build, sh};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct Args {
    /// Only the interposer benchmark.
    #[arg(long)]
    pub preload_only: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let artifacts = build::run(
        &build::Args {
            release: true,
            no_ebpf: args.preload_only,
        },
        None,
    )?;
    sh::run(
        sh::cargo()
            .args(["bench", "-p", "tessera-preload", "--bench", "interpose"])
            .env("TESSERA_ARTIFACTS", artifacts.path()),
    )?;
    if !args.preload_only {
        if sh::is_root() {
            sh::run(
                sh::cargo()
                    .args(["bench", "-p", "tessera-agent", "--bench", "ebpf_overhead"])
                    .env("TESSERA_ARTIFACTS", artifacts.path()),
            )?;
        } else {
            eprintln!("skipped: the eBPF benchmark needs root");
        }
    }
    Ok(())
}
