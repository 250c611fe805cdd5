//! Hot reload of the policy file, once per control period.
//!
//! Each period costs one `stat` of the file (symlinks followed: a
//! Kubernetes ConfigMap volume replaces its files by swapping a symlink,
//! so the target's identity is what changes). The file is re-read when
//! anything of its device, inode, size, modification or change time
//! differs from the last look; the stamp is taken before the read, so a
//! write racing with the read is seen again in the next period.
//!
//! Invariants:
//! - a policy is replaced only by a file that parsed and checked
//!   completely; a bad file, an unreadable one or a deleted one leaves the
//!   policy in force as it was (the built-in defaults if nothing was ever
//!   loaded), and the view says why;
//! - each new problem is logged once (a warning naming file, line and
//!   field), not every period;
//! - the default path missing is the normal case of a node without a
//!   policy: the built-in defaults, no error. A configured path that is
//!   missing is reported (the defaults are in force until it appears).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Policy, file};
use crate::error_chain::with_causes;

/// What identifies one version of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// What the last look found.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Look {
    /// Not looked yet.
    Never,
    /// A file (read, whether it was accepted or not).
    File(Stamp),
    /// No file.
    Missing,
    /// `stat` failed otherwise (the message).
    Unreadable(String),
}

/// Watches the policy file and swaps the policy when a good new version
/// appears.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    explicit: bool,
    look: Look,
    loads: u64,
    /// The file the policy in force came from (none: built-in defaults).
    in_force: Option<PathBuf>,
    error: Option<String>,
}

impl Reloader {
    /// Watches `path`; `explicit`: configured by the operator (a missing
    /// file is then reported, not taken as "no policy").
    pub fn new(path: &Path, explicit: bool) -> Self {
        Self {
            path: path.to_path_buf(),
            explicit,
            look: Look::Never,
            loads: 0,
            in_force: None,
            error: None,
        }
    }

    /// The watched path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Looks at the file once; replaces `policy` when a new version parsed
    /// and checked. Returns whether `policy` changed.
    pub fn poll(&mut self, policy: &mut Policy) -> bool {
        let look = match std::fs::metadata(&self.path) {
            Ok(m) => Look::File(Stamp::of(&m)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Look::Missing,
            Err(e) => Look::Unreadable(format!(
                "cannot read policy file {}: {e}",
                self.path.display()
            )),
        };
        if look == self.look {
            return false;
        }
        self.look = look.clone();
        match look {
            Look::File(_) => match file::read(&self.path) {
                Ok(p) => {
                    self.loads += 1;
                    self.in_force = Some(self.path.clone());
                    self.error = None;
                    tracing::info!(
                        file = %self.path.display(),
                        rules = p.rules.len(),
                        loads = self.loads,
                        "policy loaded"
                    );
                    let changed = *policy != p;
                    *policy = p;
                    changed
                }
                Err(e) => {
                    self.problem(with_causes(&e));
                    false
                }
            },
            Look::Missing if self.loads > 0 => {
                self.problem(format!(
                    "policy file {} was removed; the policy loaded from it stays in force",
                    self.path.display()
                ));
                false
            }
            Look::Missing if self.explicit => {
                self.problem(format!(
                    "policy file {} does not exist; the built-in defaults are in force until it appears",
                    self.path.display()
                ));
                false
            }
            Look::Missing => {
                tracing::info!(file = %self.path.display(), "no policy file; the built-in defaults are in force");
                self.error = None;
                false
            }
            Look::Unreadable(msg) => {
                self.problem(msg);
                false
            }
            Look::Never => false,
        }
    }

    /// Records (and logs, once per new message) why the file is not used.
    fn problem(&mut self, msg: String) {
        if self.error.as_deref() != Some(msg.as_str()) {
            let kept = match &self.in_force {
                Some(p) => format!("the policy loaded from {} before", p.display()),
                None => "the built-in defaults".to_owned(),
            };
            tracing::warn!(error = %msg, in_force = %kept, "policy file not applied");
        }
        self.error = Some(msg);
    }

    /// The state for the period's view.
    pub fn view(&self, policy: &Policy) -> PolicyView {
        PolicyView {
            file: self.in_force.clone(),
            watching: self.path.clone(),
            loads: self.loads,
            rules: policy.rules.iter().map(|r| r.name.clone()).collect(),
            error: self.error.clone(),
        }
    }
}

/// The policy in force and the last reload, as the view shows it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PolicyView {
    /// The file the policy in force came from (null: built-in defaults).
    pub file: Option<PathBuf>,
    /// The file the agent watches (the `policy` setting).
    pub watching: PathBuf,
    /// Policies loaded so far (1 after the first load).
    pub loads: u64,
    /// The names of the policy's rules, in the order they are tried.
    pub rules: Vec<String>,
    /// Why the file as it is now is not applied (bad, unreadable, removed,
    /// missing); the policy in force stays. Null: the file is in force (or
    /// there is none at the default path).
    pub error: Option<String>,
}
