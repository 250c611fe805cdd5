//! `tracepoint/syscalls/sys_enter_ioctl`: every ioctl on the system enters
//! here; the fd is resolved to a device through the task's file table.

use aya_ebpf::{EbpfContext, macros::tracepoint, programs::TracePointContext};
use tessera_ebpf_common::stats;

use crate::{config, counters::stat, ioctl, kernel};

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
    // SAFETY: `record` points at the tracepoint's record, which holds these
    // 8-byte fields; the verifier checks the accesses against its size.
    let (fd, cmd, arg) = unsafe {
        (
            record.add(FD).cast::<u64>().read(),
            record.add(CMD).cast::<u64>().read(),
            record.add(ARG).cast::<u64>().read(),
        )
    };
    match kernel::fd_rdev(fd as u32, &offsets) {
        Some(rdev) => ioctl::record(rdev, cmd as u32, arg),
        None => stat(stats::FD_UNRESOLVED),
    }
    0
}
