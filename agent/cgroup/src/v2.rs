//! Finding the cgroup v2 hierarchy and the ids the eBPF programs report.
//!
//! `bpf_get_current_cgroup_id()` is the id of the task's cgroup in the v2
//! (default) hierarchy, which is the inode number of its directory. On
//! hybrid hosts v2 is mounted beside the v1 controllers (often at
//! `/sys/fs/cgroup/unified`), so the mount point is read, not assumed.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use tessera_mountinfo as mountinfo;

/// Errors finding cgroups.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// `/proc/self/mountinfo` could not be read.
    #[error("cannot read {path}")]
    MountInfo {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No cgroup2 file system is mounted.
    #[error("no cgroup2 file system is mounted (see /proc/self/mountinfo)")]
    NotMounted,
    /// The cgroup directory could not be inspected.
    #[error("cannot stat cgroup directory {path}")]
    Stat {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The mount point of the cgroup v2 hierarchy of this mount namespace.
pub fn cgroup2_root() -> Result<PathBuf, CgroupError> {
    let text =
        std::fs::read_to_string(mountinfo::SELF).map_err(|source| CgroupError::MountInfo {
            path: PathBuf::from(mountinfo::SELF),
            source,
        })?;
    cgroup2_mount(&text).ok_or(CgroupError::NotMounted)
}

/// The first cgroup2 mount in `mountinfo` text whose root is `/` (a mount
/// of the whole hierarchy, not of a subtree).
pub fn cgroup2_mount(text: &str) -> Option<PathBuf> {
    mountinfo::parse(text)
        .find(|m| m.fs_type == "cgroup2" && m.root == "/")
        .map(|m| m.mount_point)
}

/// The id the eBPF programs report for tasks in cgroup directory `dir`.
pub fn cgroup_id(dir: &Path) -> Result<u64, CgroupError> {
    std::fs::metadata(dir)
        .map(|m| m.ino())
        .map_err(|source| CgroupError::Stat {
            path: dir.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 31 0:30 / /sys/fs/cgroup/cpu rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu
";

    #[test]
    fn finds_cgroup2_on_hybrid_hosts() {
        assert_eq!(
            cgroup2_mount(HYBRID),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn skips_subtree_mounts_and_unescapes() {
        let text = "\
40 30 0:27 /kubepods /host/cg rw - cgroup2 cgroup2 rw
41 30 0:27 / /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw
";
        assert_eq!(cgroup2_mount(text), Some(PathBuf::from("/mnt/my cgroups")));
        assert_eq!(cgroup2_mount("31 25 0:26 / /x rw - tmpfs tmpfs rw\n"), None);
    }
}
