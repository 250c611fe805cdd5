//! The Tessera node agent.
//!
//! One agent runs on every GPU node. So far it takes the GPU inventory
//! through NVML ([`gpu`]); the device plugin, eBPF observation and the
//! compute controller arrive in later changes (see `design.md`).

#![forbid(unsafe_code)]

pub mod cgroup;
pub mod ebpf;
pub mod gpu;
