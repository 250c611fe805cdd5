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
        out(dev, ordinal)
    }

    fn cuDeviceGetCount(count: *mut c_int) {
        let p = process::get()?;
        out(count, p.sim.gpu_count() as c_int)
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        let p = process::get()?;
        let d = p.device(dev)?;
        copy_str(name, len, &p.sim.node().gpu[d].model)
    }

    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) {
        let p = process::get()?;
        let d = p.device(dev)?;
        out(uuid, CUuuid { bytes: p.sim.uuid_bytes(d) })
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        let p = process::get()?;
        let d = p.device(dev)?;
        out(bytes, (p.sim.node().gpu[d].memory_mib << 20) as usize)
    }

    fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: CUdevice) {
        let p = process::get()?;
        out(value, device::attribute(p, dev, attrib)?)
    }

    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) {
        let p = process::get()?;
        let d = p.device(dev)?;
        let [a, b] = p.sim.node().gpu[d].compute_capability;
        out(major, a as c_int)?;
        out(minor, b as c_int)
    }

    fn cuDeviceGetPCIBusId(id: *mut c_char, len: c_int, dev: CUdevice) {
        let p = process::get()?;
        copy_str(id, len, &device::pci_bus_id(p, dev)?)
    }

    fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) {
        let p = process::get()?;
        out(dev, device::by_pci_bus_id(p, cstr(id)?)?)
    }

    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) {
        let p = process::get()?;
        out(can, c_int::from(device::can_access_peer(p, dev, peer)?))
    }

    fn cuDeviceGetP2PAttribute(value: *mut c_int, attrib: c_int, src: CUdevice, dst: CUdevice) {
        let p = process::get()?;
        let linked = device::can_access_peer(p, src, dst)?;
        out(value, match attrib {
            // PERFORMANCE_RANK
            1 => c_int::from(!linked),
            // ACCESS_SUPPORTED, NATIVE_ATOMIC_SUPPORTED, CUDA_ARRAY_ACCESS_SUPPORTED
            2..=4 => c_int::from(linked),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }
}

super::cu_alias! {
    cuDeviceGetUuid_v2 => cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice);
}
