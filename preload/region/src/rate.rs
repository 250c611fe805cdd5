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
//!
//! Taking ahead ([`Bucket::try_take_ahead`]): a process may take a batch of
//! `n` warps at once and spend it on later launches without touching the
//! bucket, provided it spends the batch within `L` ns of the batch's
//! admission and drops what is left after that (or when the control epoch
//! changes). The batch is admitted only when *all* of it conforms at once,
//! under a tolerance reduced by `L` (`b' = b − r·L` warps, see
//! [`batch_max`]); a batch never waits, so a late-waking thread cannot
//! hold one past its time (a launch that must wait is taken alone).
//! Then, for any number of processes, the warps launched in any window
//! `[t1, t2]` were admitted in `[t1 − L, t2]`, which GCRA bounds by
//! `r·(t2 − t1 + L) + b' = r·(t2 − t1) + b`: taking ahead never lets a
//! container exceed its rate plus burst. A batch dropped unspent (expired,
//! a rate change, the process exited or was killed) is simply lost: the
//! container launches less, never more.

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
#[inline]
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

/// Most warps one batch taken ahead may hold under `rate`/`burst` when it
/// is spent within `lifetime_ns` of its admission and covers at most
/// `span_ns` of the rate: `min(b − r·L, r·span)`, 0 when the burst is too
/// small to take ahead (see the module docs).
pub fn batch_max(rate: u64, burst: u64, lifetime_ns: u64, span_ns: u64) -> u64 {
    let warps_in = |ns: u64| {
        u64::try_from(u128::from(rate) * u128::from(ns) / 1_000_000_000).unwrap_or(u64::MAX)
    };
    burst
        .saturating_sub(warps_in(lifetime_ns))
        .min(warps_in(span_ns))
}

impl Bucket {
    /// Counts a launch of `cost` warps.
    pub fn count(&self, cost: u64) {
        self.count_many(1, cost);
    }

    /// Counts `launches` launches of `warps` warps in all.
    pub fn count_many(&self, launches: u64, warps: u64) {
        self.launches.fetch_add(launches, Ordering::Relaxed);
        self.warps.fetch_add(warps, Ordering::Relaxed);
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
        let admit = self.reserve(
            ns_for(cost, rate).min(MAX_DEBT_NS),
            ns_for(burst, rate),
            now,
        );
        self.count(cost);
        admit
    }

    /// Takes a batch of `warps` (at most [`batch_max`] of the same
    /// `rate`/`burst`/`lifetime_ns`) ahead of the launches that will spend
    /// it, if all of it conforms at `now` under the tolerance `burst` less
    /// `lifetime_ns`; otherwise takes nothing and says so. Never makes the
    /// caller wait, so a batch's admission is always `now`. Counts
    /// nothing: the caller counts launches as it spends the batch
    /// ([`Bucket::count_many`]). `rate` is neither 0 nor unlimited.
    pub fn try_take_ahead(
        &self,
        warps: u64,
        rate: u64,
        burst: u64,
        lifetime_ns: u64,
        epoch: u64,
        now: u64,
    ) -> bool {
        if rate == 0 || rate == UNLIMITED {
            return false;
        }
        self.rescale(rate, epoch, now);
        let inc = ns_for(warps, rate).min(MAX_DEBT_NS);
        let tolerance = ns_for(burst, rate).saturating_sub(lifetime_ns);
        let mut tat = self.tat_ns.load(Ordering::Acquire);
        loop {
            let from = tat.max(now);
            if from.saturating_add(inc).saturating_sub(tolerance) > now {
                return false;
            }
            match self.tat_ns.compare_exchange_weak(
                tat,
                from.saturating_add(inc),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(current) => tat = current,
            }
        }
    }

    /// Advances the TAT by `inc` ns and says when the launch may start:
    /// once `TAT_before − tolerance` has passed.
    fn reserve(&self, inc: u64, tolerance: u64, now: u64) -> Admit {
        let mut tat = self.tat_ns.load(Ordering::Acquire);
        loop {
            let next = tat.max(now).saturating_add(inc);
            match self
                .tat_ns
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
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
    fn batch_max_leaves_the_lifetime_out_of_the_burst() {
        // 20000 warps/s, burst 200 (10 ms): 8 ms of lifetime leave 40.
        assert_eq!(batch_max(20_000, 200, 8_000_000, S), 40);
        // Capped by the span.
        assert_eq!(batch_max(20_000, 200, 0, 1_000_000), 20);
        // A burst shorter than the lifetime cannot be taken ahead.
        assert_eq!(batch_max(1_000, 5, 8_000_000, S), 0);
        assert_eq!(
            batch_max(u64::MAX / 2, 1 << 40, 1, S),
            (1 << 40) - (u64::MAX / 2) / S
        );
    }

    #[test]
    fn a_batch_is_taken_only_if_all_of_it_conforms_now() {
        let b = bucket();
        let t0 = 100 * S;
        // rate 1000/s, burst 100, lifetime 10 ms (10 warps): 90 warps may
        // be taken ahead at once, then nothing until they are paid for.
        assert!(b.try_take_ahead(90, 1000, 100, 10_000_000, 2, t0));
        assert!(!b.try_take_ahead(1, 1000, 100, 10_000_000, 2, t0));
        // A refused batch took nothing: 1 ms later one warp conforms, not
        // two.
        assert!(!b.try_take_ahead(2, 1000, 100, 10_000_000, 2, t0 + 1_000_000));
        assert!(b.try_take_ahead(1, 1000, 100, 10_000_000, 2, t0 + 1_000_000));
        // Taking ahead counts nothing; paused and unlimited take nothing.
        assert_eq!(b.launches.load(Ordering::Relaxed), 0);
        assert!(!b.try_take_ahead(1, 0, 100, 0, 2, t0 + S));
        assert!(!b.try_take_ahead(1, UNLIMITED, 100, 0, 2, t0 + S));
    }

    /// Processes taking batches ahead and spending each within its
    /// lifetime, at the worst moments: late, all at once, after idling;
    /// when a batch is refused, a launch of one warp taken alone. In no
    /// window do they launch more than rate × window + burst.
    #[test]
    fn processes_taking_ahead_never_exceed_rate_plus_burst() {
        let b = bucket();
        let (rate, burst, life) = (10_000u64, 400u64, 5_000_000u64);
        let max = batch_max(rate, burst, life, S);
        assert_eq!(max, 350);
        let t0 = 100 * S;
        // (time, warps) of every launch.
        let mut launched: Vec<(u64, u64)> = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        // Each step, a process (at a random time, with idle gaps) takes a
        // batch and spends it within its life.
        let mut now = t0;
        let mut idle_end = t0;
        for step in 0..4000 {
            if step % 500 == 0 {
                now += S;
                idle_end = now;
            } else {
                now += rand(2_000_000);
            }
            let warps = 1 + rand(max);
            // Refused: this process takes and launches one warp alone, at
            // its start (as the library does).
            let (admitted, warps) = if b.try_take_ahead(warps, rate, burst, life, 2, now) {
                (now, warps)
            } else {
                match b.take(1, rate, burst, 2, now) {
                    Admit::Now => (now, 1),
                    Admit::At(t) => (t, 1),
                    Admit::Paused => unreachable!(),
                }
            };
            let late = if warps == 1 { 0 } else { life - 1 };
            // Spent all at once: as late as allowed (just inside its
            // life) if admitted within a lifetime of the end of an idle
            // spell, at once otherwise, so late batches pile onto prompt
            // ones: the worst case for the bound.
            let late = if admitted < idle_end + life { late } else { 0 };
            launched.push((admitted + late, warps));
        }
        launched.sort();
        // Every window starting at a launch.
        let mut worst = 0f64;
        for i in 0..launched.len() {
            let mut sum = 0;
            for &(t, w) in &launched[i..] {
                sum += w;
                let window = t - launched[i].0;
                let allowed = rate as f64 * window as f64 / S as f64 + burst as f64;
                // (Plus one warp: a launch taken alone may end a window
                // past the bound by its own cost, as in any GCRA.)
                assert!(
                    sum as f64 <= allowed + 1.0 + 1e-6,
                    "{sum} warps in {window} ns (allowed {allowed})"
                );
                worst = worst.max(sum as f64 - allowed);
                if window > 50_000_000 {
                    break;
                }
            }
        }
        // The bound is tight: some window comes within a batch of it.
        assert!(worst > -(max as f64), "{worst}");
    }

    #[test]
    fn one_launch_adds_at_most_a_second_of_debt() {
        let b = bucket();
        let t0 = 100 * S;
        let _ = b.take(u64::MAX, 1, 0, 2, t0);
        assert_eq!(b.take(1, 1, 0, 2, t0), Admit::At(t0 + MAX_DEBT_NS));
    }
}
