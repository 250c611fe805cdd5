//! Walking kernel structs with offsets from the agent:
//! `current->files->fdt->fd[fd]->f_inode->i_rdev`.

use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};
use tessera_ebpf_common::config::KernelOffsets;

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
fn read<T>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel is fault-tolerant: any address is
    // allowed and an unreadable one returns an error.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }.ok()
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

/// `fdtable.max_fds` and `fdtable.fd`; one read when `fd` directly follows
/// `max_fds` and its padding, as in every kernel so far.
#[inline(always)]
fn fdtable(fdt: *const u8, off: &KernelOffsets) -> Option<(u32, *const u8)> {
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Head {
        max_fds: u32,
        pad: u32,
        fd: *const u8,
    }
    if off.fdtable_fd == off.fdtable_max_fds + 8 {
        let head: Head = read(fdt, off.fdtable_max_fds)?;
        return Some((head.max_fds, head.fd));
    }
    Some((read(fdt, off.fdtable_max_fds)?, read(fdt, off.fdtable_fd)?))
}

/// Device number of the current task's file descriptor `fd`.
#[inline(always)]
pub fn fd_rdev(fd: u32, off: &KernelOffsets) -> Option<u32> {
    // SAFETY: the helper has no preconditions.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let files: *const u8 = read(task, off.task_files)?;
    if files.is_null() {
        return None;
    }
    let fdt: *const u8 = read(files, off.files_fdt)?;
    if fdt.is_null() {
        return None;
    }
    let (max_fds, fds) = fdtable(fdt, off)?;
    if fd >= max_fds {
        return None;
    }
    if fds.is_null() {
        return None;
    }
    let slot = u32::try_from(core::mem::size_of::<usize>())
        .ok()?
        .checked_mul(fd)?;
    let file: *const u8 = read(fds, slot)?;
    file_rdev(file, off)
}
