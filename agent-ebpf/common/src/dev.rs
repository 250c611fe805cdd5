//! Device numbers as the kernel stores them (`dev_t` in `inode.i_rdev`),
//! and the value the agent stores for each watched device.

/// Bits of the minor number in a kernel `dev_t` (`MINORBITS`).
pub const MINOR_BITS: u32 = 20;
/// Mask of the minor number in a kernel `dev_t`.
pub const MINOR_MASK: u32 = (1 << MINOR_BITS) - 1;

/// Kernel `dev_t` of `major:minor` (`MKDEV`); the key of the watched map.
pub const fn kdev(major: u32, minor: u32) -> u32 {
    (major << MINOR_BITS) | (minor & MINOR_MASK)
}

/// Major number of a kernel `dev_t`.
pub const fn kdev_major(dev: u32) -> u32 {
    dev >> MINOR_BITS
}

/// Minor number of a kernel `dev_t`.
pub const fn kdev_minor(dev: u32) -> u32 {
    dev & MINOR_MASK
}

/// What a watched device is, for the agent's reports.
pub mod class {
    /// `/dev/nvidiactl` (195:255).
    pub const CONTROL: u32 = 1;
    /// `/dev/nvidiaN` (195:N).
    pub const GPU: u32 = 2;
    /// `/dev/nvidia-modeset` (195:254).
    pub const MODESET: u32 = 3;
    /// `/dev/nvidia-uvm`.
    pub const UVM: u32 = 4;
    /// `/dev/nvidia-uvm-tools`.
    pub const UVM_TOOLS: u32 = 5;
    /// `/dev/nvidia-caps/*` (MIG and system capabilities).
    pub const CAPS: u32 = 6;
    /// A stand-in device named in configuration (tests, simulator).
    pub const STAND_IN: u32 = 7;
}

/// How the programs turn an ioctl command into the counted number.
pub mod decode {
    /// NVIDIA frontend: `_IOC_NR(cmd)`, and `NV_ESC_IOCTL_XFER_CMD` is
    /// unwrapped to the escape it carries.
    pub const NV_FRONTEND: u32 = 0;
    /// The whole command, as UVM uses plain integers.
    pub const RAW: u32 = 1;
    /// `_IOC_NR(cmd)` only.
    pub const IOC_NR: u32 = 2;
}

/// Value of the watched-devices map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchedDevice {
    /// One of [`class`].
    pub class: u32,
    /// One of [`decode`].
    pub decode: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kdev_round_trips() {
        let dev = kdev(195, 255);
        assert_eq!(dev, 0x0c30_00ff);
        assert_eq!((kdev_major(dev), kdev_minor(dev)), (195, 255));
        assert_eq!(kdev(1, 3), (1 << 20) | 3);
        assert_eq!(kdev_minor(kdev(511, 0x1_2345)), 0x1_2345);
    }

    #[test]
    fn watched_device_has_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<WatchedDevice>(), 8);
    }
}
