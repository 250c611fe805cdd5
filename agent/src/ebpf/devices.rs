//! The set of devices the eBPF programs count: the NVIDIA device nodes,
//! discovered from `/proc`, or stand-ins named in configuration.
//!
//! NVIDIA numbers (see `reference/ebpf.md` §1): the frontend has the fixed
//! major 195 (`nvidiaN` = minor N, `nvidia-modeset` 254, `nvidiactl` 255);
//! `nvidia-uvm` and `nvidia-caps` get dynamic majors, listed in
//! `/proc/devices`. Each GPU's minor is the "Device Minor:" line of
//! `/proc/driver/nvidia/gpus/<pci>/information`.

use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tessera_ebpf_common::dev::{WatchedDevice, class, decode, kdev};

/// The NVIDIA frontend's major number.
pub const NVIDIA_MAJOR: u32 = 195;
/// `/dev/nvidia-modeset`'s minor.
pub const MODESET_MINOR: u32 = 254;
/// `/dev/nvidiactl`'s minor.
pub const CONTROL_MINOR: u32 = 255;

/// Errors finding devices.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A /proc file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A device spec is not `[class=]path` or `[class=]major:minor`.
    #[error("device spec {spec:?} is not [class=]path or [class=]major:minor")]
    BadSpec {
        /// The spec.
        spec: String,
    },
    /// A configured path is not a character device.
    #[error("{0} is not a character device")]
    NotCharDevice(PathBuf),
}

/// One watched device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// One of `tessera_ebpf_common::dev::class`.
    pub class: u32,
    /// A name for reports, e.g. `nvidia0` or `/dev/null`.
    pub label: String,
}

impl Device {
    fn new(major: u32, minor: u32, class: u32, label: impl Into<String>) -> Self {
        Self {
            major,
            minor,
            class,
            label: label.into(),
        }
    }

    /// The kernel `dev_t`, the key of the watched-devices map.
    pub fn kdev(&self) -> u32 {
        kdev(self.major, self.minor)
    }

    /// The value of the watched-devices map.
    pub fn watched(&self) -> WatchedDevice {
        let how = match self.class {
            class::UVM | class::UVM_TOOLS => decode::RAW,
            class::CONTROL | class::GPU | class::STAND_IN => decode::NV_FRONTEND,
            _ => decode::IOC_NR,
        };
        WatchedDevice {
            class: self.class,
            decode: how,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}:{})", self.label, self.major, self.minor)
    }
}

/// A configured stand-in: `[class=]target`, where target is a device node
/// path or `major:minor` and class one of [`CLASS_NAMES`] (default
/// `stand-in`, decoded like the NVIDIA frontend). E.g. `/dev/null`,
/// `uvm=/dev/zero`, `control=1:3`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// One of `tessera_ebpf_common::dev::class`.
    pub class: u32,
    /// The device.
    pub target: DeviceTarget,
}

/// The device a [`DeviceSpec`] names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceTarget {
    /// A device node, e.g. `/dev/null`.
    Path(PathBuf),
    /// Numbers, e.g. `1:3`.
    Number(u32, u32),
}

/// Class names accepted in a [`DeviceSpec`].
pub const CLASS_NAMES: [(&str, u32); 7] = [
    ("stand-in", class::STAND_IN),
    ("control", class::CONTROL),
    ("gpu", class::GPU),
    ("modeset", class::MODESET),
    ("uvm", class::UVM),
    ("uvm-tools", class::UVM_TOOLS),
    ("caps", class::CAPS),
];

impl DeviceSpec {
    /// A stand-in device node.
    pub fn path(path: impl Into<PathBuf>) -> Self {
        Self {
            class: class::STAND_IN,
            target: DeviceTarget::Path(path.into()),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let spec = s.trim();
        let bad = || DeviceError::BadSpec {
            spec: spec.to_owned(),
        };
        let (class, target) = match spec.split_once('=') {
            Some((name, target)) => {
                let class = CLASS_NAMES
                    .iter()
                    .find(|(n, _)| *n == name.trim())
                    .map(|(_, c)| *c)
                    .ok_or_else(bad)?;
                (class, target.trim())
            }
            None => (class::STAND_IN, spec),
        };
        let target = if target.starts_with('/') {
            DeviceTarget::Path(PathBuf::from(target))
        } else {
            let (major, minor) = target.split_once(':').ok_or_else(bad)?;
            DeviceTarget::Number(
                major.parse().map_err(|_| bad())?,
                minor.parse().map_err(|_| bad())?,
            )
        };
        Ok(Self { class, target })
    }
}

impl DeviceSpec {
    /// The device this spec names.
    pub fn resolve(&self) -> Result<Device, DeviceError> {
        match &self.target {
            DeviceTarget::Number(major, minor) => Ok(Device::new(
                *major,
                *minor,
                self.class,
                format!("{major}:{minor}"),
            )),
            DeviceTarget::Path(path) => {
                let meta = std::fs::metadata(path).map_err(|source| DeviceError::Read {
                    path: path.clone(),
                    source,
                })?;
                if !meta.file_type().is_char_device() {
                    return Err(DeviceError::NotCharDevice(path.clone()));
                }
                let (major, minor) = split_user_dev(meta.rdev());
                Ok(Device::new(
                    major,
                    minor,
                    self.class,
                    path.display().to_string(),
                ))
            }
        }
    }
}

/// Splits a user-space `dev_t` (glibc's encoding, as `stat` returns it).
pub fn split_user_dev(dev: u64) -> (u32, u32) {
    (libc::major(dev), libc::minor(dev))
}

/// The NVIDIA devices of this node, read from `proc` (normally `/proc`).
/// Always includes `nvidiactl` and `nvidia-modeset`, whose numbers are
/// fixed, so a driver loaded later is still seen on those.
pub fn discover(proc: &Path) -> Result<Vec<Device>, DeviceError> {
    let mut devices = vec![
        Device::new(NVIDIA_MAJOR, CONTROL_MINOR, class::CONTROL, "nvidiactl"),
        Device::new(
            NVIDIA_MAJOR,
            MODESET_MINOR,
            class::MODESET,
            "nvidia-modeset",
        ),
    ];
    for minor in gpu_minors(&proc.join("driver/nvidia/gpus"))? {
        devices.push(Device::new(
            NVIDIA_MAJOR,
            minor,
            class::GPU,
            format!("nvidia{minor}"),
        ));
    }
    let majors = read_optional(&proc.join("devices"))?.unwrap_or_default();
    if let Some(uvm) = char_major(&majors, "nvidia-uvm") {
        devices.push(Device::new(uvm, 0, class::UVM, "nvidia-uvm"));
        devices.push(Device::new(uvm, 1, class::UVM_TOOLS, "nvidia-uvm-tools"));
    }
    if let Some(caps) = char_major(&majors, "nvidia-caps") {
        for file in ["mig-minors", "sys-minors"] {
            let text = read_optional(&proc.join("driver/nvidia-caps").join(file))?;
            for minor in cap_minors(text.as_deref().unwrap_or_default()) {
                devices.push(Device::new(
                    caps,
                    minor,
                    class::CAPS,
                    format!("nvidia-cap{minor}"),
                ));
            }
        }
    }
    devices.sort_by_key(Device::kdev);
    devices.dedup_by_key(|d| d.kdev());
    Ok(devices)
}

fn read_optional(path: &Path) -> Result<Option<String>, DeviceError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(DeviceError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Minors of the GPUs listed under `/proc/driver/nvidia/gpus`.
fn gpu_minors(gpus: &Path) -> Result<Vec<u32>, DeviceError> {
    let entries = match std::fs::read_dir(gpus) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(DeviceError::Read {
                path: gpus.to_owned(),
                source,
            });
        }
    };
    let mut minors = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| DeviceError::Read {
            path: gpus.to_owned(),
            source,
        })?;
        let info = read_optional(&entry.path().join("information"))?;
        if let Some(minor) = info.as_deref().and_then(device_minor) {
            minors.push(minor);
        }
    }
    Ok(minors)
}

/// The "Device Minor:" value of a GPU's `information` file.
fn device_minor(information: &str) -> Option<u32> {
    information.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "Device Minor").then(|| value.trim().parse().ok())?
    })
}

/// The major of character device `name` in the text of `/proc/devices`
/// (e.g. `nvidia-uvm`, `nvidia-caps`: dynamic majors).
pub fn char_major(proc_devices: &str, name: &str) -> Option<u32> {
    proc_devices
        .lines()
        .skip_while(|l| !l.starts_with("Character devices:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| {
            let (major, dev) = l.trim().split_once(char::is_whitespace)?;
            (dev.trim() == name).then(|| major.parse().ok())?
        })
}

/// Minors in `/proc/driver/nvidia-caps/{mig,sys}-minors` ("<cap path> <minor>").
fn cap_minors(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.lines()
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
}

#[cfg(test)]
mod tests;
