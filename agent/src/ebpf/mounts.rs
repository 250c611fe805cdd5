//! Mounting the pseudo file systems the observer needs when the host (or
//! the agent's container) has not: tracefs for tracepoint ids, bpffs for
//! pins.

use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, mount};

use crate::mountinfo;

/// Where tracefs is expected; aya also looks at the debugfs location.
pub const TRACEFS: &str = "/sys/kernel/tracing";
const TRACEFS_IN_DEBUGFS: &str = "/sys/kernel/debug/tracing";
/// Where bpffs is expected.
pub const BPFFS: &str = "/sys/fs/bpf";

/// Errors mounting.
#[derive(Debug, thiserror::Error)]
#[error("cannot mount {fs} at {path}")]
pub struct MountError {
    /// The file system type.
    pub fs: &'static str,
    /// The mount point.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

/// Makes sure tracefs is mounted; returns whether this call mounted it.
pub fn ensure_tracefs() -> Result<bool, MountError> {
    let _guard = MOUNTING.lock().unwrap_or_else(|p| p.into_inner());
    let usable = |dir: &str| Path::new(dir).join("events").is_dir();
    if usable(TRACEFS) || usable(TRACEFS_IN_DEBUGFS) {
        return Ok(false);
    }
    mount_fs("tracefs", Path::new(TRACEFS))?;
    Ok(true)
}

/// Makes sure bpffs is mounted at `path`; returns whether this call
/// mounted it.
pub fn ensure_bpffs(path: &Path) -> Result<bool, MountError> {
    let _guard = MOUNTING.lock().unwrap_or_else(|p| p.into_inner());
    if is_mount_of(path, "bpf") {
        return Ok(false);
    }
    mount_fs("bpf", path)?;
    Ok(true)
}

/// Serialises check-and-mount within the process, so two threads do not
/// stack two mounts (the second would hide what was made on the first).
static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn mount_fs(fs: &'static str, path: &Path) -> Result<(), MountError> {
    let err = |source| MountError {
        fs,
        path: path.to_owned(),
        source,
    };
    std::fs::create_dir_all(path).map_err(err)?;
    mount(fs, path, fs, MountFlags::empty(), None).map_err(|e| err(e.into()))
}

fn is_mount_of(path: &Path, fs: &str) -> bool {
    mountinfo::read().is_ok_and(|mounts| {
        mounts
            .iter()
            .any(|m| m.fs_type == fs && m.mount_point == path)
    })
}
