//! The global the agent writes into the object before loading it.
//!
//! Rust eBPF programs cannot carry CO-RE relocations yet, so the agent reads
//! the struct offsets from the running kernel's BTF and passes them here,
//! together with the parameter layouts of the NVIDIA driver it found.

use crate::rm::RmLayout;

/// Byte offsets of the kernel struct members the programs walk to turn an
/// fd into a device number (`current->files->fdt->fd[fd]->f_inode->i_rdev`)
/// and to read the caller's ids.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.files`
    pub task_files: u32,
    /// `files_struct.fdt`
    pub files_fdt: u32,
    /// `fdtable.max_fds`
    pub fdtable_max_fds: u32,
    /// `fdtable.fd`
    pub fdtable_fd: u32,
    /// `file.f_inode`
    pub file_inode: u32,
    /// `inode.i_rdev`
    pub inode_rdev: u32,
    /// `task_struct.pid`
    pub task_pid: u32,
    /// `task_struct.tgid`
    pub task_tgid: u32,
    /// `task_struct.cgroups`: with the next three,
    /// `task->cgroups->dfl_cgrp->kn->id` is the cgroup v2 id that
    /// `bpf_get_current_cgroup_id` returns, read without a helper call.
    pub task_cgroups: u32,
    /// `css_set.dfl_cgrp`
    pub css_set_dfl_cgrp: u32,
    /// `cgroup.kn`
    pub cgroup_kn: u32,
    /// `kernfs_node.id`
    pub kernfs_node_id: u32,
    /// `task_struct.group_leader`
    pub task_group_leader: u32,
    /// `task_struct.start_time`
    pub task_start_time: u32,
}

/// The `TESSERA_CONFIG` global.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramConfig {
    /// Kernel struct offsets. The programs do nothing while
    /// `offsets.file_inode` is zero (the object was loaded unconfigured).
    pub offsets: KernelOffsets,
    /// Syscall number of ioctl on this architecture (raw tracepoint mode).
    pub ioctl_syscall_nr: u32,
    /// Offset of the `group_dead` field in the `sched/sched_process_exit`
    /// tracepoint record, 0 where the kernel's record has none (before
    /// 6.16): then a process counts as gone when its leader thread exits.
    pub exit_group_dead_offset: u32,
    /// Layouts of `NV_ESC_RM_ALLOC` for the node's driver version; all zero
    /// turns the memory estimate off.
    pub rm: RmLayout,
    /// What the `bpf_rdonly_cast` walk needs; read only by the programs
    /// that make that kfunc call ([`RDONLY_CAST_MARK`]).
    pub casts: CastConfig,
}

/// The kernel types the programs cast untyped pointers to with the
/// `bpf_rdonly_cast` kfunc (Linux 6.2+), after which every step of the
/// walk from the fd slot to `i_rdev` is a plain load that the verifier
/// types and the JIT makes fault-tolerant, instead of a
/// `bpf_probe_read_kernel` call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CastConfig {
    /// BTF id of `struct files_struct`: the fd slot at address `a` is read
    /// as `((struct files_struct *)(a - files_fd_array))->fd_array[0]`,
    /// which the verifier types as a `struct file *`.
    pub files_struct_id: u32,
    /// `files_struct.fd_array`.
    pub files_fd_array: u32,
    /// BTF id of `struct file` (the kprobe's untyped argument).
    pub file_id: u32,
}

/// The immediate of the programs' `bpf_rdonly_cast` kfunc calls in the
/// object: Rust eBPF cannot emit a kfunc relocation, so the programs spell
/// the call instruction out ([`kfunc_call`]) with this mark, and the agent
/// replaces it with the kfunc's id in the running kernel's BTF before
/// loading. The `*_probe` programs (`names`) make no such call: they read
/// with `bpf_probe_read_kernel`, for kernels without the kfunc.
pub const RDONLY_CAST_MARK: u32 = 0x7E55_CA57;

/// A BPF kfunc call instruction with immediate `imm` as the 8 bytes of the
/// object, little-endian (`BPF_JMP | BPF_CALL`, `src_reg`
/// `BPF_PSEUDO_KFUNC_CALL`, `off` 0: a vmlinux function).
pub const fn kfunc_call(imm: u32) -> u64 {
    0x85 | (2 << 12) | ((imm as u64) << 32)
}

impl ProgramConfig {
    /// The value compiled into the object.
    pub const UNSET: Self = Self {
        offsets: KernelOffsets {
            task_files: 0,
            files_fdt: 0,
            fdtable_max_fds: 0,
            fdtable_fd: 0,
            file_inode: 0,
            inode_rdev: 0,
            task_pid: 0,
            task_tgid: 0,
            task_cgroups: 0,
            css_set_dfl_cgrp: 0,
            cgroup_kn: 0,
            kernfs_node_id: 0,
            task_group_leader: 0,
            task_start_time: 0,
        },
        ioctl_syscall_nr: 0,
        exit_group_dead_offset: 0,
        rm: RmLayout::OFF,
        casts: CastConfig {
            files_struct_id: 0,
            files_fd_array: 0,
            file_id: 0,
        },
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<KernelOffsets>(), 56);
        assert_eq!(core::mem::size_of::<RmLayout>(), 20);
        assert_eq!(core::mem::size_of::<CastConfig>(), 12);
        assert_eq!(core::mem::size_of::<ProgramConfig>(), 96);
    }

    #[test]
    fn kfunc_call_is_the_documented_encoding() {
        // code 0x85, regs byte 0x20 (src 2, dst 0), off 0, imm.
        assert_eq!(
            kfunc_call(0x1234_5678).to_le_bytes(),
            [0x85, 0x20, 0, 0, 0x78, 0x56, 0x34, 0x12]
        );
    }
}
