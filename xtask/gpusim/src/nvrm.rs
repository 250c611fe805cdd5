//! NVIDIA kernel-driver ABI facts the simulator reproduces on its stand-in
//! devices: escape numbers, command encodings and parameter layouts
//! (open-gpu-kernel-modules `nv-ioctl-numbers.h`, `nv_escape.h`, `nvos.h`,
//! `uvm_ioctl.h`; see `shared/reference/ebpf.md`).
//!
//! Frontend escapes are encoded `_IOWR('F', nr, sizeof(params))`; UVM
//! commands are raw integers.

/// `NV_IOCTL_MAGIC`.
pub const NV_IOCTL_MAGIC: u8 = b'F';
/// `NV_ESC_CHECK_VERSION_STR`.
pub const NV_ESC_CHECK_VERSION_STR: u8 = 0xD2;
/// `NV_ESC_IOCTL_XFER_CMD`.
pub const NV_ESC_IOCTL_XFER_CMD: u8 = 0xD3;
/// `NV_ESC_RM_FREE`.
pub const NV_ESC_RM_FREE: u8 = 0x29;
/// `NV_ESC_RM_CONTROL`.
pub const NV_ESC_RM_CONTROL: u8 = 0x2A;
/// `NV_ESC_RM_ALLOC`.
pub const NV_ESC_RM_ALLOC: u8 = 0x2B;

/// `UVM_REGISTER_GPU`.
pub const UVM_REGISTER_GPU: u64 = 37;
/// `UVM_UNREGISTER_GPU`.
pub const UVM_UNREGISTER_GPU: u64 = 38;

/// `NV01_MEMORY_SYSTEM`: pinned host memory.
pub const NV01_MEMORY_SYSTEM: u32 = 0x3E;
/// `NV01_MEMORY_LOCAL_USER`: video memory.
pub const NV01_MEMORY_LOCAL_USER: u32 = 0x40;

/// `NV2080_CTRL_CMD_FB_GET_INFO_V2`: framebuffer (memory) information.
pub const NV2080_CTRL_CMD_FB_GET_INFO_V2: u32 = 0x2080_1303;
/// `NV2080_CTRL_CMD_GPU_GET_PIDS`: processes using the GPU.
pub const NV2080_CTRL_CMD_GPU_GET_PIDS: u32 = 0x2080_018d;
/// `NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2`: utilisation.
pub const NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2: u32 = 0x2080_2096;

/// First driver major whose NVOS21/NVOS64 carry `paramsSize` (535.43.02).
pub const PARAMS_SIZE_SINCE_MAJOR: u32 = 535;

/// `_IOWR('F', nr, size)`.
pub const fn iowr(nr: u8, size: usize) -> u64 {
    (3u64 << 30) | ((size as u64 & 0x3fff) << 16) | ((NV_IOCTL_MAGIC as u64) << 8) | nr as u64
}

/// `nv_ioctl_rm_api_version_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RmApiVersion {
    /// `NV_RM_API_VERSION_CMD_*`.
    pub cmd: u32,
    /// `NV_RM_API_VERSION_REPLY_*`.
    pub reply: u32,
    /// NUL-terminated driver version.
    pub version_string: [u8; 64],
}

/// `NV_RM_API_VERSION_CMD_STRICT`.
pub const NV_RM_API_VERSION_CMD_STRICT: u32 = 0;

/// `nv_ioctl_xfer_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Xfer {
    /// The wrapped escape's number (e.g. `NV_ESC_RM_ALLOC`).
    pub cmd: u32,
    /// Size of the wrapped parameters.
    pub size: u32,
    /// Pointer to them.
    pub ptr: u64,
}

/// `NVOS00_PARAMETERS` (RM_FREE).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos00 {
    /// Client.
    pub h_root: u32,
    /// Parent object.
    pub h_object_parent: u32,
    /// Object to free.
    pub h_object_old: u32,
    /// Out: status.
    pub status: u32,
}

/// `NVOS54_PARAMETERS` (RM_CONTROL).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos54 {
    /// Client.
    pub h_client: u32,
    /// Target object.
    pub h_object: u32,
    /// Control command.
    pub cmd: u32,
    /// Flags.
    pub flags: u32,
    /// Pointer to the command's parameters.
    pub params: u64,
    /// Their size.
    pub params_size: u32,
    /// Out: status.
    pub status: u32,
}

/// `NVOS64_PARAMETERS` as of driver 535 (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos64 {
    /// Client.
    pub h_root: u32,
    /// Parent object.
    pub h_object_parent: u32,
    /// New object's handle.
    pub h_object_new: u32,
    /// Class to allocate.
    pub h_class: u32,
    /// Pointer to the class's allocation parameters.
    pub p_alloc_parms: u64,
    /// Pointer to requested access rights.
    pub p_rights_requested: u64,
    /// Size of the allocation parameters.
    pub params_size: u32,
    /// Flags.
    pub flags: u32,
    /// Out: status.
    pub status: u32,
    /// Padding to 8.
    pub _pad: u32,
}

/// `NVOS64_PARAMETERS` before driver 535 (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvos64Legacy {
    /// Client.
    pub h_root: u32,
    /// Parent object.
    pub h_object_parent: u32,
    /// New object's handle.
    pub h_object_new: u32,
    /// Class to allocate.
    pub h_class: u32,
    /// Pointer to the class's allocation parameters.
    pub p_alloc_parms: u64,
    /// Pointer to requested access rights.
    pub p_rights_requested: u64,
    /// Out: status.
    pub status: u32,
    /// Padding to 8.
    pub _pad: u32,
}

/// `NV_MEMORY_ALLOCATION_PARAMS` (class 0x40 / 0x3E), fields up to
/// `hVASpace` at their driver offsets; the tail is kept zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryAllocationParams {
    /// Owner tag.
    pub owner: u32,
    /// Memory type.
    pub kind: u32,
    /// Flags.
    pub flags: u32,
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
    /// Pitch.
    pub pitch: i32,
    /// Attributes.
    pub attr: u32,
    /// More attributes.
    pub attr2: u32,
    /// Format.
    pub format: u32,
    /// Compression coverage.
    pub compr_covg: u32,
    /// Z-cull coverage.
    pub zcull_covg: u32,
    /// Padding.
    pub _pad0: u32,
    /// Range low.
    pub range_lo: u64,
    /// Range high.
    pub range_hi: u64,
    /// In/out: size in bytes (offset 64).
    pub size: u64,
    /// Alignment.
    pub alignment: u64,
    /// Offset.
    pub offset: u64,
    /// Limit.
    pub limit: u64,
    /// Address (offset 96).
    pub address: u64,
    /// Compression tag offset.
    pub ctag_offset: u32,
    /// VA space handle (offset 108).
    pub h_va_space: u32,
    /// Internal flags.
    pub internal_flags: u32,
    /// Tag.
    pub tag: u32,
    /// NUMA node (550+).
    pub numa_node: i32,
    /// Padding.
    pub _pad1: u32,
}

/// `UVM_REGISTER_GPU_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UvmRegisterGpu {
    /// GPU UUID bytes.
    pub gpu_uuid: [u8; 16],
    /// Out: NUMA enabled (NvBool).
    pub numa_enabled: u8,
    /// Padding.
    pub _pad: [u8; 3],
    /// Out: NUMA node.
    pub numa_node_id: i32,
    /// The nvidiactl fd the RM client lives on.
    pub rm_ctrl_fd: i32,
    /// RM client.
    pub h_client: u32,
    /// SMC partition reference (0 without MIG).
    pub h_smc_part_ref: u32,
    /// Out: status.
    pub rm_status: u32,
}

/// `UVM_UNREGISTER_GPU_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UvmUnregisterGpu {
    /// GPU UUID bytes.
    pub gpu_uuid: [u8; 16],
    /// Out: status.
    pub rm_status: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_driver() {
        assert_eq!(size_of::<RmApiVersion>(), 72);
        assert_eq!(size_of::<Xfer>(), 16);
        assert_eq!(size_of::<Nvos00>(), 16);
        assert_eq!(size_of::<Nvos54>(), 32);
        assert_eq!(size_of::<Nvos64>(), 48);
        assert_eq!(size_of::<Nvos64Legacy>(), 40);
        assert_eq!(std::mem::offset_of!(MemoryAllocationParams, size), 64);
        assert_eq!(std::mem::offset_of!(MemoryAllocationParams, address), 96);
        assert_eq!(
            std::mem::offset_of!(MemoryAllocationParams, h_va_space),
            108
        );
        assert_eq!(size_of::<UvmRegisterGpu>(), 40);
        assert_eq!(std::mem::offset_of!(UvmRegisterGpu, rm_ctrl_fd), 24);
    }

    #[test]
    fn commands_match_reference_encodings() {
        // shared/reference/ebpf.md, "Computed on x86_64".
        assert_eq!(iowr(NV_ESC_RM_ALLOC, size_of::<Nvos64>()), 0xC030_462B);
        assert_eq!(
            iowr(NV_ESC_RM_ALLOC, size_of::<Nvos64Legacy>()),
            0xC028_462B
        );
        assert_eq!(iowr(NV_ESC_RM_FREE, size_of::<Nvos00>()), 0xC010_4629);
        assert_eq!(iowr(NV_ESC_RM_CONTROL, size_of::<Nvos54>()), 0xC020_462A);
        assert_eq!(iowr(NV_ESC_IOCTL_XFER_CMD, size_of::<Xfer>()), 0xC010_46D3);
    }
}
