//! The `TESSERA_CONFIG` global, written by the agent before loading.

use tessera_ebpf_common::config::{KernelOffsets, ProgramConfig};

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
