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

#[cfg(test)]
mod tests {
    use super::*;

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
