//! The `TESSERA_CONFIG` global, written by the agent before loading.

use tessera_ebpf_common::{
    config::{CastConfig, KernelOffsets, ProgramConfig},
    rm::RmLayout,
};

/// Overridden by the agent (`EbpfLoader::override_global`).
#[unsafe(no_mangle)]
static TESSERA_CONFIG: ProgramConfig = ProgramConfig::UNSET;

/// The kernel struct offsets, or `None` while the object is unconfigured.
#[inline(always)]
pub fn offsets() -> Option<KernelOffsets> {
    // SAFETY: a read of a live static; volatile so the compiler does not
    // fold the compiled-in value, which the loader replaces.
    let offsets = unsafe { core::ptr::read_volatile(&raw const TESSERA_CONFIG.offsets) };
    (offsets.file_inode != 0).then_some(offsets)
}

/// ioctl's syscall number on this architecture.
#[inline(always)]
pub fn ioctl_syscall_nr() -> u32 {
    // SAFETY: as in `offsets`.
    unsafe { core::ptr::read_volatile(&raw const TESSERA_CONFIG.ioctl_syscall_nr) }
}

/// Offset of `group_dead` in the process-exit record, 0 if absent.
#[inline(always)]
pub fn exit_group_dead_offset() -> u32 {
    // SAFETY: as in `offsets`.
    unsafe { core::ptr::read_volatile(&raw const TESSERA_CONFIG.exit_group_dead_offset) }
}

/// The driver's RM_ALLOC layouts.
#[inline(always)]
pub fn rm_layout() -> RmLayout {
    // SAFETY: as in `offsets`.
    unsafe { core::ptr::read_volatile(&raw const TESSERA_CONFIG.rm) }
}

/// What the `bpf_rdonly_cast` walk needs.
#[inline(always)]
pub fn casts() -> CastConfig {
    // SAFETY: as in `offsets`.
    unsafe { core::ptr::read_volatile(&raw const TESSERA_CONFIG.casts) }
}
