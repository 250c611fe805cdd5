//! What some NVIDIA ioctls carry: the GPU a process registers with UVM
//! (`UVM_REGISTER_GPU`) and the video memory it allocates and frees
//! (`NV_ESC_RM_ALLOC` of class 0x40, `NV_ESC_RM_FREE` on nvidiactl). The
//! memory figure is the size requested at entry: an estimate (see
//! `tessera_ebpf_common::rm`).

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_ktime_get_ns},
};
use tessera_ebpf_common::{
    rm::{AllocHead, FreeParams, RmObject, RmObjectKey, RmProcess},
    stats,
    uvm::{GpuUse, GpuUseKey},
};

use crate::{
    config,
    counters::stat,
    maps::{GPU_USE, RM_OBJECTS, RM_PROCS},
};

/// Reads a `T` from user memory at `addr`.
#[inline(always)]
fn read_user<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user is fault-tolerant: any address is
    // allowed and an unreadable one returns an error.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}

/// Adds `v` to the u64 at `p` with one BPF atomic add: the target has no
/// atomic read-modify-write in `core` (no CAS), so this is the instruction
/// itself.
///
/// # Safety
///
/// `p` points at an aligned u64 inside a live map value.
#[inline(always)]
unsafe fn add(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract; the instruction touches only `*p`.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({p} + 0) += {v}",
            p = in(reg) p,
            v = in(reg) v,
            options(nostack),
        )
    };
}

/// `UVM_REGISTER_GPU`: the parameters start with the GPU's UUID.
#[inline(always)]
pub fn uvm_register(cgroup_id: u64, params: u64) {
    let Some(uuid) = read_user::<[u8; 16]>(params) else {
        stat(stats::ARG_UNREADABLE);
        return;
    };
    let key = GpuUseKey { cgroup_id, uuid };
    if GPU_USE.get_ptr_mut(key).is_none() {
        let first = GpuUse {
            // SAFETY: the helper has no preconditions.
            first_ns: unsafe { bpf_ktime_get_ns() },
            first_tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
            registrations: 0,
            reserved: 0,
        };
        // Another CPU may have inserted it meanwhile; either way it exists.
        let _ = GPU_USE.insert(key, first, u64::from(BPF_NOEXIST));
    }
    match GPU_USE.get_ptr_mut(key) {
        // SAFETY: a field of a live map value.
        Some(v) => unsafe { add(&raw mut (*v).registrations, 1) },
        None => stat(stats::TRACK_DROPPED),
    }
}

/// `NV_ESC_RM_ALLOC` with a parameter block of `size` bytes at `params`.
#[inline(always)]
pub fn rm_alloc(cgroup_id: u64, params: u64, size: u32) {
    let layout = config::rm_layout();
    let Some(nvos64) = layout.alloc_kind(size) else {
        if layout.enabled() {
            stat(stats::ARG_UNREADABLE);
        }
        return;
    };
    let Some(head) = read_user::<AllocHead>(params) else {
        stat(stats::ARG_UNREADABLE);
        return;
    };
    if head.h_class != layout.mem_class {
        return;
    }
    if nvos64 && layout.nvos64_flags_offset != 0 {
        match read_user::<u32>(params + u64::from(layout.nvos64_flags_offset)) {
            Some(f) if f & tessera_ebpf_common::rm::NVOS64_FLAGS_FINN_SERIALIZED == 0 => {}
            _ => {
                stat(stats::ARG_UNREADABLE);
                return;
            }
        }
    }
    let Some(bytes) = read_user::<u64>(head.p_alloc_parms + u64::from(layout.mem_size_offset))
    else {
        stat(stats::ARG_UNREADABLE);
        return;
    };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if RM_PROCS.get_ptr_mut(tgid).is_none() {
        let fresh = RmProcess {
            cgroup_id,
            // SAFETY: the helper has no preconditions.
            start_ns: unsafe { bpf_ktime_get_ns() },
            ..RmProcess::default()
        };
        let _ = RM_PROCS.insert(tgid, fresh, u64::from(BPF_NOEXIST));
    }
    let Some(process) = RM_PROCS.get_ptr_mut(tgid) else {
        stat(stats::TRACK_DROPPED);
        return;
    };
    // SAFETY: a live map value; start_ns is written once, at insertion.
    let start_ns = unsafe { (*process).start_ns };
    let key = RmObjectKey {
        tgid,
        h_root: head.h_root,
        h_object: head.h_object_new,
        reserved: 0,
    };
    if RM_OBJECTS
        .insert(key, RmObject { bytes, start_ns }, 0)
        .is_err()
    {
        stat(stats::TRACK_DROPPED);
        return;
    }
    // SAFETY: field pointers inside a live map value.
    unsafe {
        add(&raw mut (*process).live_bytes, bytes);
        add(&raw mut (*process).allocs, 1);
    }
    stat(stats::RM_ALLOC_TRACKED);
}

/// `NV_ESC_RM_FREE` (NVOS00) at `params`.
#[inline(always)]
pub fn rm_free(params: u64, size: u32) {
    if !config::rm_layout().enabled() || size as usize != core::mem::size_of::<FreeParams>() {
        return;
    }
    let Some(free) = read_user::<FreeParams>(params) else {
        stat(stats::ARG_UNREADABLE);
        return;
    };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(process) = RM_PROCS.get_ptr_mut(tgid) else {
        return;
    };
    if free.h_object_old == free.h_root {
        // The whole client goes, with everything it held.
        // SAFETY: field pointers inside a live map value.
        unsafe {
            core::ptr::write_volatile(&raw mut (*process).live_bytes, 0);
            add(&raw mut (*process).client_frees, 1);
        }
        return;
    }
    let key = RmObjectKey {
        tgid,
        h_root: free.h_root,
        h_object: free.h_object_old,
        reserved: 0,
    };
    // SAFETY: the value is copied out at once.
    let Some(object) = (unsafe { RM_OBJECTS.get(key) }).copied() else {
        return;
    };
    let _ = RM_OBJECTS.remove(key);
    // SAFETY: field pointers inside a live map value.
    unsafe {
        if object.start_ns != (*process).start_ns {
            return;
        }
        add(&raw mut (*process).live_bytes, object.bytes.wrapping_neg());
        add(&raw mut (*process).frees, 1);
    }
}
