//! The one folder that holds every runnable artifact:
//! `target/tessera/<profile>/`.
//!
//! ```text
//! bin/   gpusim, tessera-agent, tessera-scheduler
//! lib/   libtessera.so                       (the in-container interposer)
//! sim/   libcuda.so.1, libnvidia-ml.so.1     (the simulated GPU node's driver
//!        libcuda.so, libnvidia-ml.so          libraries, plus link-time names)
//! ebpf/  tessera.bpf.o                       (eBPF observers)
//!        tessera-guard.bpf.o                 (the per-pod device guard)
//! ```

use std::path::{Path, PathBuf};

use crate::sh::workspace_root;

/// Paths inside the artifact folder of one build profile.
#[derive(Clone, Debug)]
pub struct Artifacts {
    pub dir: PathBuf,
}

impl Artifacts {
    pub fn for_profile(profile: &str) -> Self {
        Self {
            dir: workspace_root().join("target/tessera").join(profile),
        }
    }

    pub fn bin(&self) -> PathBuf {
        self.dir.join("bin")
    }
    pub fn lib(&self) -> PathBuf {
        self.dir.join("lib")
    }
    pub fn sim(&self) -> PathBuf {
        self.dir.join("sim")
    }
    pub fn ebpf(&self) -> PathBuf {
        self.dir.join("ebpf")
    }
    pub fn path(&self) -> &Path {
        &self.dir
    }
}
