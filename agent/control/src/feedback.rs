//! The loop of one (container, GPU): counters to observations, and an
//! observation plus a cap to the next launch rate (see the module docs of
//! [`crate`] for the law).
//!
//! Invariants the code keeps:
//! - the rate is finite, at least [`MIN_RATE`] and at most [`MAX_RATE`]
//!   warps/s, and grows by at most `max_growth` per period;
//! - the integral stays within `[-cap/4, min(cap/4, 105 - cap)]`;
//! - the cost estimate, once known, is finite and positive;
//! - untrusted counters never panic: a counter that went backwards
//!   rebases, and warps beyond what the bucket could have admitted at the
//!   rates in force are clipped.

use super::{CAPACITY_PERCENT, ControllerConfig, LoopState};

/// Lowest rate written (0 would pause launches).
pub const MIN_RATE: f64 = 1.0;
/// Highest rate written (warps/s): far above any GPU.
pub const MAX_RATE: f64 = 1e15;

/// Windows shorter than this (s) are ignored (the next tick covers them).
const MIN_WINDOW_S: f64 = 0.005;
/// Windows longer than this (s) mean the caller stalled or restarted:
/// counters rebase, nothing is learnt from them.
const MAX_WINDOW_S: f64 = 10.0;
/// Most throttle time carried into later windows (s): a launch waits at
/// most a second, a few threads may wait at once.
const MAX_WAIT_CARRY_S: f64 = 2.0;
/// A bucket counts as binding when launches waited this share of the
/// window...
const BINDING_WAIT_SHARE: f64 = 0.01;
/// ...or the container launched at least this share of its rate.
const BINDING_RATE_SHARE: f64 = 0.97;
/// Most windows learnt as one ([`Held`]).
const HOLD_WINDOWS: f64 = 10.0;

/// One window's measurements, derived from the counters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// SM use over the window (percent), if measured.
    pub sm_percent: Option<f64>,
    /// Warps launched per second over the window (clipped).
    pub warps_per_s: f64,
    /// Whether the bucket held the container back.
    pub binding: bool,
}

/// Windows of a saturated device held back to be learnt as one: from a
/// window in which the container's warps looked cheap (they queued
/// rather than ran) until the device has room again, when what queued
/// has run and looks dear by as much. Learning only the dear windows
/// after each burst of a neighbour, never the cheap ones, would raise the
/// cost and lower the rate (and the share) cycle after cycle; the windows
/// together cost what they cost. At most [`HOLD_WINDOWS`]: on a device
/// saturated for good, a second's windows are learnt together.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Held {
    /// Sums of SM percent and warps/s over the windows held.
    sm: f64,
    warps: f64,
    /// Windows held.
    n: f64,
}

impl Held {
    fn hold(&mut self, u: f64, w: f64) {
        self.sm += u;
        self.warps += w;
        self.n += 1.0;
    }

    /// The means of SM percent and warps/s over the windows held and
    /// `(u, w)`; none held: `(u, w)`. Lets the held windows go.
    fn fold(&mut self, u: f64, w: f64) -> (f64, f64) {
        let h = std::mem::take(self);
        let n = h.n + 1.0;
        ((h.sm + u) / n, (h.warps + w) / n)
    }
}

/// The previous counter values, to take deltas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counters {
    warps: u64,
    throttled_ns: u64,
}

/// The state of one loop.
#[derive(Clone, Debug, PartialEq)]
pub struct Loop {
    /// SM percent per warp/s, once estimated.
    cost: Option<f64>,
    /// Forgotten sums of SM percent and warps/s (their ratio is `cost`).
    sm_sum: f64,
    warps_sum: f64,
    /// Integral correction, in percentage points of the cap.
    integral: f64,
    /// The rate in force since the last decision, and the one before.
    rate: f64,
    prev_rate: f64,
    /// The cap the rate in force aims at.
    aimed: f64,
    counters: Option<Counters>,
    /// Warps the bucket could still have admitted beyond the rate.
    allowance: f64,
    /// Throttle time reported but not yet spent (s).
    wait_carry: f64,
    /// Cheap windows of a saturated device, not learnt yet.
    held: Held,
    state: LoopState,
}

impl Loop {
    /// A loop with no estimate, starting at `rate` (the configured initial
    /// rate, or the rate found in the control region when the agent
    /// resumes control of a running container).
    pub fn new(rate: f64) -> Self {
        let rate = clamp_rate(rate);
        Self {
            cost: None,
            sm_sum: 0.0,
            warps_sum: 0.0,
            integral: 0.0,
            rate,
            prev_rate: rate,
            aimed: 0.0,
            counters: None,
            allowance: rate,
            wait_carry: 0.0,
            held: Held::default(),
            state: LoopState::Probing,
        }
    }

    /// The rate in force (warps/s).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The cost estimate (SM percent per warp/s).
    pub fn cost(&self) -> Option<f64> {
        self.cost
    }

    /// What the loop is doing.
    pub fn state(&self) -> LoopState {
        self.state
    }

    /// The integral correction (pp).
    pub fn integral(&self) -> f64 {
        self.integral
    }

    /// Forgets the counters last seen: the next observation only records
    /// them.
    pub fn rebase(&mut self) {
        self.counters = None;
    }

    /// Turns cumulative counters read at the end of a `dt_s` window into an
    /// observation; `None` when the window teaches nothing (the first
    /// one, a too short or too long one, counters that went backwards).
    pub fn observe(
        &mut self,
        dt_s: f64,
        sm_percent: Option<f64>,
        warps: u64,
        throttled_ns: u64,
        burst_s: f64,
    ) -> Option<Observation> {
        let now = Counters {
            warps,
            throttled_ns,
        };
        let before = self.counters.replace(now)?;
        if !(MIN_WINDOW_S..=MAX_WINDOW_S).contains(&dt_s) {
            if dt_s < MIN_WINDOW_S {
                // Keep the older base: the next window covers this one.
                self.counters = Some(before);
            }
            return None;
        }
        // A counter that went backwards (region recreated, or rewritten by
        // the container): rebase, learn nothing.
        let dw = warps.checked_sub(before.warps)?;
        let dthr = throttled_ns.checked_sub(before.throttled_ns)?;
        // No honest bucket admits more than the rates in force allowed
        // over the window, plus the burst and one launch's debt (at most a
        // second of the rate): `allowance` mirrors the bucket, so a
        // counter inflated window after window gains nothing beyond that.
        let r = self.rate.max(self.prev_rate);
        let credit = self.allowance + r * dt_s * 1.02;
        let used = (dw as f64).min(credit);
        self.allowance = (credit - used).min(r * (burst_s + 1.0));
        let warps_per_s = used / dt_s;
        // The bucket adds a launch's whole wait when it admits it: a wait
        // longer than the window goes on into the next ones (a container
        // held at one launch a second is held all that second).
        let owed = dthr as f64 / 1e9 + self.wait_carry;
        let waited = owed.min(dt_s);
        self.wait_carry = (owed - dt_s).clamp(0.0, MAX_WAIT_CARRY_S);
        let binding = waited >= BINDING_WAIT_SHARE * dt_s
            || (warps_per_s > 0.0 && warps_per_s >= BINDING_RATE_SHARE * self.rate);
        let sm_percent = sm_percent
            .filter(|u| u.is_finite())
            .map(|u| u.clamp(0.0, CAPACITY_PERCENT));
        Some(Observation {
            sm_percent,
            warps_per_s,
            binding,
        })
    }

    /// Learns from `obs` (if any) and decides the rate that aims at `cap`
    /// (percent) for the next window. `saturated`: the device was busy
    /// nearly all the window, so a container's warps may have queued
    /// rather than run — then nothing moves the rate up.
    pub fn decide(
        &mut self,
        obs: Option<Observation>,
        cap: f64,
        saturated: bool,
        cfg: &ControllerConfig,
    ) -> f64 {
        let cap = cap.clamp(0.0, CAPACITY_PERCENT);
        let old = self.rate;
        let mut probe_rate = None;
        if let Some(o) = obs {
            self.state = if o.warps_per_s > 0.0 {
                LoopState::Tracking
            } else {
                LoopState::Idle
            };
            if let Some(u) = o.sm_percent {
                let w = o.warps_per_s;
                let cheap = self.cost.is_some_and(|c| u / w < c);
                let hold = saturated
                    && w > 0.0
                    && (cheap || self.held.n > 0.0)
                    && self.held.n + 1.0 < HOLD_WINDOWS;
                if hold {
                    // Queued warps look cheap, and the warps that queued
                    // run dear while the device stays busy: held until it
                    // has room (neither learnt nor integrated now).
                    self.held.hold(u, w);
                } else {
                    let (u, w) = if w > 0.0 {
                        self.held.fold(u, w)
                    } else {
                        // Idle: what queued ran or was dropped meanwhile.
                        self.held = Held::default();
                        (u, w)
                    };
                    let o = Observation {
                        sm_percent: Some(u),
                        warps_per_s: w,
                        ..o
                    };
                    self.learn(o, u, cap, saturated, cfg, &mut probe_rate);
                    // Conditional integration: large errors are the model's
                    // business (a transient), small ones the integral's.
                    let e = self.aimed - u;
                    if self.cost.is_some()
                        && o.binding
                        && e.abs() <= (0.2 * cap).max(2.0)
                        && !(saturated && e > 0.0)
                    {
                        self.integral += cfg.ki * e;
                    }
                }
            }
        }
        // A little over 100 lets a container alone on its GPU catch up after
        // it was held back (e.g. short of CPU).
        let hi = (cap / 4.0).min(CAPACITY_PERCENT + 5.0 - cap).max(0.0);
        self.integral = self.integral.clamp(-cap / 4.0, hi);
        let wanted = match (self.cost, probe_rate) {
            (_, Some(r)) => r,
            (Some(c), None) => (cap + self.integral).max(0.0) / c,
            (None, None) => old,
        };
        let mut rate = clamp_rate(wanted.min(old * cfg.max_growth.max(1.0)));
        // On a saturated device a higher rate may only queue: the rate
        // rises there only towards a cap that rose (another container's
        // fell in the same split), never from the integral or the
        // estimate alone.
        if saturated && rate > old && probe_rate.is_none() && cap <= self.aimed {
            rate = old;
        }
        if self.cost.is_none() {
            self.state = LoopState::Probing;
        }
        self.prev_rate = old;
        self.rate = rate;
        self.aimed = cap;
        rate
    }

    /// Updates the cost estimate from one window with SM use `u`.
    fn learn(
        &mut self,
        o: Observation,
        u: f64,
        cap: f64,
        saturated: bool,
        cfg: &ControllerConfig,
        probe_rate: &mut Option<f64>,
    ) {
        let w = o.warps_per_s;
        match self.cost {
            None => {
                if w > 0.0 && u >= (cap / 4.0).max(1.0) {
                    self.sm_sum = u;
                    self.warps_sum = w;
                    self.cost = Some(u / w);
                } else if o.binding {
                    // Still far below the cap, held by the bucket: grow
                    // (from below, so never past the cap by more than the
                    // measurement's rounding). Also on a saturated device,
                    // or a newcomer would never get going there.
                    *probe_rate = Some(self.rate * cfg.probe_growth);
                }
            }
            Some(c) => {
                if w <= 0.0 {
                    return;
                }
                let f = cfg.forget.clamp(0.0, 0.99);
                let (s, ws) = (f * self.sm_sum + u, f * self.warps_sum + w);
                let next = s / ws;
                if !next.is_finite() || next <= 0.0 || !ws.is_finite() {
                    // Warps that cost nothing measurable: the estimate
                    // falls as far as one period's growth allows.
                    let lower = c / cfg.max_growth.max(1.0);
                    self.warps_sum = if ws.is_finite() { ws } else { w };
                    self.sm_sum = lower * self.warps_sum;
                    self.cost = Some(lower);
                    return;
                }
                if saturated && next < c {
                    // Queued warps look cheap: do not believe it.
                    return;
                }
                self.sm_sum = s;
                self.warps_sum = ws;
                self.cost = Some(next);
            }
        }
    }
}

fn clamp_rate(r: f64) -> f64 {
    if r.is_nan() {
        MIN_RATE
    } else {
        r.clamp(MIN_RATE, MAX_RATE)
    }
}
