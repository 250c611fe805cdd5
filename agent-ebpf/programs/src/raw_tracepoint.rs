//! `raw_tp/sys_enter`: runs for every syscall, so it filters on the
//! syscall number first; cheaper than the syscall tracepoint per ioctl.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::bpf_probe_read_kernel,
    macros::raw_tracepoint,
    programs::{ProbeContext, RawTracePointContext},
};
use tessera_ebpf_common::stats;

use crate::{
    config,
    counters::stat,
    ioctl,
    kernel::{self, Cast, Probe, Walk},
    verdict,
};

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn ioctl_raw_tp(ctx: RawTracePointContext) -> i32 {
    on_syscall::<Cast>(&ctx)
}

/// [`ioctl_raw_tp`] for kernels without `bpf_rdonly_cast`.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn ioctl_raw_tp_probe(ctx: RawTracePointContext) -> i32 {
    on_syscall::<Probe>(&ctx)
}

#[inline(always)]
fn on_syscall<W: Walk>(ctx: &RawTracePointContext) -> i32 {
    // TP_PROTO(struct pt_regs *regs, long id)
    let id: u64 = ctx.arg(1);
    if id != u64::from(config::ioctl_syscall_nr()) {
        return 0;
    }
    let Some(offsets) = config::offsets() else {
        return 0;
    };
    let regs: *const pt_regs = ctx.arg(0);
    // One copy of the user registers (one helper call, whatever the
    // size), then read the arguments from it.
    // SAFETY: bpf_probe_read_kernel is fault-tolerant.
    let Ok(mut regs) = (unsafe { bpf_probe_read_kernel(regs) }) else {
        return 0;
    };
    let args = ProbeContext::new((&raw mut regs).cast());
    let Some(fd) = args.arg::<u64>(0) else {
        return 0;
    };
    let task = kernel::current();
    let Some(rdev) = kernel::fd_rdev::<W>(task, fd as u32, &offsets, &config::casts()) else {
        stat(stats::FD_UNRESOLVED);
        return 0;
    };
    let Some(watched) = verdict::watched_dev(rdev) else {
        return 0;
    };
    let (Some(cmd), Some(arg)) = (args.arg::<u64>(1), args.arg::<u64>(2)) else {
        return 0;
    };
    ioctl::record(task, &offsets, rdev, watched, cmd as u32, arg);
    0
}
