//! NVML (`nvml.h`, API version 12): return codes, structure layouts, enum
//! values and constants. Rust names are CamelCase without the `nvml`
//! prefix; each item names its C counterpart. `tests/headers.rs` checks
//! every size, offset and value against NVIDIA's published header.

use core::ffi::{c_char, c_uint, c_ulonglong, c_void};

/// `nvmlReturn_t` (a C enum, passed as `unsigned int`).
pub type Return = c_uint;
/// `nvmlDevice_t`: an opaque pointer.
pub type DeviceHandle = *mut c_void;
/// `nvmlEventSet_t`: an opaque pointer.
pub type EventSetHandle = *mut c_void;

/// `NVML_SUCCESS`.
pub const SUCCESS: Return = 0;
/// `NVML_ERROR_UNINITIALIZED`.
pub const ERROR_UNINITIALIZED: Return = 1;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub const ERROR_INVALID_ARGUMENT: Return = 2;
/// `NVML_ERROR_NOT_SUPPORTED`.
pub const ERROR_NOT_SUPPORTED: Return = 3;
/// `NVML_ERROR_NO_PERMISSION`.
pub const ERROR_NO_PERMISSION: Return = 4;
/// `NVML_ERROR_NOT_FOUND`.
pub const ERROR_NOT_FOUND: Return = 6;
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
pub const ERROR_INSUFFICIENT_SIZE: Return = 7;
/// `NVML_ERROR_DRIVER_NOT_LOADED`.
pub const ERROR_DRIVER_NOT_LOADED: Return = 9;
/// `NVML_ERROR_TIMEOUT`.
pub const ERROR_TIMEOUT: Return = 10;
/// `NVML_ERROR_FUNCTION_NOT_FOUND`.
pub const ERROR_FUNCTION_NOT_FOUND: Return = 13;
/// `NVML_ERROR_GPU_IS_LOST`.
pub const ERROR_GPU_IS_LOST: Return = 15;
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`.
pub const ERROR_ARGUMENT_VERSION_MISMATCH: Return = 25;
/// `NVML_ERROR_UNKNOWN`.
pub const ERROR_UNKNOWN: Return = 999;

/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE`.
pub const PCI_BUS_ID_BUFFER_SIZE: usize = 32;
/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE` (the legacy field).
pub const PCI_BUS_ID_LEGACY_BUFFER_SIZE: usize = 16;
/// `NVML_NVLINK_MAX_LINKS`.
pub const NVLINK_MAX_LINKS: u32 = 18;
/// `NVML_API_VERSION`.
pub const API_VERSION: u32 = 12;

/// `NVML_FEATURE_DISABLED`.
pub const FEATURE_DISABLED: c_uint = 0;
/// `NVML_FEATURE_ENABLED`.
pub const FEATURE_ENABLED: c_uint = 1;

/// `NVML_DEVICE_MIG_DISABLE`.
pub const MIG_DISABLE: c_uint = 0;
/// `NVML_DEVICE_MIG_ENABLE`.
pub const MIG_ENABLE: c_uint = 1;

/// `NVML_TOPOLOGY_INTERNAL`.
pub const TOPOLOGY_INTERNAL: c_uint = 0;
/// `NVML_TOPOLOGY_NODE`.
pub const TOPOLOGY_NODE: c_uint = 40;
/// `NVML_TOPOLOGY_SYSTEM`.
pub const TOPOLOGY_SYSTEM: c_uint = 50;

/// `NVML_TEMPERATURE_GPU`.
pub const TEMPERATURE_GPU: c_uint = 0;

/// `NVML_CLOCK_GRAPHICS`.
pub const CLOCK_GRAPHICS: c_uint = 0;
/// `NVML_CLOCK_SM`.
pub const CLOCK_SM: c_uint = 1;
/// `NVML_CLOCK_MEM`.
pub const CLOCK_MEM: c_uint = 2;
/// `NVML_CLOCK_VIDEO`.
pub const CLOCK_VIDEO: c_uint = 3;

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SINGLE_BIT_ECC: c_ulonglong = 0x1;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID_CRITICAL_ERROR: c_ulonglong = 0x8;
/// `nvmlEventTypeAll`: every event type the API defines (up to
/// `nvmlEventTypeGpuRecoveryAction`, NVML 12.9).
pub const EVENT_ALL: c_ulonglong = 0x1
    | 0x2
    | 0x4
    | 0x8
    | 0x10
    | 0x80
    | 0x100
    | 0x200
    | 0x400
    | 0x800
    | 0x1000
    | 0x2000
    | 0x4000
    | 0x8000;

/// `gpuInstanceId` / `computeInstanceId` when MIG does not apply.
pub const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `NVML_STRUCT_VERSION(data, ver)`: the struct's size with the version in
/// the top byte.
pub const fn struct_version<T>(version: u32) -> c_uint {
    core::mem::size_of::<T>() as c_uint | (version << 24)
}

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// Total physical memory (bytes).
    pub total: c_ulonglong,
    /// Unallocated memory.
    pub free: c_ulonglong,
    /// Reserved plus allocated memory.
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryV2 {
    /// Must be [`MEMORY_V2`].
    pub version: c_uint,
    /// Total physical memory (bytes).
    pub total: c_ulonglong,
    /// Reserved for the driver and firmware.
    pub reserved: c_ulonglong,
    /// Unallocated memory.
    pub free: c_ulonglong,
    /// Allocated memory.
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2`.
pub const MEMORY_V2: c_uint = struct_version::<MemoryV2>(2);

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Utilization {
    /// Percent of time a kernel ran.
    pub gpu: c_uint,
    /// Percent of time device memory was read or written.
    pub memory: c_uint,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessInfoV1 {
    /// Process id.
    pub pid: c_uint,
    /// Device memory used (bytes).
    pub used_gpu_memory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t`, also `nvmlProcessInfo_t` (what the `_v3`
/// functions take).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: c_uint,
    /// Device memory used (bytes).
    pub used_gpu_memory: c_ulonglong,
    /// GPU instance ([`NO_INSTANCE`] without MIG).
    pub gpu_instance_id: c_uint,
    /// Compute instance ([`NO_INSTANCE`] without MIG).
    pub compute_instance_id: c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessUtilizationSample {
    /// Process id.
    pub pid: c_uint,
    /// CPU timestamp (µs).
    pub time_stamp: c_ulonglong,
    /// SM utilisation (%).
    pub sm_util: c_uint,
    /// Frame buffer utilisation (%).
    pub mem_util: c_uint,
    /// Encoder utilisation (%).
    pub enc_util: c_uint,
    /// Decoder utilisation (%).
    pub dec_util: c_uint,
}

/// `nvmlPciInfo_t` (the layout `nvmlDeviceGetPciInfo_v3` fills).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PciInfo {
    /// `domain:bus:device.function` with a 4-digit domain.
    pub bus_id_legacy: [c_char; PCI_BUS_ID_LEGACY_BUFFER_SIZE],
    /// PCI domain.
    pub domain: c_uint,
    /// PCI bus.
    pub bus: c_uint,
    /// Device on the bus.
    pub device: c_uint,
    /// Device id (upper 16 bits) and vendor id (lower 16 bits).
    pub pci_device_id: c_uint,
    /// Subsystem device id and subsystem vendor id.
    pub pci_sub_system_id: c_uint,
    /// `domain:bus:device.function` with an 8-digit domain.
    pub bus_id: [c_char; PCI_BUS_ID_BUFFER_SIZE],
}

/// How many bytes of [`PciInfo`] the `_v1`/`_v2` entry points write: those
/// versions predate the 32-byte `busId` and had 16 reserved bytes in its
/// place, so callers built against old headers pass a 52-byte struct.
pub const PCI_INFO_LEGACY_SIZE: usize = PCI_BUS_ID_LEGACY_BUFFER_SIZE + 5 * 4 + 16;

/// `nvmlEventData_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventData {
    /// Device the event happened on.
    pub device: DeviceHandle,
    /// `nvmlEventType*` bit.
    pub event_type: c_ulonglong,
    /// The Xid for Xid events, 0 otherwise.
    pub event_data: c_ulonglong,
    /// GPU instance ([`NO_INSTANCE`] without MIG).
    pub gpu_instance_id: c_uint,
    /// Compute instance ([`NO_INSTANCE`] without MIG).
    pub compute_instance_id: c_uint,
}

/// The `nvmlEventData_t` of the `nvmlEventSetWait` (v1) era: no instance ids.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventDataV1 {
    /// Device the event happened on.
    pub device: DeviceHandle,
    /// `nvmlEventType*` bit.
    pub event_type: c_ulonglong,
    /// The Xid for Xid events, 0 otherwise.
    pub event_data: c_ulonglong,
}

const _: () = {
    assert!(core::mem::size_of::<Memory>() == 24);
    assert!(core::mem::size_of::<MemoryV2>() == 40);
    assert!(MEMORY_V2 == 0x0200_0028);
    assert!(core::mem::size_of::<Utilization>() == 8);
    assert!(core::mem::size_of::<ProcessInfoV1>() == 16);
    assert!(core::mem::size_of::<ProcessInfo>() == 24);
    assert!(core::mem::size_of::<ProcessUtilizationSample>() == 32);
    assert!(core::mem::size_of::<PciInfo>() == 68);
    assert!(PCI_INFO_LEGACY_SIZE == 52);
    assert!(core::mem::size_of::<EventData>() == 32);
    assert!(core::mem::size_of::<EventDataV1>() == 24);
};
