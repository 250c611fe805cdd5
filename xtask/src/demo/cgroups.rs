//! The demo's containers as real cgroups (outside Kubernetes a container
//! is whatever cgroup its processes are in): one parent per demo run below
//! the cgroup v2 root, one child per container. Only as root; removed when
//! dropped (after the workloads are gone).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The mount point of the cgroup v2 hierarchy, from a mountinfo text:
/// `/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on hybrid
/// ones. The first `cgroup2` mount wins.
pub(super) fn v2_root_in(mountinfo: &str) -> Option<PathBuf> {
    tessera_mountinfo::parse(mountinfo)
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
}

/// This run's cgroups.
pub(super) struct Cgroups {
    /// `<v2 root>/tessera-demo-<pid>`.
    parent: PathBuf,
    children: Vec<PathBuf>,
}

impl Cgroups {
    /// Creates the parent under the detected v2 root.
    pub(super) fn create() -> Result<Self> {
        let mountinfo = std::fs::read_to_string(tessera_mountinfo::SELF)
            .with_context(|| format!("cannot read {}", tessera_mountinfo::SELF))?;
        let Some(root) = v2_root_in(&mountinfo) else {
            bail!("no cgroup2 file system is mounted");
        };
        let parent = root.join(format!("tessera-demo-{}", std::process::id()));
        std::fs::create_dir(&parent)
            .with_context(|| format!("cannot create cgroup {}", parent.display()))?;
        Ok(Self {
            parent,
            children: Vec::new(),
        })
    }

    /// Creates the cgroup of container `name`; returns its path.
    pub(super) fn add(&mut self, name: &str) -> Result<PathBuf> {
        let dir = self.parent.join(name);
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create cgroup {}", dir.display()))?;
        self.children.push(dir.clone());
        Ok(dir)
    }

    pub(super) fn parent(&self) -> &Path {
        &self.parent
    }
}

/// Removes a cgroup; its processes may take a moment to leave after they
/// were reaped (rmdir answers EBUSY until then).
fn remove(dir: &Path) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if Instant::now() >= end => {
                eprintln!("demo: cannot remove cgroup {}: {e}", dir.display());
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for c in self.children.iter().rev() {
            remove(c);
        }
        remove(&self.parent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v2_root_is_found_on_unified_and_hybrid_hosts() {
        let unified = "29 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(
            v2_root_in(unified).as_deref(),
            Some(Path::new("/sys/fs/cgroup"))
        );
        let hybrid = "\
25 1 0:23 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,name=systemd
";
        assert_eq!(
            v2_root_in(hybrid).as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            v2_root_in("30 1 0:27 / /mnt/cg\\040v2 rw - cgroup2 none rw\n").as_deref(),
            Some(Path::new("/mnt/cg v2"))
        );
        assert_eq!(
            v2_root_in("27 25 0:25 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"),
            None
        );
    }
}
