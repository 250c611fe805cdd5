//! The two per-period NVML list queries, made once each into a buffer the
//! caller keeps, where nvml-wrapper makes two calls (the length, then the
//! list into a fresh vector).
//!
//! Both NVML functions take an array and its length; when the array is too
//! short they answer `NVML_ERROR_INSUFFICIENT_SIZE` and write the length
//! they need. A buffer kept between periods, grown to the longest answer
//! plus headroom, fits in all but the period after a list grew, so a period
//! costs one driver round trip per query instead of two. It also closes
//! nvml-wrapper's window: a process that starts between its two calls makes
//! its second one fail; here the query is retried with the length NVML
//! just gave.
//!
//! The agent's only unsafe code for NVML (nvml-wrapper does the rest): the
//! raw handle of a borrowed device and one call of the function NVML
//! exports, each with its contract stated.

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    nvmlProcessInfo_t, nvmlProcessUtilizationSample_t, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
};

/// Entries added past the length NVML asked for (processes that start
/// before the next call).
const HEADROOM: usize = 8;
/// Calls before a list that keeps outgrowing its buffer is an error.
const ATTEMPTS: usize = 4;
/// The most entries asked for: far beyond the processes one GPU can hold.
const MAX_ENTRIES: usize = 1 << 16;

/// Calls `query(array, length)` until the array is long enough; returns
/// the entries written, at the head of `buf`.
fn into_buffer<T: Copy>(
    buf: &mut Vec<T>,
    zero: T,
    mut query: impl FnMut(*mut T, &mut u32) -> u32,
) -> Result<&[T], NvmlError> {
    if buf.len() < HEADROOM {
        buf.resize(HEADROOM, zero);
    }
    for _ in 0..ATTEMPTS {
        let mut count = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let code = query(buf.as_mut_ptr(), &mut count);
        let count = count as usize;
        if code == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE {
            if count >= MAX_ENTRIES {
                break;
            }
            buf.resize(count.max(buf.len()) + HEADROOM, zero);
            continue;
        }
        nvml_try(code)?;
        // (A driver answering more than it was given room for is not
        // believed past the buffer.)
        return Ok(&buf[..count.min(buf.len())]);
    }
    Err(NvmlError::InsufficientSize(None))
}

/// `nvmlDeviceGetProcessUtilization` of `device` since `since_us`: the
/// samples, at the head of `buf` (`NvmlError::NotFound` when no process
/// used the SMs since then).
pub fn process_utilization<'b>(
    device: &Device<'_>,
    since_us: u64,
    buf: &'b mut Vec<nvmlProcessUtilizationSample_t>,
) -> Result<&'b [nvmlProcessUtilizationSample_t], NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetProcessUtilization.as_ref())?;
    // SAFETY: the handle is only passed back to the NVML it came from, which
    // `device` borrows (so it is still initialised).
    let handle = unsafe { device.handle() };
    let zero = nvmlProcessUtilizationSample_t {
        pid: 0,
        timeStamp: 0,
        smUtil: 0,
        memUtil: 0,
        encUtil: 0,
        decUtil: 0,
    };
    into_buffer(buf, zero, |array, count| {
        // SAFETY: `array` holds `*count` entries (`into_buffer` passes its
        // buffer and length) and `count` is a valid `u32`; NVML writes at
        // most `*count` entries and the count.
        unsafe { sym(handle, array, count, since_us) }
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` of `device`: the processes
/// with a compute context, at the head of `buf`.
pub fn running_compute_processes<'b>(
    device: &Device<'_>,
    buf: &'b mut Vec<nvmlProcessInfo_t>,
) -> Result<&'b [nvmlProcessInfo_t], NvmlError> {
    let sym = nvml_sym(
        device
            .nvml()
            .lib()
            .nvmlDeviceGetComputeRunningProcesses_v3
            .as_ref(),
    )?;
    // SAFETY: as in `process_utilization`.
    let handle = unsafe { device.handle() };
    let zero = nvmlProcessInfo_t {
        pid: 0,
        usedGpuMemory: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    };
    into_buffer(buf, zero, |array, count| {
        // SAFETY: as in `process_utilization` (the count comes first in this
        // function's arguments).
        unsafe { sym(handle, count, array) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings::{
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_enum_NVML_SUCCESS,
    };

    /// A driver holding `items`, answering as NVML does: too short an
    /// array gets `INSUFFICIENT_SIZE` and the length needed.
    fn driver(items: &[u32]) -> impl FnMut(*mut u32, &mut u32) -> u32 + '_ {
        move |array, count| {
            if (*count as usize) < items.len() {
                *count = items.len() as u32;
                return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
            }
            for (i, v) in items.iter().enumerate() {
                // SAFETY: the array holds `*count` >= items.len() entries.
                unsafe { array.add(i).write(*v) };
            }
            *count = items.len() as u32;
            nvmlReturn_enum_NVML_SUCCESS
        }
    }

    /// `driver(items)` through `into_buffer`: the entries and the calls.
    fn read(buf: &mut Vec<u32>, items: &[u32]) -> (Vec<u32>, usize) {
        let mut calls = 0;
        let mut d = driver(items);
        let got = into_buffer(buf, 0, |a, c| {
            calls += 1;
            d(a, c)
        })
        .unwrap()
        .to_vec();
        (got, calls)
    }

    #[test]
    fn a_list_longer_than_the_buffer_is_read_whole_and_the_buffer_kept() {
        let items: Vec<u32> = (1..=100).collect();
        let mut buf = Vec::new();
        // One short call, one that fits.
        assert_eq!(read(&mut buf, &items), (items.clone(), 2));
        // The next period fits at once.
        assert_eq!(read(&mut buf, &items), (items, 1));
        // A shorter list: only its entries.
        assert_eq!(read(&mut buf, &[7, 8]), (vec![7, 8], 1));
    }

    #[test]
    fn errors_pass_through_and_a_list_that_keeps_growing_stops() {
        let mut buf = Vec::new();
        let e = into_buffer(&mut buf, 0u32, |_, _| nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
        assert!(matches!(e, Err(NvmlError::NotFound)), "{e:?}");
        // Always one longer than what it was given.
        let mut calls = 0;
        let e = into_buffer(&mut buf, 0u32, |_, c| {
            calls += 1;
            *c += 1;
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
        });
        assert!(matches!(e, Err(NvmlError::InsufficientSize(_))), "{e:?}");
        assert_eq!(calls, ATTEMPTS);
        // One that claims more than it had room for is cut at the buffer.
        let mut small = vec![0u32; HEADROOM];
        let got = into_buffer(&mut small, 0, |_, c| {
            *c = 1000;
            nvmlReturn_enum_NVML_SUCCESS
        })
        .unwrap();
        assert_eq!(got.len(), HEADROOM);
    }
}
