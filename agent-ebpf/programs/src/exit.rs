//! `tracepoint/sched/sched_process_exit`: forgets a process when it is
//! gone, so its tgid can be reused without inheriting its registration,
//! its "already reported" mark or its memory estimate.
//!
//! The record's `group_dead` (6.16+; offset from the agent) says whether
//! the last thread is exiting. Without it, the leader thread's exit counts,
//! which forgets a process early if its leader exits before the others.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};

use crate::{
    config,
    maps::{REGISTERED, REPORTED, RM_PROCS},
};

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let offset = config::exit_group_dead_offset();
    let gone = if offset != 0 {
        // SAFETY: the agent took the offset from this tracepoint's format
        // file; the read is a fault-tolerant probe read of the record.
        let dead: Result<u8, i32> = unsafe { ctx.read_at(offset as usize) };
        matches!(dead, Ok(d) if d != 0)
    } else {
        pid_tgid as u32 == tgid
    };
    if gone {
        let _ = REGISTERED.remove(tgid);
        let _ = REPORTED.remove(tgid);
        let _ = RM_PROCS.remove(tgid);
    }
    0
}
