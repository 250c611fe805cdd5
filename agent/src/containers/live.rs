//! Whether any process still uses a region directory: the last guard
//! before a directory is garbage-collected ([`super::gc`]).
//!
//! Four independent kinds of evidence, any one of which keeps the
//! directory:
//! - the pod's cgroup (kubelet's `…pod<uid>…` directory in the cgroup v2
//!   tree, found by the metadata's `pod_uid`) still exists: kubelet removes
//!   it only once the pod is gone, whatever its pod list says meanwhile;
//! - the container's cgroup (when the metadata names one) holds a process;
//! - a usage slot names a process of the agent's pid namespace with the
//!   same pid and start time (containers without their own pid namespace);
//! - a process maps the directory's usage file: `/proc/<pid>/maps` lines
//!   whose inode is the file's and whose path ends in `/usage`. This holds
//!   whatever the process's pid or mount namespace (inside a container
//!   the file appears as `/run/tessera/usage`, its inode is the host
//!   file's), so a container in its own pid namespace is found too.
//!
//! Errors lean to "alive": a cgroup that cannot be read counts as busy.
//! A usage file that cannot be read leaves only the other evidence (its
//! content is the container's and may be garbage); that is reported.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use tessera_region::file::{USAGE_FILE, read_usage_bytes};
use tessera_region::reader::read_usage;

use crate::cgroup::path::Classified;
use crate::cgroup::walk::CgroupMap;

use super::meta::Metadata;
use super::pids;

/// Where processes are looked up.
#[derive(Clone, Debug)]
pub struct Probe {
    /// `/proc` (of the host pid namespace).
    pub proc_root: PathBuf,
    /// The cgroup v2 mount point, if any.
    pub cgroup_root: Option<PathBuf>,
}

/// What keeps a directory alive, or why it was judged unused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Some process uses it; the evidence, as text.
    Alive(String),
    /// No process uses it; remarks (e.g. an unreadable usage file).
    Unused(Vec<String>),
}

/// What one round gathered about the node's processes and pods (once for
/// all candidates).
#[derive(Clone, Debug, Default)]
pub struct Evidence {
    /// [`mapped_usage_inodes`].
    pub mapped: HashSet<u64>,
    /// Pod UID (lower case) → its cgroup path, of every pod cgroup in the
    /// v2 tree.
    pub pod_cgroups: HashMap<String, String>,
}

/// Every pod cgroup under the v2 root `root`, by pod UID (lower case).
/// Pods kept only in v1 (the cgroupfs driver on a hybrid host) are not
/// seen.
pub fn pod_cgroups(root: &Path) -> HashMap<String, String> {
    let Ok(map) = CgroupMap::build(root) else {
        return HashMap::new();
    };
    map.by_id
        .into_values()
        .filter_map(|e| match e.kind {
            Classified::Pod(pod) => Some((pod.uid.to_ascii_lowercase(), e.path)),
            _ => None,
        })
        .collect()
}

/// Inodes of files named `usage` mapped by any process under
/// `proc_root` (one pass over every process's maps, read line by line: a
/// process with a huge map count costs time, never memory).
pub fn mapped_usage_inodes(proc_root: &Path) -> HashSet<u64> {
    use std::io::BufRead;
    let mut out = HashSet::new();
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        // A process that exits meanwhile has no maps: nothing to add.
        let Ok(file) = std::fs::File::open(e.path().join("maps")) else {
            continue;
        };
        let mut reader = std::io::BufReader::new(file);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if let Some(ino) = usage_inode(&line) {
                out.insert(ino);
            }
        }
    }
    out
}

/// The inode of one `/proc/<pid>/maps` line if it maps a file named
/// `usage`: `address perms offset dev inode` separated by single spaces,
/// then padding and the path (which may hold spaces; a deleted file's
/// ends in ` (deleted)`).
pub fn usage_inode(line: &[u8]) -> Option<u64> {
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\n');
    let mut f = line.splitn(6, ' ');
    let (_addr, _perms, _off, _dev) = (f.next()?, f.next()?, f.next()?, f.next()?);
    let ino: u64 = f.next()?.parse().ok()?;
    let path = f.next()?.trim_start();
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    let file = path.rsplit('/').next()?;
    (ino != 0 && path.starts_with('/') && file == USAGE_FILE).then_some(ino)
}

impl Probe {
    /// The probe of this host: `/proc` and the cgroup v2 mount found in
    /// `/proc/self/mountinfo`.
    pub fn host() -> Self {
        Self {
            proc_root: PathBuf::from("/proc"),
            cgroup_root: crate::cgroup::v2::cgroup2_root().ok(),
        }
    }

    /// This round's [`Evidence`].
    pub fn gather(&self) -> Evidence {
        Evidence {
            mapped: mapped_usage_inodes(&self.proc_root),
            pod_cgroups: self
                .cgroup_root
                .as_deref()
                .map(pod_cgroups)
                .unwrap_or_default(),
        }
    }

    /// Whether any process (or kubelet's pod cgroup) uses directory `dir`
    /// with metadata `meta`; `evidence` is this round's [`Self::gather`].
    pub fn verdict(&self, dir: &Path, meta: &Metadata, evidence: &Evidence) -> Verdict {
        let mut remarks = Vec::new();
        let mapped = &evidence.mapped;
        if let Some(uid) = &meta.pod_uid
            && let Some(path) = evidence.pod_cgroups.get(&uid.to_ascii_lowercase())
        {
            return Verdict::Alive(format!(
                "the pod's cgroup {path} still exists (kubelet has not cleaned the pod up)"
            ));
        }
        if let Some(rel) = &meta.cgroup {
            match &self.cgroup_root {
                Some(root) => {
                    let cg = root.join(rel.trim_start_matches('/'));
                    match pids::cgroup_pids(&cg) {
                        Ok(p) if !p.is_empty() => {
                            return Verdict::Alive(format!(
                                "cgroup {} holds {} process(es), e.g. pid {}",
                                cg.display(),
                                p.len(),
                                p[0]
                            ));
                        }
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            return Verdict::Alive(format!(
                                "cgroup {} cannot be read ({e}); taken as busy",
                                cg.display()
                            ));
                        }
                    }
                }
                None => remarks.push(format!(
                    "cgroup {rel} is named but no cgroup v2 hierarchy is mounted"
                )),
            }
        }
        let usage = dir.join(USAGE_FILE);
        match std::fs::symlink_metadata(&usage) {
            Ok(m) if m.is_file() && mapped.contains(&m.ino()) => {
                return Verdict::Alive(format!(
                    "a process maps {} (inode {})",
                    usage.display(),
                    m.ino()
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                remarks.push(format!("{} does not exist", usage.display()));
            }
            Err(e) => remarks.push(format!("cannot stat {}: {e}", usage.display())),
        }
        match read_usage_bytes(&usage).and_then(|b| read_usage(&b)) {
            Ok(u) => {
                for s in &u.slots {
                    if let Some(p) = pids::proc_info(&self.proc_root, s.pid)
                        && p.start_time == s.start_time
                    {
                        return Verdict::Alive(format!(
                            "usage slot {} names live process {} (start time {})",
                            s.index, s.pid, s.start_time
                        ));
                    }
                }
            }
            Err(e) if usage.exists() => remarks.push(format!(
                "usage region {} cannot be read: {}",
                usage.display(),
                crate::error_chain::with_causes(&e)
            )),
            Err(_) => {}
        }
        Verdict::Unused(remarks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_name_the_usage_inode() {
        let l = |s: &str| usage_inode(s.as_bytes());
        assert_eq!(
            l(
                "7f1c2000-7f1c3000 rw-s 00000000 fd:01 1234567                    /run/tessera/usage\n"
            ),
            Some(1_234_567)
        );
        // A host path with spaces, a deleted file.
        assert_eq!(
            l("7f1c2000-7f1c3000 rw-s 00000000 fd:01 42  /var/lib/my root/c 1/usage"),
            Some(42)
        );
        assert_eq!(
            l("7f1c2000-7f1c3000 rw-s 00000000 fd:01 43 /x/usage (deleted)"),
            Some(43)
        );
        // Other files, anonymous maps, look-alikes.
        assert_eq!(
            l("7f1c2000-7f1c3000 r--p 00000000 fd:01 44 /x/control"),
            None
        );
        assert_eq!(
            l("7f1c2000-7f1c3000 r--p 00000000 fd:01 45 /x/my-usage"),
            None
        );
        assert_eq!(l("7f1c2000-7f1c3000 rw-p 00000000 00:00 0 "), None);
        assert_eq!(l("7ffd1000-7ffd2000 rw-p 00000000 00:00 0  [stack]"), None);
        assert_eq!(l("garbage"), None);
    }

    #[test]
    fn a_fake_proc_is_scanned() {
        let tmp = tempfile::tempdir().unwrap();
        for (pid, maps) in [
            (
                "12",
                "1000-2000 rw-s 00000000 08:01 777 /run/tessera/usage\n",
            ),
            (
                "13",
                "1000-2000 r-xp 00000000 08:01 778 /usr/lib/libc.so.6\n",
            ),
            (
                "self",
                "1000-2000 rw-s 00000000 08:01 779 /run/tessera/usage\n",
            ),
        ] {
            std::fs::create_dir(tmp.path().join(pid)).unwrap();
            std::fs::write(tmp.path().join(pid).join("maps"), maps).unwrap();
        }
        assert_eq!(mapped_usage_inodes(tmp.path()), HashSet::from([777]));
    }
}
