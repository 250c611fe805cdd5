//! Walking kernel structs with offsets from the agent:
//! `current->files->fdt->fd[fd]->f_inode->i_rdev`.
//!
//! The first part, `current->files->fdt->{max_fds, fd}`, is plain loads
//! from BTF-typed pointers (`bpf_get_current_task_btf`): the verifier
//! checks them against the kernel's BTF (the offsets are constants to it,
//! read from the frozen `TESSERA_CONFIG`) and the JIT makes them
//! fault-tolerant, at the cost of a load each. The fd array holds
//! untyped pointers; two walks go on from there ([`Walk`]):
//!
//! - [`Cast`]: the `bpf_rdonly_cast` kfunc (6.2+, which the verifier
//!   replaces by a register move) types the fd slot's address as a
//!   `struct files_struct` whose `fd_array[0]` is the slot, so the slot,
//!   `file->f_inode` and `inode->i_rdev` are plain loads too (untrusted
//!   BTF pointers: fault-tolerant, read-only);
//! - [`Probe`]: each of those three is a `bpf_probe_read_kernel` call
//!   (about 40 ns each on the test VM), for kernels without the kfunc.

use aya_ebpf::helpers::{self, bpf_probe_read_kernel, generated::bpf_get_current_task_btf};
use tessera_ebpf_common::config::{CastConfig, KernelOffsets, RDONLY_CAST_MARK, kfunc_call};

/// Reads a `T` at `base + offset` in kernel memory with a helper call.
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
/// `base` derives, by such loads only, from `bpf_get_current_task_btf` or
/// [`rdonly_cast`], and `offset` is a member offset from the kernel's BTF
/// that the verifier sees as a constant (the frozen `TESSERA_CONFIG`). The
/// verifier then checks the access against the member's type and the JIT
/// makes it fault-tolerant (`BPF_PROBE_MEM`); an offset that is not a
/// member makes the program fail to load, never a wild read.
#[inline(always)]
unsafe fn load<T>(base: *const u8, offset: u32) -> T {
    // SAFETY: the caller's contract.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) }
}

/// `bpf_rdonly_cast(addr, btf_id)`: `addr` as a read-only, untrusted
/// pointer to the kernel type `btf_id`. The call instruction is spelt out
/// with [`RDONLY_CAST_MARK`], which the agent replaces with the kfunc's
/// BTF id; `btf_id` must be a constant to the verifier (it comes from the
/// frozen `TESSERA_CONFIG`).
///
/// # Safety
///
/// None for memory: loads through the result are checked by the verifier
/// against the type and made fault-tolerant by the JIT. Calls clobber
/// r1–r5, as declared.
#[inline(always)]
unsafe fn rdonly_cast(addr: u64, btf_id: u32) -> *const u8 {
    let out: u64;
    // SAFETY: one kfunc call instruction with the BPF calling convention:
    // arguments in r1 and r2, result in r0, r1–r5 clobbered, no stack.
    unsafe {
        core::arch::asm!(
            ".quad {insn}",
            insn = const kfunc_call(RDONLY_CAST_MARK),
            in("r1") addr,
            in("r2") u64::from(btf_id),
            lateout("r0") out,
            lateout("r1") _,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
            options(nostack),
        )
    };
    out as *const u8
}

/// How the walk reads what lies past the fd array.
pub trait Walk {
    /// The `struct file *` in the fd slot at `slot`, `None` if empty or
    /// unreadable.
    fn fd_slot(slot: u64, casts: &CastConfig) -> Option<*const u8>;
    /// `file` (as [`Walk::fd_slot`] returned it) typed for
    /// [`Walk::file_rdev`]; the kprobe's argument is an untyped pointer.
    fn file(file: *const u8, casts: &CastConfig) -> *const u8;
    /// Device number (`i_rdev`) of `file`, 0 for a non-device inode.
    fn file_rdev(file: *const u8, off: &KernelOffsets) -> Option<u32>;
}

/// Plain loads after `bpf_rdonly_cast`.
pub struct Cast;

impl Walk for Cast {
    #[inline(always)]
    fn fd_slot(slot: u64, casts: &CastConfig) -> Option<*const u8> {
        let base = slot.wrapping_sub(u64::from(casts.files_fd_array));
        // SAFETY: loads through the cast pointer are typed and
        // fault-tolerant (see `rdonly_cast`).
        let files = unsafe { rdonly_cast(base, casts.files_struct_id) };
        // SAFETY: `files` is a BTF-typed pointer from `rdonly_cast`;
        // `fd_array[0]` of it is the slot; `load`'s contract.
        let file: *const u8 = unsafe { load(files, casts.files_fd_array) };
        (!file.is_null()).then_some(file)
    }

    #[inline(always)]
    fn file(file: *const u8, casts: &CastConfig) -> *const u8 {
        // SAFETY: as in `fd_slot`.
        unsafe { rdonly_cast(file as u64, casts.file_id) }
    }

    #[inline(always)]
    fn file_rdev(file: *const u8, off: &KernelOffsets) -> Option<u32> {
        if file.is_null() {
            return None;
        }
        // SAFETY: `file` is a typed `struct file *` (`fd_slot`, `file`);
        // `load`'s contract.
        let inode: *const u8 = unsafe { load(file, off.file_inode) };
        if inode.is_null() {
            return None;
        }
        // SAFETY: as above, `inode` came from such a load.
        Some(unsafe { load(inode, off.inode_rdev) })
    }
}

/// `bpf_probe_read_kernel` calls.
pub struct Probe;

impl Walk for Probe {
    #[inline(always)]
    fn fd_slot(slot: u64, _casts: &CastConfig) -> Option<*const u8> {
        let file: *const u8 = read(slot as *const u8, 0)?;
        (!file.is_null()).then_some(file)
    }

    #[inline(always)]
    fn file(file: *const u8, _casts: &CastConfig) -> *const u8 {
        file
    }

    #[inline(always)]
    fn file_rdev(file: *const u8, off: &KernelOffsets) -> Option<u32> {
        if file.is_null() {
            return None;
        }
        let inode: *const u8 = read(file, off.file_inode)?;
        if inode.is_null() {
            return None;
        }
        read(inode, off.inode_rdev)
    }
}

/// The current task, BTF-typed: the one helper call of the walk.
#[inline(always)]
pub fn current() -> *const u8 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_get_current_task_btf() as *const u8 }
}

/// `bpf_get_current_cgroup_id()` of `task` ([`current`]) without the
/// helper call: `task->cgroups->dfl_cgrp->kn->id`, plain loads. The
/// programs run with preemption disabled, an RCU read-side section, so
/// the css_set read is live (the helper reads it so too).
#[inline(always)]
pub fn cgroup_id(task: *const u8, off: &KernelOffsets) -> u64 {
    // SAFETY: `task` is the BTF-typed current task, each pointer below
    // came from such a load; `load`'s contract.
    unsafe {
        let cset: *const u8 = load(task, off.task_cgroups);
        if cset.is_null() {
            return helpers::bpf_get_current_cgroup_id();
        }
        let cgroup: *const u8 = load(cset, off.css_set_dfl_cgrp);
        if cgroup.is_null() {
            return helpers::bpf_get_current_cgroup_id();
        }
        let kn: *const u8 = load(cgroup, off.cgroup_kn);
        if kn.is_null() {
            return helpers::bpf_get_current_cgroup_id();
        }
        load(kn, off.kernfs_node_id)
    }
}

/// `bpf_get_current_pid_tgid()` of `task` ([`current`]) without the
/// helper call: tgid in the high half, thread id in the low.
#[inline(always)]
pub fn pid_tgid(task: *const u8, off: &KernelOffsets) -> u64 {
    // SAFETY: as in `cgroup_id`.
    let (pid, tgid): (u32, u32) = unsafe { (load(task, off.task_pid), load(task, off.task_tgid)) };
    (u64::from(tgid) << 32) | u64::from(pid)
}

/// The start time of `task`'s ([`current`]) process: its leader thread's
/// `start_time`, which tells a process from a later one with its tgid.
#[inline(always)]
pub fn process_start(task: *const u8, off: &KernelOffsets) -> u64 {
    // SAFETY: as in `cgroup_id`.
    unsafe {
        let leader: *const u8 = load(task, off.task_group_leader);
        if leader.is_null() {
            return 0;
        }
        load(leader, off.task_start_time)
    }
}

/// Device number of file descriptor `fd` of `task` ([`current`]), `None`
/// if it is not open; 0 for a file that is not a device.
#[inline(always)]
pub fn fd_rdev<W: Walk>(
    task: *const u8,
    fd: u32,
    off: &KernelOffsets,
    casts: &CastConfig,
) -> Option<u32> {
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
    let slot = (fds as u64).wrapping_add(u64::from(fd) * 8);
    let file = W::fd_slot(slot, casts)?;
    W::file_rdev(file, off)
}
