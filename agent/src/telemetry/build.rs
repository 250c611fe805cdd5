//! The `GpuNode` status of one control period: a pure function of the
//! period's [`View`], the node's inventory and the status published last.
//!
//! Live use is quantised so that measurement noise does not count as a
//! change ([`Quantum`]): memory in steps of 256 MiB, SM utilisation in
//! steps of 5 %, with hysteresis — a published value moves only once the
//! raw value is at least one step away from it, so noise of less than one
//! step around any value (a step boundary included) never changes the
//! status. Grants (allocations) and health are exact.
//!
//! Invariants of the result: `devices` holds each UUID once, in the
//! inventory's order; `allocations` and `usage` are sorted (by device,
//! then namespace, pod, container), so the order in which the loop listed
//! containers is no change either; percentages are within 0..=100.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tessera_api::GpuUuid;
use tessera_api::gpunode::{
    Allocation, ComputeMode, Device, DeviceUsage, GpuNodeStatus, Health, MAX_ALLOCATIONS,
    MAX_DEVICES, Summary,
};

use crate::control::Mode;
use crate::view::View;

const MIB: u64 = 1 << 20;

/// The steps live use is published in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantum {
    /// Memory step, MiB (at least 1).
    pub memory_mib: u64,
    /// SM utilisation step, percent (1 to 100).
    pub sm_percent: u32,
}

impl Default for Quantum {
    fn default() -> Self {
        Self {
            memory_mib: 256,
            sm_percent: 5,
        }
    }
}

/// `raw` in steps of `step`: the previously published value while `raw`
/// is less than one step away from it, otherwise `raw` rounded to the
/// nearest step.
fn quantise(raw: f64, previous: Option<u64>, step: u64) -> u64 {
    let step = step.max(1);
    let raw = raw.max(0.0);
    if let Some(p) = previous
        && (raw - p as f64).abs() < step as f64
    {
        return p;
    }
    ((raw / step as f64).round() as u64).saturating_mul(step)
}

/// The status for `view`. `inventory` is the node's GPUs as
/// [`crate::gpu::Inventory::api_devices`] lists them; `previous` the status
/// published last (for the hysteresis of live use).
///
/// A GPU NVML did not answer for in this period is unhealthy, as are all
/// GPUs when the period saw none (NVML down). A grant without a memory
/// limit is reported as the GPU's whole memory (the container may take it
/// all); memory limits are rounded up to whole MiB. Containers outside
/// Kubernetes (made by the CLI) are reported with empty namespace and pod
/// and their id as the container, so their grants still count. Grants on
/// GPUs whose UUID does not parse or that are not in the inventory are
/// left out (the scheduler could not place against them).
pub fn status(
    view: &View,
    inventory: &[Device],
    previous: Option<&GpuNodeStatus>,
    quantum: Quantum,
    updated_at: Time,
) -> GpuNodeStatus {
    let mut devices: Vec<Device> = inventory.iter().take(MAX_DEVICES).cloned().collect();
    for d in &mut devices {
        let seen = view
            .devices
            .iter()
            .find(|v| parse(&v.uuid).as_ref() == Some(&d.uuid));
        let lost = match seen {
            Some(v) if !v.healthy => Some("NVML did not answer for it in the last period".into()),
            None if view.devices.is_empty() => Some(format!("NVML unavailable: {}", view.nvml)),
            None => Some("not seen by NVML in the last period".into()),
            Some(_) => None,
        };
        if let (Health::Healthy, Some(reason)) = (d.health, lost) {
            d.health = Health::Unhealthy;
            d.health_reason = Some(reason);
        }
        if d.memory_mib == 0
            && let Some(total) = seen.and_then(|v| v.memory_total_bytes)
        {
            d.memory_mib = total / MIB;
        }
    }

    let mut allocations = Vec::new();
    for c in &view.containers {
        let meta = &c.meta;
        for g in &c.gpus {
            let Some(uuid) = parse(&g.uuid) else { continue };
            let Some(device) = devices.iter().find(|d| d.uuid == uuid) else {
                continue;
            };
            allocations.push(Allocation {
                device: uuid,
                namespace: meta.namespace.clone().unwrap_or_default(),
                pod: meta.pod.clone().unwrap_or_default(),
                pod_uid: meta.pod_uid.clone(),
                container: meta.container.clone().unwrap_or_else(|| c.id.clone()),
                memory_mib: g
                    .memory_limit_bytes
                    .map_or(device.memory_mib, |b| b.div_ceil(MIB)),
                cores_percent: meta.sm_target.min(100),
                compute_mode: Some(match c.policy.mode {
                    Mode::Hard => ComputeMode::Hard,
                    Mode::Elastic => ComputeMode::Elastic,
                }),
            });
        }
    }
    allocations.sort_by(|a, b| {
        (&a.device, &a.namespace, &a.pod, &a.container).cmp(&(
            &b.device,
            &b.namespace,
            &b.pod,
            &b.container,
        ))
    });
    allocations.truncate(MAX_ALLOCATIONS);

    let mut usage = Vec::new();
    for d in &devices {
        let Some(v) = view
            .devices
            .iter()
            .find(|v| parse(&v.uuid).as_ref() == Some(&d.uuid))
        else {
            continue;
        };
        if v.memory_used_bytes.is_none() && v.sm_percent.is_none() {
            continue;
        }
        let before = previous.and_then(|p| p.usage.iter().find(|u| u.device == d.uuid));
        let memory = quantise(
            v.memory_used_bytes.unwrap_or(0) as f64 / MIB as f64,
            before.map(|u| u.memory_used_mib),
            quantum.memory_mib,
        );
        let sm = quantise(
            v.sm_percent.unwrap_or(0.0).clamp(0.0, 100.0),
            before.map(|u| u64::from(u.sm_util_percent)),
            u64::from(quantum.sm_percent.clamp(1, 100)),
        )
        .min(100) as u32;
        let processes = view
            .containers
            .iter()
            .filter(|c| {
                c.gpus
                    .iter()
                    .any(|g| parse(&g.uuid).as_ref() == Some(&d.uuid))
            })
            .map(|c| c.processes.len() as u32)
            .sum();
        usage.push(DeviceUsage {
            device: d.uuid,
            memory_used_mib: memory,
            sm_util_percent: sm,
            processes: Some(processes),
        });
    }

    let summary = summary(&devices, &allocations, &usage);
    GpuNodeStatus {
        updated_at,
        agent_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        summary,
        devices,
        allocations,
        usage,
    }
}

fn summary(devices: &[Device], allocations: &[Allocation], usage: &[DeviceUsage]) -> Summary {
    let models: BTreeSet<&str> = devices.iter().map(|d| d.model.as_str()).collect();
    let model = match models.len() {
        0 => String::new(),
        1 => models.iter().next().copied().unwrap_or_default().to_owned(),
        _ => "mixed".to_owned(),
    };
    let gpus = devices.len() as u32;
    let sm_total: u64 = usage.iter().map(|u| u64::from(u.sm_util_percent)).sum();
    // A container outside Kubernetes (no pod) counts as a pod of its own.
    let pods: BTreeSet<(&str, &str)> = allocations
        .iter()
        .map(|a| {
            let pod = if a.pod.is_empty() {
                &a.container
            } else {
                &a.pod
            };
            (a.namespace.as_str(), pod.as_str())
        })
        .collect();
    Summary {
        gpus,
        healthy_gpus: devices
            .iter()
            .filter(|d| d.health == Health::Healthy)
            .count() as u32,
        model,
        memory_mib: devices.iter().map(|d| d.memory_mib).sum(),
        allocated_memory_mib: allocations.iter().map(|a| a.memory_mib).sum(),
        used_memory_mib: usage.iter().map(|u| u.memory_used_mib).sum(),
        sm_util_percent: if gpus == 0 {
            0
        } else {
            (sm_total / u64::from(gpus)) as u32
        },
        pods: pods.len() as u32,
    }
}

/// Whether `a` and `b` say the same, the time they were computed aside.
pub fn same_content(a: &GpuNodeStatus, b: &GpuNodeStatus) -> bool {
    let GpuNodeStatus {
        updated_at: _,
        agent_version,
        summary,
        devices,
        allocations,
        usage,
    } = a;
    *agent_version == b.agent_version
        && *summary == b.summary
        && *devices == b.devices
        && *allocations == b.allocations
        && *usage == b.usage
}

fn parse(uuid: &str) -> Option<GpuUuid> {
    uuid.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::containers::Metadata;
    use crate::containers::meta::{GpuGrant, META_VERSION};
    use crate::policy::{Action, Effective};
    use crate::view::{ContainerView, DeviceView, EnforcementView, GpuView};

    const A: &str = "GPU-00000000-0000-0000-0000-00000000000a";
    const B: &str = "GPU-00000000-0000-0000-0000-00000000000b";
    const ELSEWHERE: &str = "GPU-00000000-0000-0000-0000-0000000000ff";
    const MODEL: &str = "NVIDIA A100-SXM4-40GB";

    fn uuid(s: &str) -> GpuUuid {
        s.parse().expect("test uuid")
    }

    fn time(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"))
    }

    fn inventory() -> Vec<Device> {
        let dev = |u: &str, index, numa, peer: &str| Device {
            uuid: uuid(u),
            index,
            model: MODEL.into(),
            memory_mib: 40960,
            sm_count: 108,
            numa_node: Some(numa),
            nvlink_peers: vec![uuid(peer)],
            health: Health::Healthy,
            health_reason: None,
        };
        vec![dev(A, 0, 0, B), dev(B, 1, 1, A)]
    }

    fn container(
        id: &str,
        k8s: Option<(&str, &str, &str, &str)>,
        sm_target: u32,
        mode: Mode,
        gpus: &[(&str, Option<u64>)],
    ) -> ContainerView {
        let meta = Metadata {
            version: META_VERSION,
            namespace: k8s.map(|k| k.0.into()),
            pod: k8s.map(|k| k.1.into()),
            container: k8s.map(|k| k.2.into()),
            claim: None,
            pod_uid: k8s.map(|k| k.3.into()),
            cgroup: None,
            sm_target,
            mode: Some(mode),
            priority: None,
            labels: BTreeMap::new(),
            fail_open: false,
            gpus: gpus
                .iter()
                .map(|&(u, limit)| GpuGrant {
                    uuid: u.into(),
                    memory_limit_bytes: limit,
                    context_overhead_bytes: 0,
                })
                .collect(),
        };
        ContainerView {
            id: id.into(),
            dir: format!("/var/lib/tessera/containers/{id}").into(),
            meta: Arc::new(meta),
            epoch: 1,
            since_period: Some(0),
            gpus: gpus
                .iter()
                .map(|&(u, limit)| GpuView {
                    uuid: u.into(),
                    memory_limit_bytes: limit,
                    ..GpuView::default()
                })
                .collect(),
            processes: Vec::new(),
            problems: Vec::new(),
            policy: Effective {
                mode,
                priority: 0,
                bypass_action: Action::Alert,
                memory_overage_action: Action::Alert,
                compute_overage_action: Action::Throttle,
                rule: None,
            },
            ebpf: None,
            enforcement: EnforcementView::default(),
        }
    }

    fn device_view(u: &str, index: u32, used_mib: Option<u64>, sm: Option<f64>) -> DeviceView {
        DeviceView {
            index,
            uuid: u.into(),
            memory_used_bytes: used_mib.map(|m| m * MIB),
            memory_total_bytes: Some(40960 * MIB),
            sm_percent: sm,
            healthy: true,
        }
    }

    /// Two GPUs, B not answering; a pod with a limit of 4096 MiB + 1 byte
    /// on A, a CLI container unlimited on A and 1 GiB on B, and a grant on
    /// a GPU not of this node.
    fn view() -> View {
        let mut b = device_view(B, 1, None, None);
        b.healthy = false;
        View {
            nvml: "ready".into(),
            devices: vec![device_view(A, 0, Some(5000), Some(42.4)), b],
            containers: vec![
                container(
                    "c1",
                    Some(("ml", "train", "main", "uid-1")),
                    30,
                    Mode::Elastic,
                    &[(A, Some(4096 * MIB + 1))],
                ),
                container(
                    "job7",
                    None,
                    50,
                    Mode::Hard,
                    &[(A, None), (B, Some(1024 * MIB))],
                ),
                container(
                    "c3",
                    Some(("x", "y", "z", "u")),
                    10,
                    Mode::Hard,
                    &[(ELSEWHERE, None)],
                ),
            ]
            .into_iter()
            .map(std::sync::Arc::new)
            .collect(),
            ..View::default()
        }
    }

    #[test]
    fn status_of_a_period_by_hand() {
        let s = status(&view(), &inventory(), None, Quantum::default(), time(1000));
        // Devices: the inventory, B unhealthy because NVML did not answer.
        assert_eq!(s.devices.len(), 2);
        assert_eq!(
            (s.devices[0].health, s.devices[0].health_reason.as_deref()),
            (Health::Healthy, None)
        );
        assert_eq!(s.devices[1].health, Health::Unhealthy);
        assert!(
            s.devices[1]
                .health_reason
                .as_deref()
                .is_some_and(|r| r.contains("NVML did not answer")),
            "{:?}",
            s.devices[1]
        );
        assert_eq!(
            (
                s.devices[1].numa_node,
                s.devices[1].sm_count,
                &s.devices[1].nvlink_peers
            ),
            (Some(1), 108, &vec![uuid(A)])
        );
        // Allocations: sorted by device, namespace, pod, container; the
        // grant on a foreign GPU left out; 4096 MiB + 1 byte rounds up;
        // unlimited is the whole GPU; the CLI container under its id.
        let got: Vec<_> = s
            .allocations
            .iter()
            .map(|a| {
                (
                    a.device.to_string(),
                    a.namespace.as_str(),
                    a.pod.as_str(),
                    a.container.as_str(),
                    a.pod_uid.as_deref(),
                    a.memory_mib,
                    a.cores_percent,
                    a.compute_mode,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    A.to_owned(),
                    "",
                    "",
                    "job7",
                    None,
                    40960,
                    50,
                    Some(ComputeMode::Hard)
                ),
                (
                    A.to_owned(),
                    "ml",
                    "train",
                    "main",
                    Some("uid-1"),
                    4097,
                    30,
                    Some(ComputeMode::Elastic)
                ),
                (
                    B.to_owned(),
                    "",
                    "",
                    "job7",
                    None,
                    1024,
                    50,
                    Some(ComputeMode::Hard)
                ),
            ]
        );
        // Usage: A only (B gave nothing); 5000 MiB -> 5120 (nearest 256),
        // 42.4 % -> 40 (nearest 5).
        assert_eq!(
            s.usage,
            vec![DeviceUsage {
                device: uuid(A),
                memory_used_mib: 5120,
                sm_util_percent: 40,
                processes: Some(0),
            }]
        );
        assert_eq!(
            s.summary,
            Summary {
                gpus: 2,
                healthy_gpus: 1,
                model: MODEL.into(),
                memory_mib: 81920,
                allocated_memory_mib: 40960 + 4097 + 1024,
                used_memory_mib: 5120,
                sm_util_percent: 20,
                pods: 2,
            }
        );
        assert_eq!(s.updated_at, time(1000));
    }

    #[test]
    fn noise_below_one_step_is_no_change() {
        let inv = inventory();
        let q = Quantum::default();
        let at = |mib: u64, sm: f64, prev: Option<&GpuNodeStatus>| {
            let mut v = view();
            v.devices[0] = device_view(A, 0, Some(mib), Some(sm));
            status(&v, &inv, prev, q, time(1))
        };
        // 5247 and 5249 MiB straddle the boundary between 5120 and 5376;
        // 42 and 43 % the one between 40 and 45.
        let first = at(5247, 42.0, None);
        assert_eq!(
            (
                first.usage[0].memory_used_mib,
                first.usage[0].sm_util_percent
            ),
            (5120, 40)
        );
        let mut prev = first.clone();
        for (mib, sm) in [(5249, 43.0), (5247, 42.0), (5375, 44.9), (4865, 35.1)] {
            let next = at(mib, sm, Some(&prev));
            assert!(
                same_content(&prev, &next),
                "{mib} MiB {sm} %: {:?}",
                next.usage
            );
            prev = next;
        }
        // One step away moves it.
        let moved = at(5376, 45.0, Some(&prev));
        assert_eq!(
            (
                moved.usage[0].memory_used_mib,
                moved.usage[0].sm_util_percent
            ),
            (5376, 45)
        );
        assert!(!same_content(&prev, &moved));
    }

    #[test]
    fn same_content_ignores_time_and_container_order_only() {
        let inv = inventory();
        let q = Quantum::default();
        let a = status(&view(), &inv, None, q, time(1));
        let mut reordered = view();
        reordered.containers.reverse();
        let b = status(&reordered, &inv, None, q, time(2));
        assert_ne!(a.updated_at, b.updated_at);
        assert!(same_content(&a, &b));
        let mut changed = view();
        changed.containers.pop();
        std::sync::Arc::make_mut(&mut changed.containers[0]).gpus[0].memory_limit_bytes =
            Some(2048 * MIB);
        let c = status(&changed, &inv, None, q, time(1));
        assert!(!same_content(&a, &c), "a changed grant is a change");
    }

    #[test]
    fn without_nvml_every_gpu_is_unhealthy() {
        let mut v = view();
        v.devices.clear();
        v.nvml = "driver not loaded".into();
        let s = status(&v, &inventory(), None, Quantum::default(), time(1));
        assert!(s.devices.iter().all(|d| d.health == Health::Unhealthy
            && d.health_reason.as_deref() == Some("NVML unavailable: driver not loaded")));
        assert!(s.usage.is_empty());
        assert_eq!((s.summary.healthy_gpus, s.summary.sm_util_percent), (0, 0));
    }
}
