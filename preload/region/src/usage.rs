//! The usage region's operations: process slots, memory reservation and
//! reclamation. Lock-free (invariant I2): every step is one atomic
//! operation, so a process killed at any instruction leaves no lock held.
//!
//! **Memory (invariant I1).** Each slot's `used[gpu][slot]` is the only
//! truth about what its process holds; there is no shared total to drift.
//! A reservation first adds its bytes to its own slot, then sums every
//! active slot (all `SeqCst`); if the sum exceeds the limit it takes its bytes
//! back and fails. Of two racing reservations, the later one in the `SeqCst`
//! order always sees the earlier one, so the sum of *granted* reservations
//! never exceeds the limit. A contender's transient bytes can make a
//! reservation fail that would have fitted; it retries while that is the
//! only reason.
//!
//! **Dead processes.** A slot's owner word records its pid and a
//! generation bumped on every change of hands ([`owner`]); whoever notices
//! the owner is gone (`reclaim_dead`) takes the slot over with a
//! compare-and-swap of the whole word, zeroes its counters and frees it. Only the owner or
//! the single winning reclaimer ever writes a slot's counters, and counters
//! are only ever set to zero or decreased with saturation: nothing
//! underflows.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::RegionError;
use crate::layout::{
    ABI_VERSION, MAX_GPUS, MAX_SLOTS, UNLIMITED, USAGE_MAGIC, USAGE_SIZE, UsageRegion, owner,
};

/// A reservation did not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverLimit {
    /// Bytes held by the container's processes (without this request).
    pub used: u64,
    /// The limit.
    pub limit: u64,
}

/// A slot held by a process: its index and the owner word (generation
/// included) that proves the slot is still this process's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// Slot index.
    pub slot: usize,
    /// The owner word the claim left in the slot.
    pub owner: u64,
}

/// How often a reservation retries when only transient contention made it
/// fail.
const RESERVE_RETRIES: u32 = 64;

impl UsageRegion {
    /// Writes the header of a fresh (zeroed) region.
    pub fn init(&mut self) {
        self.header.magic = USAGE_MAGIC;
        self.header.abi_version = ABI_VERSION;
        self.header.size = USAGE_SIZE as u32;
        self.header.slot_count = MAX_SLOTS as u32;
    }

    /// Checks the header (the process side trusts the rest: a container can
    /// only hurt itself by scribbling on its own usage region; the agent
    /// uses [`crate::reader`] instead).
    pub fn validate(&self, len: usize) -> Result<(), RegionError> {
        let h = &self.header;
        if h.magic != USAGE_MAGIC {
            return Err(RegionError::field("usage", "magic", "is not TSRUSE"));
        }
        if h.abi_version != ABI_VERSION {
            return Err(RegionError::field(
                "usage",
                "abi_version",
                format!("is {}; this library speaks {ABI_VERSION}", h.abi_version),
            ));
        }
        if h.size as usize != USAGE_SIZE || len < USAGE_SIZE || h.slot_count as usize != MAX_SLOTS {
            return Err(RegionError::field(
                "usage",
                "size",
                format!(
                    "is {} with {} slots (file {len} bytes); expected {USAGE_SIZE} with {MAX_SLOTS}",
                    h.size, h.slot_count
                ),
            ));
        }
        Ok(())
    }

    fn mark_active(&self, slot: usize, on: bool) {
        let word = &self.header.active[slot / 64];
        let bit = 1u64 << (slot % 64);
        if on {
            word.fetch_or(bit, Ordering::SeqCst);
        } else {
            word.fetch_and(!bit, Ordering::SeqCst);
        }
    }

    fn zero_slot(&self, slot: usize) {
        for g in 0..MAX_GPUS {
            self.used[g][slot].store(0, Ordering::SeqCst);
            self.launches[g][slot].store(0, Ordering::Relaxed);
        }
    }

    /// Claims a free slot for process `pid` (started at `start_time`).
    pub fn claim(&self, pid: u32, start_time: u64) -> Option<Claim> {
        let first = pid as usize % MAX_SLOTS;
        for k in 0..MAX_SLOTS {
            let i = (first + k) % MAX_SLOTS;
            let w = &self.owners[i];
            let free = w.load(Ordering::SeqCst);
            if owner::state(free) != owner::FREE {
                continue;
            }
            let claiming = owner::next(free, owner::CLAIMING, pid);
            if w.compare_exchange(free, claiming, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                self.start_times[i].store(start_time, Ordering::SeqCst);
                self.zero_slot(i);
                self.mark_active(i, true);
                // A reclaimer may have taken the slot meanwhile (it saw the
                // claimer's pid gone): then the slot is not ours; it will
                // be zeroed and freed by that reclaimer.
                let active = owner::next(claiming, owner::ACTIVE, pid);
                if w.compare_exchange(claiming, active, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
                {
                    return Some(Claim {
                        slot: i,
                        owner: active,
                    });
                }
            }
        }
        None
    }

    /// Gives back the caller's own slot (normal exit).
    pub fn release(&self, claim: Claim) {
        let slot = claim.slot % MAX_SLOTS;
        let w = &self.owners[slot];
        if w.load(Ordering::SeqCst) == claim.owner {
            self.zero_slot(slot);
            self.mark_active(slot, false);
            let _ = w.compare_exchange(
                claim.owner,
                owner::next(claim.owner, owner::FREE, 0),
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
        }
    }

    /// Whether `claim` still holds its slot (it may have been reclaimed if
    /// the process was wrongly taken for dead, or the region reset).
    pub fn owns(&self, claim: Claim) -> bool {
        self.owners[claim.slot % MAX_SLOTS].load(Ordering::Acquire) == claim.owner
    }

    /// Frees the slots of processes `alive` says are gone; returns how many.
    /// `me` is the caller's (pid, start time), recorded while it reclaims.
    /// `alive(pid, start)` with `start` 0 asks whether the pid exists at all.
    ///
    /// The owner word read before asking `alive` is the one the takeover
    /// compares against, generation included: if the slot changed hands
    /// meanwhile (freed and claimed again, by a reused pid too), the
    /// takeover fails and the new owner's bytes stay.
    pub fn reclaim_dead(&self, me: (u32, u64), alive: impl Fn(u32, u64) -> bool) -> usize {
        let mut n = 0;
        for i in 0..MAX_SLOTS {
            let w = self.owners[i].load(Ordering::SeqCst);
            let (state, pid) = (owner::state(w), owner::pid(w));
            let dead = match state {
                owner::ACTIVE => !alive(pid, self.start_times[i].load(Ordering::SeqCst)),
                // A claimer's start time may not be written yet: only a
                // vanished pid counts.
                owner::CLAIMING => !alive(pid, 0),
                // A reclaimer that died midway: its pid and start time are
                // in the slot.
                owner::RECLAIMING => {
                    pid != me.0 && !alive(pid, self.start_times[i].load(Ordering::SeqCst))
                }
                _ => false,
            };
            if !dead {
                continue;
            }
            let mine = owner::next(w, owner::RECLAIMING, me.0);
            if self.owners[i]
                .compare_exchange(w, mine, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            self.start_times[i].store(me.1, Ordering::SeqCst);
            self.zero_slot(i);
            self.mark_active(i, false);
            if self.owners[i]
                .compare_exchange(
                    mine,
                    owner::next(mine, owner::FREE, 0),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                n += 1;
            }
        }
        n
    }

    /// Sum of `col` over the active slots. A slot is marked active before
    /// it can hold bytes and unmarked only after it is zeroed, so no bytes
    /// are missed.
    fn sum(&self, col: &[AtomicU64; MAX_SLOTS]) -> u64 {
        let mut total = 0u64;
        for (w, word) in self.header.active.iter().enumerate() {
            let mut bits = word.load(Ordering::SeqCst);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                total = total.saturating_add(col[i].load(Ordering::SeqCst));
            }
        }
        total
    }

    /// Bytes the container holds on GPU `gpu`.
    pub fn used_bytes(&self, gpu: usize) -> u64 {
        self.sum(&self.used[gpu % MAX_GPUS])
    }

    /// Bytes slot `slot` holds on GPU `gpu`.
    pub fn slot_bytes(&self, gpu: usize, slot: usize) -> u64 {
        self.used[gpu % MAX_GPUS][slot % MAX_SLOTS].load(Ordering::SeqCst)
    }

    /// Reserves `bytes` on `gpu` for `slot` without the container exceeding
    /// `limit`. On failure nothing stays reserved.
    pub fn reserve(
        &self,
        gpu: usize,
        slot: usize,
        bytes: u64,
        limit: u64,
    ) -> Result<(), OverLimit> {
        let col = &self.used[gpu % MAX_GPUS];
        let mine = &col[slot % MAX_SLOTS];
        if limit == UNLIMITED {
            mine.fetch_add(bytes, Ordering::SeqCst);
            return Ok(());
        }
        for attempt in 0..RESERVE_RETRIES {
            let before = mine.fetch_add(bytes, Ordering::SeqCst);
            if before.checked_add(bytes).is_none() {
                mine.fetch_sub(bytes, Ordering::SeqCst);
                break;
            }
            let total = self.sum(col);
            if total <= limit {
                return Ok(());
            }
            mine.fetch_sub(bytes, Ordering::SeqCst);
            // Still over without contenders' in-flight bytes? Then it is real.
            let others = self.sum(col);
            if others.saturating_add(bytes) > limit || attempt + 1 == RESERVE_RETRIES {
                return Err(OverLimit {
                    used: others,
                    limit,
                });
            }
            std::thread::yield_now();
        }
        Err(OverLimit {
            used: self.sum(col),
            limit,
        })
    }

    /// Returns `bytes` on `gpu` from `slot` (saturating at zero).
    pub fn unreserve(&self, gpu: usize, slot: usize, bytes: u64) {
        let _ = self.used[gpu % MAX_GPUS][slot % MAX_SLOTS].fetch_update(
            Ordering::SeqCst,
            Ordering::SeqCst,
            |v| Some(v.saturating_sub(bytes)),
        );
    }

    /// Counts a launch by `slot` on `gpu`.
    pub fn count_launch(&self, gpu: usize, slot: usize) {
        self.launches[gpu % MAX_GPUS][slot % MAX_SLOTS].fetch_add(1, Ordering::Relaxed);
    }

    /// Claims the right to look for dead processes if the last look was
    /// more than `interval_ns` ago.
    pub fn reclaim_due(&self, now_ns: u64, interval_ns: u64) -> bool {
        let last = &self.header.last_reclaim_ns;
        let prev = last.load(Ordering::Relaxed);
        now_ns.saturating_sub(prev) >= interval_ns
            && last
                .compare_exchange(prev, now_ns, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn region() -> Box<UsageRegion> {
        // SAFETY: UsageRegion is made of integers and atomics, valid when
        // zeroed.
        let mut r = unsafe { Box::<UsageRegion>::new_zeroed().assume_init() };
        r.init();
        r
    }

    #[test]
    fn reservations_stop_at_the_limit_exactly() {
        let r = region();
        r.validate(USAGE_SIZE).unwrap();
        let s = r.claim(100, 1).unwrap().slot;
        r.reserve(0, s, 600, 1000).unwrap();
        r.reserve(0, s, 400, 1000).unwrap();
        assert_eq!(
            r.reserve(0, s, 1, 1000),
            Err(OverLimit {
                used: 1000,
                limit: 1000
            })
        );
        assert_eq!(r.used_bytes(0), 1000);
        r.unreserve(0, s, 400);
        r.reserve(0, s, 400, 1000).unwrap();
        // Other GPUs are independent.
        r.reserve(1, s, 1000, 1000).unwrap();
        // Unreserve saturates.
        r.unreserve(2, s, 5);
        assert_eq!(r.used_bytes(2), 0);
    }

    #[test]
    fn racing_threads_never_exceed_the_limit() {
        let r: Arc<UsageRegion> = Arc::from(region());
        let limit = 1000u64;
        let threads: Vec<_> = (0..8u32)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    let s = r.claim(1000 + t, 1).unwrap().slot;
                    let mut held = 0u64;
                    for i in 0..20_000u64 {
                        let n = 1 + (i * 7 + u64::from(t)) % 90;
                        if r.reserve(0, s, n, limit).is_ok() {
                            held += n;
                            assert!(r.used_bytes(0) <= limit + 8 * 90);
                        }
                        if i % 3 == 0 && held > 0 {
                            r.unreserve(0, s, held);
                            held = 0;
                        }
                    }
                    held
                })
            })
            .collect();
        let held: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(held <= limit);
        assert_eq!(r.used_bytes(0), held);
    }

    #[test]
    fn dead_owners_are_reclaimed_once() {
        let r = region();
        let a = r.claim(10, 5).unwrap();
        let b = r.claim(20, 6).unwrap();
        r.reserve(0, a.slot, 300, UNLIMITED).unwrap();
        r.reserve(0, b.slot, 200, UNLIMITED).unwrap();
        // pid 10 is dead.
        let n = r.reclaim_dead((99, 1), |pid, _| pid != 10);
        assert_eq!(n, 1);
        assert_eq!(r.used_bytes(0), 200);
        assert!(!r.owns(a));
        assert!(r.owns(b));
        assert_eq!(r.reclaim_dead((99, 1), |pid, _| pid != 10), 0);
        // The slot is reused, and the old claim does not own it again.
        let c = r.claim(10, 7).unwrap();
        assert_eq!(c.slot, a.slot);
        assert_eq!(r.slot_bytes(0, c.slot), 0);
        assert!(!r.owns(a), "a reused pid is a new claim");
        // A pid reused with another start time counts as dead.
        let n = r.reclaim_dead((99, 1), |_, start| start != 6);
        assert_eq!(n, 1);
        assert_eq!(r.used_bytes(0), 0);
    }

    /// The ABA interleaving, made deterministic by acting inside the
    /// reclaimer's liveness check (between its read of the owner word and
    /// its takeover): the dead owner's slot is freed by another reclaimer
    /// and claimed again by a live process that got the same pid. The slow
    /// reclaimer's takeover must fail and leave the live bytes alone.
    #[test]
    fn a_reused_pid_reclaiming_the_slot_is_not_zeroed_by_a_slow_reclaimer() {
        let r = region();
        let dead = r.claim(10, 5).unwrap();
        r.reserve(0, dead.slot, 300, UNLIMITED).unwrap();
        let reborn = std::cell::Cell::new(None);
        let n = r.reclaim_dead((99, 1), |pid, start| {
            if pid != 10 || start != 5 || reborn.get().is_some() {
                return true;
            }
            // Another process reclaims the dead owner's slot first...
            assert_eq!(r.reclaim_dead((98, 1), |p, s| !(p == 10 && s == 5)), 1);
            // ...and a new process with the recycled pid 10 claims it.
            let c = r.claim(10, 8).unwrap();
            assert_eq!(c.slot, dead.slot, "the same pid lands on the same slot");
            r.reserve(0, c.slot, 700, UNLIMITED).unwrap();
            reborn.set(Some(c));
            false
        });
        let reborn = reborn.get().unwrap();
        assert_eq!(n, 0, "the slow reclaimer took over nothing");
        assert!(r.owns(reborn), "the live process keeps its slot");
        assert_eq!(r.slot_bytes(0, reborn.slot), 700, "its bytes stay charged");
        assert_eq!(r.used_bytes(0), 700);
        assert_eq!(r.start_times[reborn.slot].load(Ordering::SeqCst), 8);
    }

    #[test]
    fn generations_advance_on_every_change_of_hands() {
        let r = region();
        let a = r.claim(10, 5).unwrap();
        r.release(a);
        let b = r.claim(10, 5).unwrap();
        assert_eq!(a.slot, b.slot);
        assert_ne!(a.owner, b.owner);
        assert_eq!(owner::state(b.owner), owner::ACTIVE);
        assert_eq!(owner::pid(b.owner), 10);
        // claim, activate, free, claim, activate
        assert_eq!(owner::generation(b.owner), 5);
        // Wrapping stays inside the generation bits.
        let top = owner::with_generation(owner::ACTIVE, 7, (1 << owner::GENERATION_BITS) - 1);
        let next = owner::next(top, owner::FREE, 0);
        assert_eq!(owner::generation(next), 0);
        assert_eq!(owner::state(next), owner::FREE);
        assert_eq!(owner::pid(next), 0);
    }

    #[test]
    fn full_table_is_reported() {
        let r = region();
        let mut claims = Vec::new();
        for pid in 0..MAX_SLOTS as u32 {
            claims.push(r.claim(pid + 1, 1).unwrap());
        }
        assert_eq!(r.claim(5000, 1), None);
        r.release(claims[3]);
        assert_eq!(r.claim(5000, 1).map(|c| c.slot), Some(claims[3].slot));
    }

    #[test]
    fn reclaim_is_rate_limited() {
        let r = region();
        assert!(r.reclaim_due(2_000_000_000, 1_000_000_000));
        assert!(!r.reclaim_due(2_500_000_000, 1_000_000_000));
        assert!(r.reclaim_due(3_000_000_000, 1_000_000_000));
    }
}
