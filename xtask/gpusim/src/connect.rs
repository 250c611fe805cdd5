//! What the stand-in `libcuda.so.1` (`cuInit`) and `libnvidia-ml.so.1`
//! (`nvmlInit`) open first: the simulated node from `GPUSIM_NODE` /
//! `GPUSIM_STATE`, then the stand-in driver devices, followed by the driver
//! version check the real libraries issue on `/dev/nvidiactl`.

use crate::ioctl::{Driver, OpenError};
use crate::sim::{Sim, SimError};

/// Why a process could not connect to the simulated node.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The node description or state file is unusable.
    #[error("cannot open the simulated GPU node")]
    Sim(#[source] SimError),
    /// A stand-in driver device could not be opened.
    #[error("cannot open the simulated driver")]
    Driver(#[source] OpenError),
}

/// A process's connection to the simulated node.
pub struct Connection {
    /// The simulated node.
    pub sim: Sim,
    /// The stand-in driver (ioctls).
    pub driver: Driver,
}

impl Connection {
    /// Opens the node named by the environment, as this process sees it
    /// (the GPUs whose stand-in device nodes it can open, see
    /// [`Sim::visible_only`]), and its stand-in devices, and issues
    /// `NV_ESC_CHECK_VERSION_STR`.
    pub fn from_env() -> Result<Self, ConnectError> {
        let sim = Sim::from_env().map_err(ConnectError::Sim)?.visible_only();
        let driver = Driver::open(sim.node()).map_err(ConnectError::Driver)?;
        driver.check_version();
        Ok(Self { sim, driver })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_joined_on_one_line() {
        let e = ConnectError::Driver(OpenError {
            path: "/dev/nvidiactl".into(),
            source: std::io::Error::other("no\nway"),
        });
        assert_eq!(
            tessera_error_chain::with_causes(&e),
            "cannot open the simulated driver: cannot open stand-in device /dev/nvidiactl: no way"
        );
    }
}
