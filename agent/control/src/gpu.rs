//! [`GpuController`]: the loops of one GPU's containers and their
//! allocator.

use std::collections::BTreeMap;
use std::time::Instant;

use super::allocator::{Allocation, Claim, allocate};
use super::feedback::{Loop, Observation};
use super::{
    CAPACITY_PERCENT, ContainerControl, ContainerId, ControlError, ControllerConfig, GpuSample,
    LoopState, Pacing, RateDecision,
};

/// One container on the GPU.
#[derive(Clone, Debug)]
struct Managed {
    control: ContainerControl,
    state: Loop,
    /// Periods left during which it counts as hungry.
    hungry_for: u32,
    /// SM use in the last window.
    measured: Option<f64>,
    /// This tick's observation (set and taken within one tick).
    obs: Option<Observation>,
}

/// The compute controller of one GPU: one loop per container, and the
/// split of the GPU among them.
///
/// The daemon keeps one per GPU, tells it which containers use the GPU
/// ([`Self::upsert`], [`Self::remove`]) and calls [`Self::tick`] every
/// [`super::PERIOD`] with fresh samples; it writes each decision's rate
/// and burst into the container's control region.
#[derive(Clone, Debug, Default)]
pub struct GpuController {
    config: ControllerConfig,
    containers: BTreeMap<ContainerId, Managed>,
    last_tick: Option<Instant>,
    /// The last split and the claims it was made from (the same claims
    /// split the same way: most periods on a GPU whose containers idle).
    split: (Vec<Claim>, Vec<Allocation>),
}

impl GpuController {
    /// A controller with `config`.
    pub fn new(config: ControllerConfig) -> Self {
        Self {
            config,
            containers: BTreeMap::new(),
            last_tick: None,
            split: (Vec::new(), Vec::new()),
        }
    }

    /// The tuning in use.
    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    /// Adds container `id`, or changes its target, mode or priority (the
    /// next tick aims at the new values; what the loop learnt is kept).
    pub fn upsert(&mut self, id: &str, control: ContainerControl) -> Result<(), ControlError> {
        control.validate()?;
        match self.containers.get_mut(id) {
            Some(m) => m.control = control,
            None => {
                self.containers.insert(
                    id.to_string(),
                    Managed {
                        control,
                        state: Loop::new(self.config.start_rate()),
                        hungry_for: 0,
                        measured: None,
                        obs: None,
                    },
                );
            }
        }
        Ok(())
    }

    /// Adds container `id` that already runs under `current` (read from
    /// its control region, e.g. after the agent restarted): the loop
    /// starts from that rate instead of the initial one, so control
    /// resumes without a jump. A rate written under another launch floor
    /// (by `container add`, which does not know the GPU's, or by an agent
    /// from before the floor) is in other units: the loop then starts
    /// from at least its own start rate, the pace of a new container. A
    /// container already known is only updated as by [`Self::upsert`].
    pub fn resume(
        &mut self,
        id: &str,
        control: ContainerControl,
        current: Pacing,
    ) -> Result<(), ControlError> {
        control.validate()?;
        if self.containers.contains_key(id) {
            return self.upsert(id, control);
        }
        let start = self.config.start_rate();
        let rate = match current.rate {
            0 | tessera_region::layout::UNLIMITED => start,
            r if current.floor != self.config.launch_floor => (r as f64).max(start),
            r => r as f64,
        };
        self.containers.insert(
            id.to_string(),
            Managed {
                control,
                state: Loop::new(rate),
                hungry_for: 0,
                measured: None,
                obs: None,
            },
        );
        Ok(())
    }

    /// Forgets container `id` (it left the GPU); its share goes to the
    /// others at the next tick.
    pub fn remove(&mut self, id: &str) -> bool {
        self.containers.remove(id).is_some()
    }

    /// Makes container `id`'s next sample only record its counters (they
    /// span more than the next window, e.g. after periods without
    /// samples).
    pub fn rebase(&mut self, id: &str) {
        if let Some(m) = self.containers.get_mut(id) {
            m.state.rebase();
        }
    }

    /// Containers managed here.
    pub fn len(&self) -> usize {
        self.containers.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    /// Whether container `id` is managed here.
    pub fn contains(&self, id: &str) -> bool {
        self.containers.contains_key(id)
    }

    /// The containers managed, with their controls.
    pub fn containers(&self) -> impl Iterator<Item = (&str, &ContainerControl)> {
        self.containers
            .iter()
            .map(|(k, m)| (k.as_str(), &m.control))
    }

    /// One period: learns from `sample` (taken at `now`, covering the
    /// window since the previous tick) and decides every managed
    /// container's launch limits, in id order. Samples of unknown
    /// containers are ignored; a managed container without one learns
    /// nothing this period. A container's first sample only records its
    /// counters.
    pub fn tick(&mut self, now: Instant, sample: &GpuSample) -> Vec<RateDecision> {
        self.tick_inner(now, sample, None)
    }

    /// [`Self::tick`], returning the decisions of the containers named in
    /// `wanted` only (sorted ascending, as ids compare; every container
    /// still learns and is allotted its share, the others' decisions are
    /// not built). One pass over the containers, whatever their number:
    /// no lookup by id per container.
    pub fn tick_for(
        &mut self,
        now: Instant,
        sample: &GpuSample,
        wanted: &[&str],
    ) -> Vec<RateDecision> {
        debug_assert!(wanted.is_sorted(), "wanted ids must be sorted");
        self.tick_inner(now, sample, Some(wanted))
    }

    fn tick_inner(
        &mut self,
        now: Instant,
        sample: &GpuSample,
        wanted: Option<&[&str]>,
    ) -> Vec<RateDecision> {
        let cfg = self.config;
        let dt = self
            .last_tick
            .map(|t| now.saturating_duration_since(t).as_secs_f64());
        // Keep the base of a window too short to learn from.
        if dt.is_none_or(|d| d >= 0.005) {
            self.last_tick = Some(now);
        }
        let mut container_busy = 0.0;
        for s in &sample.containers {
            let Some(m) = self.containers.get_mut(&s.id) else {
                continue;
            };
            let obs = m.state.observe(
                dt.unwrap_or(0.0),
                s.sm_percent,
                s.warps,
                s.throttled_ns,
                cfg.burst_s,
            );
            if let Some(o) = obs {
                m.measured = o.sm_percent;
                container_busy += o.sm_percent.unwrap_or(0.0);
                if o.binding {
                    m.hungry_for = cfg.hungry_hold.max(1);
                } else if o.warps_per_s <= 0.0 {
                    m.hungry_for = 0;
                } else {
                    m.hungry_for = m.hungry_for.saturating_sub(1);
                }
            }
            // (A second sample of one container replaces the first.)
            m.obs = obs;
        }
        let busy = sample
            .busy_percent
            .filter(|b| b.is_finite())
            .unwrap_or(container_busy)
            .max(container_busy);
        let saturated = busy >= cfg.saturated_percent;
        let claims: Vec<Claim> = self
            .containers
            .values()
            .map(|m| {
                let hungry = m.hungry_for > 0;
                Claim {
                    mode: m.control.mode,
                    priority: m.control.priority,
                    target: m.control.target_percent,
                    claim: if hungry {
                        CAPACITY_PERCENT
                    } else {
                        m.measured.unwrap_or(0.0) + cfg.headroom_pp
                    },
                    hungry,
                }
            })
            .collect();
        if claims != self.split.0 {
            self.split.1 = allocate(&claims);
            self.split.0 = claims;
        }
        let allocations = self.split.1.iter().copied();
        // (Both in id order: a cursor walks `wanted` alongside.)
        let mut next_wanted = 0;
        self.containers
            .iter_mut()
            .zip(allocations)
            .filter_map(|((id, m), a)| {
                let obs = m.obs.take();
                let rate = m.state.decide(obs, a.cap, saturated, &cfg);
                if let Some(w) = wanted {
                    while w.get(next_wanted).is_some_and(|k| *k < id.as_str()) {
                        next_wanted += 1;
                    }
                    if w.get(next_wanted) != Some(&id.as_str()) {
                        return None;
                    }
                }
                Some(RateDecision {
                    id: id.clone(),
                    pacing: Pacing {
                        rate: rate as u64,
                        burst: cfg.burst_for(rate) as u64,
                        floor: cfg.launch_floor,
                    },
                    cap_percent: a.cap,
                    measured_percent: m.measured,
                    cost: m.state.cost(),
                    hungry: m.hungry_for > 0,
                    state: if obs.is_none() && m.state.cost().is_some() {
                        LoopState::Tracking
                    } else {
                        m.state.state()
                    },
                })
            })
            .collect()
    }
}
