//! Device enumeration and attributes.

use std::ffi::{c_char, c_int};

use super::cu_export;
use super::ptr::{copy_str, cstr, out};
use crate::abi::*;
use crate::device;
use crate::process;
use crate::status::*;

cu_export! {
    fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) {
        let p = process::get()?;
        p.device(ordinal)?;
        // SAFETY: the caller's contract: `dev` is NULL or points to a
        // writable CUdevice; `out` rejects NULL.
        unsafe { out(dev, ordinal) }
    }

    fn cuDeviceGetCount(count: *mut c_int) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `count` is NULL or points to a
        // writable int; `out` rejects NULL.
        unsafe { out(count, p.sim.gpu_count() as c_int) }
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        let p = process::get()?;
        let d = p.device(dev)?;
        // SAFETY: the caller's contract: `name` is NULL or valid for
        // writing `len` bytes; `copy_str` rejects NULL and `len <= 0`.
        unsafe { copy_str(name, len, &p.sim.node().gpu[d].model) }
    }

    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) {
        let p = process::get()?;
        let d = p.device(dev)?;
        let v = CUuuid { bytes: p.sim.uuid_bytes(d) };
        // SAFETY: the caller's contract: `uuid` is NULL or points to a
        // writable CUuuid; `out` rejects NULL.
        unsafe { out(uuid, v) }
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        let p = process::get()?;
        let d = p.device(dev)?;
        let v = (p.sim.node().gpu[d].memory_mib << 20) as usize;
        // SAFETY: the caller's contract: `bytes` is NULL or points to a
        // writable size_t; `out` rejects NULL.
        unsafe { out(bytes, v) }
    }

    fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: CUdevice) {
        let p = process::get()?;
        let v = device::attribute(p, dev, attrib)?;
        // SAFETY: the caller's contract: `value` is NULL or points to a
        // writable int; `out` rejects NULL.
        unsafe { out(value, v) }
    }

    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) {
        let p = process::get()?;
        let d = p.device(dev)?;
        let [a, b] = p.sim.node().gpu[d].compute_capability;
        // SAFETY: the caller's contract: `major` and `minor` are each NULL
        // or point to a writable int; `out` rejects NULL.
        unsafe {
            out(major, a as c_int)?;
            out(minor, b as c_int)
        }
    }

    fn cuDeviceGetPCIBusId(id: *mut c_char, len: c_int, dev: CUdevice) {
        let p = process::get()?;
        let bus_id = device::pci_bus_id(p, dev)?;
        // SAFETY: the caller's contract: `id` is NULL or valid for writing
        // `len` bytes; `copy_str` rejects NULL and `len <= 0`.
        unsafe { copy_str(id, len, &bus_id) }
    }

    fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `id` is NULL or a NUL-terminated
        // string that outlives this call; `cstr` rejects NULL.
        let id = unsafe { cstr(id) }?;
        let v = device::by_pci_bus_id(p, id)?;
        // SAFETY: the caller's contract: `dev` is NULL or points to a
        // writable CUdevice; `out` rejects NULL.
        unsafe { out(dev, v) }
    }

    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) {
        let p = process::get()?;
        let v = c_int::from(device::can_access_peer(p, dev, peer)?);
        // SAFETY: the caller's contract: `can` is NULL or points to a
        // writable int; `out` rejects NULL.
        unsafe { out(can, v) }
    }

    fn cuDeviceGetP2PAttribute(value: *mut c_int, attrib: c_int, src: CUdevice, dst: CUdevice) {
        let p = process::get()?;
        let linked = device::can_access_peer(p, src, dst)?;
        let v = match attrib {
            // PERFORMANCE_RANK
            1 => c_int::from(!linked),
            // ACCESS_SUPPORTED, NATIVE_ATOMIC_SUPPORTED, CUDA_ARRAY_ACCESS_SUPPORTED
            2..=4 => c_int::from(linked),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: the caller's contract: `value` is NULL or points to a
        // writable int; `out` rejects NULL.
        unsafe { out(value, v) }
    }
}

super::cu_alias! {
    cuDeviceGetUuid_v2 => cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice);
}
