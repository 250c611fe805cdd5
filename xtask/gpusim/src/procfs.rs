//! Process liveness from `/proc`, as the driver would see a process exit.
//!
//! A process counts as alive while `/proc/<pid>/stat` exists, its start time
//! matches the one recorded at attach (so a recycled pid is not mistaken for
//! the original) and it is not a zombie: the real driver releases a
//! process's memory when its files close at exit, before its parent reaps it.
//! A thread-group leader that exited while other threads run shows as a
//! zombie too, but its process's files are still open: it counts as alive
//! until its last thread is gone (as a pidfd, see `liveness.rs`, tells).

use std::fs;

/// What `/proc/<pid>/stat` says about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Scheduler state letter (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Start time in clock ticks after boot (field 22).
    pub start_time: u64,
}

/// Parses the content of a `stat` file.
pub fn parse_stat(text: &str) -> Option<Stat> {
    // The command name (field 2) may hold spaces and parentheses; fields
    // after it start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // rest[0] is field 3 (state); field 22 is rest[19].
    let state = fields.first()?.chars().next()?;
    let start_time = fields.get(19)?.parse().ok()?;
    Some(Stat { state, start_time })
}

/// Reads `/proc/<pid>/stat`.
pub fn stat(pid: i32) -> Option<Stat> {
    if pid <= 0 {
        return None;
    }
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// This process's start time.
pub fn self_start_time() -> u64 {
    stat(std::process::id() as i32).map_or(0, |s| s.start_time)
}

/// The command name of `pid` (`/proc/<pid>/comm`, without its newline).
pub fn comm(pid: u32) -> Option<String> {
    let mut name = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    if name.ends_with('\n') {
        name.pop();
    }
    Some(name)
}

/// Whether `pid`, started at `start_time`, is still running.
pub fn alive(pid: i32, start_time: u64) -> bool {
    match stat(pid) {
        Some(s) if s.start_time != start_time => false,
        // A zombie leader whose other threads still run is listed with
        // them under `task/`; once alone, the process is gone.
        Some(s) if matches!(s.state, 'Z' | 'X' | 'x') => {
            fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| d.count() > 1)
        }
        Some(_) => true,
        None => false,
    }
}

/// Whether thread `tid` is held still from outside: stopped (`T`, `t`:
/// a stop signal or a tracer) or in a frozen cgroup (v2 freezer,
/// `cgroup.events` says `frozen 1`). Such a thread makes no progress until
/// someone else lets it go. Anything unreadable counts as not held.
pub fn suspended(tid: i32) -> bool {
    match stat(tid) {
        Some(s) if matches!(s.state, 'T' | 't') => true,
        Some(_) => frozen_cgroup(tid),
        None => false,
    }
}

/// Whether the cgroup v2 of `tid` is frozen, through this process's view of
/// the cgroup v2 tree (`/proc/self/mountinfo`; on a hybrid host it is
/// mounted apart from the v1 controllers).
fn frozen_cgroup(tid: i32) -> bool {
    let Ok(cgroups) = fs::read_to_string(format!("/proc/{tid}/cgroup")) else {
        return false;
    };
    let Some(path) = cgroups.lines().find_map(|l| l.strip_prefix("0::")) else {
        return false;
    };
    // Outside this process's cgroup namespace: not visible from here.
    if path.starts_with("/..") {
        return false;
    }
    let Ok(mounts) = tessera_mountinfo::read() else {
        return false;
    };
    mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup2" && m.root == "/")
        .any(|m| {
            let events = m
                .mount_point
                .join(path.trim_start_matches('/'))
                .join("cgroup.events");
            fs::read_to_string(events).is_ok_and(|t| t.lines().any(|l| l == "frozen 1"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder in a frozen cgroup v2 counts as suspended, and again as
    /// running once thawed. Needs root and a cgroup v2 tree (as CI has).
    #[test]
    fn a_process_in_a_frozen_cgroup_counts_as_suspended() {
        // SAFETY: geteuid takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            println!("skipped: not root (a test cgroup is made and frozen)");
            return;
        }
        let mounts = tessera_mountinfo::read().unwrap();
        let Some(v2) = mounts
            .iter()
            .find(|m| m.fs_type == "cgroup2" && m.root == "/")
        else {
            println!("skipped: no cgroup v2 tree mounted");
            return;
        };
        let dir = v2
            .mount_point
            .join(format!("gpusim-freeze-{}", std::process::id()));
        fs::create_dir(&dir).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        let frozen = |want: &str| {
            (0..200).any(|_| {
                let events = fs::read_to_string(dir.join("cgroup.events")).unwrap();
                let done = events.lines().any(|l| l == want);
                if !done {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                done
            })
        };
        assert!(!suspended(pid), "running, not suspended");
        fs::write(dir.join("cgroup.freeze"), "1").unwrap();
        assert!(frozen("frozen 1"), "the cgroup did not freeze");
        let held = suspended(pid);
        fs::write(dir.join("cgroup.freeze"), "0").unwrap();
        assert!(frozen("frozen 0"), "the cgroup did not thaw");
        let after = suspended(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        fs::remove_dir(&dir).unwrap();
        assert!(held, "a frozen process counts as suspended");
        assert!(!after, "a thawed process does not");
    }

    #[test]
    fn parses_names_with_parentheses() {
        let s =
            "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(
            parse_stat(s),
            Some(Stat {
                state: 'S',
                start_time: 98765
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn command_names_come_without_newline() {
        let mine = fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(
            comm(std::process::id()).unwrap(),
            mine.trim_end_matches('\n')
        );
        assert_eq!(comm(u32::MAX), None);
    }

    #[test]
    fn this_process_is_alive() {
        let me = std::process::id() as i32;
        assert!(alive(me, self_start_time()));
        assert!(!alive(me, self_start_time() + 1));
        assert!(!alive(-1, 0));
    }
}
