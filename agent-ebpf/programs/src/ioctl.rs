//! Counting one ioctl on a device, shared by the three attach modes.

use aya_ebpf::helpers::{bpf_get_current_cgroup_id, bpf_probe_read_user};
use tessera_ebpf_common::{ioctl::decode, keys::IoctlKey, stats};

use crate::{
    counters::{bump, stat},
    maps::{IOCTL_COUNTS, WATCHED_DEVS},
};

/// Counts `cmd` on the device `rdev` if that device is watched; `arg` is the
/// ioctl's user-space argument.
#[inline(always)]
pub fn record(rdev: u32, cmd: u32, arg: u64) {
    // SAFETY: the value is copied out at once; a concurrent update by the
    // agent can at worst give the old or the new decoding.
    let Some(watched) = (unsafe { WATCHED_DEVS.get(rdev) }).copied() else {
        return;
    };
    let (nr, flags) = decode(watched.decode, cmd, || {
        // `nv_ioctl_xfer_t` starts with `u32 cmd`.
        // SAFETY: bpf_probe_read_user is fault-tolerant.
        unsafe { bpf_probe_read_user(arg as *const u32) }.ok()
    });
    let key = IoctlKey {
        // SAFETY: the helper has no preconditions.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        dev: rdev,
        nr,
        flags,
        reserved: 0,
    };
    bump(&IOCTL_COUNTS, &key);
    stat(stats::IOCTL_COUNTED);
}
