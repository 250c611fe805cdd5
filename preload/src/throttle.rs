//! Admitting launches through the container's bucket for a GPU (see
//! `tessera_region::rate`): take tokens, and if the bucket says "later",
//! sleep until then — in steps of at most [`CHECK_NS`], so a new rate
//! from the agent takes effect within one step.

use std::sync::atomic::Ordering;

use tessera_region::UNLIMITED;
use tessera_region::rate::Admit;

use crate::state::Enforcer;
use crate::sys;

/// Longest sleep before looking at the control region again (10 ms).
pub const CHECK_NS: u64 = 10_000_000;

/// Waits until a launch of `cost` warps on control GPU `gpu` may start,
/// and counts it.
pub fn admit(e: &Enforcer, gpu: usize, cost: u64) {
    let bucket = &e.usage.buckets[gpu];
    loop {
        let (rate, burst, epoch) = e.control.launch_limits(gpu);
        if rate == UNLIMITED {
            // Counted only: no clock read, no bucket.
            bucket.launches.fetch_add(1, Ordering::Relaxed);
            bucket.warps.fetch_add(cost, Ordering::Relaxed);
            break;
        }
        let now = sys::monotonic_ns();
        match bucket.take(cost, rate, burst, epoch, now) {
            Admit::Now => break,
            Admit::At(t) => {
                if wait_until(e, t, epoch) {
                    break;
                }
            }
            Admit::Paused => sleep_ns(CHECK_NS),
        }
    }
    if let Some(slot) = e.slot_fast() {
        e.usage.count_launch(gpu, slot);
    }
}

/// Sleeps until `t`; false if the limits changed meanwhile (the caller
/// takes tokens again under the new ones).
fn wait_until(e: &Enforcer, t: u64, epoch: u64) -> bool {
    loop {
        let now = sys::monotonic_ns();
        if now >= t {
            return true;
        }
        if e.control.epoch() != epoch {
            return false;
        }
        sleep_ns((t - now).min(CHECK_NS));
    }
}

fn sleep_ns(ns: u64) {
    std::thread::sleep(std::time::Duration::from_nanos(ns));
}
