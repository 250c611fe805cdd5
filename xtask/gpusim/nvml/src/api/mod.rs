//! The exported C functions, grouped as the NVML documentation groups
//! them. Each is a thin shell: it runs its body in [`guard::entry`]
//! (panics become `NVML_ERROR_UNKNOWN`), resolves the library context and
//! device handle, and reads and writes the caller's memory only through
//! [`ptr`].
//!
//! The functions are `unsafe extern "C"`: their pointer arguments must be
//! NULL or valid as the NVML API documents, which C callers guarantee.
//!
//! [`guard::entry`]: crate::guard::entry
//! [`ptr`]: crate::ptr

#![allow(
    non_snake_case,
    clippy::missing_safety_doc,
    reason = "exported under NVML's C names; the safety contract is the NVML API's"
)]

mod device;
mod events;
mod modes;
mod system;
mod topology;
mod usage;
