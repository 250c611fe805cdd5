"""What `nvidia-smi` shows, read through NVIDIA's Python bindings of NVML
(nvidia-ml-py, `import pynvml`), for the Rust test to check against the
simulator's record (xtask/gpusim/tests/nvml_clients.rs).

Usage: nvml_smi.py

Prints nvidia-smi's table on stderr (for whoever reads the test's output)
and one line `smi <json>` on stdout, then `end`. A reading NVML does not
support (as a passively cooled GPU's fan) is null, as nvidia-smi's `N/A`.
"""

import json
import sys

import pynvml as nvml

MIB = 1 << 20


def maybe(f, *args):
    try:
        return f(*args)
    except nvml.NVMLError_NotSupported:
        return None


def device(i):
    h = nvml.nvmlDeviceGetHandleByIndex(i)
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    mem2 = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
    procs = []
    for p in nvml.nvmlDeviceGetComputeRunningProcesses(h):
        procs.append({"pid": p.pid, "used": p.usedGpuMemory, "name": nvml.nvmlSystemGetProcessName(p.pid)})
    ecc_current, ecc_pending = nvml.nvmlDeviceGetEccMode(h)
    return {
        "index": nvml.nvmlDeviceGetIndex(h),
        "name": nvml.nvmlDeviceGetName(h),
        "uuid": nvml.nvmlDeviceGetUUID(h),
        "bus_id": nvml.nvmlDeviceGetPciInfo(h).busId,
        "minor": nvml.nvmlDeviceGetMinorNumber(h),
        "total": mem.total,
        "used": mem.used,
        "free": mem.free,
        "v2": {"total": mem2.total, "reserved": mem2.reserved, "used": mem2.used, "free": mem2.free},
        "util": nvml.nvmlDeviceGetUtilizationRates(h).gpu,
        "temperature": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        "power": nvml.nvmlDeviceGetPowerUsage(h),
        "power_limit": nvml.nvmlDeviceGetEnforcedPowerLimit(h),
        "fan": maybe(nvml.nvmlDeviceGetFanSpeed, h),
        "pstate": nvml.nvmlDeviceGetPerformanceState(h),
        "persistence": nvml.nvmlDeviceGetPersistenceMode(h),
        "display_active": nvml.nvmlDeviceGetDisplayActive(h),
        "ecc": ecc_current,
        "ecc_uncorrected": nvml.nvmlDeviceGetTotalEccErrors(
            h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
        "compute_mode": nvml.nvmlDeviceGetComputeMode(h),
        "mig": nvml.nvmlDeviceGetMigMode(h)[0],
        "cc": list(nvml.nvmlDeviceGetCudaComputeCapability(h)),
        "processes": procs,
    }


def table(smi):
    cuda = smi["cuda_version"]
    out = [
        f"NVIDIA-SMI {smi['driver_version']}  Driver Version: {smi['driver_version']}  "
        f"CUDA Version: {cuda // 1000}.{cuda % 1000 // 10}"
    ]
    for g in smi["gpus"]:
        fan = "N/A" if g["fan"] is None else f"{g['fan']}%"
        out.append(
            f"{g['index']:>3}  {g['name']:<28} {'On' if g['persistence'] else 'Off'}  "
            f"{g['bus_id']} {'On' if g['display_active'] else 'Off'}  {g['ecc_uncorrected']}"
        )
        out.append(
            f"{fan:>5} {g['temperature']}C P{g['pstate']} {g['power'] // 1000}W / "
            f"{g['power_limit'] // 1000}W  {g['used'] // MIB}MiB / {g['total'] // MIB}MiB  "
            f"{g['util']}%  {'Default' if g['compute_mode'] == 0 else g['compute_mode']}"
        )
    out.append("Processes: GPU  PID  Process name  GPU Memory Usage")
    for g in smi["gpus"]:
        for p in g["processes"]:
            out.append(f"  {g['index']:>3} {p['pid']:>7}  {p['name']:<20} {p['used'] // MIB}MiB")
    return "\n".join(out)


nvml.nvmlInit()
smi = {
    "driver_version": nvml.nvmlSystemGetDriverVersion(),
    "cuda_version": nvml.nvmlSystemGetCudaDriverVersion_v2(),
    "gpus": [device(i) for i in range(nvml.nvmlDeviceGetCount())],
}
nvml.nvmlShutdown()
print(table(smi), file=sys.stderr)
print("smi", json.dumps(smi), flush=True)
print("end", flush=True)
