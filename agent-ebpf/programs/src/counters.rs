//! Incrementing per-CPU counters.

use aya_ebpf::{bindings::BPF_NOEXIST, maps::PerCpuHashMap};

use crate::maps::OBS_STATS;
use tessera_ebpf_common::stats;

/// Adds one to `key` in `map`; counts a drop when the map is full.
#[inline(always)]
pub fn bump<K>(map: &PerCpuHashMap<K, u64>, key: &K) {
    if let Some(count) = map.get_ptr_mut(key) {
        // SAFETY: the pointer is this CPU's slot of a live element; the
        // program cannot migrate or be re-entered on this CPU meanwhile.
        unsafe { *count += 1 };
        return;
    }
    if map.insert(key, 1, u64::from(BPF_NOEXIST)).is_ok() {
        return;
    }
    // Another CPU may have inserted the key between lookup and insert.
    match map.get_ptr_mut(key) {
        // SAFETY: as above.
        Some(count) => unsafe { *count += 1 },
        None => stat(stats::COUNT_DROPPED),
    }
}

/// Adds one to the program counter `index` (one of `stats::*`).
#[inline(always)]
pub fn stat(index: u32) {
    if let Some(count) = OBS_STATS.get_ptr_mut(index) {
        // SAFETY: this CPU's slot of an array element that always exists.
        unsafe { *count += 1 };
    }
}

/// Adds `v` to the u64 at `p` with one BPF atomic add: the target has no
/// atomic read-modify-write in `core` (no CAS), so this is the instruction
/// itself.
///
/// # Safety
///
/// `p` points at an aligned u64 inside a live map value.
#[inline(always)]
pub unsafe fn add(p: *mut u64, v: u64) {
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
