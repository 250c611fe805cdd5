//! Processes that use NVIDIA devices without having registered with the
//! preload: the first open or ioctl of a watched device by an unregistered
//! process inside a watched cgroup (a GPU pod) goes to the `EVENTS` ring
//! buffer, once per process.
//!
//! Registered processes cost one hash lookup; reported ones two. Only an
//! unregistered, unreported process walks its cgroup ancestry (one helper
//! call and lookup per level), which repeats for processes outside every
//! watched cgroup (host daemons such as nvidia-smi or DCGM).

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid,
        generated::{bpf_get_current_ancestor_cgroup_id, bpf_ktime_get_ns},
    },
};
use tessera_ebpf_common::{events::BypassEvent, stats};

use crate::{
    counters::stat,
    maps::{EVENTS, REGISTERED, REPORTED, WATCHED_CGROUPS},
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

/// Reports this access if the current process must register, has not, and
/// has not been reported yet. `kind` is one of `events::kind`.
#[inline(always)]
pub fn check(cgroup_id: u64, dev: u32, kind: u32, nr: u32, flags: u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if REGISTERED.get_ptr(tgid).is_some() || REPORTED.get_ptr(tgid).is_some() {
        return;
    }
    let Some(watched_cgroup_id) = watched_cgroup() else {
        return;
    };
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // Exactly once per process, also when its threads race here: only the
    // thread whose insert creates the entry reports.
    if REPORTED.insert(tgid, now, u64::from(BPF_NOEXIST)).is_err() {
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
