//! `tracepoint/syscalls/sys_enter_ioctl`: every ioctl on the system enters
//! here; the fd is resolved to a file through the task's file table, and
//! files that are not watched devices are rejected from the verdict cache.

use aya_ebpf::{EbpfContext, macros::tracepoint, programs::TracePointContext};
use tessera_ebpf_common::stats;

use crate::{config, counters::stat, ioctl, kernel, verdict};

/// Offsets of `fd`, `cmd` and `arg` in the record (the tracepoint's
/// `format` file: syscall arguments are 8-byte fields from offset 16).
const FD: usize = 16;
const CMD: usize = 24;
const ARG: usize = 32;

#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn ioctl_tp(ctx: TracePointContext) -> u32 {
    let Some(offsets) = config::offsets() else {
        return 0;
    };
    let record = ctx.as_ptr().cast::<u8>();
    // SAFETY: `record` points at the tracepoint's record, which holds this
    // 8-byte field; the verifier checks the access against its size.
    let fd = unsafe { record.add(FD).cast::<u64>().read() };
    let Some(file) = kernel::fd_file(fd as u32, &offsets) else {
        stat(stats::FD_UNRESOLVED);
        return 0;
    };
    let Some((rdev, watched)) = verdict::watched_file(file, &offsets) else {
        return 0;
    };
    // SAFETY: as above, for these two fields.
    let (cmd, arg) = unsafe {
        (
            record.add(CMD).cast::<u64>().read(),
            record.add(ARG).cast::<u64>().read(),
        )
    };
    ioctl::record(rdev, watched, cmd as u32, arg);
    0
}
