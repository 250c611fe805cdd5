//! SM use per process from NVML (`nvmlDeviceGetProcessUtilization`, one
//! call a period into a kept buffer: [`tessera_nvml_sys`]), folded into what the
//! controller takes: percent per pid over the window since a timestamp.
//!
//! NVML returns the samples its driver buffered since `since` (µs, CPU
//! clock), possibly several per process (one per sampling interval of the
//! driver), and none for a process that did not use the SMs; the
//! simulator returns one per process covering the whole window. Averaging
//! the samples of each pid serves both. Keep the newest timestamp seen as
//! the next call's `since`, so windows follow each other without gaps or
//! overlap.

use std::collections::BTreeMap;

use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessUtilizationSample;
use nvml_wrapper_sys::bindings::nvmlProcessUtilizationSample_t;

use super::{CAPACITY_PERCENT, ControlError};

/// SM use per process over one window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SmSamples {
    /// Percent of the GPU's time per pid (host pid namespace), 0..=100.
    pub by_pid: BTreeMap<u32, f64>,
    /// Newest sample timestamp (µs), or the `since` asked for when there
    /// was none: the next window's `since`.
    pub newest_us: u64,
}

impl SmSamples {
    /// The sum over `pids` (a container's processes), at most 100.
    pub fn sum_over(&self, pids: impl IntoIterator<Item = u32>) -> f64 {
        let mut seen = std::collections::BTreeSet::new();
        pids.into_iter()
            .filter(|p| seen.insert(*p))
            .filter_map(|p| self.by_pid.get(&p))
            .sum::<f64>()
            .min(CAPACITY_PERCENT)
    }

    /// The sum over every process: the device's SM busy, at most 100.
    pub fn total(&self) -> f64 {
        self.by_pid.values().sum::<f64>().min(CAPACITY_PERCENT)
    }
}

/// Folds raw samples: those newer than `since_us` are averaged per pid;
/// values above 100 (no real GPU reports them) count as 100.
pub fn fold_samples(samples: &[ProcessUtilizationSample], since_us: u64) -> SmSamples {
    let mut acc: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
    let mut newest_us = since_us;
    for s in samples.iter().filter(|s| s.timestamp > since_us) {
        let e = acc.entry(s.pid).or_default();
        e.0 += f64::from(s.sm_util.min(100));
        e.1 += 1;
        newest_us = newest_us.max(s.timestamp);
    }
    SmSamples {
        by_pid: acc
            .into_iter()
            .map(|(pid, (sum, n))| (pid, sum / f64::from(n.max(1))))
            .collect(),
        newest_us,
    }
}

/// Reads `device`'s per-process SM samples since `since_us` (0: all the
/// driver buffered). No sample (`NVML_ERROR_NOT_FOUND`: nothing used the
/// SMs since then) is an empty result whose `newest_us` is now, not an
/// error.
pub fn read_sm_samples(device: &Device<'_>, since_us: u64) -> Result<SmSamples, ControlError> {
    read_sm_samples_into(device, since_us, &mut Vec::new())
}

/// [`read_sm_samples`] with the query's buffer `buf` kept by the caller
/// between periods (one NVML call a period instead of two, see
/// [`tessera_nvml_sys`]).
pub fn read_sm_samples_into(
    device: &Device<'_>,
    since_us: u64,
    buf: &mut Vec<nvmlProcessUtilizationSample_t>,
) -> Result<SmSamples, ControlError> {
    match tessera_nvml_sys::process_utilization(device, since_us, buf) {
        Ok(raw) => {
            let samples: Vec<ProcessUtilizationSample> = raw
                .iter()
                .map(|&s| ProcessUtilizationSample::from(s))
                .collect();
            Ok(fold_samples(&samples, since_us))
        }
        Err(NvmlError::NotFound) => Ok(SmSamples {
            by_pid: BTreeMap::new(),
            newest_us: since_us.max(now_us()),
        }),
        Err(source) => Err(ControlError::Nvml { source }),
    }
}

/// The CPU clock NVML stamps samples with (µs since the epoch).
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
