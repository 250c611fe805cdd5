//! Device memory charged to the simulated GPU: the one sequence behind
//! every device allocation (linear, pitch, managed, pool, array, VMM
//! physical) and its release.
//!
//! A charge is rounded up to the node's allocation granularity and taken
//! from the process's channel (what NVML reports as the process's memory);
//! the stand-in driver sees an `NV_ESC_RM_ALLOC` of video memory for it,
//! and an `NV_ESC_RM_FREE` when it is given back. Linear allocations that
//! live in shared pages (see [`crate::heap`]) have no charge of their own
//! ([`Charge::none`]): their page holds one.

use gpusim::Attachment;
use gpusim::nvrm::NV01_MEMORY_LOCAL_USER;

use crate::process::{Process, sim_err};
use crate::status::CUresult;

/// Device memory charged to a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    /// The channel it is charged to; `att.gpu` is the device.
    pub att: Attachment,
    /// Bytes charged (rounded up to the allocation granularity).
    pub bytes: u64,
    /// RM object handle in the stand-in ioctl traffic.
    pub rm: u32,
}

impl Charge {
    /// No device memory of its own (an allocation inside a page that a
    /// charge of its own holds); giving it back does nothing.
    pub fn none(att: Attachment) -> Self {
        Self {
            att,
            bytes: 0,
            rm: 0,
        }
    }
}

impl Process {
    /// Charges `bytes` (rounded up) to channel `att`, or fails with
    /// `CUDA_ERROR_OUT_OF_MEMORY` and charges nothing.
    pub fn charge(&self, att: &Attachment, bytes: u64) -> Result<Charge, CUresult> {
        let bytes = self.sim.round_allocation(bytes);
        self.sim.alloc(att, bytes).map_err(sim_err)?;
        let rm = self
            .driver
            .alloc_memory(att.gpu, NV01_MEMORY_LOCAL_USER, bytes);
        Ok(Charge {
            att: *att,
            bytes,
            rm,
        })
    }

    /// Gives a charge back. The RM object is freed even if the simulator
    /// cannot take the bytes back (the channel may be gone); that error is
    /// returned.
    pub fn uncharge(&self, c: &Charge) -> Result<(), CUresult> {
        if c.bytes == 0 {
            return Ok(());
        }
        self.driver.free(c.att.gpu, c.rm);
        self.sim.free(&c.att, c.bytes).map_err(sim_err)
    }

    /// Gives `bytes` of charge `c` back and keeps the rest (and its RM
    /// object) in `c`.
    pub fn uncharge_part(&self, c: &mut Charge, bytes: u64) -> Result<(), CUresult> {
        let bytes = bytes.min(c.bytes);
        c.bytes -= bytes;
        self.sim.free(&c.att, bytes).map_err(sim_err)
    }
}
