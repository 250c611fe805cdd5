//! Mounting the pseudo file systems the observer and the guard need when
//! the host (or the agent's container) has not: tracefs for tracepoint
//! ids, bpffs for pins.
//!
//! **Whatever needs one mounts it first**: the observer calls
//! [`ensure_tracefs`] before it attaches a tracepoint, the guard calls
//! [`ensure_bpffs`] before it makes or fills its pin directory
//! (`Guards::ensure_pin_dir`). Nothing may assume the host mounted them:
//! a new node often has neither, and `cargo xtask test` runs the tests in
//! a mount namespace where both start unmounted.
//!
//! **One mount, even when processes race.** Every bpffs mount is a file
//! system of its own, so a second mount stacked on the first hides every
//! pin made on the first. Check and mount therefore happen under an
//! exclusive `flock(2)` on the mount point's parent directory, which all
//! processes of the mount namespace share (a process-local mutex would not
//! stop the agent's own helpers, or two test processes, from both seeing
//! "not mounted").

use std::fs::File;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, mount};

use crate::mountinfo;

/// Where tracefs is expected; aya also looks at the debugfs location.
pub const TRACEFS: &str = "/sys/kernel/tracing";
const TRACEFS_IN_DEBUGFS: &str = "/sys/kernel/debug/tracing";
/// Where bpffs is expected.
pub const BPFFS: &str = "/sys/fs/bpf";

/// Errors making sure a file system is mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The mount itself (or making its mount point) failed.
    #[error("cannot mount {fs} at {path}")]
    Mount {
        /// The file system type.
        fs: &'static str,
        /// The mount point.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The lock that serialises check-and-mount could not be taken.
    #[error("cannot lock {path} to mount {fs} below it")]
    Lock {
        /// The file system type.
        fs: &'static str,
        /// The locked directory (the mount point's parent).
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The mount table could not be read, so whether the file system is
    /// mounted is unknown (mounting anyway could hide an existing one).
    #[error("cannot read the mount table {}", mountinfo::SELF)]
    MountTable(#[source] std::io::Error),
}

/// Makes sure tracefs is mounted; returns whether this call mounted it.
pub fn ensure_tracefs() -> Result<bool, MountError> {
    let path = Path::new(TRACEFS);
    let usable = || {
        [TRACEFS, TRACEFS_IN_DEBUGFS]
            .iter()
            .any(|dir| Path::new(dir).join("events").is_dir())
    };
    if usable() {
        return Ok(false);
    }
    let _lock = lock_parent("tracefs", path)?;
    if usable() {
        return Ok(false);
    }
    mount_fs("tracefs", path)?;
    Ok(true)
}

/// Makes sure bpffs is mounted at `path`; returns whether this call
/// mounted it.
pub fn ensure_bpffs(path: &Path) -> Result<bool, MountError> {
    if is_mount_of(path, "bpf")? {
        return Ok(false);
    }
    let _lock = lock_parent("bpf", path)?;
    if is_mount_of(path, "bpf")? {
        return Ok(false);
    }
    mount_fs("bpf", path)?;
    Ok(true)
}

/// Takes an exclusive lock on the parent directory of mount point `path`
/// (made if missing), held until the returned file is dropped. The parent
/// is not the mount point, so it is the same directory before and after
/// the mount.
fn lock_parent(fs: &'static str, path: &Path) -> Result<File, MountError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("/"),
    };
    let lock_err = |source| MountError::Lock {
        fs,
        path: parent.to_owned(),
        source,
    };
    std::fs::create_dir_all(parent).map_err(lock_err)?;
    let dir = File::open(parent).map_err(lock_err)?;
    dir.lock().map_err(lock_err)?;
    Ok(dir)
}

fn mount_fs(fs: &'static str, path: &Path) -> Result<(), MountError> {
    let err = |source| MountError::Mount {
        fs,
        path: path.to_owned(),
        source,
    };
    std::fs::create_dir_all(path).map_err(err)?;
    mount(fs, path, fs, MountFlags::empty(), None).map_err(|e| err(e.into()))
}

fn is_mount_of(path: &Path, fs: &str) -> Result<bool, MountError> {
    let mounts = mountinfo::read().map_err(MountError::MountTable)?;
    Ok(mounts
        .iter()
        .any(|m| m.fs_type == fs && m.mount_point == path))
}
