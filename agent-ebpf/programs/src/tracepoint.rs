//! `tracepoint/syscalls/sys_enter_ioctl`: every ioctl on the system enters
//! here; the fd is resolved to a device number through the task's file
//! table, and what is not a watched device is rejected (sockets and other
//! non-devices at once, devices from the verdict cache).

use aya_ebpf::{EbpfContext, macros::tracepoint, programs::TracePointContext};
use tessera_ebpf_common::stats;

use crate::{
    config,
    counters::stat,
    ioctl,
    kernel::{self, Cast, Probe, Walk},
    verdict,
};

/// Offsets of `fd`, `cmd` and `arg` in the record (the tracepoint's
/// `format` file: syscall arguments are 8-byte fields from offset 16).
const FD: usize = 16;
const CMD: usize = 24;
const ARG: usize = 32;

#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn ioctl_tp(ctx: TracePointContext) -> u32 {
    on_ioctl::<Cast>(&ctx)
}

/// [`ioctl_tp`] for kernels without `bpf_rdonly_cast`.
#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn ioctl_tp_probe(ctx: TracePointContext) -> u32 {
    on_ioctl::<Probe>(&ctx)
}

#[inline(always)]
fn on_ioctl<W: Walk>(ctx: &TracePointContext) -> u32 {
    let Some(offsets) = config::offsets() else {
        return 0;
    };
    let record = ctx.as_ptr().cast::<u8>();
    // SAFETY: `record` points at the tracepoint's record, which holds this
    // 8-byte field; the verifier checks the access against its size.
    let fd = unsafe { record.add(FD).cast::<u64>().read() };
    let task = kernel::current();
    let Some(rdev) = kernel::fd_rdev::<W>(task, fd as u32, &offsets, &config::casts()) else {
        stat(stats::FD_UNRESOLVED);
        return 0;
    };
    let Some(watched) = verdict::watched_dev(rdev) else {
        return 0;
    };
    // SAFETY: as above, for these two fields.
    let (cmd, arg) = unsafe {
        (
            record.add(CMD).cast::<u64>().read(),
            record.add(ARG).cast::<u64>().read(),
        )
    };
    ioctl::record(task, &offsets, rdev, watched, cmd as u32, arg);
    0
}
