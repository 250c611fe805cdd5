//! What some NVIDIA ioctls carry: the GPU a process registers with UVM
//! (`UVM_REGISTER_GPU`) and the video memory it allocates and frees
//! (`NV_ESC_RM_ALLOC` of class 0x40, `NV_ESC_RM_FREE` on nvidiactl). The
//! memory figure is the size requested at entry: an estimate (see
//! `tessera_ebpf_common::rm`).

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::{bpf_get_current_pid_tgid, generated::bpf_ktime_get_ns},
};
use tessera_ebpf_common::{
    rm::{AllocHead, FreeParams, RmClient, RmClientKey, RmObject, RmObjectKey, RmProcess},
    stats,
    uvm::{GpuUse, GpuUseKey},
};

use crate::{
    config,
    counters::{add, stat},
    maps::{GPU_USE, RM_CLIENTS, RM_OBJECTS, RM_PROCS},
    user::read_user,
};

/// `EEXIST`: what an insert with `BPF_NOEXIST` of an existing key returns
/// (negated).
const EEXIST: i32 = 17;

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

/// The estimate of process `tgid`, created at its first tracked allocation.
#[inline(always)]
fn process(tgid: u32, cgroup_id: u64) -> Option<*mut RmProcess> {
    if let Some(p) = RM_PROCS.get_ptr_mut(tgid) {
        return Some(p);
    }
    let fresh = RmProcess {
        cgroup_id,
        // SAFETY: the helper has no preconditions.
        start_ns: unsafe { bpf_ktime_get_ns() },
        ..RmProcess::default()
    };
    // Another thread may have inserted it meanwhile; either way it exists.
    let _ = RM_PROCS.insert(tgid, fresh, u64::from(BPF_NOEXIST));
    RM_PROCS.get_ptr_mut(tgid)
}

/// Client `key` of the process started at `proc_ns`, if it is known.
#[inline(always)]
fn live_client(key: &RmClientKey, proc_ns: u64) -> Option<*mut RmClient> {
    let client = RM_CLIENTS.get_ptr_mut(key)?;
    // SAFETY: a live map value; proc_ns is written once, at insertion.
    (unsafe { (*client).proc_ns } == proc_ns).then_some(client)
}

/// Client `key` of the process started at `proc_ns`, created at its first
/// tracked allocation (replacing one an earlier process with the same
/// tgid left).
#[inline(always)]
fn client(key: &RmClientKey, proc_ns: u64) -> Option<*mut RmClient> {
    if let Some(client) = live_client(key, proc_ns) {
        return Some(client);
    }
    let fresh = RmClient {
        proc_ns,
        // SAFETY: the helper has no preconditions.
        since_ns: unsafe { bpf_ktime_get_ns() },
        bytes: 0,
    };
    // Absent: only one of racing threads creates it. Left by an earlier
    // process: replaced.
    let flags = if RM_CLIENTS.get_ptr(key).is_some() {
        BPF_ANY
    } else {
        BPF_NOEXIST
    };
    let _ = RM_CLIENTS.insert(key, fresh, u64::from(flags));
    live_client(key, proc_ns)
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
    let Some(process) = process(tgid, cgroup_id) else {
        stat(stats::TRACK_DROPPED);
        return;
    };
    // SAFETY: a live map value; start_ns is written once, at insertion.
    let proc_ns = unsafe { (*process).start_ns };
    let client_key = RmClientKey {
        tgid,
        h_root: head.h_root,
    };
    let Some(client) = client(&client_key, proc_ns) else {
        stat(stats::TRACK_DROPPED);
        return;
    };
    // SAFETY: as above, since_ns is written once.
    let client_ns = unsafe { (*client).since_ns };
    let key = RmObjectKey {
        tgid,
        h_root: head.h_root,
        h_object: head.h_object_new,
        reserved: 0,
    };
    // SAFETY: the value is copied out at once.
    let flags = match unsafe { RM_OBJECTS.get(key) }.map(|o| o.client_ns) {
        // The handle is live in this client: the driver refuses to
        // allocate it again, so this does not count.
        Some(ns) if ns == client_ns => return,
        // Left by a freed client or an earlier process: replaced.
        Some(_) => BPF_ANY,
        None => BPF_NOEXIST,
    };
    match RM_OBJECTS.insert(key, RmObject { bytes, client_ns }, u64::from(flags)) {
        Ok(()) => {}
        // A racing thread allocated the same handle: counted once.
        Err(e) if e == -EEXIST => return,
        Err(_) => {
            stat(stats::TRACK_DROPPED);
            return;
        }
    }
    // SAFETY: field pointers inside live map values.
    unsafe {
        add(&raw mut (*client).bytes, bytes);
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
    // SAFETY: a live map value; start_ns is written once, at insertion.
    let proc_ns = unsafe { (*process).start_ns };
    let client_key = RmClientKey {
        tgid,
        h_root: free.h_root,
    };
    let client = live_client(&client_key, proc_ns);
    if free.h_object_old == free.h_root {
        // The whole client goes, with everything it held; the process's
        // other clients (NVML's besides CUDA's) keep theirs.
        // SAFETY: field pointers inside live map values; the client's
        // bytes are read before its entry is removed.
        unsafe {
            add(&raw mut (*process).client_frees, 1);
            if let Some(client) = client {
                let bytes = core::ptr::read_volatile(&raw const (*client).bytes);
                let _ = RM_CLIENTS.remove(client_key);
                add(&raw mut (*process).live_bytes, bytes.wrapping_neg());
            }
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
    let Some(client) = client else {
        return;
    };
    // SAFETY: field pointers inside live map values.
    unsafe {
        if object.client_ns != (*client).since_ns {
            return;
        }
        let minus = object.bytes.wrapping_neg();
        add(&raw mut (*client).bytes, minus);
        add(&raw mut (*process).live_bytes, minus);
        add(&raw mut (*process).frees, 1);
    }
}
