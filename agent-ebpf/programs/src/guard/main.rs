//! `tessera-guard.bpf.o`: the per-pod device guard, on its own so that
//! loading one instance per pod creates no maps.
//!
//! Each instance carries its pod's policy in the `TESSERA_GUARD` global
//! (`tessera_ebpf_common::guard::GuardPolicy`), is attached to the pod's
//! cgroup through a bpf link, and the link is pinned, so the guard holds
//! without the agent. It denies opening (and mknod of) GPU devices not
//! assigned to the pod; everything else is left to the other device
//! programs and the v1 devices controller, all of which must allow.
#![no_std]
#![no_main]

use aya_ebpf::{macros::cgroup_device, programs::DeviceContext};
use tessera_ebpf_common::guard::GuardPolicy;

/// Overridden by the agent for each pod.
#[unsafe(no_mangle)]
static TESSERA_GUARD: GuardPolicy = GuardPolicy::UNSET;

#[cgroup_device]
pub fn pod_device_guard(ctx: DeviceContext) -> i32 {
    // SAFETY: the kernel passes a valid `bpf_cgroup_dev_ctx`.
    let dev = unsafe { &*ctx.device };
    // SAFETY: a read of a live static; volatile so the compiler does not
    // fold the compiled-in value, which the loader replaces.
    let policy = unsafe { core::ptr::read_volatile(&raw const TESSERA_GUARD) };
    i32::from(policy.allows(dev.access_type, dev.major, dev.minor))
}

/// GPL-compatible, matching the crate's licence (GPL-2.0 OR MIT).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program with a reachable panic path
    // (the loop below would never terminate), so this is never reached.
    unsafe { core::hint::unreachable_unchecked() }
}
