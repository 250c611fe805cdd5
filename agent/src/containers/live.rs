//! Whether any process still uses a region directory: the last guard
//! before a directory is garbage-collected ([`super::gc`]).
//!
//! Three independent kinds of evidence, any one of which keeps the
//! directory:
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

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use tessera_region::file::{USAGE_FILE, read_usage_bytes};
use tessera_region::reader::read_usage;

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

/// Inodes of files named `usage` mapped by any process under
/// `proc_root` (one pass over every process's maps).
pub fn mapped_usage_inodes(proc_root: &Path) -> HashSet<u64> {
    let mut out = HashSet::new();
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return out;
    };
    let suffix = format!("/{USAGE_FILE}");
    for e in entries.flatten() {
        let name = e.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        // A process that exits meanwhile has no maps: nothing to add.
        let Ok(text) = std::fs::read_to_string(e.path().join("maps")) else {
            continue;
        };
        for line in text.lines() {
            // address perms offset dev inode path
            let mut f = line.split_whitespace();
            let (Some(_), Some(_), Some(_), Some(_), Some(ino), Some(path)) =
                (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
            else {
                continue;
            };
            // A deleted file shows " (deleted)" after the path.
            let path = path.trim_end_matches(" (deleted)");
            if path.ends_with(&suffix)
                && let Ok(ino) = ino.parse::<u64>()
                && ino != 0
            {
                out.insert(ino);
            }
        }
    }
    out
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

    /// Whether any process uses directory `dir` with metadata `meta`;
    /// `mapped` is [`mapped_usage_inodes`] of this round.
    pub fn verdict(&self, dir: &Path, meta: &Metadata, mapped: &HashSet<u64>) -> Verdict {
        let mut remarks = Vec::new();
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
