//! Counting one ioctl on a watched device, shared by the three attach
//! modes; then the bypass check and what the ioctl's parameters tell.

use aya_ebpf::helpers::bpf_get_current_cgroup_id;
use tessera_ebpf_common::{
    dev::{WatchedDevice, class},
    events::kind,
    ioctl::{Xfer, decode, flags, ioc_size},
    keys::IoctlKey,
    rm::{NV_ESC_RM_ALLOC, NV_ESC_RM_FREE},
    uvm::UVM_REGISTER_GPU,
};

use crate::{bypass, counters::bump, maps::IOCTL_COUNTS, track, user::read_user};

/// Counts `cmd` on the watched device `rdev` (see [`verdict`]); `arg` is
/// the ioctl's user-space argument.
///
/// [`verdict`]: crate::verdict
#[inline(always)]
pub fn record(rdev: u32, watched: WatchedDevice, cmd: u32, arg: u64) {
    let mut xfer = None;
    let (nr, nr_flags) = decode(watched.decode, cmd, || {
        let x: Xfer = read_user(arg)?;
        xfer = Some(x);
        Some(x.cmd)
    });
    // SAFETY: the helper has no preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
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
