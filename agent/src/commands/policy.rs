//! `tessera-agent policy check FILE`: the policy file as the agent would
//! load it, for operators and CI (exit status 1 with the error naming
//! file, line, column and field when it would be refused).

use std::path::PathBuf;

use crate::policy::{PolicyError, file};

/// `tessera-agent policy …`.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// Parse and check a policy file; print it with every default written
    /// out (the policy the agent would apply), or why it would be refused.
    Check {
        /// The policy file (YAML).
        file: PathBuf,
    },
}

/// Runs `command`; returns what to print.
pub fn run(command: &PolicyCommand) -> Result<String, PolicyError> {
    match command {
        PolicyCommand::Check { file: path } => {
            let policy = file::read(path)?;
            Ok(format!(
                "# {}: accepted, {} rule(s)\n{}",
                path.display(),
                policy.rules.len(),
                file::to_yaml(&policy).trim_end()
            ))
        }
    }
}
