//! Finding the programs a test runs (promtool, prometheus, unshare, …).

use std::path::PathBuf;

/// `program` in a directory of `PATH`, if it is there.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
