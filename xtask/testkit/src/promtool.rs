//! `promtool check metrics` (the Debian `prometheus` package, installed by
//! `cargo xtask setup`) over a `/metrics` text: the independent judge of
//! the exposition format for the agent's and the scheduler's tests.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::programs::on_path;

/// Why a promtool test cannot run here (print it as `skipped: <why>`).
pub const NOT_INSTALLED: &str = "prometheus is not installed (cargo xtask setup installs it)";

/// The `promtool` on `PATH`.
#[derive(Debug, Clone)]
pub struct Promtool(PathBuf);

/// What `promtool check metrics` said of one text.
#[derive(Debug)]
pub struct Checked {
    /// It exited 0: no error and no lint problem.
    pub success: bool,
    /// Its stdout then its stderr (its findings go to stderr).
    pub said: String,
}

impl Promtool {
    /// The `promtool` on `PATH`, or why there is none ([`NOT_INSTALLED`]).
    pub fn find() -> Result<Self, String> {
        on_path("promtool")
            .map(Self)
            .ok_or_else(|| NOT_INSTALLED.to_owned())
    }

    /// `promtool check metrics` with `text` on its stdin.
    pub fn check_metrics(&self, text: &str) -> Checked {
        let mut child = Command::new(&self.0)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.0.display()));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        Checked {
            success: out.status.success(),
            said: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
}
