//! Which pod and container a cgroup belongs to.
//!
//! The eBPF programs report cgroup ids (`bpf_get_current_cgroup_id`: the
//! inode number of the task's cgroup v2 directory). This module turns them
//! into pods:
//!
//! - [`path`]: a pure parser of kubelet's cgroup paths, for the systemd
//!   and cgroupfs drivers, containerd, CRI-O and cri-dockerd naming, every
//!   QoS class; paths under `kubepods` that match no known pattern are
//!   reported as unknown with the reason, never guessed;
//! - [`walk`]: builds the id → pod/container map from the v2 tree, and
//!   says when a hybrid host keeps the pods out of the v2 tree altogether;
//! - [`v2`]: where cgroup v2 is mounted and a directory's id.

#![forbid(unsafe_code)]

pub mod path;
pub mod v2;
pub mod walk;

pub use path::{Classified, ContainerRef, Driver, PodRef, QosClass, Runtime, classify};
pub use v2::{CgroupError, cgroup_id, cgroup2_root};
pub use walk::{CgroupEntry, CgroupMap, WalkError};
