//! The exported totals of every counter, advanced each period from the
//! view ([`super::monotonic`]), kept per container and GPU. A container
//! or GPU missing from a period's view is forgotten: if it comes back its
//! series start again (Prometheus sees a new series or a reset).
//!
//! This runs every control period, so it allocates only for containers
//! and GPUs it has not seen before.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::monotonic::Counter;
use crate::daemon::view::{ContainerView, Reason, View};
use crate::policy::Action;

/// The usage region's counters of one (container, GPU).
#[derive(Debug, Default)]
pub struct GpuCounters {
    /// Kernel launches admitted.
    pub launches: Counter,
    /// Warps admitted.
    pub warps: Counter,
    /// Throttled time (ns).
    pub throttled_ns: Counter,
}

/// One container's counters.
#[derive(Debug, Default)]
pub struct ContainerCounters {
    /// By GPU UUID.
    pub gpus: HashMap<String, GpuCounters>,
    /// NVIDIA ioctls (eBPF).
    pub ioctls: Counter,
    /// Device opens (eBPF).
    pub opens: Counter,
    /// Bypass events (eBPF).
    pub bypass: Counter,
    /// Watchdog actions.
    pub enforcement: BTreeMap<(Reason, Action), Counter>,
}

/// Every counter of the agent.
#[derive(Debug, Default)]
pub struct Counters {
    containers: HashMap<String, ContainerCounters>,
    /// Policies loaded.
    pub policy_loads: Counter,
}

impl Counters {
    /// Advances every counter from `view` and forgets what it lacks.
    pub fn update(&mut self, view: &View) {
        let ids: HashSet<&str> = view.containers.iter().map(|c| c.id.as_str()).collect();
        self.containers.retain(|id, _| ids.contains(id.as_str()));
        for c in &view.containers {
            if !self.containers.contains_key(&c.id) {
                self.containers
                    .insert(c.id.clone(), ContainerCounters::default());
            }
            if let Some(cc) = self.containers.get_mut(&c.id) {
                cc.update(c);
            }
        }
        self.policy_loads.advance(view.policy.loads);
    }

    /// `id`'s counters.
    pub fn container(&self, id: &str) -> Option<&ContainerCounters> {
        self.containers.get(id)
    }
}

impl ContainerCounters {
    fn update(&mut self, c: &ContainerView) {
        self.gpus
            .retain(|uuid, _| c.gpus.iter().any(|g| &g.uuid == uuid));
        for g in &c.gpus {
            if !self.gpus.contains_key(&g.uuid) {
                self.gpus.insert(g.uuid.clone(), GpuCounters::default());
            }
            if let Some(gc) = self.gpus.get_mut(&g.uuid) {
                gc.launches.advance(g.launches);
                gc.warps.advance(g.warps);
                gc.throttled_ns.advance(g.throttled_ns);
            }
        }
        if let Some(e) = &c.ebpf {
            self.ioctls.advance(e.ioctls);
            self.opens.advance(e.opens);
            self.bypass.advance(e.bypass_events);
        }
        for reason in Reason::ALL {
            for action in Action::ALL {
                let count = c
                    .enforcement
                    .actions
                    .iter()
                    .filter(|a| a.reason == reason && a.action == action)
                    .fold(0u64, |s, a| s.saturating_add(a.count));
                self.enforcement
                    .entry((reason, action))
                    .or_default()
                    .advance(count);
            }
        }
    }

    /// The total of one (reason, action).
    pub fn enforcement(&self, reason: Reason, action: Action) -> u64 {
        self.enforcement
            .get(&(reason, action))
            .map_or(0, Counter::total)
    }
}
