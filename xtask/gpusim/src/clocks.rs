//! Clock rates every simulated GPU reports through CUDA and NVML: those of
//! an H100 SXM. The node description has no field for them, and nothing
//! the simulator computes depends on them.

/// Maximum graphics/SM clock (MHz).
pub const MAX_SM_CLOCK_MHZ: u32 = 1980;
/// Maximum (and steady) memory clock (MHz).
pub const MAX_MEMORY_CLOCK_MHZ: u32 = 2619;
/// Maximum (and steady) video clock (MHz).
pub const MAX_VIDEO_CLOCK_MHZ: u32 = 1755;
