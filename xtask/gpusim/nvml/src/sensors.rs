//! Values the simulator has no model for, made plausible: clocks,
//! temperature, power and CUDA core counts.
//!
//! - Clocks are those of an H100 SXM ([`gpusim::clocks`]): 1980 MHz
//!   graphics/SM, 2619 MHz memory, 1755 MHz video at most, the same as the
//!   CUDA stand-in reports. The current graphics/SM clock is the maximum
//!   while the GPU ran kernels in the utilisation window and 345 MHz
//!   (idle) otherwise; memory and video clocks stay at their maximum.
//! - Temperature rises linearly with utilisation from 30 °C (idle) to 75 °C.
//! - Power rises linearly with utilisation from 70 W (idle) to 700 W.
//! - CUDA cores are SMs times the cores per SM of the compute capability.

use gpusim::clocks::{MAX_MEMORY_CLOCK_MHZ, MAX_SM_CLOCK_MHZ, MAX_VIDEO_CLOCK_MHZ};

use crate::abi::{CLOCK_GRAPHICS, CLOCK_MEM, CLOCK_SM, CLOCK_VIDEO};

/// Idle graphics/SM clock (MHz).
pub const IDLE_CLOCK_MHZ: u32 = 345;
/// Idle temperature (°C).
pub const IDLE_TEMPERATURE_C: u32 = 30;
/// Temperature at full load (°C).
pub const FULL_TEMPERATURE_C: u32 = 75;
/// Idle power (mW).
pub const IDLE_POWER_MW: u32 = 70_000;
/// Power at full load (mW).
pub const FULL_POWER_MW: u32 = 700_000;

/// Maximum clock of a clock domain (MHz), `None` for an unknown domain.
pub fn max_clock(domain: u32) -> Option<u32> {
    match domain {
        CLOCK_GRAPHICS | CLOCK_SM => Some(MAX_SM_CLOCK_MHZ),
        CLOCK_MEM => Some(MAX_MEMORY_CLOCK_MHZ),
        CLOCK_VIDEO => Some(MAX_VIDEO_CLOCK_MHZ),
        _ => None,
    }
}

/// Current clock of a domain at `util` percent GPU utilisation (MHz).
pub fn clock(domain: u32, util: u32) -> Option<u32> {
    let max = max_clock(domain)?;
    Some(match domain {
        CLOCK_GRAPHICS | CLOCK_SM if util == 0 => IDLE_CLOCK_MHZ,
        _ => max,
    })
}

/// Die temperature at `util` percent (°C).
pub fn temperature(util: u32) -> u32 {
    IDLE_TEMPERATURE_C + (FULL_TEMPERATURE_C - IDLE_TEMPERATURE_C) * util.min(100) / 100
}

/// Board power at `util` percent (mW).
pub fn power(util: u32) -> u32 {
    IDLE_POWER_MW + (FULL_POWER_MW - IDLE_POWER_MW) / 100 * util.min(100)
}

/// FP32 cores per SM of a compute capability (NVIDIA's published figures).
pub fn cores_per_sm([major, minor]: [u32; 2]) -> u32 {
    match (major, minor) {
        (3, _) => 192,
        (6, 0) | (7, _) | (8, 0) => 64,
        _ => 128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_follow_utilisation() {
        assert_eq!(clock(CLOCK_SM, 0), Some(IDLE_CLOCK_MHZ));
        assert_eq!(clock(CLOCK_SM, 1), Some(1980));
        assert_eq!(clock(CLOCK_MEM, 0), Some(2619));
        assert_eq!(clock(99, 0), None);
        assert_eq!(temperature(0), 30);
        assert_eq!(temperature(100), 75);
        assert_eq!(temperature(250), 75);
        assert_eq!(power(0), 70_000);
        assert_eq!(power(100), 700_000);
        assert_eq!(power(50), 385_000);
    }

    #[test]
    fn core_counts_by_architecture() {
        assert_eq!(cores_per_sm([9, 0]), 128);
        assert_eq!(cores_per_sm([8, 0]), 64);
        assert_eq!(cores_per_sm([8, 6]), 128);
        assert_eq!(cores_per_sm([7, 0]), 64);
        assert_eq!(cores_per_sm([3, 5]), 192);
    }
}
