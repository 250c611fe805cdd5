//! Walking kernel structs with offsets from the agent:
//! `current->files->fdt->fd[fd]->f_inode->i_rdev`.
//!
//! The first part, `current->files->fdt->{max_fds, fd}`, is plain loads
//! from BTF-typed pointers (`bpf_get_current_task_btf`): the verifier
//! checks them against the kernel's BTF (the offsets are constants to it,
//! read from the frozen `TESSERA_CONFIG`) and the JIT makes them
//! fault-tolerant, at the cost of a load each. The fd array holds
//! untyped pointers, so from the fd slot on each step is a
//! `bpf_probe_read_kernel` helper call.

use aya_ebpf::helpers::{bpf_probe_read_kernel, generated::bpf_get_current_task_btf};
use tessera_ebpf_common::config::KernelOffsets;

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
fn read<T>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel is fault-tolerant: any address is
    // allowed and an unreadable one returns an error.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }.ok()
}

/// A plain load of a `T` at `base + offset`, where `base` is a pointer the
/// verifier knows the BTF type of.
///
/// # Safety
///
/// `base` derives, by such loads only, from `bpf_get_current_task_btf`, and
/// `offset` is a member offset from the kernel's BTF that the verifier sees
/// as a constant (the frozen `TESSERA_CONFIG`). The verifier then checks
/// the access against the member's type and the JIT makes it
/// fault-tolerant (`BPF_PROBE_MEM`); an offset that is not a member makes
/// the program fail to load, never a wild read.
#[inline(always)]
unsafe fn load<T>(base: *const u8, offset: u32) -> T {
    // SAFETY: the caller's contract.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) }
}

/// Device number (`i_rdev`) of an open file, 0 for a non-device inode.
#[inline(always)]
pub fn file_rdev(file: *const u8, off: &KernelOffsets) -> Option<u32> {
    if file.is_null() {
        return None;
    }
    let inode: *const u8 = read(file, off.file_inode)?;
    if inode.is_null() {
        return None;
    }
    read(inode, off.inode_rdev)
}

/// The `struct file` of the current task's file descriptor `fd`, `None`
/// if it is not open.
#[inline(always)]
pub fn fd_file(fd: u32, off: &KernelOffsets) -> Option<*const u8> {
    // SAFETY: the helper has no preconditions.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    // SAFETY: `task` is the BTF-typed current task; `load`'s contract.
    let files: *const u8 = unsafe { load(task, off.task_files) };
    if files.is_null() {
        return None;
    }
    // SAFETY: as above, `files` came from such a load.
    let fdt: *const u8 = unsafe { load(files, off.files_fdt) };
    if fdt.is_null() {
        return None;
    }
    // SAFETY: as above.
    let max_fds: u32 = unsafe { load(fdt, off.fdtable_max_fds) };
    if fd >= max_fds {
        return None;
    }
    // SAFETY: as above.
    let fds: *const u8 = unsafe { load(fdt, off.fdtable_fd) };
    if fds.is_null() {
        return None;
    }
    let slot = u32::try_from(core::mem::size_of::<usize>())
        .ok()?
        .checked_mul(fd)?;
    let file: *const u8 = read(fds, slot)?;
    (!file.is_null()).then_some(file)
}
