//! Cgroup device programs: count access checks (opens, mknod) of watched
//! devices per cgroup. Audit only: they always allow, and the kernel still
//! applies every other device program and the v1 devices controller.
//!
//! They run where the kernel checks device permission, before the open
//! completes, so they see opens through any path (open, openat, openat2,
//! io_uring, `/proc/self/fd` reopens) and also failed ones and `access(2)`
//! checks; the kernel gives them the device number, so they need no
//! offsets.
//!
//! Two counting variants, of which the agent attaches one:
//! - [`dev_open_audit`] also reports the first open by an unregistered
//!   process ([`bypass`]), which needs `bpf_get_current_ancestor_cgroup_id`,
//!   `bpf_get_current_pid_tgid` and `bpf_get_current_comm`, which cgroup
//!   device programs may call only on newer kernels (the ancestor helper
//!   from Linux 6.4), so older kernels' verifiers refuse it;
//! - [`dev_open_count`] only counts (`bpf_get_current_cgroup_id`, which
//!   device programs have had all along); the agent falls back to it.

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid},
    macros::cgroup_device,
    programs::DeviceContext,
};
use tessera_ebpf_common::{dev::kdev, events::kind, guard::DEV_CHAR, keys::OpenKey};

use crate::{
    bypass,
    counters::bump,
    maps::{OPEN_COUNTS, WATCHED_DEVS},
};

/// Allow.
const ALLOW: i32 = 1;

/// The device number and requested access of the access check, if it is
/// of a watched character device.
#[inline(always)]
fn watched(ctx: &DeviceContext) -> Option<(u32, u32)> {
    // SAFETY: the kernel passes a valid `bpf_cgroup_dev_ctx`.
    let dev = unsafe { &*ctx.device };
    if dev.access_type & 0xFFFF != DEV_CHAR {
        return None;
    }
    let rdev = kdev(dev.major, dev.minor);
    WATCHED_DEVS.get_ptr(rdev)?;
    Some((rdev, dev.access_type >> 16))
}

/// Counts the access check if it is of a watched character device;
/// returns the key counted.
#[inline(always)]
fn count(ctx: &DeviceContext) -> Option<OpenKey> {
    let (rdev, access) = watched(ctx)?;
    let key = OpenKey {
        // SAFETY: the helper has no preconditions.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        dev: rdev,
        access,
    };
    bump(&OPEN_COUNTS, &key);
    Some(key)
}

/// Counts, and reports the first open by an unregistered process.
#[cgroup_device]
pub fn dev_open_audit(ctx: DeviceContext) -> i32 {
    if let Some(key) = count(&ctx) {
        bypass::check(
            bypass::Ancestry::Walked,
            key.cgroup_id,
            || (bpf_get_current_pid_tgid(), 0),
            key.dev,
            kind::OPEN,
            key.access,
            0,
        );
    }
    ALLOW
}

/// Counts only: for kernels whose device programs lack the helpers the
/// bypass report needs.
#[cgroup_device]
pub fn dev_open_count(ctx: DeviceContext) -> i32 {
    let _ = count(&ctx);
    ALLOW
}
