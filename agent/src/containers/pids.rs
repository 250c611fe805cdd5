//! Which host processes belong to a container, and which of them are
//! registered in its usage region.
//!
//! The cgroup is the authority on membership: every pid listed in
//! `cgroup.procs` of the container's cgroup (and of the cgroups below it)
//! is the container's, whatever it claims. The usage region names
//! processes by their pid in the container's pid namespace, so each host
//! pid is translated by the last entry of `NSpid` in
//! `/proc/<pid>/status`, and a slot matches a process when both its pid
//! and its start time agree. A slot that matches no process of the cgroup
//! is stale or forged; a process with no slot runs without the preload (or
//! has not touched a GPU yet).

use std::collections::HashMap;
use std::path::Path;

use tessera_region::layout::start;
use tessera_region::reader::SlotView;

/// Most cgroup directories visited below a container's cgroup.
pub const MAX_CGROUPS: usize = 1024;
/// Deepest level visited below a container's cgroup.
pub const MAX_DEPTH: usize = 16;

/// A host process as the kernel describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    /// Pid in the host (the agent's) pid namespace.
    pub host_pid: u32,
    /// Pid in the process's own (innermost) pid namespace.
    pub ns_pid: u32,
    /// Start time (clock ticks after boot, `/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// The tag of its pid namespace (`/proc/<pid>/ns/pid`'s inode, as
    /// [`start::tag_of_inode`] makes it; 0: not readable).
    pub ns_tag: u32,
}

/// Pids in `cgroup.procs` of `dir` and of the cgroups below it. A cgroup
/// that vanishes meanwhile contributes nothing.
pub fn cgroup_pids(dir: &Path) -> std::io::Result<Vec<u32>> {
    let mut out = Vec::new();
    let top = std::fs::read_to_string(dir.join("cgroup.procs"))?;
    out.extend(top.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    let mut visited = 0;
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) || depth + 1 > MAX_DEPTH {
                continue;
            }
            visited += 1;
            if visited > MAX_CGROUPS {
                break;
            }
            let p = e.path();
            if let Ok(text) = std::fs::read_to_string(p.join("cgroup.procs")) {
                out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
            stack.push((p, depth + 1));
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The innermost pid of `NSpid` in `/proc/<pid>/status` text.
pub fn parse_ns_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Field 22 (start time) of `/proc/<pid>/stat` text; the command name
/// (field 2) may hold spaces and parentheses, so fields are counted after
/// the last `)`.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts with field 3 (state); field 22 is the 20th of rest.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Host process `pid`, or `None` if it is gone.
pub fn proc_info(proc_root: &Path, pid: u32) -> Option<ProcInfo> {
    let dir = proc_root.join(pid.to_string());
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let ns_tag = std::fs::metadata(dir.join("ns/pid")).map_or(0, |m| {
        use std::os::unix::fs::MetadataExt as _;
        start::tag_of_inode(m.ino())
    });
    Some(ProcInfo {
        host_pid: pid,
        ns_pid: parse_ns_pid(&status).unwrap_or(pid),
        start_time: parse_start_time(&stat)?,
        ns_tag,
    })
}

/// Whether slot `s` names process `p`: the same pid in its namespace, the
/// same start time, and the same namespace where both tags are known
/// (the containers of a pod sharing a claim share one region, and each
/// may have a pid 1).
pub fn names(s: &SlotView, p: &ProcInfo) -> bool {
    s.pid == p.ns_pid
        && s.start_time == p.start_time
        && (s.ns_tag == 0 || p.ns_tag == 0 || s.ns_tag == p.ns_tag)
}

/// One process of a container, or one slot of its usage region.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProcessView {
    /// Host pid, if known (from the cgroup, or verified in /proc).
    pub host_pid: Option<u32>,
    /// Pid in the container's namespace.
    pub ns_pid: u32,
    /// The usage slot it registered, if any.
    pub slot: Option<usize>,
    /// How it was matched.
    pub source: Source,
}

/// How a [`ProcessView`] was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// In the cgroup and registered in the usage region.
    Registered,
    /// In the cgroup, not registered (no preload, or no GPU use yet).
    Unregistered,
    /// A slot that names no process of the cgroup (stale or forged).
    UnmatchedSlot,
    /// No cgroup known: a slot whose pid and start time match a process in
    /// the agent's pid namespace (containers outside pid namespaces).
    SameNamespace,
}

/// Joins the container's host processes with its usage slots.
pub fn join(procs: &[ProcInfo], slots: &[SlotView]) -> Vec<ProcessView> {
    let mut by_ns: HashMap<(u32, u64), Vec<&SlotView>> = HashMap::new();
    for s in slots {
        by_ns.entry((s.pid, s.start_time)).or_default().push(s);
    }
    let mut out = Vec::new();
    let mut used = Vec::new();
    for p in procs {
        let slot = by_ns
            .get(&(p.ns_pid, p.start_time))
            .and_then(|c| c.iter().find(|s| !used.contains(&s.index) && names(s, p)))
            .map(|s| s.index);
        if let Some(s) = slot {
            used.push(s);
        }
        out.push(ProcessView {
            host_pid: Some(p.host_pid),
            ns_pid: p.ns_pid,
            slot,
            source: if slot.is_some() {
                Source::Registered
            } else {
                Source::Unregistered
            },
        });
    }
    for s in slots {
        if !used.contains(&s.index) {
            out.push(ProcessView {
                host_pid: None,
                ns_pid: s.pid,
                slot: Some(s.index),
                source: Source::UnmatchedSlot,
            });
        }
    }
    out
}

/// Without a cgroup: each slot whose pid and start time match a host
/// process (as `lookup` describes pids, e.g. [`proc_info`]) is taken as
/// that host process.
pub fn join_same_namespace(
    mut lookup: impl FnMut(u32) -> Option<ProcInfo>,
    slots: &[SlotView],
) -> Vec<ProcessView> {
    slots
        .iter()
        .map(|s| {
            let live = lookup(s.pid).filter(|p| {
                p.start_time == s.start_time
                    && (s.ns_tag == 0 || p.ns_tag == 0 || s.ns_tag == p.ns_tag)
            });
            ProcessView {
                host_pid: live.map(|p| p.host_pid),
                ns_pid: s.pid,
                slot: Some(s.index),
                source: if live.is_some() {
                    Source::SameNamespace
                } else {
                    Source::UnmatchedSlot
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_region::MAX_GPUS;
    use tessera_region::reader::SlotState;

    #[test]
    fn ns_pid_is_the_innermost() {
        let s = "Name:\tpython\nTgid:\t4242\nNSpid:\t4242\t17\t1\nPPid:\t1\n";
        assert_eq!(parse_ns_pid(s), Some(1));
        assert_eq!(parse_ns_pid("NSpid:\t99\n"), Some(99));
        assert_eq!(parse_ns_pid("Name: x\n"), None);
    }

    #[test]
    fn start_time_survives_odd_command_names() {
        let stat = "77 (a) b (c)) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10";
        assert_eq!(parse_start_time(stat), Some(123_456));
        assert_eq!(parse_start_time("1 (x"), None);
    }

    #[test]
    fn own_process_is_found() {
        let me = std::process::id();
        let p = proc_info(Path::new("/proc"), me).unwrap();
        assert_eq!(p.host_pid, me);
        assert!(p.start_time > 0);
    }

    fn slot(index: usize, pid: u32, start_time: u64) -> SlotView {
        SlotView {
            index,
            state: SlotState::Active,
            pid,
            start_time,
            ns_tag: 0,
            used: [0; MAX_GPUS],
            launches: [0; MAX_GPUS],
        }
    }

    /// Two containers sharing a region, each with a pid 1 started in the
    /// same tick: each process gets the slot of its own namespace.
    #[test]
    fn pid_1_of_two_namespaces_get_their_own_slots() {
        let p = |host_pid, ns_tag| ProcInfo {
            host_pid,
            ns_pid: 1,
            start_time: 10,
            ns_tag,
        };
        let tagged = |index, ns_tag| SlotView {
            ns_tag,
            ..slot(index, 1, 10)
        };
        let j = join(&[p(5000, 7), p(6000, 8)], &[tagged(2, 8), tagged(1, 7)]);
        assert_eq!((j[0].host_pid, j[0].slot), (Some(5000), Some(1)));
        assert_eq!((j[1].host_pid, j[1].slot), (Some(6000), Some(2)));
        // A third namespace's slot names neither.
        let j = join(&[p(5000, 7)], &[tagged(3, 9)]);
        assert_eq!(j[0].source, Source::Unregistered);
        assert_eq!(j[1].source, Source::UnmatchedSlot);
        // An untagged slot (an older preload) matches as before.
        let j = join(&[p(5000, 7)], &[slot(4, 1, 10)]);
        assert_eq!(j[0].slot, Some(4));
    }

    #[test]
    fn join_matches_pid_and_start_time() {
        let procs = [
            ProcInfo {
                host_pid: 5000,
                ns_pid: 1,
                start_time: 10,
                ns_tag: 0,
            },
            ProcInfo {
                host_pid: 5001,
                ns_pid: 2,
                start_time: 11,
                ns_tag: 0,
            },
        ];
        // Slot 0: pid 1 (matches); slot 3: pid 2 but another start time
        // (a reused pid: stale); slot 4: a pid the cgroup does not hold.
        let slots = [slot(0, 1, 10), slot(3, 2, 99), slot(4, 77, 10)];
        let j = join(&procs, &slots);
        assert_eq!(j[0].source, Source::Registered);
        assert_eq!((j[0].host_pid, j[0].slot), (Some(5000), Some(0)));
        assert_eq!(j[1].source, Source::Unregistered);
        let unmatched: Vec<_> = j
            .iter()
            .filter(|v| v.source == Source::UnmatchedSlot)
            .map(|v| v.slot)
            .collect();
        assert_eq!(unmatched, [Some(3), Some(4)]);
    }
}
