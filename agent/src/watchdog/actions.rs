//! The watchdog's actions on a container's cgroup, and the state they
//! leave there.
//!
//! The state lives in the kernel, not in the agent (invariant I4): a
//! frozen container is `cgroup.freeze` = 1 (confirmed by `frozen 1` in
//! `cgroup.events`), a denied one has a device guard pinned in bpffs
//! under its id ([`Deny`]). A restarted agent reads both back, and an
//! operator undoes them with `tessera-agent container thaw|allow ID`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tessera_error_chain::PathIoError;

use crate::ebpf::{GuardDevices, GuardError, Guards};

/// Why an action failed.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// A cgroup file (or a guard pin) could not be written or read:
    /// `cannot {action} {path}`.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// The freeze did not take within the wait.
    #[error("cgroup {0} did not report frozen 1 within 1 s")]
    NotFrozen(PathBuf),
    /// The container has no cgroup to act on.
    #[error("container has no cgroup; only alerts are possible")]
    NoCgroup,
    /// The deny action is unavailable (no guard object, not root …).
    #[error("the deny action is unavailable: {0}")]
    NoGuard(String),
    /// The guard failed.
    #[error(transparent)]
    Guard(#[from] GuardError),
    /// A container id cannot name a pin.
    #[error("container id {0:?} cannot name a device guard pin")]
    PinName(String),
}

fn write(path: PathBuf, text: &str, action: &'static str) -> Result<(), ActionError> {
    std::fs::write(&path, text).map_err(|source| PathIoError::new(action, path, source).into())
}

/// Whether `cgroup.events` of `dir` says `frozen 1`.
pub fn is_frozen(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|t| t.lines().any(|l| l.trim() == "frozen 1"))
}

/// Freezes cgroup `dir` and waits (at most 1 s) until the kernel reports
/// it frozen.
pub fn freeze(dir: &Path) -> Result<(), ActionError> {
    write(dir.join("cgroup.freeze"), "1", "write 1 to")?;
    let end = Instant::now() + Duration::from_secs(1);
    while !is_frozen(dir) {
        if Instant::now() >= end {
            return Err(ActionError::NotFrozen(dir.to_owned()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Thaws cgroup `dir`.
pub fn thaw(dir: &Path) -> Result<(), ActionError> {
    write(dir.join("cgroup.freeze"), "0", "write 0 to")
}

/// Kills every process of cgroup `dir`: `cgroup.kill` where the kernel
/// has it (5.14+), else SIGKILL to each pid of the subtree (a process
/// forked meanwhile may escape that fallback; the next period sees it).
/// A frozen cgroup is killed too (SIGKILL wakes frozen tasks). Returns
/// how it was done.
pub fn kill(dir: &Path, pids: &[u32]) -> Result<&'static str, ActionError> {
    let file = dir.join("cgroup.kill");
    if file.exists() {
        write(file, "1", "write 1 to")?;
        return Ok("cgroup.kill");
    }
    for &pid in pids {
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            // A process already gone is fine.
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    Ok("SIGKILL to each pid")
}

/// The deny action: a device guard allowing no guarded device, on the
/// container's own cgroup, pinned under its id.
#[derive(Clone, Debug)]
pub struct Deny {
    guards: Guards,
}

/// The pin name of container `id`: bpffs refuses dots, so `_` becomes
/// `_u` and `.` becomes `_d` (an injective map).
pub fn pin_name(id: &str) -> Result<String, ActionError> {
    let mut out = String::from("c-");
    for c in id.chars() {
        match c {
            '.' => out.push_str("_d"),
            '_' => out.push_str("_u"),
            c => out.push(c),
        }
    }
    if crate::ebpf::guard::valid_pin_name(&out) {
        Ok(out)
    } else {
        Err(ActionError::PinName(id.to_owned()))
    }
}

impl Deny {
    /// Guards from `object` over `devices`, pinned under `pin_dir`.
    pub fn new(object: &Path, devices: GuardDevices, pin_dir: &Path) -> Result<Self, ActionError> {
        if !object.exists() {
            return Err(ActionError::NoGuard(format!(
                "no device guard object at {}",
                object.display()
            )));
        }
        let guards = Guards::new(object, devices)?.with_pin_dir(pin_dir);
        Ok(Self { guards })
    }

    /// Denies cgroup `dir` (container `id`) further opens of guarded
    /// devices; handles it holds keep working.
    pub fn deny(&self, id: &str, dir: &Path) -> Result<(), ActionError> {
        self.guards.guard_cgroup(dir, &pin_name(id)?, &[])?;
        Ok(())
    }

    /// Removes container `id`'s deny guard; returns whether there was one.
    pub fn allow(&self, id: &str) -> Result<bool, ActionError> {
        Ok(self.guards.unguard(&pin_name(id)?)?)
    }

    /// Whether container `id` is denied (its pin exists).
    pub fn is_denied(&self, id: &str) -> bool {
        pin_name(id).is_ok_and(|n| self.guards.pin_dir().join(n).exists())
    }
}

/// `tessera-agent container thaw`: thaws the cgroup of the container
/// described by `meta` and waits (at most 1 s) until the kernel reports
/// it thawed; returns what to print.
pub fn thaw_container(meta: &crate::containers::Metadata) -> Result<String, ActionError> {
    let rel = meta.cgroup.as_deref().ok_or(ActionError::NoCgroup)?;
    let root = crate::cgroup::cgroup2_root().map_err(|e| {
        PathIoError::new(
            "find the cgroup v2 hierarchy for",
            rel,
            std::io::Error::other(e.to_string()),
        )
    })?;
    let dir = super::cgroup_dir(&root, rel);
    thaw(&dir)?;
    // (A running throttle freezes it again and marks it anew.)
    super::throttle::unmark(&dir)?;
    let end = Instant::now() + Duration::from_secs(1);
    while is_frozen(&dir) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    if is_frozen(&dir) {
        return Err(PathIoError::new(
            "thaw",
            dir,
            std::io::Error::other("cgroup.events still says frozen 1 after 1 s"),
        )
        .into());
    }
    Ok(format!("thawed {}", dir.display()))
}

/// `tessera-agent container allow`: removes container `id`'s deny guard
/// pinned under `pin_dir`; returns what to print.
pub fn allow_container(pin_dir: &Path, id: &str) -> Result<String, ActionError> {
    let pin = pin_dir.join(pin_name(id)?);
    match std::fs::remove_file(&pin) {
        Ok(()) => Ok(format!("removed device guard {}", pin.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(format!(
            "container {id} was not denied ({} absent)",
            pin.display()
        )),
        Err(source) => Err(PathIoError::new("remove device guard pin", pin, source).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_names_are_injective_and_dot_free() {
        assert_eq!(pin_name("a.b_c").unwrap(), "c-a_db_uc");
        assert_ne!(pin_name("a_d").unwrap(), pin_name("a.").unwrap());
        assert!(pin_name(&".".repeat(128)).is_err());
    }

    #[test]
    fn freeze_names_the_file() {
        let err = freeze(Path::new("/nonexistent/cg"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/cg/cgroup.freeze"), "{err}");
    }
}
