//! Processes that use NVIDIA devices without having registered with the
//! preload: the first open or ioctl of a watched device by an unregistered
//! process inside a watched cgroup (a GPU pod) goes to the `EVENTS` ring
//! buffer, once per process.
//!
//! On the ioctl path, which watched cgroup the task is in comes first,
//! from a per-CPU cache keyed by cgroup id (one walk of the ancestry per
//! cgroup and change of the watched set): processes outside every watched
//! cgroup (host daemons such as nvidia-smi or DCGM) stop there; inside,
//! registered and reported processes stop at a per-CPU cache keyed by
//! (tgid, start time), and only its misses ask `REGISTERED` and `REPORTED`.
//! Device programs use neither cache (they can be preempted) and walk the
//! ancestry of unregistered, unreported processes each time (one helper
//! call and lookup per level).

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm,
        generated::{bpf_get_current_ancestor_cgroup_id, bpf_ktime_get_ns},
    },
};
use tessera_ebpf_common::{
    events::BypassEvent,
    stats,
    verdict::{CGROUP_EPOCH, CgroupVerdict, TASK_EPOCH, TaskVerdict, cgroup_slot, task_slot},
};

use crate::{
    counters::stat,
    maps::{CGROUP_VERDICTS, EPOCHS, EVENTS, REGISTERED, REPORTED, TASK_VERDICTS, WATCHED_CGROUPS},
};

/// Deepest cgroup level looked at (the root is level 0; a container under
/// `kubepods.slice/kubepods-burstable.slice/…pod….slice` is at level 4).
const MAX_LEVELS: i32 = 16;

/// The watched cgroup the current task is in (its own or an ancestor).
#[inline(always)]
fn watched_cgroup() -> Option<u64> {
    let mut level = 0;
    while level < MAX_LEVELS {
        // SAFETY: the helper has no preconditions; 0 means "deeper than
        // the task's cgroup".
        let id = unsafe { bpf_get_current_ancestor_cgroup_id(level) };
        if id == 0 {
            return None;
        }
        if WATCHED_CGROUPS.get_ptr(id).is_some() {
            return Some(id);
        }
        level += 1;
    }
    None
}

/// [`watched_cgroup`] of the current task, whose cgroup is `cgroup_id`,
/// answered from the per-CPU cache while the cgroup epoch holds
/// (`tessera_ebpf_common::verdict`). Only for programs that are not
/// preempted (the ioctl programs).
#[inline(always)]
fn watched_cgroup_cached(cgroup_id: u64) -> Option<u64> {
    let epoch = match EPOCHS.get_ptr(CGROUP_EPOCH) {
        // SAFETY: an element of a live array; volatile, as the agent
        // changes it.
        Some(p) => unsafe { core::ptr::read_volatile(p) },
        None => 0,
    };
    let slot = CGROUP_VERDICTS.get_ptr_mut(cgroup_slot(cgroup_id));
    let (Some(slot), true) = (slot, epoch != 0) else {
        return watched_cgroup();
    };
    // SAFETY: this CPU's element of a live per-CPU array, accessed only by
    // programs that are not preempted.
    let cached = unsafe { *slot };
    if cached.cgroup_id == cgroup_id && cached.epoch == epoch {
        return (cached.watched != 0).then_some(cached.watched);
    }
    let watched = watched_cgroup();
    // SAFETY: as above.
    unsafe {
        *slot = CgroupVerdict {
            cgroup_id,
            epoch,
            watched: watched.unwrap_or(0),
        }
    };
    watched
}

/// The task cache's slot of one process (`tessera_ebpf_common::verdict::
/// TaskVerdict`), with the task epoch read before anything was looked up.
struct TaskCache {
    slot: *mut TaskVerdict,
    want: TaskVerdict,
}

impl TaskCache {
    /// `None` while the cache is off (epoch 0).
    #[inline(always)]
    fn new(tgid: u32, start_ns: u64) -> Option<Self> {
        // SAFETY: an element of a live array; volatile, as the agent
        // changes it.
        let epoch = unsafe { core::ptr::read_volatile(EPOCHS.get_ptr(TASK_EPOCH)?) };
        if epoch == 0 {
            return None;
        }
        Some(Self {
            slot: TASK_VERDICTS.get_ptr_mut(task_slot(tgid))?,
            want: TaskVerdict {
                tgid,
                reserved: 0,
                start_ns,
                epoch,
            },
        })
    }

    /// Whether the slot says this process needs no report.
    #[inline(always)]
    fn hit(&self) -> bool {
        // SAFETY: this CPU's element of a live per-CPU array, accessed only
        // by programs that are not preempted.
        unsafe { *self.slot == self.want }
    }

    /// Records that this process needs no report.
    #[inline(always)]
    fn store(self) {
        // SAFETY: as in `hit`.
        unsafe { *self.slot = self.want };
    }
}

/// How [`check`] finds the watched cgroup.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ancestry {
    /// From the per-CPU cache: ioctl programs, which are not preempted.
    Cached,
    /// Walked every time: device programs, which can be.
    Walked,
}

/// Reports this access if the current process must register, has not, and
/// has not been reported yet. `kind` is one of `events::kind`; `caller`
/// gives what `bpf_get_current_pid_tgid` would and the process's start
/// time ([`Ancestry::Cached`] only: the task cache's key), asked only
/// inside a watched cgroup.
#[inline(always)]
pub fn check(
    ancestry: Ancestry,
    cgroup_id: u64,
    caller: impl FnOnce() -> (u64, u64),
    dev: u32,
    kind: u32,
    nr: u32,
    flags: u32,
) {
    // Processes outside every watched cgroup (host daemons) stop at the
    // cache; inside, registered ones at the first lookup.
    let watched = match ancestry {
        Ancestry::Cached => {
            let Some(id) = watched_cgroup_cached(cgroup_id) else {
                return;
            };
            Some(id)
        }
        Ancestry::Walked => None,
    };
    let (pid_tgid, start_ns) = caller();
    let tgid = (pid_tgid >> 32) as u32;
    // Processes known to need no report, per CPU: only where runs are not
    // preempted (the ioctl programs).
    let known = match ancestry {
        Ancestry::Cached => TaskCache::new(tgid, start_ns),
        Ancestry::Walked => None,
    };
    if let Some(known) = &known
        && known.hit()
    {
        return;
    }
    if REGISTERED.get_ptr(tgid).is_some() || REPORTED.get_ptr(tgid).is_some() {
        if let Some(known) = known {
            known.store();
        }
        return;
    }
    let Some(watched_cgroup_id) = watched.or_else(watched_cgroup) else {
        return;
    };
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // Exactly once per process, also when its threads race here: only the
    // thread whose insert creates the entry reports.
    let inserted = REPORTED.insert(tgid, now, u64::from(BPF_NOEXIST)).is_ok();
    // Reported now, or by a racing thread: no report again either way.
    if let Some(known) = known {
        known.store();
    }
    if !inserted {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<BypassEvent>(0) else {
        stat(stats::EVENT_DROPPED);
        return;
    };
    entry.write(BypassEvent {
        ktime_ns: now,
        cgroup_id,
        watched_cgroup_id,
        pid: pid_tgid as u32,
        tgid,
        dev,
        kind,
        nr,
        flags,
        comm: bpf_get_current_comm().unwrap_or_default(),
    });
    entry.submit(0);
    stat(stats::BYPASS_REPORTED);
}
