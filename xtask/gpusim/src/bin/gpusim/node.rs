//! `gpusim node`: the effective node description.

use anyhow::{Context, Result};
use gpusim::state::Config;

/// The description processes use (see [`Config::effective_node`]). Does not
/// create a state file.
pub fn run(cfg: &Config) -> Result<()> {
    let node = cfg.effective_node().with_context(|| {
        format!(
            "cannot tell the effective node description (state file {})",
            cfg.state_path.display()
        )
    })?;
    let text = toml::to_string(&node).context("cannot write the node description as TOML")?;
    print!("{text}");
    Ok(())
}
