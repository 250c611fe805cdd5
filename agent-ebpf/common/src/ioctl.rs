//! How an ioctl command on a watched device becomes the counted number.
//!
//! The NVIDIA frontend (`nvidiactl`, `nvidiaN`) reads only `_IOC_NR` and
//! `_IOC_SIZE` of the command, so the number counted is `_IOC_NR`; the type
//! byte is ignored by the driver and can't be trusted. Parameter blocks too
//! big for the size field go through [`NV_ESC_IOCTL_XFER_CMD`], whose
//! argument `nv_ioctl_xfer_t {u32 cmd; u32 size; u64 ptr}` names the real
//! escape, so that one is unwrapped. UVM uses plain integers as commands.
//!
//! Every number that can reach a map key is bounded, so a process cannot
//! fill the count map by inventing commands.

use crate::dev::decode;

/// `NV_ESC_IOCTL_XFER_CMD`: the escape that wraps large parameter blocks.
pub const NV_ESC_IOCTL_XFER_CMD: u32 = 0xD3;
/// Largest escape number (`_IOC_NR` is 8 bits).
pub const MAX_ESCAPE: u32 = 0xFF;
/// The number recorded when the real number is out of range or unreadable.
pub const NR_UNKNOWN: u32 = u32::MAX;

/// Flags in `keys::IoctlKey::flags`.
pub mod flags {
    /// The number is the escape carried by `NV_ESC_IOCTL_XFER_CMD`.
    pub const XFER: u32 = 1;
    /// The number is the whole command (UVM).
    pub const RAW: u32 = 1 << 1;
    /// The XFER argument could not be read; the number is `NR_UNKNOWN`.
    pub const UNREADABLE: u32 = 1 << 2;
    /// The command was out of the known range; the number is `NR_UNKNOWN`.
    pub const OUT_OF_RANGE: u32 = 1 << 3;
}

/// `_IOC_NR(cmd)`.
pub const fn ioc_nr(cmd: u32) -> u32 {
    cmd & 0xFF
}

/// `_IOC_SIZE(cmd)`: the size of the parameter block.
pub const fn ioc_size(cmd: u32) -> u32 {
    (cmd >> 16) & 0x3FFF
}

/// `nv_ioctl_xfer_t`, the argument of [`NV_ESC_IOCTL_XFER_CMD`]. `cmd` is
/// the bare escape number (the driver switches on it directly).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Xfer {
    /// The wrapped escape number.
    pub cmd: u32,
    /// Size of the wrapped parameter block.
    pub size: u32,
    /// User pointer to it.
    pub ptr: u64,
}

/// Whether a raw (UVM) command is in the range UVM defines: small
/// integers, plus `UVM_INITIALIZE`/`UVM_DEINITIALIZE` (0x3000_000x).
pub const fn raw_in_range(cmd: u32) -> bool {
    cmd <= 0xFFFF || (cmd & 0xFFFF_FF00) == 0x3000_0000
}

/// Decodes `cmd` for a device whose decoding is `how` (one of
/// `dev::decode`). `read_xfer_cmd` reads the `cmd` field of the XFER
/// argument; it is called only for an XFER ioctl on the NVIDIA frontend.
/// Returns the counted number and its flags.
#[inline(always)]
pub fn decode(how: u32, cmd: u32, read_xfer_cmd: impl FnOnce() -> Option<u32>) -> (u32, u32) {
    if how == decode::RAW {
        return if raw_in_range(cmd) {
            (cmd, flags::RAW)
        } else {
            (NR_UNKNOWN, flags::RAW | flags::OUT_OF_RANGE)
        };
    }
    let nr = ioc_nr(cmd);
    if how != decode::NV_FRONTEND || nr != NV_ESC_IOCTL_XFER_CMD {
        return (nr, 0);
    }
    match read_xfer_cmd() {
        Some(inner) if inner <= MAX_ESCAPE => (inner, flags::XFER),
        Some(_) => (NR_UNKNOWN, flags::XFER | flags::OUT_OF_RANGE),
        None => (NR_UNKNOWN, flags::XFER | flags::UNREADABLE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RM_ALLOC: u32 = 0xC030_462B;
    const XFER: u32 = 0xC010_46D3;

    #[test]
    fn frontend_counts_ioc_nr_whatever_the_type_byte() {
        assert_eq!(decode(decode::NV_FRONTEND, RM_ALLOC, || None), (0x2B, 0));
        // The driver ignores the type byte; so does the decoder.
        assert_eq!(decode(decode::NV_FRONTEND, 0xC030_002B, || None), (0x2B, 0));
    }

    #[test]
    fn frontend_unwraps_xfer() {
        assert_eq!(
            decode(decode::NV_FRONTEND, XFER, || Some(0x2A)),
            (0x2A, flags::XFER)
        );
        assert_eq!(
            decode(decode::NV_FRONTEND, XFER, || None),
            (NR_UNKNOWN, flags::XFER | flags::UNREADABLE)
        );
        assert_eq!(
            decode(decode::NV_FRONTEND, XFER, || Some(0x1_2B)),
            (NR_UNKNOWN, flags::XFER | flags::OUT_OF_RANGE)
        );
    }

    #[test]
    fn size_comes_from_the_command() {
        assert_eq!(ioc_size(RM_ALLOC), 48);
        assert_eq!(ioc_size(XFER), 16);
        assert_eq!(ioc_size(0xC020_462B), 32);
        assert_eq!(core::mem::size_of::<Xfer>(), 16);
    }

    #[test]
    fn plain_ioc_nr_does_not_read_xfer() {
        let read = || -> Option<u32> { panic!("must not read the argument") };
        assert_eq!(decode(decode::IOC_NR, XFER, read), (0xD3, 0));
    }

    #[test]
    fn raw_keeps_uvm_commands_and_bounds_the_rest() {
        assert_eq!(decode(decode::RAW, 37, || None), (37, flags::RAW));
        assert_eq!(
            decode(decode::RAW, 0x3000_0001, || None),
            (0x3000_0001, flags::RAW)
        );
        assert_eq!(
            decode(decode::RAW, 0xDEAD_BEEF, || None),
            (NR_UNKNOWN, flags::RAW | flags::OUT_OF_RANGE)
        );
    }
}
