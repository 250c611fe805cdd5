//! The watchdog's and the daemon's eBPF settings: the `[watchdog]` table of
//! the agent's configuration file.
//!
//! ```toml
//! [watchdog]
//! # The eBPF observer: "auto" (start it when root and the object loads,
//! # else say why in the view), "off", or "required" (the same, but a
//! # failure is logged as an error every retry; never fatal).
//! ebpf = "auto"
//! # The observer's object and the device guard's object (`cargo xtask
//! # build` puts both in target/tessera/<profile>/ebpf/).
//! ebpf_object = "/usr/lib/tessera/tessera.bpf.o"
//! guard_object = "/usr/lib/tessera/tessera-guard.bpf.o"
//! # Devices to watch and guard instead of the NVIDIA ones in /proc, as
//! # `[class=]path` or `[class=]major:minor` (the simulator's stand-ins).
//! # devices = ["control=/dev/null", "uvm=/dev/zero", "gpu=/dev/full"]
//! # Memory a process may hold on a GPU beyond the container's limit for
//! # its CUDA contexts when the container's metadata charges none
//! # (`overhead` of the GPU grant): what one context costs on the node's
//! # GPUs (300 to 500 MiB on current ones; the simulator's is 300).
//! context_allowance_mib = 512
//! # Where the deny action pins its device guards (on bpffs).
//! # deny_pin_dir = "/sys/fs/bpf/tessera/1/deny"
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use crate::ebpf::devices::{DeviceError, DeviceSpec};
use crate::ebpf::{Device, mounts};

/// Whether the daemon runs the eBPF observer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EbpfSetting {
    /// When it can; else the view says why not.
    #[default]
    Auto,
    /// Never.
    Off,
    /// Always expected: a failure is an error in the log (still not fatal:
    /// NVML-based detection goes on).
    Required,
}

/// The `[watchdog]` table as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchdogFile {
    /// See [`WatchdogSettings::ebpf`].
    pub ebpf: Option<EbpfSetting>,
    /// See [`WatchdogSettings::ebpf_object`].
    pub ebpf_object: Option<PathBuf>,
    /// See [`WatchdogSettings::guard_object`].
    pub guard_object: Option<PathBuf>,
    /// See [`WatchdogSettings::devices`].
    pub devices: Option<Vec<String>>,
    /// See [`WatchdogSettings::context_allowance`].
    pub context_allowance_mib: Option<u64>,
    /// See [`WatchdogSettings::deny_pin_dir`].
    pub deny_pin_dir: Option<PathBuf>,
}

/// The watchdog's settings, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchdogSettings {
    /// Whether to run the eBPF observer.
    pub ebpf: EbpfSetting,
    /// `tessera.bpf.o`.
    pub ebpf_object: PathBuf,
    /// `tessera-guard.bpf.o`.
    pub guard_object: PathBuf,
    /// Stand-in devices (empty: the NVIDIA devices found in `/proc`).
    pub devices: Vec<DeviceSpec>,
    /// Bytes per process allowed beyond the limit for uncharged contexts.
    pub context_allowance: u64,
    /// Pin directory of the deny action's guards.
    pub deny_pin_dir: PathBuf,
}

/// The context allowance unless configured (MiB).
pub const DEFAULT_CONTEXT_ALLOWANCE_MIB: u64 = 512;

/// Most accepted context allowance (MiB).
pub const MAX_CONTEXT_ALLOWANCE_MIB: u64 = 16 << 10;

/// `/sys/fs/bpf/tessera/<abi>/deny`.
pub fn default_deny_pin_dir() -> PathBuf {
    std::path::Path::new(mounts::BPFFS)
        .join("tessera")
        .join(tessera_ebpf_common::ABI_VERSION.to_string())
        .join("deny")
}

impl Default for WatchdogSettings {
    fn default() -> Self {
        Self {
            ebpf: EbpfSetting::Auto,
            ebpf_object: "/usr/lib/tessera/tessera.bpf.o".into(),
            guard_object: "/usr/lib/tessera/tessera-guard.bpf.o".into(),
            devices: Vec::new(),
            context_allowance: DEFAULT_CONTEXT_ALLOWANCE_MIB << 20,
            deny_pin_dir: default_deny_pin_dir(),
        }
    }
}

impl WatchdogSettings {
    /// Checks the table; the error names the field (under `watchdog.`)
    /// and what is accepted.
    pub fn from_file(file: WatchdogFile) -> Result<Self, (&'static str, String)> {
        let d = Self::default();
        let field = |f: &'static str, p: String| (f, p);
        let mut devices = Vec::new();
        for (i, spec) in file.devices.unwrap_or_default().iter().enumerate() {
            devices.push(
                spec.parse::<DeviceSpec>().map_err(|e: DeviceError| {
                    field("watchdog.devices", format!("entry {i}: {e}"))
                })?,
            );
        }
        let mib = file
            .context_allowance_mib
            .unwrap_or(DEFAULT_CONTEXT_ALLOWANCE_MIB);
        if mib > MAX_CONTEXT_ALLOWANCE_MIB {
            return Err(field(
                "watchdog.context_allowance_mib",
                format!("is {mib}; accepted: 0 to {MAX_CONTEXT_ALLOWANCE_MIB} (MiB)"),
            ));
        }
        let paths = [
            ("watchdog.ebpf_object", &file.ebpf_object),
            ("watchdog.guard_object", &file.guard_object),
            ("watchdog.deny_pin_dir", &file.deny_pin_dir),
        ];
        for (name, p) in paths {
            if let Some(p) = p
                && !p.is_absolute()
            {
                return Err(field(
                    name,
                    format!("{} is relative; accepted: an absolute path", p.display()),
                ));
            }
        }
        Ok(Self {
            ebpf: file.ebpf.unwrap_or(d.ebpf),
            ebpf_object: file.ebpf_object.unwrap_or(d.ebpf_object),
            guard_object: file.guard_object.unwrap_or(d.guard_object),
            devices,
            context_allowance: mib << 20,
            deny_pin_dir: file.deny_pin_dir.unwrap_or(d.deny_pin_dir),
        })
    }

    /// The devices to watch and guard: the configured stand-ins, else the
    /// NVIDIA devices of `/proc`.
    pub fn resolve_devices(&self) -> Result<Vec<Device>, DeviceError> {
        if self.devices.is_empty() {
            crate::ebpf::devices::discover(std::path::Path::new("/proc"))
        } else {
            self.devices.iter().map(DeviceSpec::resolve).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_checks() {
        let s = WatchdogSettings::from_file(WatchdogFile::default()).unwrap();
        assert_eq!(s, WatchdogSettings::default());
        let bad = WatchdogSettings::from_file(WatchdogFile {
            context_allowance_mib: Some(1 << 30),
            ..WatchdogFile::default()
        })
        .unwrap_err();
        assert_eq!(bad.0, "watchdog.context_allowance_mib");
        let bad = WatchdogSettings::from_file(WatchdogFile {
            devices: Some(vec!["gpu=".into()]),
            ..WatchdogFile::default()
        })
        .unwrap_err();
        assert_eq!(bad.0, "watchdog.devices");
        let bad = WatchdogSettings::from_file(WatchdogFile {
            guard_object: Some("rel.o".into()),
            ..WatchdogFile::default()
        })
        .unwrap_err();
        assert_eq!(bad.0, "watchdog.guard_object");
    }
}
