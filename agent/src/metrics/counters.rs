//! The exported totals of every counter, advanced each period from the
//! view ([`super::monotonic`]), kept per container and GPU. A container
//! or GPU missing from a period's view is forgotten: if it comes back its
//! series start again (Prometheus sees a new series or a reset).
//!
//! This runs every control period, so it allocates only for containers
//! and GPUs it has not seen before.

use std::collections::HashMap;

use super::monotonic::Counter;
use crate::policy::Action;
use crate::view::{ContainerView, Reason, View};

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
    /// By GPU UUID, in the order of the container's latest view.
    gpus: Vec<(String, GpuCounters)>,
    /// NVIDIA ioctls (eBPF).
    pub ioctls: Counter,
    /// Device opens (eBPF).
    pub opens: Counter,
    /// Bypass events (eBPF).
    pub bypass: Counter,
    /// Watchdog actions, by [`Reason::ALL`] then [`Action::ALL`] index.
    enforcement: [[Counter; Action::ALL.len()]; Reason::ALL.len()],
    /// The update that last saw the container.
    seen: u64,
    /// The view the counters were last advanced from: the same one again
    /// (a quiet container's, shared by the daemon) changes nothing. A
    /// weak reference keeps its allocation, so no later view can take
    /// its address.
    from: std::sync::Weak<ContainerView>,
}

/// Every counter of the agent.
#[derive(Debug, Default)]
pub struct Counters {
    containers: HashMap<String, ContainerCounters>,
    /// Updates so far.
    updates: u64,
    /// Policies loaded.
    pub policy_loads: Counter,
}

impl Counters {
    /// Advances every counter from `view` and forgets what it lacks.
    pub fn update(&mut self, view: &View) {
        self.updates += 1;
        let now = self.updates;
        for c in &view.containers {
            let cc = match self.containers.get_mut(c.id.as_str()) {
                Some(cc) => cc,
                None => self.containers.entry(c.id.clone()).or_default(),
            };
            cc.seen = now;
            if !std::ptr::eq(cc.from.as_ptr(), std::sync::Arc::as_ptr(c)) {
                cc.update(c);
                cc.from = std::sync::Arc::downgrade(c);
            }
        }
        self.containers.retain(|_, cc| cc.seen == now);
        self.policy_loads.advance(view.policy.loads);
    }

    /// `id`'s counters.
    pub fn container(&self, id: &str) -> Option<&ContainerCounters> {
        self.containers.get(id)
    }
}

fn index<T: PartialEq>(all: &[T], x: &T) -> usize {
    all.iter().position(|a| a == x).unwrap_or_default()
}

impl ContainerCounters {
    fn update(&mut self, c: &ContainerView) {
        // The same GPUs as last time (the steady state): advance in
        // place; otherwise keep the GPUs still granted, in the new order.
        let same = self.gpus.len() == c.gpus.len()
            && self
                .gpus
                .iter()
                .zip(&c.gpus)
                .all(|((u, _), g)| *u == g.uuid);
        if !same {
            let mut old = std::mem::take(&mut self.gpus);
            self.gpus = c
                .gpus
                .iter()
                .map(|g| {
                    let kept = old
                        .iter()
                        .position(|(u, _)| *u == g.uuid)
                        .map(|i| old.swap_remove(i).1);
                    (g.uuid.clone(), kept.unwrap_or_default())
                })
                .collect();
        }
        for ((_, gc), g) in self.gpus.iter_mut().zip(&c.gpus) {
            gc.launches.advance(g.launches);
            gc.warps.advance(g.warps);
            gc.throttled_ns.advance(g.throttled_ns);
        }
        if let Some(e) = &c.ebpf {
            self.ioctls.advance(e.ioctls);
            self.opens.advance(e.opens);
            self.bypass.advance(e.bypass_events);
        }
        let mut counts = [[0u64; Action::ALL.len()]; Reason::ALL.len()];
        for a in &c.enforcement.actions {
            let n = &mut counts[index(&Reason::ALL, &a.reason)][index(&Action::ALL, &a.action)];
            *n = n.saturating_add(a.count);
        }
        for (row, counted) in self.enforcement.iter_mut().zip(counts) {
            for (counter, count) in row.iter_mut().zip(counted) {
                counter.advance(count);
            }
        }
    }

    /// The counters of GPU `uuid` (`GPU-…`).
    pub fn gpu(&self, uuid: &str) -> Option<&GpuCounters> {
        self.gpus.iter().find(|(u, _)| u == uuid).map(|(_, g)| g)
    }

    /// The total of one (reason, action).
    pub fn enforcement(&self, reason: Reason, action: Action) -> u64 {
        self.enforcement[index(&Reason::ALL, &reason)][index(&Action::ALL, &action)].total()
    }
}
