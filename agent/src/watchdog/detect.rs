//! What the watchdog looks for in one period, as pure functions of what
//! the period read: NVML's per-process memory, the container's processes
//! (cgroup members joined with usage slots), its usage region (decoded and
//! raw), its limits, and the eBPF observer's bypass reports.
//!
//! Findings, by reason:
//! - **compute overage**: the share of a GPU the container's host pids
//!   took above its cap ([`super::compute`]);
//! - **memory overage**: the memory NVML lists for the container's host
//!   pids on a GPU above what it may hold there ([`allowed_bytes`]);
//! - **bypass**: a process of the container's cgroup that NVML lists on a
//!   GPU (or that the eBPF observer reported) without a slot in the usage
//!   region — it never registered with the preload;
//! - **tampering**: the usage region contradicts the ground truth — a
//!   slot holding bytes whose bit in the active bitmap is clear (the
//!   preload's sums skip it), registered processes holding more in NVML
//!   than their slots account for (counters rewritten, or the driver used
//!   around the preload), a launch bucket whose theoretical arrival time
//!   went back without a new control epoch, or a bucket epoch ahead of the
//!   control region's (a reset token bucket).
//!
//! **Context overhead.** NVML's per-process figure includes the process's
//! CUDA contexts. The limit covers everything the container holds, so a
//! container whose grant charges a context overhead (the preload counts
//! it against the limit) is judged on NVML's figure alone. Where the grant
//! charges less than contexts cost, each process listed on the GPU may
//! hold `context_allowance − charged overhead` more (the setting
//! `watchdog.context_allowance_mib`, default 512 MiB, what one context
//! costs on current GPUs; set it to the node's figure — the simulator's is
//! 300 MiB — or charge the overhead in the grants). No other tolerance is
//! needed: the preload reserves before the driver allocates and rounds
//! up to the driver's granularity, so a cooperating container's account
//! is never below what the driver holds for it.
//!
//! **Lowered limits.** Lowering a running container's limit below its use
//! frees nothing (the preload refuses new allocations): the watchdog then
//! holds the container to the use it had when it saw the limit drop, a
//! ceiling that follows the use down to the limit. An agent that starts
//! with a container already above its limit judges it on the limit.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use tessera_region::MAX_GPUS;
use tessera_region::layout::{Bucket, UNLIMITED, usage_offsets};
use tessera_region::reader::UsageSnapshot;
use tessera_region::spec::format_uuid;

use crate::containers::Metadata;
use crate::containers::meta::GpuGrant;
use crate::containers::pids::{ProcessView, Source};
use crate::view::Reason;

/// One thing seen this period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Why it matters.
    pub reason: Reason,
    /// The GPU concerned (`GPU-…`), if one.
    pub gpu: Option<String>,
    /// Host pids concerned.
    pub pids: Vec<u32>,
    /// What was seen, one line.
    pub what: String,
}

/// One GPU's memory as NVML lists it: host pid → bytes.
pub type GpuMemory = HashMap<u32, u64>;

/// The watchdog's memory of a container between periods.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// Per granted GPU: the limit last seen, and the ceiling over it
    /// after a lowering (see the module docs).
    limits: HashMap<[u8; 16], (u64, Option<u64>)>,
    /// Per bucket index: (epoch, TAT) last read.
    buckets: [Option<(u64, u64)>; MAX_GPUS],
    /// Per bucket index: recent samples.
    warps: [VecDeque<BucketSample>; MAX_GPUS],
    /// Recent shares of each granted GPU against their caps.
    compute: super::compute::ComputeMemory,
}

/// One read of a launch bucket: (time, warps admitted, launches
/// admitted, rate, burst).
type BucketSample = (Instant, u64, u64, u64, u64);

/// The span over which admitted warps are held against the rate.
pub const RATE_WINDOW: Duration = Duration::from_millis(300);

/// Whether `warps` admitted over `span` can have come through a bucket
/// that ran at most at `rate` with at most `burst`: GCRA admits at most
/// `rate·span + burst`; threads waiting on tokens they took, the agent's
/// read timing and a rescaled debt are covered by a factor of 1.5 on the
/// rate, twice the burst and 100 ms more of the rate. A reset bucket
/// admits as fast as the GPU runs, several times the rate of a capped
/// container.
///
/// One launch adds at most [`tessera_region::rate::MAX_DEBT_NS`] of debt
/// however many warps it has, so launches of more than half a second of
/// the rate each (`launches` of `warps` on average) may pass the bucket
/// faster than its rate: then nothing can be concluded from the warps and
/// this says they conform (the bucket's TAT check still applies).
pub fn warps_conform(warps: u64, launches: u64, span: Duration, rate: u64, burst: u64) -> bool {
    let r = rate as f64;
    if launches > 0 && warps as f64 / launches as f64 > 0.5 * r {
        return true;
    }
    let bound = 1.5 * r * span.as_secs_f64() + 2.0 * burst as f64 + 0.1 * r;
    (warps as f64) <= bound
}

/// What one period read of a container.
pub struct Facts<'a> {
    /// Its metadata (grants, limits).
    pub meta: &'a Metadata,
    /// Its processes.
    pub processes: &'a [ProcessView],
    /// Its usage region, decoded (none: unreadable).
    pub usage: Option<&'a UsageSnapshot>,
    /// The same, raw.
    pub usage_raw: Option<&'a [u8]>,
    /// The control region's epoch after this period's write.
    pub control_epoch: u64,
    /// The launch rate each granted GPU runs under (control region order).
    pub launch_rates: &'a [u64],
    /// The launch burst of each, in the same order.
    pub launch_bursts: &'a [u64],
    /// When the usage region was read.
    pub now: Instant,
    /// NVML's per-process memory, per node GPU.
    pub nvml: &'a HashMap<[u8; 16], GpuMemory>,
    /// Host pids the eBPF observer reported as bypassing (this period).
    pub ebpf_bypass: &'a [u32],
    /// See [`super::settings::WatchdogSettings::context_allowance`].
    pub context_allowance: u64,
    /// Each granted GPU's share and cap this period, in the order of the
    /// metadata's GPUs.
    pub compute: &'a [super::compute::Compute],
}

/// What a container may hold on GPU `i` of its grant with `procs`
/// processes listed there by NVML: the limit plus each process's
/// uncharged context allowance (see the module docs).
pub fn allowed_bytes(limit: u64, charged_overhead: u64, allowance: u64, procs: u64) -> u64 {
    limit.saturating_add(procs.saturating_mul(allowance.saturating_sub(charged_overhead)))
}

fn bit_set(raw: &[u8], slot: usize) -> bool {
    let off = std::mem::offset_of!(tessera_region::layout::UsageHeader, active) + (slot / 64) * 8;
    raw.get(off..off + 8).is_some_and(|b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a) & (1 << (slot % 64)) != 0
    })
}

fn u64_at(raw: &[u8], off: usize) -> Option<u64> {
    let b = raw.get(off..off + 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

/// The (epoch, TAT) of bucket `i` in a raw usage region.
fn bucket_at(raw: &[u8], i: usize) -> Option<(u64, u64)> {
    let base = usage_offsets::BUCKETS + i * std::mem::size_of::<Bucket>();
    Some((
        u64_at(raw, base + std::mem::offset_of!(Bucket, epoch))?,
        u64_at(raw, base + std::mem::offset_of!(Bucket, tat_ns))?,
    ))
}

/// Everything seen in one period.
pub fn findings(f: &Facts<'_>, memory: &mut Memory) -> Vec<Finding> {
    let host = host_processes(f.processes);
    let granted = f.meta.uuids();
    let mut out = bypass(f, &host, &granted);
    for (i, grant) in f.meta.gpus.iter().enumerate() {
        let Some(uuid) = granted.get(i) else { continue };
        let Some(listed) = f.nvml.get(uuid) else {
            continue;
        };
        let mine: Vec<(u32, u64)> = listed
            .iter()
            .filter(|(pid, _)| host.contains_key(pid))
            .map(|(p, b)| (*p, *b))
            .collect();
        if let Some(limit) = grant.memory_limit_bytes {
            out.extend(memory_overage(f, uuid, limit, grant, &mine, memory));
        }
        if let Some(c) = f.compute.get(i) {
            let mut pids: Vec<u32> = mine.iter().map(|(p, _)| *p).collect();
            pids.sort_unstable();
            let gpu = format_uuid(uuid);
            out.extend(super::compute::overage(
                &mut memory.compute,
                (i, &gpu),
                f.now,
                *c,
                &pids,
            ));
        }
        out.extend(unaccounted(f, &host, (i, uuid, grant), &mine));
    }
    if let (Some(u), Some(raw)) = (f.usage, f.usage_raw) {
        out.extend(inactive_slot_with_bytes(f, u, raw));
        for i in 0..f.meta.gpus.len().min(MAX_GPUS) {
            let gpu = granted.get(i).map(format_uuid);
            out.extend(bucket_counters(f, u, i, gpu.as_deref(), memory));
            out.extend(bucket_reset(f, raw, i, gpu.as_deref(), memory));
        }
    }
    out
}

/// The container's processes with a host pid, by host pid (slots no
/// process matched left out).
fn host_processes(processes: &[ProcessView]) -> HashMap<u32, &ProcessView> {
    processes
        .iter()
        .filter_map(|p| p.host_pid.map(|h| (h, p)))
        .filter(|(_, p)| p.source != Source::UnmatchedSlot)
        .collect()
}

/// Bypass: processes listed by NVML, or reported by eBPF, with no slot
/// (one finding for them all); and registered processes on a GPU not
/// granted (one finding each).
fn bypass(f: &Facts<'_>, host: &HashMap<u32, &ProcessView>, granted: &[[u8; 16]]) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut bypass: Vec<u32> = Vec::new();
    let mut bypass_gpu = None;
    // (A container without host processes has none listed by NVML.)
    let mut uuids: Vec<&[u8; 16]> = if host.is_empty() {
        Vec::new()
    } else {
        f.nvml.keys().collect()
    };
    uuids.sort();
    for uuid in &uuids {
        let mut pids: Vec<u32> = f.nvml[*uuid].keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            let Some(p) = host.get(&pid) else { continue };
            if p.source == Source::Unregistered && !bypass.contains(&pid) {
                bypass.push(pid);
                bypass_gpu.get_or_insert(format_uuid(uuid));
            } else if p.source != Source::Unregistered && !granted.contains(uuid) {
                out.push(Finding {
                    reason: Reason::Bypass,
                    gpu: Some(format_uuid(uuid)),
                    pids: vec![pid],
                    what: format!(
                        "pid {pid} uses GPU {} that is not granted",
                        format_uuid(uuid)
                    ),
                });
            }
        }
    }
    for &pid in f.ebpf_bypass {
        if host
            .get(&pid)
            .is_some_and(|p| p.source == Source::Unregistered)
            && !bypass.contains(&pid)
        {
            bypass.push(pid);
        }
    }
    if !bypass.is_empty() {
        out.push(Finding {
            reason: Reason::Bypass,
            gpu: bypass_gpu,
            what: format!(
                "pid(s) {bypass:?} use the GPU without registering with the preload (no usage slot)"
            ),
            pids: bypass,
        });
    }
    out
}

/// Memory overage on GPU `uuid` of the grant: `mine` (the container's
/// processes NVML lists there, with their bytes) hold more than they may
/// ([`allowed_bytes`], or the ceiling over a lowered limit, which this
/// updates in `memory`).
fn memory_overage(
    f: &Facts<'_>,
    uuid: &[u8; 16],
    limit: u64,
    grant: &GpuGrant,
    mine: &[(u32, u64)],
    memory: &mut Memory,
) -> Option<Finding> {
    let used: u64 = mine.iter().map(|(_, b)| b).sum();
    let n = mine.len() as u64;
    let allowed = allowed_bytes(limit, grant.context_overhead_bytes, f.context_allowance, n);
    let (last, ceiling) = memory.limits.get(uuid).copied().unwrap_or((limit, None));
    let ceiling = match ceiling {
        _ if limit > last && used <= allowed => None,
        Some(c) => Some(c.min(used.max(allowed))),
        None if limit < last && used > allowed => Some(used),
        None => None,
    }
    .filter(|&c| c > allowed);
    memory.limits.insert(*uuid, (limit, ceiling));
    let bound = ceiling.unwrap_or(allowed);
    if used <= bound {
        return None;
    }
    let mut pids: Vec<u32> = mine.iter().map(|(p, _)| *p).collect();
    pids.sort_unstable();
    let gpu = format_uuid(uuid);
    Some(Finding {
        reason: Reason::MemoryOverage,
        gpu: Some(gpu.clone()),
        pids,
        what: format!(
            "holds {} MiB on {gpu} (NVML), may hold {} MiB (limit {} MiB)",
            used >> 20,
            bound >> 20,
            limit >> 20
        ),
    })
}

/// Tampering: on GPU `i` of the grant (`uuid`), the registered processes
/// among `mine` hold more in NVML than their slots account for (plus
/// their uncharged context allowance).
fn unaccounted(
    f: &Facts<'_>,
    host: &HashMap<u32, &ProcessView>,
    (i, uuid, grant): (usize, &[u8; 16], &GpuGrant),
    mine: &[(u32, u64)],
) -> Option<Finding> {
    let slots_used = |p: &ProcessView| -> u64 {
        let Some(u) = f.usage else { return 0 };
        p.slot
            .and_then(|s| u.slots.iter().find(|v| v.index == s))
            .map_or(0, |v| v.used[i])
    };
    let registered: Vec<&(u32, u64)> = mine
        .iter()
        .filter(|(p, _)| {
            host.get(p)
                .is_some_and(|v| v.source != Source::Unregistered)
        })
        .collect();
    let real: u64 = registered.iter().map(|(_, b)| b).sum();
    let account: u64 = registered.iter().map(|(p, _)| slots_used(host[p])).sum();
    let slack = (registered.len() as u64).saturating_mul(
        f.context_allowance
            .saturating_sub(grant.context_overhead_bytes),
    );
    if real <= account.saturating_add(slack) {
        return None;
    }
    let mut pids: Vec<u32> = registered.iter().map(|(p, _)| *p).collect();
    pids.sort_unstable();
    let gpu = format_uuid(uuid);
    Some(Finding {
        reason: Reason::Tampering,
        gpu: Some(gpu.clone()),
        pids,
        what: format!(
            "usage region accounts {} MiB on {gpu}, NVML sees {} MiB for the same processes",
            account >> 20,
            real >> 20
        ),
    })
}

/// Tampering: the first usage slot that holds bytes while its bit in the
/// active bitmap of `raw` is clear (the preload's sums skip it).
fn inactive_slot_with_bytes(f: &Facts<'_>, u: &UsageSnapshot, raw: &[u8]) -> Option<Finding> {
    let s = u
        .slots
        .iter()
        .find(|s| s.used.iter().any(|&b| b != 0) && !bit_set(raw, s.index))?;
    Some(Finding {
        reason: Reason::Tampering,
        gpu: None,
        pids: f
            .processes
            .iter()
            .filter(|p| p.slot == Some(s.index))
            .filter_map(|p| p.host_pid)
            .collect(),
        what: format!(
            "usage slot {} holds bytes but its bit in the active bitmap is clear",
            s.index
        ),
    })
}

/// Tampering: launch bucket `i`'s counters went back, or admitted more
/// warps over the last [`RATE_WINDOW`] than its rate allows
/// ([`warps_conform`]); this period's read is kept in `memory`.
fn bucket_counters(
    f: &Facts<'_>,
    u: &UsageSnapshot,
    i: usize,
    gpu: Option<&str>,
    memory: &mut Memory,
) -> Option<Finding> {
    let rate = f.launch_rates.get(i).copied().unwrap_or(UNLIMITED);
    let burst = f.launch_bursts.get(i).copied().unwrap_or(0);
    let (warps, launches) = (u.buckets[i].warps, u.buckets[i].launches);
    let q = &mut memory.warps[i];
    q.push_back((f.now, warps, launches, rate, burst));
    while q.len() > 2 && f.now.duration_since(q[1].0) >= RATE_WINDOW {
        q.pop_front();
    }
    let (t0, w0, l0, _, _) = q[0];
    let span = f.now.duration_since(t0);
    let r_max = q.iter().map(|s| s.3).max().unwrap_or(UNLIMITED);
    let b_max = q.iter().map(|s| s.4).max().unwrap_or(0);
    let tampering = |what| Finding {
        reason: Reason::Tampering,
        gpu: gpu.map(str::to_owned),
        pids: Vec::new(),
        what,
    };
    if warps < w0 || launches < l0 {
        Some(tampering(format!(
            "launch bucket {i}'s counters went back (warps {w0} to {warps}, launches {l0} to {launches})"
        )))
    } else if span >= RATE_WINDOW
        && r_max != UNLIMITED
        && !warps_conform(warps - w0, launches - l0, span, r_max, b_max)
    {
        Some(tampering(format!(
            "launch bucket {i} admitted {} warps in {} ms at a rate of {r_max} warps/s (token bucket reset)",
            warps - w0,
            span.as_millis()
        )))
    } else {
        None
    }
}

/// Tampering: launch bucket `i` of a rate-limited GPU names a control
/// epoch ahead of the control region's, or its theoretical arrival time
/// went back without a new epoch; this period's (epoch, TAT) is kept in
/// `memory`.
fn bucket_reset(
    f: &Facts<'_>,
    raw: &[u8],
    i: usize,
    gpu: Option<&str>,
    memory: &mut Memory,
) -> Option<Finding> {
    let rate = f.launch_rates.get(i).copied().unwrap_or(UNLIMITED);
    let now = bucket_at(raw, i);
    let before = std::mem::replace(&mut memory.buckets[i], now);
    let (epoch, tat) = now?;
    if rate == UNLIMITED || rate == 0 {
        return None;
    }
    let tampering = |what| Finding {
        reason: Reason::Tampering,
        gpu: gpu.map(str::to_owned),
        pids: Vec::new(),
        what,
    };
    if epoch > f.control_epoch {
        Some(tampering(format!(
            "launch bucket {i} names control epoch {epoch}, the control region is at {}",
            f.control_epoch
        )))
    } else if let Some((e0, t0)) = before
        && e0 == epoch
        && tat < t0
    {
        Some(tampering(format!(
            "launch bucket {i} went back {} µs without a new control epoch (token bucket reset)",
            (t0 - tat) / 1000
        )))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const UUID: &str = "GPU-12345678-9abc-def0-0123-456789abcdef";

    fn meta(limit: u64, overhead: u64) -> Metadata {
        let mut m: Metadata = serde_json::from_value(serde_json::json!({
            "version": 1, "sm_target": 50, "gpus": []
        }))
        .unwrap();
        m.gpus.push(GpuGrant {
            uuid: UUID.into(),
            memory_limit_bytes: Some(limit),
            context_overhead_bytes: overhead,
        });
        m
    }

    fn proc(pid: u32, slot: Option<usize>) -> ProcessView {
        ProcessView {
            host_pid: Some(pid),
            ns_pid: pid,
            slot,
            source: if slot.is_some() {
                Source::Registered
            } else {
                Source::Unregistered
            },
        }
    }

    fn run(
        m: &Metadata,
        procs: &[ProcessView],
        nvml: &[(u32, u64)],
        allowance: u64,
        mem: &mut Memory,
    ) -> Vec<Finding> {
        let uuid = m.uuids()[0];
        let nvml = HashMap::from([(uuid, nvml.iter().copied().collect::<GpuMemory>())]);
        findings(
            &Facts {
                meta: m,
                processes: procs,
                usage: None,
                usage_raw: None,
                control_epoch: 2,
                launch_rates: &[UNLIMITED],
                launch_bursts: &[0],
                now: Instant::now(),
                nvml: &nvml,
                ebpf_bypass: &[],
                context_allowance: allowance,
                compute: &[],
            },
            mem,
        )
    }

    fn reasons(f: &[Finding]) -> Vec<Reason> {
        f.iter().map(|f| f.reason).collect()
    }

    #[test]
    fn overage_counts_contexts_unless_allowed() {
        let m = meta(1000 * MIB, 0);
        let p = [proc(10, None)];
        let mut mem = Memory::default();
        let f = run(&m, &p, &[(10, 1100 * MIB)], 0, &mut mem);
        assert!(reasons(&f).contains(&Reason::MemoryOverage), "{f:?}");
        assert!(reasons(&f).contains(&Reason::Bypass), "{f:?}");
        let f = run(&m, &p, &[(10, 1100 * MIB)], 300 * MIB, &mut mem);
        assert!(!reasons(&f).contains(&Reason::MemoryOverage), "{f:?}");
        // A grant that charges the context gets no allowance for it.
        let m = meta(1000 * MIB, 300 * MIB);
        let f = run(&m, &p, &[(10, 1100 * MIB)], 300 * MIB, &mut mem);
        assert!(reasons(&f).contains(&Reason::MemoryOverage), "{f:?}");
        assert_eq!(allowed_bytes(10, 3, 5, 2), 14);
    }

    #[test]
    fn foreign_processes_are_not_the_containers() {
        let m = meta(1000 * MIB, 0);
        let f = run(
            &m,
            &[proc(10, None)],
            &[(99, 4000 * MIB)],
            0,
            &mut Memory::default(),
        );
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn a_lowered_limit_holds_the_use_it_had() {
        let mut mem = Memory::default();
        let p = [proc(10, None)];
        let f = run(&meta(1000 * MIB, 0), &p, &[(10, 800 * MIB)], 0, &mut mem);
        assert!(!reasons(&f).contains(&Reason::MemoryOverage));
        // Lowered to 500 at 800 in use: 800 is the ceiling.
        let f = run(&meta(500 * MIB, 0), &p, &[(10, 800 * MIB)], 0, &mut mem);
        assert!(!reasons(&f).contains(&Reason::MemoryOverage), "{f:?}");
        // It frees to 600: the ceiling follows; growing back is an overage.
        let f = run(&meta(500 * MIB, 0), &p, &[(10, 600 * MIB)], 0, &mut mem);
        assert!(!reasons(&f).contains(&Reason::MemoryOverage), "{f:?}");
        let f = run(&meta(500 * MIB, 0), &p, &[(10, 700 * MIB)], 0, &mut mem);
        assert!(reasons(&f).contains(&Reason::MemoryOverage), "{f:?}");
        // A fresh agent judges on the limit.
        let f = run(
            &meta(500 * MIB, 0),
            &p,
            &[(10, 600 * MIB)],
            0,
            &mut Memory::default(),
        );
        assert!(reasons(&f).contains(&Reason::MemoryOverage), "{f:?}");
    }

    #[test]
    fn registered_processes_beyond_their_account_are_tampering() {
        let m = meta(1000 * MIB, 0);
        // Slot 0 accounts nothing (no usage region decoded): NVML's 200 MiB
        // are unaccounted.
        let f = run(
            &m,
            &[proc(10, Some(0))],
            &[(10, 200 * MIB)],
            0,
            &mut Memory::default(),
        );
        assert_eq!(reasons(&f), [Reason::Tampering], "{f:?}");
        let f = run(
            &m,
            &[proc(10, Some(0))],
            &[(10, 200 * MIB)],
            300 * MIB,
            &mut Memory::default(),
        );
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn admitted_warps_are_bounded_by_the_rate() {
        let s = Duration::from_millis(500);
        // 1000 warps/s, burst 100: 500 ms admit at most ~500 + 100.
        assert!(warps_conform(600, 60, s, 1000, 100));
        assert!(warps_conform(1000, 100, s, 1000, 100));
        assert!(!warps_conform(2000, 200, s, 1000, 100));
        // Launches of a second of the rate each: the debt clamp may let
        // them through faster; nothing to conclude.
        assert!(warps_conform(6400, 2, s, 320, 1));
    }
}
