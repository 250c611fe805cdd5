//! Which GPUs a cgroup's processes registered with UVM.
//!
//! `UVM_REGISTER_GPU` (raw command 37 on `/dev/nvidia-uvm`) is what the
//! CUDA driver issues when a process first creates a context on a GPU; its
//! parameters start with the GPU's 16-byte UUID (`uvm_ioctl.h`), so it is a
//! per-process "uses GPU X" signal that needs no driver state.

/// `UVM_REGISTER_GPU`.
pub const UVM_REGISTER_GPU: u32 = 37;
/// `UVM_UNREGISTER_GPU`.
pub const UVM_UNREGISTER_GPU: u32 = 38;

/// Key of `GPU_USE`: one GPU registered from one cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuUseKey {
    /// Cgroup v2 id of the registering process.
    pub cgroup_id: u64,
    /// The GPU's UUID, as the 16 raw bytes of `GPU-xxxxxxxx-...`.
    pub uuid: [u8; 16],
}

/// Value of `GPU_USE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuUse {
    /// `bpf_ktime_get_ns` of the first registration.
    pub first_ns: u64,
    /// Registrations seen (one per process and GPU, normally).
    pub registrations: u64,
    /// The first registering process.
    pub first_tgid: u32,
    /// Zero.
    pub reserved: u32,
}

/// Formats a raw GPU UUID the way NVML does (`GPU-` + 8-4-4-4-12 hex).
pub fn format_uuid(uuid: &[u8; 16], out: &mut [u8; 40]) -> usize {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out[..4].copy_from_slice(b"GPU-");
    let mut n = 4;
    for (i, byte) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out[n] = b'-';
            n += 1;
        }
        out[n] = HEX[usize::from(byte >> 4)];
        out[n + 1] = HEX[usize::from(byte & 0xF)];
        n += 2;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_implicit_padding() {
        assert_eq!(core::mem::size_of::<GpuUseKey>(), 24);
        assert_eq!(core::mem::size_of::<GpuUse>(), 24);
    }

    #[test]
    fn formats_like_nvml() {
        let uuid = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        let mut out = [0u8; 40];
        let n = format_uuid(&uuid, &mut out);
        assert_eq!(
            core::str::from_utf8(&out[..n]).unwrap(),
            "GPU-12345678-9abc-def0-0123-456789abcdef"
        );
    }
}
