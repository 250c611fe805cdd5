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
//! the agent changes the limits (a new control epoch), the first launch
//! under the new epoch forgives the debt accumulated under the old rate,
//! so a raised rate takes effect at once.

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

fn ns_for(warps: u64, rate: u64) -> u64 {
    let ns = u128::from(warps) * 1_000_000_000 / u128::from(rate.max(1));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

impl Bucket {
    /// Takes `cost` warps at `now` under `rate`/`burst`, as set in control
    /// epoch `epoch`, and says when the launch may start.
    pub fn take(&self, cost: u64, rate: u64, burst: u64, epoch: u64, now: u64) -> Admit {
        if rate == UNLIMITED {
            self.launches.fetch_add(1, Ordering::Relaxed);
            self.warps.fetch_add(cost, Ordering::Relaxed);
            return Admit::Now;
        }
        if rate == 0 {
            return Admit::Paused;
        }
        let seen = self.epoch.load(Ordering::Acquire);
        if seen != epoch
            && self
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.tat_ns.store(now, Ordering::Release);
        }
        let inc = ns_for(cost, rate);
        let tolerance = ns_for(burst, rate);
        let mut tat = self.tat_ns.load(Ordering::Acquire);
        loop {
            let next = tat.max(now).saturating_add(inc);
            match self
                .tat_ns
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.launches.fetch_add(1, Ordering::Relaxed);
                    self.warps.fetch_add(cost, Ordering::Relaxed);
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
    fn a_new_epoch_forgives_old_debt() {
        let b = bucket();
        let t0 = 100 * S;
        // A slow rate builds a long queue.
        for _ in 0..100 {
            let _ = b.take(1, 1, 0, 2, t0);
        }
        assert!(matches!(b.take(1, 1, 0, 2, t0), Admit::At(t) if t > t0 + 50 * S));
        // The agent raises the rate (epoch 4): launches start at once again.
        assert_eq!(b.take(1, 1_000_000, 10, 4, t0 + 1), Admit::Now);
    }
}
