//! placeholder, written by the eBPF helper
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Args {}
pub struct Tools;
pub fn run(_: &Args) -> anyhow::Result<()> { Ok(()) }
pub fn ensure() -> anyhow::Result<Tools> { Ok(Tools) }
