//! Shared by the integration tests: the built artifacts, a private
//! simulated node per test, and C programs compiled against the stand-in.

#![allow(dead_code, reason = "each test binary uses a different subset")]
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use tessera_testkit::sim as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{Gpu, NodeSpec};
pub use support::{Node, cc, sim_dir};

/// The C sources of the tests.
pub fn c_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c")
}

/// What the NVML tests do on a [`Node`].
pub trait NodeExt {
    /// Compiles `tests/c/<source>` into this node's folder. `link` links it
    /// against the stand-in (with an rpath); otherwise it gets `-ldl`.
    fn compile(&self, source: &str, link: bool) -> PathBuf;
}

impl NodeExt for Node {
    fn compile(&self, source: &str, link: bool) -> PathBuf {
        let exe = self.dir.path().join(source.trim_end_matches(".c"));
        let src = c_dir().join(source);
        let sim = sim_dir();
        let mut args = vec![
            "-std=c99".to_string(),
            "-o".into(),
            exe.display().to_string(),
            src.display().to_string(),
        ];
        if link {
            args.push(format!("-L{}", sim.display()));
            args.push(format!("-Wl,-rpath,{}", sim.display()));
            args.push("-lnvidia-ml".into());
        } else {
            args.push("-ldl".into());
        }
        cc(&args.iter().map(String::as_str).collect::<Vec<_>>());
        exe
    }
}

/// Runs a command to completion.
pub fn run(mut c: Command) -> Output {
    c.output().unwrap()
}

/// `key=value` lines as a map.
pub fn keys(stdout: &[u8]) -> BTreeMap<String, String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A node of three GPUs: two NVLinked A100s on NUMA node 0 (MIG on the
/// first) and an L4 on NUMA node 1.
pub fn three_gpus() -> NodeSpec {
    let a100 = || {
        Gpu::new("NVIDIA A100-SXM4-80GB", 81920)
            .sms(108)
            .compute_capability(8, 0)
            .numa(0)
    };
    NodeSpec::new()
        .driver_version("550.54.15")
        .cuda_version(12040)
        .gpu(
            a100()
                .reserved_mib(512)
                .nvlink(&[1])
                .uuid("GPU-11111111-2222-3333-4444-555555555555")
                .pci_bus_id("0000:3b:00.0")
                .pci_device_id(0x20b2_10de)
                .mig_enabled(),
        )
        .gpu(a100().nvlink(&[0]).pci_bus_id("0000:5e:00.0"))
        .gpu(
            Gpu::new("NVIDIA L4", 23034)
                .sms(58)
                .compute_capability(8, 9)
                .numa(1),
        )
}
