//! Running commands with their command line echoed, and failing with a
//! message that names the command.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The cargo that runs xtask.
pub fn cargo_program() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// A `cargo` command using the same cargo that runs xtask, with
/// [`cargo_env`].
pub fn cargo() -> Command {
    let mut cmd = Command::new(cargo_program());
    cmd.current_dir(workspace_root());
    cargo_env(&mut cmd);
    cmd
}

/// The environment of every cargo that xtask starts. Under CI,
/// incremental compilation is off: a fresh clone builds each crate once,
/// so its caches (3.3 GB of a clean `cargo xtask test`) are disk spent for
/// nothing. Elsewhere cargo's defaults stand, so that a developer's next
/// build stays incremental.
pub fn cargo_env(cmd: &mut Command) -> &mut Command {
    if in_ci() {
        cmd.env("CARGO_INCREMENTAL", "0");
    }
    cmd
}

/// Whether this run is CI's: `CI` is `true` (or `1`), as CI services set it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Human-readable command line.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd`, echoing it, and fails unless it exits with status 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    eprintln!("$ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed with {status}");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; fails unless it exits with status 0.
pub fn output(cmd: &mut Command) -> Result<String> {
    let line = describe(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Where `program` is on `PATH`, if it is (the tests' lookup).
pub use tessera_testkit::programs::on_path;

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // `id -u` keeps xtask free of unsafe code.
    output(Command::new("id").arg("-u"))
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}
