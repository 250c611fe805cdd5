//! Real ioctl traffic on stand-in devices, so kernel-side observers see what
//! a process on a real GPU node would cause.
//!
//! Each simulated call that a real driver serves through an ioctl issues
//! one ioctl per device involved, with the real command number and
//! parameter layout of the reported driver version:
//!
//! | call | device | ioctl |
//! |---|---|---|
//! | `cuInit`, `nvmlInit` (once per process) | control | `NV_ESC_CHECK_VERSION_STR` |
//! | context creation on a GPU (first context of the process there) | gpu *i* (if configured) | `NV_ESC_REGISTER_FD` |
//! | | uvm | `UVM_REGISTER_GPU` with the GPU's UUID |
//! | last context on a GPU destroyed | uvm | `UVM_UNREGISTER_GPU` |
//! | device allocation (linear, pitch, pool, async, array, VMM physical) | control | `NV_ESC_RM_ALLOC`, class `NV01_MEMORY_LOCAL_USER` (0x40), size at offset 64 of the parameters |
//! | pinned host allocation | control | `NV_ESC_RM_ALLOC`, class `NV01_MEMORY_SYSTEM` (0x3E) |
//! | free of any of those | control | `NV_ESC_RM_FREE` |
//! | NVML memory, utilisation and process queries | control | `NV_ESC_RM_CONTROL` with the matching `NV2080_CTRL_CMD_*` |
//!
//! Launches, copies and synchronisation issue none: a real GPU takes work
//! through user-mapped doorbells. Managed memory issues none either (the
//! real driver creates it by `mmap` of nvidia-uvm).
//!
//! With `ioctl.xfer = true` every frontend escape travels wrapped in
//! `NV_ESC_IOCTL_XFER_CMD`. The stand-ins (by default `/dev/null`) reject
//! the commands with ENOTTY; only the syscall matters. Opening a stand-in
//! can fail (say, a device cgroup denies it); callers turn that into the
//! error a driver would return.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::node::NodeDescription;
use crate::nvrm::{self, Nvos00, Nvos54, Nvos64, Nvos64Legacy, Xfer};
use crate::sys;

/// `NV_ESC_REGISTER_FD`.
const NV_ESC_REGISTER_FD: u8 = 0xC9;

/// A stand-in device could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot open stand-in device {path}")]
pub struct OpenError {
    /// The device.
    pub path: PathBuf,
    /// Cause.
    #[source]
    pub source: io::Error,
}

/// The process's connection to the (stand-in) driver.
pub struct Driver {
    enabled: bool,
    xfer: bool,
    modern_layouts: bool,
    version: String,
    gpu_paths: Vec<Option<PathBuf>>,
    control: Option<OwnedFd>,
    uvm: Option<OwnedFd>,
    gpu_fds: Mutex<Vec<Option<OwnedFd>>>,
    client: u32,
    next_handle: AtomicU32,
}

impl Driver {
    /// Opens the control and UVM stand-ins (when ioctls are enabled).
    pub fn open(node: &NodeDescription) -> Result<Self, OpenError> {
        let cfg = &node.ioctl;
        let open = |p: &Path| {
            sys::open_device(p).map_err(|source| OpenError {
                path: p.to_path_buf(),
                source,
            })
        };
        let (control, uvm) = if cfg.enabled {
            (Some(open(&cfg.control)?), Some(open(&cfg.uvm)?))
        } else {
            (None, None)
        };
        let gpu_paths = (0..node.gpu.len())
            .map(|i| cfg.gpu_devices.get(i).cloned())
            .collect::<Vec<_>>();
        Ok(Self {
            enabled: cfg.enabled,
            xfer: cfg.xfer,
            modern_layouts: node.driver_major() >= nvrm::PARAMS_SIZE_SINCE_MAJOR,
            version: node.driver_version.clone(),
            gpu_fds: Mutex::new(gpu_paths.iter().map(|_| None).collect()),
            gpu_paths,
            control,
            uvm,
            client: 0xc1d0_0000 | (sys::getpid() as u32 & 0xffff),
            next_handle: AtomicU32::new(1),
        })
    }

    fn control_fd(&self) -> Option<RawFd> {
        self.control.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Issues a frontend escape on `fd`, wrapped in XFER when configured.
    fn escape<T>(&self, fd: RawFd, nr: u8, params: &mut T) {
        let size = size_of::<T>();
        let cmd = nvrm::iowr(nr, size);
        if self.xfer {
            // The driver switches on the bare escape number inside XFER.
            let mut x = Xfer {
                cmd: u32::from(nr),
                size: size as u32,
                ptr: params as *mut T as u64,
            };
            // SAFETY: x is a live nv_ioctl_xfer_t whose pointer refers to
            // `params`, valid for `size` bytes for the call's duration.
            unsafe {
                sys::ioctl(
                    fd,
                    nvrm::iowr(nvrm::NV_ESC_IOCTL_XFER_CMD, size_of::<Xfer>()),
                    (&mut x as *mut Xfer).cast(),
                )
            };
        } else {
            // SAFETY: params is valid for `size` bytes, which the command
            // encodes.
            unsafe { sys::ioctl(fd, cmd, (params as *mut T).cast()) };
        }
    }

    /// `NV_ESC_CHECK_VERSION_STR` (once per process, at init).
    pub fn check_version(&self) {
        let Some(fd) = self.control_fd() else { return };
        let mut p = nvrm::RmApiVersion {
            cmd: nvrm::NV_RM_API_VERSION_CMD_STRICT,
            reply: 0,
            version_string: [0; 64],
        };
        let v = self.version.as_bytes();
        let n = v.len().min(63);
        p.version_string[..n].copy_from_slice(&v[..n]);
        self.escape(fd, nvrm::NV_ESC_CHECK_VERSION_STR, &mut p);
    }

    /// Opens GPU `gpu`'s device stand-in (if configured) and registers the
    /// GPU with UVM: the first context of the process on that GPU.
    pub fn register_gpu(
        &self,
        gpu: usize,
        uuid: [u8; 16],
        numa_node: i32,
    ) -> Result<(), OpenError> {
        if !self.enabled {
            return Ok(());
        }
        if let Some(Some(path)) = self.gpu_paths.get(gpu) {
            let mut fds = self.gpu_fds.lock().unwrap_or_else(|p| p.into_inner());
            if fds[gpu].is_none() {
                let fd = sys::open_device(path).map_err(|source| OpenError {
                    path: path.clone(),
                    source,
                })?;
                let mut reg = self.control_fd().unwrap_or(-1);
                self.escape(fd.as_raw_fd(), NV_ESC_REGISTER_FD, &mut reg);
                fds[gpu] = Some(fd);
            }
        }
        if let Some(uvm) = &self.uvm {
            let mut p = nvrm::UvmRegisterGpu {
                gpu_uuid: uuid,
                numa_node_id: numa_node,
                rm_ctrl_fd: self.control_fd().unwrap_or(-1),
                h_client: self.client,
                ..Default::default()
            };
            // SAFETY: p is a live UVM_REGISTER_GPU_PARAMS.
            unsafe {
                sys::ioctl(
                    uvm.as_raw_fd(),
                    nvrm::UVM_REGISTER_GPU,
                    (&mut p as *mut nvrm::UvmRegisterGpu).cast(),
                )
            };
        }
        Ok(())
    }

    /// `UVM_UNREGISTER_GPU`: the last context on a GPU is gone.
    pub fn unregister_gpu(&self, uuid: [u8; 16]) {
        if let Some(uvm) = &self.uvm {
            let mut p = nvrm::UvmUnregisterGpu {
                gpu_uuid: uuid,
                rm_status: 0,
            };
            // SAFETY: p is a live UVM_UNREGISTER_GPU_PARAMS.
            unsafe {
                sys::ioctl(
                    uvm.as_raw_fd(),
                    nvrm::UVM_UNREGISTER_GPU,
                    (&mut p as *mut nvrm::UvmUnregisterGpu).cast(),
                )
            };
        }
    }

    /// `NV_ESC_RM_ALLOC` of a memory class; returns the new object's handle.
    pub fn alloc_memory(&self, gpu: usize, class: u32, bytes: u64) -> u32 {
        let handle = 0xbe00_0000 | (self.next_handle.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff);
        let Some(fd) = self.control_fd() else {
            return handle;
        };
        let mut params = nvrm::MemoryAllocationParams {
            owner: 0x6d65_6d31,
            size: bytes,
            numa_node: -1,
            ..Default::default()
        };
        let parent = 0xcaf0_0000 | gpu as u32;
        if self.modern_layouts {
            let mut p = Nvos64 {
                h_root: self.client,
                h_object_parent: parent,
                h_object_new: handle,
                h_class: class,
                p_alloc_parms: &mut params as *mut _ as u64,
                params_size: size_of::<nvrm::MemoryAllocationParams>() as u32,
                ..Default::default()
            };
            self.escape(fd, nvrm::NV_ESC_RM_ALLOC, &mut p);
        } else {
            let mut p = Nvos64Legacy {
                h_root: self.client,
                h_object_parent: parent,
                h_object_new: handle,
                h_class: class,
                p_alloc_parms: &mut params as *mut _ as u64,
                ..Default::default()
            };
            self.escape(fd, nvrm::NV_ESC_RM_ALLOC, &mut p);
        }
        handle
    }

    /// `NV_ESC_RM_FREE` of `handle`.
    pub fn free(&self, gpu: usize, handle: u32) {
        let Some(fd) = self.control_fd() else { return };
        let mut p = Nvos00 {
            h_root: self.client,
            h_object_parent: 0xcaf0_0000 | gpu as u32,
            h_object_old: handle,
            status: 0,
        };
        self.escape(fd, nvrm::NV_ESC_RM_FREE, &mut p);
    }

    /// `NV_ESC_RM_CONTROL` with `cmd` on GPU `gpu`'s subdevice.
    pub fn control(&self, gpu: usize, cmd: u32) {
        let Some(fd) = self.control_fd() else { return };
        let mut scratch = [0u64; 8];
        let mut p = Nvos54 {
            h_client: self.client,
            h_object: 0x5c00_0000 | gpu as u32,
            cmd,
            flags: 0,
            params: scratch.as_mut_ptr() as u64,
            params_size: size_of_val(&scratch) as u32,
            status: 0,
        };
        self.escape(fd, nvrm::NV_ESC_RM_CONTROL, &mut p);
    }
}
