//! The container-wide launch bucket of one GPU, as a generic cell rate
//! algorithm (GCRA) on one atomic: the *theoretical arrival time* (TAT).
//!
//! A launch costing `c` warps under rate `r` (warps/s) and burst `b`
//! advances the TAT by `c / r` seconds and may start once
//! `TAT_before - b / r` has passed. After idling, `b` warps start at once;
//! in the long run launches start at exactly `r` warps/s, however many
//! processes and threads share the bucket. Taking tokens is one
//! compare-and-swap: no lock, no syscall.
//!
//! Settings: `r` = [`UNLIMITED`] skips the bucket (launches are only
//! counted); `r` = 0 pauses launches until the agent raises the rate. When
//! the agent changes the rate (a newer control epoch), the first launch
//! under it rescales the outstanding debt to the new rate — what was owed
//! for `d` seconds at the old rate is owed for `d·r_old/r_new` at the new
//! one — so a raised rate takes effect at once and repeated writes of the
//! same rate change nothing. One launch adds at most [`MAX_DEBT_NS`] of
//! debt, so a single huge grid cannot stall the container for long.

use std::sync::atomic::Ordering;

use crate::layout::{Bucket, UNLIMITED};

/// When a launch may start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Now.
    Now,
    /// At this monotonic time (ns).
    At(u64),
    /// Not while the rate is zero.
    Paused,
}

/// Warps launched by `blocks` blocks of `threads` threads (at least 1).
pub fn launch_cost(blocks: u64, threads_per_block: u64) -> u64 {
    blocks
        .max(1)
        .saturating_mul(threads_per_block.max(1).div_ceil(32))
}

/// Most debt one launch can add (1 s).
pub const MAX_DEBT_NS: u64 = 1_000_000_000;

fn ns_for(warps: u64, rate: u64) -> u64 {
    let ns = u128::from(warps) * 1_000_000_000 / u128::from(rate.max(1));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// `debt_ns` owed at rate `old` rescaled to rate `new` (both non-zero),
/// at most [`MAX_DEBT_NS`].
pub fn rescaled(debt_ns: u64, old: u64, new: u64) -> u64 {
    let scaled = u128::from(debt_ns) * u128::from(old) / u128::from(new.max(1));
    u64::try_from(scaled).unwrap_or(u64::MAX).min(MAX_DEBT_NS)
}

impl Bucket {
    /// Counts a launch of `cost` warps.
    pub fn count(&self, cost: u64) {
        self.launches.fetch_add(1, Ordering::Relaxed);
        self.warps.fetch_add(cost, Ordering::Relaxed);
    }

    /// Brings the bucket to control epoch `epoch`, whose rate is `rate`
    /// (neither 0 nor unlimited): the first caller to see a newer epoch
    /// rescales the outstanding debt to `rate`; older and equal epochs
    /// change nothing.
    pub fn rescale(&self, rate: u64, epoch: u64, now: u64) {
        let seen = self.epoch.load(Ordering::Acquire);
        if epoch <= seen
            || self
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // The rate the current debt was taken at (0 = never set).
        let old = self.debt_rate.swap(rate, Ordering::AcqRel);
        if old == 0 || old == UNLIMITED {
            self.tat_ns.store(now, Ordering::Release);
        } else if old != rate {
            let _ = self
                .tat_ns
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                    Some(now + rescaled(tat.saturating_sub(now), old, rate))
                });
        }
    }

    /// Takes `cost` warps at `now` under `rate`/`burst`, as set in control
    /// epoch `epoch`, and says when the launch may start. Each call counts
    /// one launch (except when paused): a caller told [`Admit::At`] that
    /// sees the rate change while it waits must not take again, but move
    /// its start with [`rescaled`] (see [`Bucket::rescale`]).
    pub fn take(&self, cost: u64, rate: u64, burst: u64, epoch: u64, now: u64) -> Admit {
        if rate == UNLIMITED {
            self.count(cost);
            return Admit::Now;
        }
        if rate == 0 {
            return Admit::Paused;
        }
        self.rescale(rate, epoch, now);
        let inc = ns_for(cost, rate).min(MAX_DEBT_NS);
        let tolerance = ns_for(burst, rate);
        let mut tat = self.tat_ns.load(Ordering::Acquire);
        loop {
            let next = tat.max(now).saturating_add(inc);
            match self
                .tat_ns
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.count(cost);
                    let start = tat.saturating_sub(tolerance);
                    return if start > now {
                        self.throttled_ns.fetch_add(start - now, Ordering::Relaxed);
                        Admit::At(start)
                    } else {
                        Admit::Now
                    };
                }
                Err(current) => tat = current,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket() -> Box<Bucket> {
        // SAFETY: Bucket is made of atomics, valid when zeroed.
        unsafe { Box::<Bucket>::new_zeroed().assume_init() }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn costs_are_warps() {
        assert_eq!(launch_cost(1, 32), 1);
        assert_eq!(launch_cost(1, 33), 2);
        assert_eq!(launch_cost(132, 256), 132 * 8);
        assert_eq!(launch_cost(0, 0), 1);
    }

    #[test]
    fn burst_then_steady_rate() {
        let b = bucket();
        let t0 = 100 * S;
        // rate 1000 warps/s, burst 10: 11 launches start at once.
        for i in 0..11 {
            assert_eq!(b.take(1, 1000, 10, 2, t0), Admit::Now, "launch {i}");
        }
        // The next ones are spaced 1 ms apart.
        assert_eq!(b.take(1, 1000, 10, 2, t0), Admit::At(t0 + 1_000_000));
        assert_eq!(b.take(1, 1000, 10, 2, t0), Admit::At(t0 + 2_000_000));
        // Simulate a steady stream: each launch taken when the previous may
        // start; over 1 s, 1000 launches start.
        let mut now = t0 + 2_000_000;
        let mut started = 0;
        while now < t0 + S {
            match b.take(1, 1000, 10, 2, now) {
                Admit::Now => started += 1,
                Admit::At(t) => {
                    now = t;
                    started += 1;
                }
                Admit::Paused => unreachable!(),
            }
        }
        assert!((995..=1005).contains(&started), "{started}");
    }

    #[test]
    fn zero_pauses_and_unlimited_skips() {
        let b = bucket();
        assert_eq!(b.take(5, 0, 0, 2, S), Admit::Paused);
        for _ in 0..1000 {
            assert_eq!(b.take(5, UNLIMITED, 0, 2, S), Admit::Now);
        }
        assert_eq!(b.warps.load(Ordering::Relaxed), 5000);
    }

    #[test]
    fn a_new_rate_rescales_the_debt() {
        let b = bucket();
        let t0 = 100 * S;
        // 10 warps/s: 20 launches owe 2 s.
        for _ in 0..20 {
            let _ = b.take(1, 10, 0, 2, t0);
        }
        assert_eq!(b.take(1, 10, 0, 2, t0), Admit::At(t0 + 2 * S));
        // 1000 warps/s (epoch 4): the 2.1 s owed become 21 ms.
        assert_eq!(b.take(1, 1000, 0, 4, t0), Admit::At(t0 + 21_000_000));
        // An older epoch does not move it back.
        assert_eq!(b.take(1, 10, 0, 2, t0), Admit::At(t0 + 22_000_000));
    }

    #[test]
    fn rewriting_the_same_rate_forgives_nothing() {
        let b = bucket();
        let t0 = 100 * S;
        for _ in 0..10 {
            let _ = b.take(100, 1000, 0, 2, t0);
        }
        // 1000 warps owed at 1000/s: the next launch waits a second, also
        // after the agent rewrote the same rate.
        assert_eq!(b.take(1, 1000, 0, 4, t0), Admit::At(t0 + S));
    }

    #[test]
    fn one_launch_adds_at_most_a_second_of_debt() {
        let b = bucket();
        let t0 = 100 * S;
        let _ = b.take(u64::MAX, 1, 0, 2, t0);
        assert_eq!(b.take(1, 1, 0, 2, t0), Admit::At(t0 + MAX_DEBT_NS));
    }
}
