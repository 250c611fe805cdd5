//! [`GpuBackend`] over NVML, through `nvml-wrapper` (loaded at run time).

use std::ffi::OsStr;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use super::{
    DriverInfo, GpuBackend, GpuDevice, GpuError, GpuLive, GpuProcess, GpuUsage, Health,
    cores_per_sm,
};

/// `NVML_NVLINK_MAX_LINKS`.
const NVLINK_MAX_LINKS: u32 = 18;

/// NVML, loaded and initialised; shut down on drop.
pub struct NvmlBackend {
    nvml: Nvml,
    /// The process list's buffer, kept between queries ([`tessera_nvml_sys`]).
    processes: std::sync::Mutex<Vec<nvml_wrapper_sys::bindings::nvmlProcessInfo_t>>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").finish_non_exhaustive()
    }
}

/// `Ok(None)` for what the GPU does not support.
fn optional<T>(r: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::NotSupported) => Ok(None),
        Err(e) => Err(e),
    }
}

impl NvmlBackend {
    /// Loads `library` (a file name or path) and calls `nvmlInit`.
    pub fn load(library: &OsStr) -> Result<Self, GpuError> {
        let nvml = Nvml::builder()
            .lib_path(library)
            .init()
            .map_err(|source| GpuError::Init {
                library: library.to_string_lossy().into_owned(),
                source,
            })?;
        Ok(Self {
            nvml,
            processes: std::sync::Mutex::default(),
        })
    }

    /// The NVML handle (for the compute controller's samples).
    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// GPU `index`'s minor number: its device node is `/dev/nvidia<minor>`
    /// (the device plugin passes it to the containers given the GPU).
    pub fn minor_number(&self, index: u32) -> Result<u32, GpuError> {
        self.handle(index)?
            .minor_number()
            .map_err(device_error(index, "minor number"))
    }

    fn handle(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, GpuError> {
        self.nvml
            .device_by_index(index)
            .map_err(|source| match source {
                NvmlError::InvalidArg => GpuError::NoSuchDevice {
                    index,
                    count: self.nvml.device_count().unwrap_or(0),
                },
                source => device_error(index, "handle")(source),
            })
    }

    /// GPU `index`'s processes, with each process's SM use from `sm` (pid
    /// → percent) instead of a query of its own (the daemon reads
    /// per-process utilisation once a period for its controllers; each
    /// NVML query is a driver round trip), and its memory totals, read
    /// unless `memory` gives them (`(used, free)` bytes: the daemon reads
    /// them less often than the processes).
    pub fn live_with(
        &self,
        index: u32,
        sm: impl Fn(u32) -> Option<u32>,
        memory: Option<(u64, u64)>,
    ) -> Result<GpuLive, GpuError> {
        let d = self.handle(index)?;
        self.live_of(&d, index, sm, memory)
    }

    fn live_of(
        &self,
        d: &nvml_wrapper::Device<'_>,
        index: u32,
        sm: impl Fn(u32) -> Option<u32>,
        memory: Option<(u64, u64)>,
    ) -> Result<GpuLive, GpuError> {
        let err = |what| device_error(index, what);
        let (used, free) = match memory {
            Some(m) => m,
            None => {
                let m = d.memory_info().map_err(err("memory"))?;
                (m.used, m.free)
            }
        };
        let mut buf = self
            .processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let processes = tessera_nvml_sys::running_compute_processes(d, &mut buf)
            .map_err(err("processes"))?
            .iter()
            .map(|&raw| {
                let p = nvml_wrapper::struct_wrappers::device::ProcessInfo::from(raw);
                GpuProcess {
                    pid: p.pid,
                    used_memory_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                    sm_percent: sm(p.pid),
                }
            })
            .collect();
        Ok(GpuLive {
            memory_used_bytes: used,
            memory_free_bytes: free,
            processes,
        })
    }
}

/// Turns a failed query on GPU `index` into a [`GpuError`].
fn device_error(index: u32, what: &'static str) -> impl Fn(NvmlError) -> GpuError {
    move |source| match source {
        NvmlError::GpuLost => GpuError::Lost { index },
        source => GpuError::Device {
            index,
            what,
            source,
        },
    }
}

/// SMs: from the device attributes (MIG devices), else cores per SM.
fn sm_count(d: &nvml_wrapper::Device<'_>, cc: Option<[u32; 2]>) -> Result<Option<u32>, NvmlError> {
    if let Some(a) = optional(d.attributes())? {
        return Ok(Some(a.multiprocessor_count));
    }
    let (Some(cores), Some(cc)) = (optional(d.num_cores())?, cc) else {
        return Ok(None);
    };
    Ok(Some(cores / cores_per_sm(cc)))
}

/// Remote PCI bus ids of the active NVLinks; links NVML does not support
/// are skipped, the first link number it rejects ends the list.
fn nvlinks(d: &nvml_wrapper::Device<'_>) -> Result<Vec<String>, NvmlError> {
    let mut remote = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        let l = d.link_wrapper_for(link);
        match l.is_active() {
            Ok(true) => remote.push(l.remote_pci_info()?.bus_id),
            Ok(false) | Err(NvmlError::NotSupported) => {}
            Err(NvmlError::InvalidArg) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(remote)
}

impl GpuBackend for NvmlBackend {
    fn driver(&self) -> Result<DriverInfo, GpuError> {
        let system = |what| move |source| GpuError::System { what, source };
        Ok(DriverInfo {
            driver_version: self
                .nvml
                .sys_driver_version()
                .map_err(system("driver version"))?,
            cuda_driver_version: self
                .nvml
                .sys_cuda_driver_version()
                .map_err(system("CUDA driver version"))?,
        })
    }

    fn device_count(&self) -> Result<u32, GpuError> {
        self.nvml.device_count().map_err(|source| GpuError::System {
            what: "device count",
            source,
        })
    }

    fn device(&self, index: u32) -> Result<GpuDevice, GpuError> {
        let d = self.handle(index)?;
        let err = |what| device_error(index, what);
        let uuid = d.uuid().map_err(err("UUID"))?;
        let name = d.name().map_err(err("name"))?;
        let pci_bus_id = d.pci_info().map_err(err("PCI information"))?.bus_id;
        let compute_capability = optional(d.cuda_compute_capability())
            .map_err(err("compute capability"))?
            .map(|c| [c.major.max(0) as u32, c.minor.max(0) as u32]);
        let sm_count = sm_count(&d, compute_capability).map_err(err("SM count"))?;
        let numa_node = optional(d.numa_node_id()).map_err(err("NUMA node"))?;
        // Live queries: a lost GPU keeps its identity but answers none.
        let live = (|| -> Result<_, NvmlError> {
            let memory = d.memory_info()?.total;
            let mig = optional(d.mig_mode())?.map(|m| m.current == 1);
            Ok((memory, mig, nvlinks(&d)?))
        })();
        let (memory_total_bytes, mig_enabled, nvlink_remote_bus_ids, health) = match live {
            Ok((m, mig, links)) => (Some(m), mig, links, Health::Healthy),
            Err(NvmlError::GpuLost) => (None, None, Vec::new(), Health::Lost),
            Err(e) => return Err(err("memory, MIG mode and NVLinks")(e)),
        };
        Ok(GpuDevice {
            index,
            uuid,
            name,
            pci_bus_id,
            memory_total_bytes,
            numa_node,
            sm_count,
            compute_capability,
            nvlink_remote_bus_ids,
            mig_enabled,
            health,
        })
    }

    fn usage(&self, index: u32, since_unix_us: u64) -> Result<GpuUsage, GpuError> {
        let d = self.handle(index)?;
        let mut buf = Vec::new();
        let samples = match tessera_nvml_sys::process_utilization(&d, since_unix_us, &mut buf) {
            Ok(s) => s,
            Err(NvmlError::NotFound) => &[],
            Err(e) => return Err(device_error(index, "process utilisation")(e)),
        };
        let util = d
            .utilization_rates()
            .map_err(device_error(index, "utilisation"))?;
        let live = self.live_of(
            &d,
            index,
            |pid| samples.iter().find(|s| s.pid == pid).map(|s| s.smUtil),
            None,
        )?;
        Ok(GpuUsage {
            memory_used_bytes: live.memory_used_bytes,
            memory_free_bytes: live.memory_free_bytes,
            utilization_gpu_percent: util.gpu,
            utilization_memory_percent: util.memory,
            processes: live.processes,
        })
    }
}
