//! Command-line and environment settings of the eBPF observer.

use std::path::PathBuf;

use super::devices::{self, Device, DeviceError, DeviceSpec};
use super::mode::ModeRequest;
use super::observer::ObserverConfig;

/// eBPF observer flags, to be flattened into the agent's arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct EbpfArgs {
    /// The eBPF object (`tessera.bpf.o`).
    #[arg(
        long = "ebpf-object",
        env = "TESSERA_EBPF_OBJECT",
        default_value = "/usr/lib/tessera/tessera.bpf.o"
    )]
    pub object: PathBuf,
    /// How to observe ioctls: auto, kprobe, tracepoint or raw-tracepoint.
    #[arg(
        long = "ebpf-attach",
        env = "TESSERA_EBPF_ATTACH",
        default_value = "auto"
    )]
    pub attach: ModeRequest,
    /// Devices to watch instead of the NVIDIA ones found in /proc,
    /// comma separated: `[class=]path` or `[class=]major:minor`, class one
    /// of stand-in (default), control, gpu, modeset, uvm, uvm-tools, caps
    /// (e.g. `control=/dev/null,uvm=/dev/zero`).
    #[arg(
        long = "ebpf-devices",
        env = "TESSERA_EBPF_DEVICES",
        value_delimiter = ','
    )]
    pub devices: Vec<DeviceSpec>,
    /// NVIDIA driver version whose ioctl parameter layouts to decode
    /// (e.g. `595.45.04`, or the simulator's); default: the running
    /// module's (`/proc/driver/nvidia/version`), else the newest known.
    #[arg(
        long = "ebpf-driver-version",
        env = "TESSERA_EBPF_DRIVER_VERSION",
        value_parser = parse_driver_major
    )]
    pub driver_major: Option<u32>,
}

/// A `--ebpf-driver-version` that is not a driver version.
#[derive(Debug, thiserror::Error)]
#[error("driver version {version:?} is not <major>.<minor>[.<patch>] (e.g. 595.45.04)")]
struct DriverVersionError {
    version: String,
}

/// The major of a driver version string.
fn parse_driver_major(s: &str) -> Result<u32, DriverVersionError> {
    super::driver::major_of_version(s).ok_or_else(|| DriverVersionError {
        version: s.to_owned(),
    })
}

impl EbpfArgs {
    /// The devices to watch: the configured stand-ins, else discovery.
    pub fn devices(&self) -> Result<Vec<Device>, DeviceError> {
        if self.devices.is_empty() {
            devices::discover(std::path::Path::new("/proc"))
        } else {
            self.devices.iter().map(DeviceSpec::resolve).collect()
        }
    }

    /// The observer configuration these flags describe.
    pub fn config(&self) -> Result<ObserverConfig, DeviceError> {
        let mut config = ObserverConfig::new(self.object.clone(), self.devices()?);
        config.mode = self.attach;
        config.driver_major = self.driver_major;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::ebpf::mode::AttachMode;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        ebpf: EbpfArgs,
    }

    #[test]
    fn parses_flags() {
        let cli = Cli::try_parse_from([
            "agent",
            "--ebpf-attach",
            "raw-tracepoint",
            "--ebpf-devices",
            "/dev/null,uvm=1:5",
            "--ebpf-driver-version",
            "530.30.02",
        ])
        .unwrap();
        assert_eq!(
            cli.ebpf.attach,
            ModeRequest::Only(AttachMode::RawTracepoint)
        );
        let config = cli.ebpf.config().unwrap();
        assert_eq!(config.driver_major, Some(530));
        let numbers: Vec<(u32, u32)> = config.devices.iter().map(|d| (d.major, d.minor)).collect();
        assert_eq!(numbers, [(1, 3), (1, 5)]);
        assert_eq!(
            config.devices[1].class,
            tessera_ebpf_common::dev::class::UVM
        );
    }

    #[test]
    fn rejects_bad_mode() {
        assert!(Cli::try_parse_from(["agent", "--ebpf-attach", "lsm"]).is_err());
    }

    #[test]
    fn rejects_bad_driver_version() {
        let err = Cli::try_parse_from(["agent", "--ebpf-driver-version", "latest"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("is not <major>.<minor>"), "{err}");
        let cli = Cli::try_parse_from(["agent"]).unwrap();
        assert_eq!(cli.ebpf.driver_major, None);
    }
}
