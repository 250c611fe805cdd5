//! A chosen container's metadata (`meta.json`): its assignment turned
//! into limits on this node's GPUs, in HAMi's vocabulary
//! ([`tessera_api::resources`]: the same reading, ranges, percent → MiB
//! and defaults as the scheduler's).
//!
//! Per GPU, the memory limit is the assignment's `memoryMiB`, else its
//! `memoryPercent` of the GPU's memory (NVML), else the container's own
//! `nvidia.com/gpumem` (MiB) or `nvidia.com/gpumem-percentage` limit,
//! else all of the GPU's memory (HAMi's `defaultMem: 0`). The SM target
//! is the assignment's `coresPercent`, else the container's
//! `nvidia.com/gpucores`, else 100 (HAMi's `defaultCores: 0`: no cap); it
//! must be the same on every GPU (one target per container).
//!
//! Hostile-tenant rule: an assignment may not exceed what the container's
//! immutable spec asks for (`gpumem`, `gpumem-percentage`, `gpucores`), so
//! editing the annotation after the bind cannot raise a limit; nor may a
//! limit exceed the GPU.
//!
//! Mode and priority are written only when the pod says so explicitly:
//! the `tessera.dev/compute-mode` annotation (`hard` | `elastic`) and the
//! container's `nvidia.com/priority` limit, HAMi's 0 (high) or 1 (low),
//! mapped to the agent's scale (0 to 100, higher served first) as
//! 0 → [`HAMI_HIGH`], 1 → [`HAMI_LOW`]. Absent, the node policy decides.

use tessera_api::GpuUuid;
use tessera_api::annotations::{COMPUTE_MODE, COMPUTE_MODE_VALUES};
use tessera_api::gpunode::ComputeMode;
use tessera_api::resources::{
    ContainerResources, GPU_CORES, GpuShare, UNCAPPED_SM_PERCENT, percent_of_mib,
};

use crate::containers::meta::{GpuGrant, META_VERSION, Metadata, Mode};
use crate::gpu::InventoryGpu;

use super::pods::Choice;

pub use tessera_api::resources::{HAMI_HIGH, HAMI_LOW};

/// Why a chosen container's limits cannot be granted; the message names
/// the pod, container, GPU and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod} container {container}: {problem}")]
pub struct GrantError {
    /// `namespace/name`.
    pub pod: String,
    /// The container.
    pub container: String,
    /// What is wrong.
    pub problem: String,
}

/// The grant: metadata and the inventory index of each GPU (in the
/// container's order).
#[derive(Debug, Clone)]
pub struct Grant {
    /// The metadata to write.
    pub meta: Metadata,
    /// Index into the inventory of each GPU.
    pub gpus: Vec<usize>,
}

/// The metadata for `choice` on a node with `gpus`.
pub fn grant(choice: &Choice, gpus: &[InventoryGpu]) -> Result<Grant, GrantError> {
    let fail = |problem: String| GrantError {
        pod: choice.pod(),
        container: choice.container.name.clone(),
        problem,
    };
    let c = &choice.container;
    let share = GpuShare::read(&ContainerResources::from(c)).map_err(|errors| {
        let each: Vec<String> = errors.iter().map(ToString::to_string).collect();
        fail(each.join("; "))
    })?;
    let share = share.as_ref();
    let asked_memory = share.and_then(|s| s.memory);
    let asked_cores = share.and_then(|s| s.cores).map(u64::from);
    let mut grants = Vec::new();
    let mut indices = Vec::new();
    let mut cores: Option<Option<u64>> = None;
    for (j, g) in choice.assignment.gpus.iter().enumerate() {
        let field = |f: &str| {
            format!(
                "tessera.dev/assignment containers[{}].gpus[{j}].{f}",
                c.name
            )
        };
        let i = gpus
            .iter()
            .position(|x| x.uuid.parse::<GpuUuid>().is_ok_and(|u| u == g.uuid))
            .ok_or_else(|| fail(format!("assigned GPU {} is not on this node", g.uuid)))?;
        let total_mib = gpus[i].memory_total_mib.ok_or_else(|| {
            fail(format!(
                "assigned GPU {} is lost (NVML gives no memory size)",
                g.uuid
            ))
        })?;
        let asked_limit = asked_memory.map(|m| m.mib_on(total_mib));
        let mib = g
            .memory_mib
            .or(g
                .memory_percent
                .map(|p| percent_of_mib(total_mib, u64::from(p))))
            .or(asked_limit)
            .unwrap_or(total_mib);
        if mib == 0 {
            return Err(fail(format!(
                "the memory limit on GPU {} rounds to 0 MiB",
                g.uuid
            )));
        }
        if let Some(a) = asked_limit
            && mib > a
        {
            return Err(fail(format!(
                "{} grants {mib} MiB on GPU {}, more than the container asks for ({a} MiB); refused",
                field("memoryMiB"),
                g.uuid
            )));
        }
        if mib > total_mib {
            return Err(fail(format!(
                "{} grants {mib} MiB on GPU {}, which has {total_mib} MiB",
                field("memoryMiB"),
                g.uuid
            )));
        }
        let core = g
            .cores_percent
            .map(u64::from)
            .or(asked_cores.filter(|&p| p > 0));
        if let (Some(t), Some(a)) = (core, asked_cores)
            && a > 0
            && t > a
        {
            return Err(fail(format!(
                "{} is {t}, more than the container's {GPU_CORES} ({a}); refused",
                field("coresPercent")
            )));
        }
        match cores {
            Some(prev) if prev != core => {
                return Err(fail(format!(
                    "{} differs between its GPUs; one SM target per container is accepted",
                    field("coresPercent")
                )));
            }
            _ => cores = Some(core),
        }
        grants.push(GpuGrant {
            uuid: gpus[i].uuid.clone(),
            memory_limit_bytes: Some(mib << 20),
            context_overhead_bytes: 0,
        });
        indices.push(i);
    }
    let sm_target = cores.flatten().map_or(UNCAPPED_SM_PERCENT, |p| {
        u32::try_from(p).unwrap_or(UNCAPPED_SM_PERCENT)
    });
    let priority = share.and_then(GpuShare::agent_priority);
    let mode = match choice.annotations.get(COMPUTE_MODE).map(|v| (v, v.parse())) {
        None => None,
        Some((_, Ok(ComputeMode::Hard))) => Some(Mode::Hard),
        Some((_, Ok(ComputeMode::Elastic))) => Some(Mode::Elastic),
        Some((v, Err(_))) => {
            return Err(fail(format!(
                "annotation {COMPUTE_MODE} is {v:?}; accepted: {COMPUTE_MODE_VALUES}"
            )));
        }
    };
    let meta = Metadata {
        version: META_VERSION,
        namespace: Some(choice.namespace.clone()),
        pod: Some(choice.name.clone()),
        container: Some(c.name.clone()),
        claim: None,
        pod_uid: Some(choice.uid.clone()),
        cgroup: None,
        sm_target,
        mode,
        priority,
        labels: choice.labels.clone(),
        fail_open: false,
        gpus: grants,
    };
    meta.validate()
        .map_err(|e| fail(format!("its metadata is refused: {e}")))?;
    Ok(Grant {
        meta,
        gpus: indices,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use serde_json::json as j;

    use super::*;
    use crate::gpu::{FakeBackend, FakeGpu, Inventory};
    use crate::kubelet::pods::choose;

    const G0: &str = "GPU-00000000-0000-0000-0000-000000000000";
    const G1: &str = "GPU-00000000-0000-0000-0000-000000000001";

    fn gpus() -> Vec<InventoryGpu> {
        Inventory::collect(&FakeBackend::new(vec![
            FakeGpu::new(0, "G", 10000),
            FakeGpu::new(1, "G", 3001),
        ]))
        .unwrap()
        .gpus
    }

    /// A pod whose container `c` has `limits` and the assignment `gpus`.
    fn choice(limits: serde_json::Value, gpus: serde_json::Value, ann: &[(&str, &str)]) -> Choice {
        let n = gpus.as_array().unwrap().len();
        let mut limits = limits;
        limits["nvidia.com/gpu"] = n.to_string().into();
        let a = serde_json::json!({"version":1,"node":"n","boundAt":"2026-12-01T00:00:00Z",
            "containers":[{"name":"c","gpus":gpus}]});
        let mut annotations = serde_json::json!({"tessera.dev/assignment": a.to_string()});
        for (k, v) in ann {
            annotations[*k] = (*v).into();
        }
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name":"p","namespace":"ns","uid":"u-1","annotations":annotations},
            "spec": {"containers":[{"name":"c","resources":{"limits":limits}}]}
        }))
        .unwrap();
        choose(&[pod], "n", "nvidia.com/gpu", n, &HashSet::new()).unwrap()
    }

    fn err(c: &Choice) -> String {
        grant(c, &gpus()).unwrap_err().to_string()
    }

    #[test]
    fn limits_come_from_the_assignment_then_the_spec_then_hami_defaults() {
        // Percent of each GPU's own memory, rounded down; one SM target.
        let g = grant(
            &choice(
                j!({}),
                j!([{"uuid":G1,"memoryPercent":50,"coresPercent":30},{"uuid":G0,"memoryMiB":7,"coresPercent":30}]),
                &[],
            ),
            &gpus(),
        )
        .unwrap();
        assert_eq!(g.gpus, [1, 0]);
        let limits: Vec<_> = g.meta.gpus.iter().map(|x| x.memory_limit_bytes).collect();
        assert_eq!(limits, [Some(1500 << 20), Some(7 << 20)]);
        assert_eq!(
            (g.meta.sm_target, g.meta.priority, g.meta.mode),
            (30, None, None)
        );
        assert_eq!(g.meta.pod_uid.as_deref(), Some("u-1"));
        // Nothing in the assignment: the spec's gpumem, gpucores and
        // priority 1 (HAMi's low).
        let g = grant(
            &choice(
                j!({"nvidia.com/gpumem":"2k","nvidia.com/gpucores":"15","nvidia.com/priority":"1"}),
                j!([{"uuid":G0}]),
                &[("tessera.dev/compute-mode", "hard")],
            ),
            &gpus(),
        )
        .unwrap();
        assert_eq!(g.meta.gpus[0].memory_limit_bytes, Some(2000 << 20));
        assert_eq!((g.meta.sm_target, g.meta.priority), (15, Some(HAMI_LOW)));
        assert_eq!(g.meta.mode, Some(Mode::Hard));
        // Nothing anywhere: the whole GPU, no cap; gpucores 0 is no cap.
        let g = grant(
            &choice(
                j!({"nvidia.com/gpucores":"0","nvidia.com/priority":"0"}),
                j!([{"uuid":G1}]),
                &[],
            ),
            &gpus(),
        )
        .unwrap();
        assert_eq!(g.meta.gpus[0].memory_limit_bytes, Some(3001 << 20));
        assert_eq!((g.meta.sm_target, g.meta.priority), (100, Some(HAMI_HIGH)));
    }

    #[test]
    fn bad_or_greedy_values_are_refused_naming_pod_container_and_field() {
        let cases: Vec<(Choice, &str)> = vec![
            (
                choice(
                    j!({"nvidia.com/gpumem":"1k"}),
                    j!([{"uuid":G0,"memoryMiB":1001}]),
                    &[],
                ),
                "grants 1001 MiB on GPU GPU-00000000-0000-0000-0000-000000000000, more than the container asks for (1000 MiB)",
            ),
            (
                choice(
                    j!({"nvidia.com/gpumem-percentage":"10"}),
                    j!([{"uuid":G0,"memoryPercent":20}]),
                    &[],
                ),
                "more than the container asks for (1000 MiB)",
            ),
            (
                choice(j!({}), j!([{"uuid":G1,"memoryMiB":4000}]), &[]),
                "which has 3001 MiB",
            ),
            (
                choice(
                    j!({"nvidia.com/gpucores":"20"}),
                    j!([{"uuid":G0,"coresPercent":21}]),
                    &[],
                ),
                "coresPercent is 21, more than the container's nvidia.com/gpucores (20)",
            ),
            (
                choice(
                    j!({}),
                    j!([{"uuid":G0,"coresPercent":20},{"uuid":G1,"coresPercent":30}]),
                    &[],
                ),
                "differs between its GPUs",
            ),
            (
                choice(j!({"nvidia.com/priority":"2"}), j!([{"uuid":G0}]), &[]),
                "nvidia.com/priority is 2, out of range; accepted: 0 (high) or 1 (low)",
            ),
            (
                choice(j!({"nvidia.com/gpumem":"4Gi"}), j!([{"uuid":G0}]), &[]),
                "nvidia.com/gpumem is 4294967296, out of range; accepted: whole MiB per GPU",
            ),
            (
                choice(
                    j!({"nvidia.com/gpumem-percentage":"0"}),
                    j!([{"uuid":G0}]),
                    &[],
                ),
                "gpumem-percentage is 0",
            ),
            (
                choice(
                    j!({}),
                    j!([{"uuid":G0}]),
                    &[("tessera.dev/compute-mode", "soft")],
                ),
                "tessera.dev/compute-mode is \"soft\"; accepted: hard or elastic",
            ),
            (
                choice(
                    j!({}),
                    j!([{"uuid":"GPU-00000000-0000-0000-0000-0000000000ff"}]),
                    &[],
                ),
                "assigned GPU GPU-00000000-0000-0000-0000-0000000000ff is not on this node",
            ),
        ];
        for (c, says) in cases {
            let e = err(&c);
            assert!(e.starts_with("pod ns/p container c: "), "{e}");
            assert!(e.contains(says), "{e}\nexpected: {says}");
        }
    }
}
