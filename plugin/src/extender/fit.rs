//! Trial placement of a pod's GPU shares on one node.
//!
//! Containers are placed in pod order; each takes `count` distinct GPUs
//! that are healthy, admitted by the pod's `tessera.dev/gpu-*` selectors,
//! and have the share's memory and SM percent still free, counting what
//! earlier containers of the same pod took. Binpack tries the fullest
//! fitting GPUs first, spread the emptiest; ties go to the lower UUID so the
//! result is deterministic.

use std::cmp::Reverse;

use crate::annotations::{GpuPolicy, Placement};
use crate::resources::{GpuShare, Memory};

use super::view::{GpuView, NodeView};

/// Where each container's shares would go.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// (container, GPU UUIDs) in pod order.
    pub containers: Vec<(String, Vec<String>)>,
    /// The node's GPUs with the pod's shares added.
    pub gpus_after: Vec<GpuView>,
}

impl Assignment {
    /// Mean load of the node's healthy GPUs after placement, 0.0..=1.0.
    pub fn node_load(&self) -> f64 {
        let healthy: Vec<&GpuView> = self.gpus_after.iter().filter(|g| g.healthy).collect();
        if healthy.is_empty() {
            return 1.0;
        }
        healthy.iter().map(|g| g.load()).sum::<f64>() / healthy.len() as f64
    }
}

/// Why a pod does not fit a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// Not now, but it would on the same node without other pods' shares.
    Busy(String),
    /// Not even on the empty node: too few matching GPUs, or too small.
    Never(String),
}

/// Places `shares` on `node`, or says why not.
pub fn place(
    shares: &[GpuShare],
    policy: &GpuPolicy,
    node: &NodeView,
) -> Result<Assignment, Unfit> {
    match try_place(shares, policy, node.gpus.clone()) {
        Ok(assignment) => Ok(assignment),
        Err(reason) => {
            let empty = node
                .gpus
                .iter()
                .map(|g| GpuView {
                    used_mib: 0,
                    cores_used_percent: 0,
                    ..g.clone()
                })
                .collect();
            match try_place(shares, policy, empty) {
                Ok(_) => Err(Unfit::Busy(reason)),
                Err(never) => Err(Unfit::Never(never)),
            }
        }
    }
}

fn try_place(
    shares: &[GpuShare],
    policy: &GpuPolicy,
    mut gpus: Vec<GpuView>,
) -> Result<Assignment, String> {
    let mut containers = Vec::with_capacity(shares.len());
    for share in shares {
        let memory = share.effective_memory();
        let cores = u32::from(share.effective_cores());
        let usable =
            |g: &GpuView| g.healthy && g.memory_mib > 0 && policy.admits(&g.uuid, &g.model);
        let mut fitting: Vec<usize> = (0..gpus.len())
            .filter(|&i| {
                let g = &gpus[i];
                usable(g) && g.free_mib() >= memory.mib_on(g.memory_mib) && g.free_cores() >= cores
            })
            .collect();
        let wanted = usize::try_from(share.count).unwrap_or(usize::MAX);
        if fitting.len() < wanted {
            let usable_count = gpus.iter().filter(|g| usable(g)).count();
            return Err(format!(
                "container {:?} needs {} GPU(s) with {} and {cores}% SMs free; {} of {} usable GPUs have room ({} unhealthy or outside the pod's tessera.dev/gpu-* selectors)",
                share.container,
                share.count,
                describe(memory),
                fitting.len(),
                usable_count,
                gpus.len() - usable_count,
            ));
        }
        let room = |g: &GpuView| {
            (
                g.free_mib().saturating_sub(memory.mib_on(g.memory_mib)),
                g.free_cores().saturating_sub(cores),
            )
        };
        match policy.placement {
            Placement::Binpack => fitting.sort_by(|&a, &b| {
                (room(&gpus[a]), &gpus[a].uuid).cmp(&(room(&gpus[b]), &gpus[b].uuid))
            }),
            Placement::Spread => fitting.sort_by(|&a, &b| {
                (Reverse(room(&gpus[a])), &gpus[a].uuid)
                    .cmp(&(Reverse(room(&gpus[b])), &gpus[b].uuid))
            }),
        }
        fitting.truncate(wanted);
        let mut uuids = Vec::with_capacity(wanted);
        for i in fitting {
            let g = &mut gpus[i];
            g.used_mib += memory.mib_on(g.memory_mib);
            g.cores_used_percent += cores;
            uuids.push(g.uuid.clone());
        }
        containers.push((share.container.clone(), uuids));
    }
    Ok(Assignment {
        containers,
        gpus_after: gpus,
    })
}

fn describe(memory: Memory) -> String {
    match memory {
        Memory::Mib(mib) => format!("{mib} MiB"),
        Memory::Percent(p) => format!("{p}% of memory"),
    }
}
