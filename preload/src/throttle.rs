//! Admitting launches through the container's bucket for a GPU (see
//! `tessera_region::rate`).
//!
//! Each thread takes warps from the shared bucket in batches ahead of its
//! launches ([`tessera_region::layout::Bucket::try_take_ahead`]) and spends them from thread-local
//! state, so most launches touch no shared memory and read no precise
//! clock: one load of the control epoch, one read of the coarse clock, a
//! few thread-local cells. Invariants (they make the module docs of
//! `tessera_region::rate` apply, so threads and processes together never
//! exceed rate + burst):
//! - a batch is spent only while the coarse clock is before its admission
//!   time + [`Life::spend_ns`], i.e. within [`Life::bound_ns`] of its
//!   admission, and under the control epoch it was taken in; what is left
//!   after that is dropped, never returned;
//! - a batch holds at most [`batch_max`] warps for that bound;
//! - a forked child starts with no batch (its parent's is the parent's);
//! - a batch is spent on the GPU it was taken for only: a launch spends it
//!   without a device lookup only while its [`Route`] (one GPU under the
//!   batch's epoch, or the same current context in the same context
//!   generation) still leads to that GPU, else it looks its device up;
//! - every launch is charged `max(cost, floor)`, the floor being the GPU's
//!   `launch_floor` under the epoch the charge is made in (the batch's, or
//!   the one `refill` reads): the bucket, the batch and the usage
//!   counters all see the charged warps.
//!
//! The hooks try [`try_admit_fast`] before any other check (the one-GPU
//! route), then [`try_admit_in_context`] (the context route), and only
//! then dispatch and [`admit`].
//!
//! Batches grow (doubling) while a thread spends each one before it
//! expires, and shrink to what was spent when one expires, so a thread
//! that launches rarely takes exactly what it launches and drops nothing.
//! A batch is taken only if the bucket holds all of it now; otherwise (a
//! throttled container, a burst too small for batches, no coarse clock)
//! the launch takes from the bucket alone and waits its turn there, as
//! before batches existed: a launch that waits anyway does not need a
//! fast path.
//!
//! Launch counters in the usage region are added per batch (without a
//! limit, every [`FLUSH_EVERY`] launches): at the next batch, when the
//! thread exits, and when the process exits normally. They lag a running
//! thread by at most one batch; a killed process's last batch goes
//! uncounted. The simulator's launch log, not these counters,
//! is what the tests judge launch limits by.
//!
//! A launch the bucket says must wait sleeps in steps of at most
//! [`CHECK_NS`], so a new rate from the agent takes effect within one step
//! (the README claims 10 ms; half of that is left for late wake-ups).

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::{Once, OnceLock};

use tessera_region::UNLIMITED;
use tessera_region::rate::{Admit, batch_max, rescaled};

use crate::state::{self, Enforcer};
use crate::sys;

/// Longest sleep before looking at the control region again (5 ms): a
/// new rate applies within 10 ms even to a thread woken a little late.
pub const CHECK_NS: u64 = 5_000_000;

/// How long a batch may be spent after its admission by the coarse
/// clock (4 ms).
pub const SPEND_NS: u64 = 4_000_000;

/// Launches an unlimited thread counts before adding them to the usage
/// region.
pub const FLUSH_EVERY: u64 = 64;

/// Coarse clocks ticking slower than this are not used (no batches).
const MAX_COARSE_TICK_NS: u64 = 10_000_000;

/// How long batches live on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Life {
    /// A batch is spent while the coarse clock reads less than its
    /// admission time plus this.
    pub spend_ns: u64,
    /// Upper bound on the real time between a batch's admission and its
    /// last launch: `spend_ns` plus one coarse tick (the coarse clock lags
    /// the real one by less than a tick).
    pub bound_ns: u64,
}

impl Life {
    /// For a coarse clock ticking every `tick_ns` (`None`: none).
    pub fn for_tick(tick_ns: Option<u64>) -> Option<Self> {
        let tick = tick_ns.filter(|&t| t > 0 && t <= MAX_COARSE_TICK_NS)?;
        Some(Self {
            spend_ns: SPEND_NS,
            bound_ns: SPEND_NS + tick,
        })
    }
}

fn life() -> Option<Life> {
    static LIFE: OnceLock<Option<Life>> = OnceLock::new();
    *LIFE.get_or_init(|| Life::for_tick(sys::coarse_resolution_ns()))
}

const NO_GPU: usize = usize::MAX;

/// How a thread's launches find the GPU of its batch while the control
/// epoch is the batch's, without looking the device up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// They do not: every launch looks its device up.
    Lookup,
    /// The container has exactly one GPU (index 0).
    Single,
    /// The GPU of context `ctx`, while it is the thread's current context
    /// and no context was destroyed since `generation`
    /// ([`crate::accounting::context_generation`]): a context's device
    /// never changes, and a reused handle comes with a new generation.
    Context {
        /// The context handle.
        ctx: usize,
        /// The context generation it was looked up in.
        generation: u64,
    },
}

/// A thread's batch and its launches not yet counted.
struct Local {
    /// The enforcer the batch was taken from (`None`: no batch, e.g. in a
    /// forked child, whose first launch then takes the full path).
    enforcer: Cell<Option<&'static Enforcer>>,
    /// How the next launches find the batch's GPU while the control epoch
    /// is `epoch` (the fast path, [`try_admit_fast`]).
    route: Cell<Route>,
    /// Control GPU index of the batch (`NO_GPU`: none).
    gpu: Cell<usize>,
    /// Control epoch the batch was taken in.
    epoch: Cell<u64>,
    /// Spend only while the coarse clock reads less than this.
    expires: Cell<u64>,
    /// Warps left in the batch.
    left: Cell<u64>,
    /// Warps the batch held.
    size: Cell<u64>,
    /// The GPU's launch floor under `epoch`.
    floor: Cell<u64>,
    /// Launches (and their warps) on `gpu` not yet counted.
    launches: Cell<u64>,
    warps: Cell<u64>,
    /// The rate was unlimited when the thread last looked (under `epoch`):
    /// launches are only counted, and `left` is infinite.
    unlimited: Cell<bool>,
    /// Whether the exit flushes are registered for this thread.
    hooked: Cell<bool>,
}

impl Local {
    const fn new() -> Self {
        Self {
            enforcer: Cell::new(None),
            route: Cell::new(Route::Lookup),
            gpu: Cell::new(NO_GPU),
            epoch: Cell::new(0),
            expires: Cell::new(0),
            left: Cell::new(0),
            size: Cell::new(0),
            floor: Cell::new(0),
            launches: Cell::new(0),
            warps: Cell::new(0),
            unlimited: Cell::new(false),
            hooked: Cell::new(false),
        }
    }

    /// Spends `cost` (at least the batch's floor) from this thread's batch
    /// if it is for `gpu`, taken under `epoch`, holds enough and has not
    /// expired (unlimited: counts the launch, up to [`FLUSH_EVERY`] of
    /// them).
    #[inline(always)]
    fn try_spend(&self, gpu: usize, epoch: u64, cost: u64) -> bool {
        let cost = cost.max(self.floor.get());
        if self.gpu.get() != gpu || self.epoch.get() != epoch || self.left.get() < cost {
            return false;
        }
        let fresh = if self.unlimited.get() {
            self.launches.get() < FLUSH_EVERY
        } else {
            sys::coarse_ns() < self.expires.get()
        };
        if fresh {
            self.spend(cost);
        }
        fresh
    }

    /// `Local::try_spend` on the batch's GPU if the thread's route is
    /// [`Route::Context`] and its current context is still the route's,
    /// with no context destroyed since.
    fn try_spend_in_context(&self, epoch: u64, cost: u64) -> bool {
        let Route::Context { ctx, generation } = self.route.get() else {
            return false;
        };
        crate::accounting::context_generation() == generation
            && crate::accounting::current_context() == ctx
            && self.try_spend(self.gpu.get(), epoch, cost)
    }

    fn spend(&self, cost: u64) {
        self.left.set(self.left.get() - cost);
        self.launches.set(self.launches.get() + 1);
        self.warps.set(self.warps.get() + cost);
    }
}

thread_local! {
    // No destructor: always accessible, also from the fork handler and
    // other thread-local destructors.
    static LOCAL: Local = const { Local::new() };
    static FLUSH_AT_THREAD_EXIT: FlushAtThreadExit = const { FlushAtThreadExit };
}

/// The launch fast path, before any other check of the hook: spends
/// `cost` warps from this thread's batch if the control epoch is still
/// the batch's, the container had one GPU under it ([`Route::Single`]),
/// and the batch holds enough and has not expired (see
/// `Local::try_spend`). `false`: the caller takes the full path
/// ([`try_admit_in_context`], then dispatch, device lookup, [`admit`]).
///
/// Skipping the mode and fork checks is sound: a batch exists only if a
/// launch of this thread went through [`admit`] under limits, the mode
/// never changes once set, and a forked child's only thread starts with
/// no batch ([`forget`]).
#[inline(always)]
pub fn try_admit_fast(cost: u64) -> bool {
    LOCAL.with(|l| {
        let Some(e) = l.enforcer.get() else {
            return false;
        };
        // (The field, not `ControlRegion::epoch`: a call into another
        // crate that is not inlined.)
        let epoch = e.control.header.epoch.load(Ordering::Acquire);
        matches!(l.route.get(), Route::Single) && l.try_spend(l.gpu.get(), epoch, cost)
    })
}

/// [`try_admit_fast`] for a thread whose route is [`Route::Context`]: the
/// first thing the full path tries (out of the hook, so that the one-GPU
/// fast path stays small).
pub fn try_admit_in_context(cost: u64) -> bool {
    LOCAL.with(|l| match l.enforcer.get() {
        Some(e) => l.try_spend_in_context(e.control.header.epoch.load(Ordering::Acquire), cost),
        None => false,
    })
}

/// Waits until a launch of `cost` warps on control GPU `gpu` may start,
/// and counts it. `route` says how the launch found `gpu`, valid under
/// control epoch `route_epoch`; the thread's batch serves
/// [`try_admit_fast`] by that route if it is taken under that same epoch.
#[inline]
pub fn admit(e: &'static Enforcer, gpu: usize, cost: u64, route: Route, route_epoch: u64) {
    let epoch = e.control.header.epoch.load(Ordering::Acquire);
    // The per-launch check alone inside the thread-local access; the slow
    // path looks the thread-local up again.
    if !LOCAL.with(|l| l.try_spend(gpu, epoch, cost)) {
        LOCAL.with(|l| refill(e, l, gpu, cost, route, route_epoch));
    }
}

/// Drops this thread's batch and uncounted launches (in a forked child:
/// they are the parent's).
pub fn forget() {
    LOCAL.with(|l| {
        for c in [
            &l.epoch,
            &l.expires,
            &l.left,
            &l.size,
            &l.floor,
            &l.launches,
            &l.warps,
        ] {
            c.set(0);
        }
        l.gpu.set(NO_GPU);
        l.enforcer.set(None);
        l.route.set(Route::Lookup);
        l.unlimited.set(false);
        l.hooked.set(false);
    });
}

/// The slow path: counts what the thread launched, drops what is left of
/// its batch, and admits this launch with a new batch.
#[cold]
#[inline(never)]
fn refill(e: &'static Enforcer, l: &Local, gpu: usize, cost: u64, route: Route, route_epoch: u64) {
    flush(e, l);
    hook_exits(l);
    let before_expiry = l.gpu.get() == gpu && sys::coarse_ns() < l.expires.get();
    let spent = l.size.get().saturating_sub(l.left.get());
    // Spent before it expired: twice as much; expired: what was spent.
    let want = if before_expiry && l.left.get() < cost.max(l.floor.get()) {
        l.size.get().saturating_mul(2)
    } else {
        spent
    };
    l.gpu.set(gpu);
    l.enforcer.set(Some(e));
    l.left.set(0);
    l.size.set(0);
    l.unlimited.set(false);
    let bucket = &e.usage.buckets[gpu];
    loop {
        let limits = e.control.launch_limits(gpu);
        let (rate, burst, epoch) = (limits.rate, limits.burst, limits.epoch);
        let cost = cost.max(limits.floor);
        l.epoch.set(epoch);
        l.floor.set(limits.floor);
        // The route under the very epoch the batch is keyed on: a GPU set
        // written between the lookup and these limits leaves the batch to
        // the per-launch path (and the next launch looks again).
        l.route.set(if epoch == route_epoch {
            route
        } else {
            Route::Lookup
        });
        if rate == UNLIMITED {
            // Counted only, in the usage region every FLUSH_EVERY launches.
            l.unlimited.set(true);
            l.left.set(u64::MAX);
            l.spend(cost);
            return;
        }
        if rate == 0 {
            sleep_ns(CHECK_NS);
            continue;
        }
        let now = sys::monotonic_ns();
        if let Some(life) = life() {
            // Whole launches of this cost: a uniform stream drops nothing.
            let max = batch_max(rate, burst, life.bound_ns, life.spend_ns);
            let n = want.min(max) / cost * cost;
            if n > cost && bucket.try_take_ahead(n, rate, burst, life.bound_ns, epoch, now) {
                l.size.set(n);
                l.left.set(n);
                l.expires.set(now.saturating_add(life.spend_ns));
                l.spend(cost);
                return;
            }
        }
        // Alone (no room for a batch now, or none wanted): the bucket
        // counts it, and it may wait.
        let admitted = match bucket.take(cost, rate, burst, epoch, now) {
            Admit::Now => now,
            Admit::At(start) => wait(e, gpu, start, rate, epoch),
            Admit::Paused => continue,
        };
        if let Some(slot) = e.slot_fast() {
            e.usage.count_launch(gpu, slot);
        }
        // No credit, but a lifetime, so that the next launch knows whether
        // a batch of this one would have been spent in time.
        l.size.set(cost);
        l.expires
            .set(admitted.saturating_add(life().map_or(0, |life| life.spend_ns)));
        return;
    }
}

/// Adds this thread's uncounted launches to the usage region.
fn flush(e: &Enforcer, l: &Local) {
    let (n, warps, gpu) = (l.launches.replace(0), l.warps.replace(0), l.gpu.get());
    if n == 0 || gpu == NO_GPU {
        return;
    }
    e.usage.buckets[gpu].count_many(n, warps);
    if let Some(slot) = e.slot_fast() {
        e.usage.launches[gpu][slot].fetch_add(n, Ordering::Relaxed);
    }
}

/// Registers the flushes at thread exit (this thread) and at process exit
/// (once).
fn hook_exits(l: &Local) {
    if l.hooked.replace(true) {
        return;
    }
    FLUSH_AT_THREAD_EXIT.with(|_| {});
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| sys::at_exit(flush_at_exit));
}

fn flush_this_thread() {
    crate::hooks::guard((), || {
        if let Some(e) = state::enforcer() {
            LOCAL.with(|l| flush(e, l));
        }
    });
}

/// Flushes the exiting thread's counts.
struct FlushAtThreadExit;

impl Drop for FlushAtThreadExit {
    fn drop(&mut self) {
        flush_this_thread();
    }
}

extern "C" fn flush_at_exit() {
    flush_this_thread();
}

/// Sleeps until `start`, when a launch (or batch) already taken from the
/// bucket at `rate` (control epoch `epoch`) may start, and returns when
/// that was. Should the agent set a new rate meanwhile, the launch is not
/// taken again: its remaining wait is rescaled as the bucket's debt is
/// (unlimited ends it, zero holds it until the rate is raised).
fn wait(e: &Enforcer, gpu: usize, mut start: u64, mut rate: u64, mut epoch: u64) -> u64 {
    let bucket = &e.usage.buckets[gpu];
    let mut paused = false;
    loop {
        let now = sys::monotonic_ns();
        if !paused && now >= start {
            return start;
        }
        if e.control.epoch() != epoch {
            let limits = e.control.launch_limits(gpu);
            let (new_rate, new_epoch) = (limits.rate, limits.epoch);
            epoch = new_epoch;
            if new_rate == UNLIMITED {
                return now;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_live_a_spend_time_plus_a_coarse_tick() {
        assert_eq!(
            Life::for_tick(Some(4_000_000)),
            Some(Life {
                spend_ns: SPEND_NS,
                bound_ns: SPEND_NS + 4_000_000
            })
        );
        // No coarse clock, or one too slow: no batches.
        assert_eq!(Life::for_tick(None), None);
        assert_eq!(Life::for_tick(Some(0)), None);
        assert_eq!(Life::for_tick(Some(20_000_000)), None);
    }
}
