//! Each channel's record of the kernels its process launched (see
//! [`LaunchLog`]): counts, warps, and warps per millisecond for the last
//! [`LAUNCH_LOG_MS`] ms, so tests judge launch limits by what the
//! simulated GPU was given, not by the limiter's own counters.

use crate::layout::{LAUNCH_LOG_MS, LaunchLog, Owner};

const NS_PER_MS: u64 = 1_000_000;

/// One process's launches on one GPU, as read from the state file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launches {
    /// The process.
    pub pid: i32,
    /// Whether it still holds the channel.
    pub active: bool,
    /// Kernels queued.
    pub kernels: u64,
    /// Their warps.
    pub warps: u64,
    /// The latest millisecond a kernel was queued in: `kernels` and
    /// `warps` count every launch up to its end.
    pub last_ms: u64,
    /// `(millisecond, warps)` for every millisecond with launches in the
    /// last [`LAUNCH_LOG_MS`] ms up to the latest one, oldest first
    /// (millisecond = monotonic ns / 10⁶).
    pub per_ms: Vec<(u64, u32)>,
}

impl Launches {
    /// Warps queued in milliseconds `from_ms..to_ms` (within the log).
    pub fn warps_between(&self, from_ms: u64, to_ms: u64) -> u64 {
        self.per_ms
            .iter()
            .filter(|(m, _)| (from_ms..to_ms).contains(m))
            .map(|&(_, w)| u64::from(w))
            .sum()
    }
}

/// Forgets everything: the log is `owner`'s from now on.
pub fn clear(log: &mut LaunchLog, owner: Owner) {
    log.owner = owner;
    log.kernels = 0;
    log.warps = 0;
    log.last_ms = 0;
    log.per_ms = [0; LAUNCH_LOG_MS];
}

/// Records a kernel of `warps` queued at `now_ns`.
pub fn record(log: &mut LaunchLog, now_ns: u64, warps: u64) {
    let ms = now_ns / NS_PER_MS;
    if ms > log.last_ms {
        // Milliseconds since the last launch had none.
        let gap = (ms - log.last_ms).min(LAUNCH_LOG_MS as u64);
        for m in ms + 1 - gap..=ms {
            log.per_ms[(m % LAUNCH_LOG_MS as u64) as usize] = 0;
        }
        log.last_ms = ms;
    }
    // A launch stamped before `last_ms` (another thread's clock read raced
    // ours) counts in the latest millisecond.
    let slot = &mut log.per_ms[(log.last_ms % LAUNCH_LOG_MS as u64) as usize];
    *slot = slot.saturating_add(u32::try_from(warps).unwrap_or(u32::MAX));
    log.kernels = log.kernels.saturating_add(1);
    log.warps = log.warps.saturating_add(warps);
}

/// The log as [`Launches`]; `active`: its process still holds the
/// channel. Its pid is the one the process had in its own pid namespace
/// (the reader translates it, see `Sim::launches`).
pub fn read(log: &LaunchLog, active: bool) -> Launches {
    let first = log.last_ms.saturating_sub(LAUNCH_LOG_MS as u64 - 1);
    let per_ms = if log.kernels == 0 {
        Vec::new()
    } else {
        (first..=log.last_ms)
            .map(|m| (m, log.per_ms[(m % LAUNCH_LOG_MS as u64) as usize]))
            .filter(|&(_, w)| w != 0)
            .collect()
    };
    Launches {
        pid: log.owner.pid,
        active,
        kernels: log.kernels,
        warps: log.warps,
        last_ms: log.last_ms,
        per_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> Box<LaunchLog> {
        // SAFETY: LaunchLog is made of integers, valid when zeroed.
        unsafe { Box::<LaunchLog>::new_zeroed().assume_init() }
    }

    #[test]
    fn counts_and_buckets_by_millisecond() {
        let mut l = log();
        clear(
            &mut l,
            Owner {
                pid: 9,
                ..Owner::default()
            },
        );
        let t = 5_000 * NS_PER_MS;
        record(&mut l, t, 3);
        record(&mut l, t + 10, 2);
        record(&mut l, t + 2 * NS_PER_MS, 7);
        let r = read(&l, true);
        assert_eq!((r.pid, r.kernels, r.warps), (9, 3, 12));
        assert_eq!(r.per_ms, vec![(5_000, 5), (5_002, 7)]);
        assert_eq!(r.warps_between(5_000, 5_002), 5);
    }

    #[test]
    fn old_milliseconds_are_forgotten_not_aliased() {
        let mut l = log();
        record(&mut l, 1_000 * NS_PER_MS, 4);
        // One full turn of the ring later, the old slot holds only the new
        // launch.
        record(&mut l, (1_000 + LAUNCH_LOG_MS as u64) * NS_PER_MS, 1);
        let r = read(&l, false);
        assert_eq!(r.per_ms, vec![(1_000 + LAUNCH_LOG_MS as u64, 1)]);
        assert_eq!(r.warps, 5);
        // A late stamp counts in the latest millisecond.
        record(&mut l, 999 * NS_PER_MS, 2);
        assert_eq!(read(&l, false).per_ms, vec![(1_512, 3)]);
    }
}
