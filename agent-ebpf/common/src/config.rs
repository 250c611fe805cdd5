//! The global the agent writes into the object before loading it.
//!
//! Rust eBPF programs cannot carry CO-RE relocations yet, so the agent reads
//! the struct offsets from the running kernel's BTF and passes them here,
//! together with the parameter layouts of the NVIDIA driver it found.

use crate::rm::RmLayout;

/// Byte offsets of the kernel struct members the programs walk to turn an
/// fd into a device number: `current->files->fdt->fd[fd]->f_inode->i_rdev`.
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
        },
        ioctl_syscall_nr: 0,
        exit_group_dead_offset: 0,
        rm: RmLayout::OFF,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<KernelOffsets>(), 24);
        assert_eq!(core::mem::size_of::<RmLayout>(), 20);
        assert_eq!(core::mem::size_of::<ProgramConfig>(), 52);
    }
}
