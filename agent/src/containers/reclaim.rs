//! Usage slots of processes no container process can judge: the agent
//! frees them.
//!
//! A process judges only the slots of its own pid namespace dead (a pid
//! names another process, or none, in another namespace; see
//! [`tessera_region::layout::start`]). When several pid namespaces share a
//! region (the containers of a pod sharing a DRA claim, or a container
//! restarted in a new namespace over the region of its previous run), a
//! slot whose process died and whose namespace has no process left would
//! keep its bytes charged for good. The agent sees every namespace: a
//! slot is its owner's while a process of the container's cgroup has the
//! slot's pid in its namespace, its start time and its namespace tag.
//!
//! Each slot is judged after its owner word is read (the takeover
//! compares that word, so a slot that changed hands meanwhile is left),
//! against the cgroup as read then: a process that registered before the
//! word was read is in the cgroup already, so a live owner is never
//! freed. Untagged slots (an older preload) are left to their own
//! processes, as before.

use std::path::Path;

use tessera_region::error::RegionError;
use tessera_region::file::open_usage;
use tessera_region::layout::start;

use super::pids::{self, ProcInfo};

/// Why the slots could not be judged.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimError {
    /// The usage region could not be mapped.
    #[error("cannot map usage region {path}")]
    Map {
        /// The region file.
        path: String,
        /// The cause.
        #[source]
        source: RegionError,
    },
    /// The agent's own process could not be described.
    #[error("cannot read the agent's own process in /proc")]
    Own,
}

/// Frees the slots of usage region `usage` whose owners are gone from
/// cgroup `cgroup` (`info` describes a host pid, `proc_root` is where
/// host processes are read again; the agent's own pid namespace is read
/// in its own `/proc`); returns how many.
pub fn reclaim_gone(
    usage: &Path,
    cgroup: &Path,
    proc_root: &Path,
    mut info: impl FnMut(u32) -> Option<ProcInfo>,
) -> Result<usize, ReclaimError> {
    let region = open_usage(usage).map_err(|source| ReclaimError::Map {
        path: usage.display().to_string(),
        source,
    })?;
    let me = pids::proc_info(Path::new("/proc"), std::process::id()).ok_or(ReclaimError::Own)?;
    let me = (me.host_pid, start::word(me.ns_tag, me.start_time));
    let names = |p: &ProcInfo, pid: u32, word: u64| {
        p.ns_pid == pid
            && p.start_time == start::ticks(word)
            && (p.ns_tag == start::tag(word) || p.ns_tag == 0)
    };
    // Read before any owner word: a slot it names is alive; one it does
    // not is looked for again in the cgroup as it is after its word.
    let before: Option<Vec<ProcInfo>> = pids::cgroup_pids(cgroup)
        .ok()
        .map(|m| m.iter().filter_map(|&h| info(h)).collect());
    let judged = |pid: u32, word: u64| -> bool {
        let tag = start::tag(word);
        if tag == 0 {
            return true;
        }
        if tag == start::tag(me.1) {
            // An agent's own (one that stopped while freeing a slot).
            return pids::proc_info(Path::new("/proc"), pid)
                .is_some_and(|p| p.start_time == start::ticks(word));
        }
        if before
            .as_ref()
            .is_some_and(|b| b.iter().any(|p| names(p, pid, word)))
        {
            return true;
        }
        // Cannot tell: alive.
        pids::cgroup_pids(cgroup).map_or(true, |members| {
            members
                .iter()
                .filter_map(|&h| pids::proc_info(proc_root, h))
                .any(|p| names(&p, pid, word))
        })
    };
    Ok(region.reclaim_dead(me, judged))
}

#[cfg(test)]
mod tests {
    use tessera_region::file::{USAGE_FILE, create_usage};

    use super::*;

    /// A slot of a namespace with no process left in the cgroup is freed;
    /// one naming a member, an untagged one and one the agent cannot judge
    /// stay.
    #[test]
    fn slots_of_processes_gone_from_the_cgroup_are_freed() {
        let dir = tempfile::tempdir().unwrap();
        create_usage(dir.path()).unwrap();
        let usage = dir.path().join(USAGE_FILE);
        let cgroup = dir.path().join("cg");
        std::fs::create_dir(&cgroup).unwrap();
        // The cgroup holds this test process (a pid 1 elsewhere).
        let me = pids::proc_info(Path::new("/proc"), std::process::id()).unwrap();
        std::fs::write(cgroup.join("cgroup.procs"), format!("{}\n", me.host_pid)).unwrap();
        let other = start::tag_of_inode(7);
        let member = ProcInfo {
            ns_pid: 1,
            ns_tag: other,
            ..me
        };
        let region = open_usage(&usage).unwrap();
        let live = region.claim(1, start::word(other, me.start_time)).unwrap();
        let gone = region
            .claim(1, start::word(other, me.start_time + 1))
            .unwrap();
        let old = region.claim(2, me.start_time).unwrap();
        region.reserve(0, gone.slot, 1 << 20, 1 << 30).unwrap();
        let info = |p: u32| (p == me.host_pid).then_some(member);
        assert_eq!(
            reclaim_gone(&usage, &cgroup, Path::new("/proc"), info).unwrap(),
            1
        );
        assert!(region.owns(live));
        assert!(!region.owns(gone));
        assert!(
            region.owns(old),
            "an untagged slot is its own namespace's to judge"
        );
        assert_eq!(region.used_bytes(0), 0);
        // Membership unreadable: nothing is judged gone.
        let lost = region.claim(3, start::word(other, 1)).unwrap();
        std::fs::remove_file(cgroup.join("cgroup.procs")).unwrap();
        assert_eq!(
            reclaim_gone(&usage, &cgroup, Path::new("/proc"), info).unwrap(),
            0
        );
        assert!(region.owns(lost));
    }
}
