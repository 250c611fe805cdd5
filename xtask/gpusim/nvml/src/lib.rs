//! Stand-in `libnvidia-ml.so.1`: the NVML C API over the simulated GPU node.
//!
//! Programs linked against NVML (or loading it with `dlopen`, as
//! `nvml-wrapper` does) see the GPUs of the node description
//! (`GPUSIM_NODE`) with the live state every process shares
//! (`GPUSIM_STATE`): memory held by simulated CUDA processes, utilisation
//! from the simulated timelines, injected Xids, lost GPUs.
//!
//! - [`api`]: the exported functions (a thin shell each);
//! - [`library`]: `nvmlInit` / `nvmlShutdown` and the open node;
//! - [`handle`], [`events`]: opaque handles, validated without being
//!   dereferenced;
//! - [`ptr`]: the only code that touches callers' memory;
//! - [`guard`]: panics become `NVML_ERROR_UNKNOWN`;
//! - [`abi`], [`error`]: layouts, constants and return codes of `nvml.h`;
//! - [`pci`], [`sensors`]: PCI identity; clocks, temperature, power.

#![deny(missing_docs)]

pub mod abi;
// The C entry points; unit tests build them without their exported names
// (no symbol of a test binary may interpose on a real library), so the
// ones no unit test calls are unused there.
#[cfg_attr(test, allow(dead_code))]
mod api;
pub mod error;
pub mod events;
pub mod guard;
pub mod handle;
pub mod library;
pub mod pci;
pub mod ptr;
pub mod sensors;
