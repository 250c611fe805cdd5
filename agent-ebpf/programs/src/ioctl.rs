//! Counting one ioctl on a watched device, shared by the three attach
//! modes; then the bypass check and what the ioctl's parameters tell.

use tessera_ebpf_common::{
    config::KernelOffsets,
    dev::{WatchedDevice, class},
    events::kind,
    ioctl::{Xfer, decode, flags, ioc_size},
    keys::IoctlKey,
    rm::{NV_ESC_RM_ALLOC, NV_ESC_RM_FREE},
    uvm::UVM_REGISTER_GPU,
};

use crate::{bypass, counters::bump, kernel, maps::IOCTL_COUNTS, track, user::read_user};

/// Counts `cmd` on the watched device `rdev` (see [`verdict`]) for the
/// current task `task` ([`kernel::current`]); `arg` is the ioctl's
/// user-space argument.
///
/// [`verdict`]: crate::verdict
#[inline(always)]
pub fn record(
    task: *const u8,
    off: &KernelOffsets,
    rdev: u32,
    watched: WatchedDevice,
    cmd: u32,
    arg: u64,
) {
    let mut xfer = None;
    let (nr, nr_flags) = decode(watched.decode, cmd, || {
        let x: Xfer = read_user(arg)?;
        xfer = Some(x);
        Some(x.cmd)
    });
    let cgroup_id = kernel::cgroup_id(task, off);
    let key = IoctlKey {
        cgroup_id,
        dev: rdev,
        nr,
        flags: nr_flags,
        reserved: 0,
    };
    bump(&IOCTL_COUNTS, &key);
    bypass::check(
        bypass::Ancestry::Cached,
        cgroup_id,
        || {
            (
                kernel::pid_tgid(task, off),
                kernel::process_start(task, off),
            )
        },
        rdev,
        kind::IOCTL,
        nr,
        nr_flags,
    );

    // The parameter block: XFER names it, else the command's size field.
    let (params, size) = match xfer {
        Some(x) => (x.ptr, x.size),
        None => (arg, ioc_size(cmd)),
    };
    match watched.class {
        class::CONTROL if nr == NV_ESC_RM_ALLOC => track::rm_alloc(cgroup_id, params, size),
        class::CONTROL if nr == NV_ESC_RM_FREE => track::rm_free(params, size),
        class::UVM if nr == UVM_REGISTER_GPU && nr_flags == flags::RAW => {
            track::uvm_register(cgroup_id, arg)
        }
        _ => {}
    }
}
