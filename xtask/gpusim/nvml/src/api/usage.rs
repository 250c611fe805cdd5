//! Live state: memory, utilisation, processes, clocks, temperature, power.
//!
//! Every query here fails with `NVML_ERROR_GPU_IS_LOST` on a GPU marked
//! lost. Memory, utilisation and process queries issue the RM control a
//! real driver serves them with (`NV2080_CTRL_CMD_*`, see gpusim's
//! `ioctl.rs`) before answering from the simulated node.

use std::ffi::{c_uint, c_ulonglong};

use gpusim::nvrm::{
    NV2080_CTRL_CMD_FB_GET_INFO_V2, NV2080_CTRL_CMD_GPU_GET_PIDS,
    NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2,
};

use crate::abi::{
    DeviceHandle, MEMORY_V2, Memory, MemoryV2, NO_INSTANCE, ProcessInfo, ProcessInfoV1,
    ProcessUtilizationSample, Return, TEMPERATURE_GPU, Utilization,
};
use crate::error::NvmlError;
use crate::guard::entry;
use crate::library::{Context, context};
use crate::{ptr, sensors};

/// Resolves `device` to a live GPU and issues `cmd` (if any) for it.
fn live(
    device: DeviceHandle,
    cmd: Option<u32>,
) -> Result<(std::sync::Arc<Context>, usize), NvmlError> {
    let ctx = context()?;
    let gpu = ctx.gpu(device)?;
    if let Some(cmd) = cmd {
        ctx.driver.control(gpu, cmd);
    }
    ctx.live(gpu)?;
    Ok((ctx, gpu))
}

/// `nvmlDeviceGetMemoryInfo` (v1): `used` includes the driver's reserve.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: DeviceHandle,
    memory: *mut Memory,
) -> Return {
    entry(|| {
        if memory.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        let (ctx, gpu) = live(device, Some(NV2080_CTRL_CMD_FB_GET_INFO_V2))?;
        let m = ctx.sim.memory_info(gpu)?;
        let used = m.reserved.saturating_add(m.used).min(m.total);
        let v = Memory {
            total: m.total,
            free: m.total - used,
            used,
        };
        // SAFETY: NVML contract: valid for an nvmlMemory_t (checked non-NULL).
        unsafe { ptr::put(memory, v) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: `version` must be `nvmlMemory_v2`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: DeviceHandle,
    memory: *mut MemoryV2,
) -> Return {
    entry(|| {
        // SAFETY: NVML contract: NULL or an nvmlMemory_v2_t.
        let version = unsafe { ptr::version(memory) }?;
        if version != MEMORY_V2 {
            return Err(NvmlError::ArgumentVersionMismatch);
        }
        let (ctx, gpu) = live(device, Some(NV2080_CTRL_CMD_FB_GET_INFO_V2))?;
        let m = ctx.sim.memory_info(gpu)?;
        let v = MemoryV2 {
            version,
            total: m.total,
            reserved: m.reserved,
            free: m.free,
            used: m.used,
        };
        // SAFETY: as above.
        unsafe { ptr::put(memory, v) }
    })
}

/// `nvmlDeviceGetUtilizationRates`: kernel and copy activity over the
/// node's utilisation window.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: DeviceHandle,
    utilization: *mut Utilization,
) -> Return {
    entry(|| {
        if utilization.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        let (ctx, gpu) = live(
            device,
            Some(NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2),
        )?;
        let u = ctx.sim.utilization(gpu)?;
        let v = Utilization {
            gpu: u.gpu,
            memory: u.memory,
        };
        // SAFETY: NVML contract: valid for an nvmlUtilization_t (checked).
        unsafe { ptr::put(utilization, v) }
    })
}

/// `nvmlDeviceGetProcessUtilization`: one sample per process with SM
/// activity since `last_seen_time_stamp` (µs; 0 = the whole history);
/// `NVML_ERROR_NOT_FOUND` when there is none. A NULL buffer asks for the
/// count (`NVML_ERROR_INSUFFICIENT_SIZE`).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: DeviceHandle,
    utilization: *mut ProcessUtilizationSample,
    process_samples_count: *mut c_uint,
    last_seen_time_stamp: c_ulonglong,
) -> Return {
    entry(|| {
        if process_samples_count.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        let (ctx, gpu) = live(
            device,
            Some(NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2),
        )?;
        let samples: Vec<ProcessUtilizationSample> = ctx
            .sim
            .process_samples(gpu, last_seen_time_stamp)?
            .into_iter()
            .filter(|s| s.sm_percent > 0 && s.timestamp_us > last_seen_time_stamp)
            .map(|s| ProcessUtilizationSample {
                pid: s.pid as c_uint,
                time_stamp: s.timestamp_us,
                sm_util: s.sm_percent,
                ..Default::default()
            })
            .collect();
        if samples.is_empty() {
            return Err(NvmlError::NotFound);
        }
        if utilization.is_null() {
            // SAFETY: NVML contract: valid for an unsigned int (checked).
            unsafe { ptr::put(process_samples_count, samples.len() as c_uint) }?;
            return Err(NvmlError::InsufficientSize);
        }
        // SAFETY: NVML contract: `utilization` holds `*process_samples_count`
        // entries.
        unsafe { ptr::put_array(process_samples_count, utilization, &samples) }
    })
}

/// The processes holding memory on a live GPU.
fn compute_processes(device: DeviceHandle) -> Result<Vec<ProcessInfo>, NvmlError> {
    let (ctx, gpu) = live(device, Some(NV2080_CTRL_CMD_GPU_GET_PIDS))?;
    Ok(ctx
        .sim
        .processes(gpu)?
        .into_iter()
        .map(|p| ProcessInfo {
            pid: p.pid as c_uint,
            used_gpu_memory: p.bytes,
            gpu_instance_id: NO_INSTANCE,
            compute_instance_id: NO_INSTANCE,
        })
        .collect())
}

fn v1(p: &ProcessInfo) -> ProcessInfoV1 {
    ProcessInfoV1 {
        pid: p.pid,
        used_gpu_memory: p.used_gpu_memory,
    }
}

/// `nvmlDeviceGetComputeRunningProcesses` (v1): `nvmlProcessInfo_v1_t`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: DeviceHandle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> Return {
    entry(|| {
        let list: Vec<ProcessInfoV1> = compute_processes(device)?.iter().map(v1).collect();
        // SAFETY: NVML contract: `infos` holds `*info_count` entries.
        unsafe { ptr::put_array(info_count, infos, &list) }
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v2`: `nvmlProcessInfo_v2_t`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: DeviceHandle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Return {
    entry(|| {
        let list = compute_processes(device)?;
        // SAFETY: NVML contract: `infos` holds `*info_count` entries.
        unsafe { ptr::put_array(info_count, infos, &list) }
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`: `nvmlProcessInfo_t` (the
/// same layout as v2 in this header).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: DeviceHandle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Return {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v2(device, info_count, infos) }
}

/// No graphics or MPS processes run on the simulated node: always an
/// empty list.
fn no_processes<T: Copy>(
    device: DeviceHandle,
    info_count: *mut c_uint,
    infos: *mut T,
) -> Result<(), NvmlError> {
    live(device, Some(NV2080_CTRL_CMD_GPU_GET_PIDS))?;
    // SAFETY: NVML contract: `info_count` is NULL or valid; nothing is
    // written to `infos`.
    unsafe { ptr::put_array::<T>(info_count, infos, &[]) }
}

/// `nvmlDeviceGetGraphicsRunningProcesses` (v1): empty.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: DeviceHandle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> Return {
    entry(|| no_processes(device, info_count, infos))
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v2`: empty.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: DeviceHandle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Return {
    entry(|| no_processes(device, info_count, infos))
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v3`: empty.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: DeviceHandle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Return {
    entry(|| no_processes(device, info_count, infos))
}

/// `nvmlDeviceGetMPSComputeRunningProcesses_v3`: empty.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: DeviceHandle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Return {
    entry(|| no_processes(device, info_count, infos))
}

/// GPU utilisation of a live GPU, for the readings derived from it.
fn util(device: DeviceHandle) -> Result<u32, NvmlError> {
    let (ctx, gpu) = live(device, None)?;
    Ok(ctx.sim.utilization(gpu)?.gpu)
}

/// `nvmlDeviceGetClockInfo`: see `sensors.rs`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: DeviceHandle,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> Return {
    entry(|| {
        let u = util(device)?;
        let mhz = sensors::clock(clock_type, u).ok_or(NvmlError::InvalidArgument)?;
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(clock, mhz) }
    })
}

/// `nvmlDeviceGetMaxClockInfo`: see `sensors.rs`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: DeviceHandle,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> Return {
    entry(|| {
        live(device, None)?;
        let mhz = sensors::max_clock(clock_type).ok_or(NvmlError::InvalidArgument)?;
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(clock, mhz) }
    })
}

/// `nvmlDeviceGetTemperature`: derived from utilisation (`sensors.rs`).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: DeviceHandle,
    sensor_type: c_uint,
    temp: *mut c_uint,
) -> Return {
    entry(|| {
        if sensor_type != TEMPERATURE_GPU {
            return Err(NvmlError::InvalidArgument);
        }
        let u = util(device)?;
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(temp, sensors::temperature(u)) }
    })
}

/// `nvmlDeviceGetPowerUsage` (mW): derived from utilisation (`sensors.rs`).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: DeviceHandle,
    power: *mut c_uint,
) -> Return {
    entry(|| {
        let u = util(device)?;
        // SAFETY: NVML contract: NULL or valid for an unsigned int.
        unsafe { ptr::put(power, sensors::power(u)) }
    })
}
