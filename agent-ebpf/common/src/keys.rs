//! Keys of the count maps. Padding is spelled out so every byte of a key is
//! initialised (the verifier requires it, and equal keys must hash equal).

/// Key of `IOCTL_COUNTS`: one ioctl number on one device from one cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IoctlKey {
    /// Cgroup v2 id of the caller (`bpf_get_current_cgroup_id`), which is
    /// the inode number of its cgroup directory.
    pub cgroup_id: u64,
    /// Kernel `dev_t` of the device (see `dev::kdev`).
    pub dev: u32,
    /// The counted number (see `ioctl::decode`).
    pub nr: u32,
    /// `ioctl::flags`.
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
}

/// Key of `OPEN_COUNTS`: access checks of one device from one cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpenKey {
    /// Cgroup v2 id of the caller.
    pub cgroup_id: u64,
    /// Kernel `dev_t` of the device.
    pub dev: u32,
    /// Requested access, `access::*` bits.
    pub access: u32,
}

/// Access bits of [`OpenKey::access`] (`BPF_DEVCG_ACC_*`).
pub mod access {
    /// mknod.
    pub const MKNOD: u32 = 1;
    /// Read (open for reading).
    pub const READ: u32 = 2;
    /// Write (open for writing).
    pub const WRITE: u32 = 4;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<IoctlKey>(), 24);
        assert_eq!(core::mem::size_of::<OpenKey>(), 16);
    }
}
