//! NVML return codes: the errors this library returns, their numeric values
//! (`nvmlReturn_t`) and the strings `nvmlErrorString` gives for them.

use std::ffi::CStr;

use gpusim::SimError;

use crate::abi::{self, Return};

pub use crate::abi::SUCCESS;

/// A failed NVML call, as the C API reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", message(self.code()).to_string_lossy())]
pub enum NvmlError {
    /// `NVML_ERROR_UNINITIALIZED`: `nvmlInit` was not called (or shut down).
    Uninitialized,
    /// `NVML_ERROR_INVALID_ARGUMENT`: a NULL pointer, a handle that is not
    /// ours, an index out of range.
    InvalidArgument,
    /// `NVML_ERROR_NOT_SUPPORTED`.
    NotSupported,
    /// `NVML_ERROR_NO_PERMISSION`.
    NoPermission,
    /// `NVML_ERROR_NOT_FOUND`.
    NotFound,
    /// `NVML_ERROR_INSUFFICIENT_SIZE`: the caller's buffer is too small.
    InsufficientSize,
    /// `NVML_ERROR_DRIVER_NOT_LOADED`: the simulated node cannot be opened.
    DriverNotLoaded,
    /// `NVML_ERROR_TIMEOUT`.
    Timeout,
    /// `NVML_ERROR_GPU_IS_LOST`.
    GpuIsLost,
    /// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`: a versioned struct carries a
    /// version this library does not know.
    ArgumentVersionMismatch,
    /// `NVML_ERROR_UNKNOWN`: anything else, including a caught panic.
    Unknown,
}

impl NvmlError {
    /// The `nvmlReturn_t` value.
    pub const fn code(self) -> Return {
        match self {
            Self::Uninitialized => abi::ERROR_UNINITIALIZED,
            Self::InvalidArgument => abi::ERROR_INVALID_ARGUMENT,
            Self::NotSupported => abi::ERROR_NOT_SUPPORTED,
            Self::NoPermission => abi::ERROR_NO_PERMISSION,
            Self::NotFound => abi::ERROR_NOT_FOUND,
            Self::InsufficientSize => abi::ERROR_INSUFFICIENT_SIZE,
            Self::DriverNotLoaded => abi::ERROR_DRIVER_NOT_LOADED,
            Self::Timeout => abi::ERROR_TIMEOUT,
            Self::GpuIsLost => abi::ERROR_GPU_IS_LOST,
            Self::ArgumentVersionMismatch => abi::ERROR_ARGUMENT_VERSION_MISMATCH,
            Self::Unknown => abi::ERROR_UNKNOWN,
        }
    }

    /// The code a failed simulator operation maps to.
    pub fn from_sim(e: &SimError) -> Self {
        match e {
            SimError::DeviceLost { .. } => Self::GpuIsLost,
            SimError::InvalidDevice { .. } => Self::InvalidArgument,
            _ => Self::Unknown,
        }
    }
}

impl From<SimError> for NvmlError {
    fn from(e: SimError) -> Self {
        Self::from_sim(&e)
    }
}

/// What `nvmlErrorString` returns for `code`.
pub const fn message(code: Return) -> &'static CStr {
    match code {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, because ECC is enabled",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not Ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        _ => c"Unknown Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_header() {
        assert_eq!(NvmlError::GpuIsLost.code(), 15);
        assert_eq!(NvmlError::ArgumentVersionMismatch.code(), 25);
        assert_eq!(NvmlError::Unknown.code(), 999);
        assert_eq!(NvmlError::InsufficientSize.to_string(), "Insufficient Size");
        assert_eq!(message(12345), c"Unknown Error");
    }

    #[test]
    fn sim_errors_map_to_codes() {
        assert_eq!(
            NvmlError::from(SimError::DeviceLost { gpu: 1 }),
            NvmlError::GpuIsLost
        );
        assert_eq!(
            NvmlError::from(SimError::InvalidDevice { gpu: 9, count: 2 }),
            NvmlError::InvalidArgument
        );
    }
}
