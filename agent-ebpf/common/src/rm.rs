//! Estimating video memory from `NV_ESC_RM_ALLOC` / `NV_ESC_RM_FREE` on
//! `nvidiactl` (see `reference/ebpf.md` §2).
//!
//! RM_ALLOC's parameter block is `NVOS21` or `NVOS64`, told apart by size
//! (the driver accepts exactly those two sizes); both start with
//! `hRoot@0, hObjectParent@4, hObjectNew@8, hClass@12, pAllocParms@16`.
//! For class `NV01_MEMORY_LOCAL_USER` (0x40) `pAllocParms` points at
//! `NV_MEMORY_ALLOCATION_PARAMS`, whose `size` (u64) sits at offset 64 in
//! every driver from 515 to 595. The sizes changed in 535 (`paramsSize`
//! was added; NVOS64 grew from 40 to 48 bytes and gained `flags`, whose
//! `FINN_SERIALIZED` bit means the parameters are not a plain struct).
//!
//! What is recorded is the size *requested* at the ioctl's entry: the
//! programs do not look at the result, so a refused allocation still
//! counts, and the driver may round the size up. It is an estimate; NVML
//! is the authority on how much memory a process holds.

/// `NV_ESC_RM_ALLOC`.
pub const NV_ESC_RM_ALLOC: u32 = 0x2B;
/// `NV_ESC_RM_FREE`.
pub const NV_ESC_RM_FREE: u32 = 0x29;
/// `NV_ESC_RM_CONTROL`: not decoded, but the most frequent escape.
pub const NV_ESC_RM_CONTROL: u32 = 0x2A;
/// `NV01_MEMORY_LOCAL_USER`: video memory.
pub const NV01_MEMORY_LOCAL_USER: u32 = 0x40;
/// `NVOS64_FLAGS_FINN_SERIALIZED`.
pub const NVOS64_FLAGS_FINN_SERIALIZED: u32 = 1;
/// Bytes of the common head of NVOS21 and NVOS64 the programs read.
pub const ALLOC_HEAD_SIZE: u32 = 24;
/// First driver major with `paramsSize` in NVOS21/NVOS64 (535.43.02).
pub const PARAMS_SIZE_SINCE_MAJOR: u32 = 535;

/// Parameter layouts of one driver version, passed in `TESSERA_CONFIG`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmLayout {
    /// `sizeof(NVOS21_PARAMETERS)`.
    pub nvos21_size: u32,
    /// `sizeof(NVOS64_PARAMETERS)`.
    pub nvos64_size: u32,
    /// Offset of `NVOS64_PARAMETERS.flags`, 0 where it has none.
    pub nvos64_flags_offset: u32,
    /// The video-memory class whose size is read.
    pub mem_class: u32,
    /// Offset of `size` in `NV_MEMORY_ALLOCATION_PARAMS`.
    pub mem_size_offset: u32,
}

impl RmLayout {
    /// Memory estimates off.
    pub const OFF: Self = Self {
        nvos21_size: 0,
        nvos64_size: 0,
        nvos64_flags_offset: 0,
        mem_class: 0,
        mem_size_offset: 0,
    };

    /// The layouts of driver major version `major` (515 and later; older
    /// drivers get the pre-535 layout, which is what they have as far back
    /// as 515.43.04, the oldest checked).
    pub const fn for_driver_major(major: u32) -> Self {
        if major >= PARAMS_SIZE_SINCE_MAJOR {
            Self {
                nvos21_size: 32,
                nvos64_size: 48,
                nvos64_flags_offset: 36,
                mem_class: NV01_MEMORY_LOCAL_USER,
                mem_size_offset: 64,
            }
        } else {
            Self {
                nvos21_size: 32,
                nvos64_size: 40,
                nvos64_flags_offset: 0,
                mem_class: NV01_MEMORY_LOCAL_USER,
                mem_size_offset: 64,
            }
        }
    }

    /// Whether the estimate is on.
    pub const fn enabled(&self) -> bool {
        self.mem_size_offset != 0
    }

    /// Whether a parameter block of `size` bytes is an RM_ALLOC this driver
    /// accepts; `Some(true)` for NVOS64 (which may carry flags).
    pub const fn alloc_kind(&self, size: u32) -> Option<bool> {
        if !self.enabled() || size == 0 {
            None
        } else if size == self.nvos64_size {
            Some(true)
        } else if size == self.nvos21_size {
            Some(false)
        } else {
            None
        }
    }
}

/// The common head of `NVOS21_PARAMETERS` and `NVOS64_PARAMETERS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocHead {
    /// Client handle.
    pub h_root: u32,
    /// Parent object.
    pub h_object_parent: u32,
    /// The new object's handle (chosen by the caller for memory).
    pub h_object_new: u32,
    /// Class to allocate.
    pub h_class: u32,
    /// User pointer to the class's parameters.
    pub p_alloc_parms: u64,
}

/// `NVOS00_PARAMETERS` (RM_FREE).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeParams {
    /// Client handle.
    pub h_root: u32,
    /// Parent object.
    pub h_object_parent: u32,
    /// Object to free; the client itself when equal to `h_root`.
    pub h_object_old: u32,
    /// Out: status.
    pub status: u32,
}

/// Key of `RM_OBJECTS`: one memory object of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RmObjectKey {
    /// Process (thread group) id.
    pub tgid: u32,
    /// Client handle.
    pub h_root: u32,
    /// Object handle.
    pub h_object: u32,
    /// Zero.
    pub reserved: u32,
}

/// Value of `RM_OBJECTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmObject {
    /// Requested bytes.
    pub bytes: u64,
    /// [`RmClient::since_ns`] of the client that allocated it, so a free
    /// after its client was freed (and the handle reused), or by a later
    /// process that reuses the tgid, does not match it.
    pub client_ns: u64,
}

/// Key of `RM_CLIENTS`: one RM client (`hRoot`) of one process. A process
/// can hold several: NVML opens its own besides CUDA's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RmClientKey {
    /// Process (thread group) id.
    pub tgid: u32,
    /// Client handle.
    pub h_root: u32,
}

/// Value of `RM_CLIENTS`: the video memory one client holds. Created at
/// the client's first tracked allocation; freeing the client subtracts
/// its bytes from its process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmClient {
    /// [`RmProcess::start_ns`] of its process (a client left by an earlier
    /// process with the same tgid does not match).
    pub proc_ns: u64,
    /// `bpf_ktime_get_ns` at its creation: tells this client from an
    /// earlier one with the same handle.
    pub since_ns: u64,
    /// Requested bytes of its live video-memory objects (wrapping).
    pub bytes: u64,
}

/// Value of `RM_PROCS` (key: tgid): one process's estimate. Updated with
/// atomic adds by concurrent threads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmProcess {
    /// Cgroup v2 id of the process at its first allocation.
    pub cgroup_id: u64,
    /// `bpf_ktime_get_ns` of its first allocation (identifies the process
    /// across tgid reuse).
    pub start_ns: u64,
    /// Requested bytes of its live video-memory objects (wrapping; read as
    /// `i64` and clamp at zero).
    pub live_bytes: u64,
    /// Video-memory allocations seen.
    pub allocs: u64,
    /// Frees that matched one of them.
    pub frees: u64,
    /// Frees of a whole RM client (which releases everything it held:
    /// that client's bytes leave `live_bytes`, other clients' stay).
    pub client_frees: u64,
}

impl RmProcess {
    /// Live bytes, clamped at zero.
    pub const fn live(&self) -> u64 {
        let v = self.live_bytes as i64;
        if v < 0 { 0 } else { v as u64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_follow_the_driver_version() {
        let modern = RmLayout::for_driver_major(595);
        assert_eq!(modern.alloc_kind(48), Some(true));
        assert_eq!(modern.alloc_kind(32), Some(false));
        assert_eq!(modern.alloc_kind(40), None);
        assert_eq!(modern.nvos64_flags_offset, 36);
        let old = RmLayout::for_driver_major(530);
        assert_eq!(old.alloc_kind(40), Some(true));
        assert_eq!(old.alloc_kind(48), None);
        assert_eq!(old.nvos64_flags_offset, 0);
        assert_eq!(RmLayout::OFF.alloc_kind(48), None);
        assert_eq!(RmLayout::for_driver_major(535), modern);
    }

    #[test]
    fn structs_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<AllocHead>(), ALLOC_HEAD_SIZE as usize);
        assert_eq!(core::mem::size_of::<FreeParams>(), 16);
        assert_eq!(core::mem::size_of::<RmObjectKey>(), 16);
        assert_eq!(core::mem::size_of::<RmObject>(), 16);
        assert_eq!(core::mem::size_of::<RmClientKey>(), 8);
        assert_eq!(core::mem::size_of::<RmClient>(), 24);
        assert_eq!(core::mem::size_of::<RmProcess>(), 48);
    }

    #[test]
    fn live_bytes_clamp_at_zero() {
        let p = RmProcess {
            live_bytes: 0u64.wrapping_sub(5),
            ..Default::default()
        };
        assert_eq!(p.live(), 0);
        let p = RmProcess {
            live_bytes: 7,
            ..Default::default()
        };
        assert_eq!(p.live(), 7);
    }
}
