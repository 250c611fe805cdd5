//! eBPF observation of NVIDIA device use, per cgroup.
//!
//! The programs live in `agent-ebpf/programs` and are built into
//! `tessera.bpf.o` by `cargo xtask build`; this module loads them.
//!
//! - [`btf`]: struct offsets from the kernel's BTF, passed to the programs
//!   as the `TESSERA_CONFIG` global (Rust eBPF has no CO-RE yet);
//! - [`devices`]: which devices to count (NVIDIA nodes from `/proc`, or
//!   stand-ins such as `/dev/null` for tests and the simulator);
//! - [`mode`]: kprobe, syscall tracepoint or raw tracepoint, probed and
//!   tried in order;
//! - [`observer`]: load, attach ([`load`]), read the per-CPU counts, GPU
//!   use and memory estimates ([`counts`]);
//! - [`bypass`]: preload registration, watched (GPU pod) cgroups, and the
//!   ring buffer of processes that skip the preload;
//! - [`driver`]: the NVIDIA driver version, for parameter layouts;
//! - [`guard`]: the per-pod cgroup device guard, pinned in bpffs;
//! - [`mounts`]: tracefs and bpffs when the host has not mounted them;
//! - `kfunc`: the programs' `bpf_rdonly_cast` calls, given the kernel's
//!   BTF id before loading;
//! - `verdict`: the epochs of the programs' device and cgroup caches.
//!
//! Opens are counted by an audit-only cgroup device program rather than a
//! syscall hook: the kernel hands it the device number, so it needs no fd
//! walk, sees every open path (including io_uring), and costs nothing
//! outside device-node opens. It counts permission checks, so `access(2)`
//! and failed opens count too.

pub mod args;
pub mod btf;
pub mod bypass;
pub mod counts;
pub mod devices;
pub mod driver;
pub mod guard;
mod kfunc;
mod load;
pub mod mode;
pub mod mounts;
pub mod observer;
mod verdict;

pub use bypass::{Access, Bypass, BypassEvents};
pub use counts::{ProgramStats, Snapshot};
pub use devices::{Device, DeviceSpec, DeviceTarget};
pub use guard::{GuardDevices, GuardError, GuardInfo, Guards};
pub use mode::{AttachMode, ModeRequest};
pub use observer::{Observer, ObserverConfig, ObserverError, OpenAudit};
