//! Cgroup device program: counts access checks (opens, mknod) of watched
//! devices per cgroup, and reports the first by an unregistered process.
//! Audit only: it always allows, and the kernel still applies every other
//! device program and the v1 devices controller.
//!
//! It runs where the kernel checks device permission, before the open
//! completes, so it sees opens through any path (open, openat, openat2,
//! io_uring, `/proc/self/fd` reopens) and also failed ones and `access(2)`
//! checks; the kernel gives it the device number, so it needs no offsets.

use aya_ebpf::{
    helpers::bpf_get_current_cgroup_id, macros::cgroup_device, programs::DeviceContext,
};
use tessera_ebpf_common::{dev::kdev, events::kind, guard::DEV_CHAR, keys::OpenKey, stats};

use crate::{
    bypass,
    counters::{bump, stat},
    maps::{OPEN_COUNTS, WATCHED_DEVS},
};

/// Allow.
const ALLOW: i32 = 1;

#[cgroup_device]
pub fn dev_open_audit(ctx: DeviceContext) -> i32 {
    // SAFETY: the kernel passes a valid `bpf_cgroup_dev_ctx`.
    let dev = unsafe { &*ctx.device };
    if dev.access_type & 0xFFFF != DEV_CHAR {
        return ALLOW;
    }
    let rdev = kdev(dev.major, dev.minor);
    if WATCHED_DEVS.get_ptr(rdev).is_none() {
        return ALLOW;
    }
    // SAFETY: the helper has no preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let access = dev.access_type >> 16;
    let key = OpenKey {
        cgroup_id,
        dev: rdev,
        access,
    };
    bump(&OPEN_COUNTS, &key);
    stat(stats::OPEN_COUNTED);
    bypass::check(cgroup_id, rdev, kind::OPEN, access, 0);
    ALLOW
}
