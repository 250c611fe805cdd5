//! Library lifetime: `nvmlInit` / `nvmlShutdown` reference counting and the
//! process's connection to the simulated node.
//!
//! The first `nvmlInit` opens the node (`GPUSIM_NODE` / `GPUSIM_STATE`) and
//! the stand-in driver devices and issues the driver version check, as
//! real NVML does when it opens `/dev/nvidiactl`; later calls only count.
//! The last `nvmlShutdown` closes both. If the node cannot be opened,
//! `nvmlInit` returns `NVML_ERROR_DRIVER_NOT_LOADED` (a stand-in device
//! that may not be opened: `NVML_ERROR_NO_PERMISSION`) and prints one line
//! to stderr naming the problem and its causes.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use gpusim::Sim;
use gpusim::connect::{ConnectError, Connection};
use gpusim::ioctl::Driver;

use crate::error::NvmlError;
use crate::handle;

/// The code `nvmlInit` returns when the node cannot be opened.
pub fn init_code(e: &ConnectError) -> NvmlError {
    match e {
        ConnectError::Driver(e) if e.source.kind() == std::io::ErrorKind::PermissionDenied => {
            NvmlError::NoPermission
        }
        _ => NvmlError::DriverNotLoaded,
    }
}

/// What an initialised library holds.
pub struct Context {
    /// The simulated node.
    pub sim: Sim,
    /// The stand-in driver (ioctls).
    pub driver: Driver,
}

impl Context {
    fn open() -> Result<Self, ConnectError> {
        let Connection { sim, driver } = Connection::from_env()?;
        Ok(Self { sim, driver })
    }

    /// Number of GPUs.
    pub fn gpu_count(&self) -> usize {
        self.sim.gpu_count()
    }

    /// The GPU a handle names, if it is ours and present on this node.
    pub fn gpu(&self, device: crate::abi::DeviceHandle) -> Result<usize, NvmlError> {
        handle::index(device)
            .filter(|&i| i < self.gpu_count())
            .ok_or(NvmlError::InvalidArgument)
    }

    /// Fails with `NVML_ERROR_GPU_IS_LOST` when `gpu` has been marked lost.
    pub fn live(&self, gpu: usize) -> Result<(), NvmlError> {
        if self.sim.is_lost(gpu)? {
            return Err(NvmlError::GpuIsLost);
        }
        Ok(())
    }
}

struct Library {
    refs: u32,
    context: Option<Arc<Context>>,
}

static LIBRARY: Mutex<Library> = Mutex::new(Library {
    refs: 0,
    context: None,
});

fn library() -> MutexGuard<'static, Library> {
    LIBRARY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `nvmlInit`: opens the node on the first call, counts the others.
pub fn init() -> Result<(), NvmlError> {
    let mut lib = library();
    if lib.refs > 0 {
        lib.refs += 1;
        return Ok(());
    }
    match Context::open() {
        Ok(ctx) => {
            lib.context = Some(Arc::new(ctx));
            lib.refs = 1;
            Ok(())
        }
        Err(e) => {
            eprintln!(
                "libnvidia-ml (gpusim): {}",
                tessera_error_chain::with_causes(&e)
            );
            Err(init_code(&e))
        }
    }
}

/// `nvmlShutdown`: closes the node when the count drops to zero.
pub fn shutdown() -> Result<(), NvmlError> {
    let mut lib = library();
    if lib.refs == 0 {
        return Err(NvmlError::Uninitialized);
    }
    lib.refs -= 1;
    if lib.refs == 0 {
        lib.context = None;
        drop(lib);
        crate::events::clear();
    }
    Ok(())
}

/// The initialised library, or `NVML_ERROR_UNINITIALIZED`.
pub fn context() -> Result<Arc<Context>, NvmlError> {
    library().context.clone().ok_or(NvmlError::Uninitialized)
}
