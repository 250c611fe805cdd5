//! `gpusim node`: the effective node description.

use anyhow::{Context, Result};
use gpusim::NodeDescription;
use gpusim::state::Config;

/// The description processes use: the one in an existing state file, else
/// the one given, else the default node. Does not create a state file.
pub fn run(cfg: &Config) -> Result<()> {
    let node = if cfg.state_path.exists() {
        crate::open(cfg)?.node().clone()
    } else if let Some(path) = &cfg.node_path {
        NodeDescription::from_file(path)?
    } else {
        NodeDescription::default_node()
    };
    let text = toml::to_string(&node).context("cannot write the node description as TOML")?;
    print!("{text}");
    Ok(())
}
