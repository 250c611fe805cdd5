//! Admitting launches through the container's bucket for a GPU (see
//! `tessera_region::rate`): take tokens, and if the bucket says "later",
//! sleep until then — in steps of at most [`CHECK_NS`], so a new rate
//! from the agent takes effect within one step.

use tessera_region::UNLIMITED;
use tessera_region::rate::{Admit, rescaled};

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
            bucket.count(cost);
            break;
        }
        match bucket.take(cost, rate, burst, epoch, sys::monotonic_ns()) {
            Admit::Now => break,
            Admit::At(start) => {
                wait(e, gpu, start, rate, epoch);
                break;
            }
            Admit::Paused => sleep_ns(CHECK_NS),
        }
    }
    if let Some(slot) = e.slot_fast() {
        e.usage.count_launch(gpu, slot);
    }
}

/// Sleeps until `start`, when a launch already taken from the bucket at
/// `rate` (control epoch `epoch`) may start. Should the agent set a new
/// rate meanwhile, the launch is not taken again: its remaining wait is
/// rescaled as the bucket's debt is (unlimited ends it, zero holds it
/// until the rate is raised).
fn wait(e: &Enforcer, gpu: usize, mut start: u64, mut rate: u64, mut epoch: u64) {
    let bucket = &e.usage.buckets[gpu];
    let mut paused = false;
    loop {
        let now = sys::monotonic_ns();
        if !paused && now >= start {
            return;
        }
        if e.control.epoch() != epoch {
            let (new_rate, _, new_epoch) = e.control.launch_limits(gpu);
            epoch = new_epoch;
            if new_rate == UNLIMITED {
                return;
            }
            paused = new_rate == 0;
            if !paused {
                bucket.rescale(new_rate, new_epoch, now);
                start = now + rescaled(start.saturating_sub(now), rate, new_rate);
                rate = new_rate;
            }
        }
        let left = if paused {
            CHECK_NS
        } else {
            start.saturating_sub(now)
        };
        sleep_ns(left.min(CHECK_NS));
    }
}

fn sleep_ns(ns: u64) {
    std::thread::sleep(std::time::Duration::from_nanos(ns));
}
