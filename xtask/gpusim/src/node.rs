//! The node description: which GPUs the simulated node has, how fast they
//! are, and which character devices stand in for the NVIDIA device nodes.
//!
//! It is a TOML file (`GPUSIM_NODE`), validated as a whole; every problem is
//! reported with the field it concerns. Without a file the node is
//! [`NodeDescription::default_node`]: two H100s joined by NVLink.
//!
//! ```toml
//! driver_version = "595.45.04"   # what NVML and cuDriverGetVersion report
//! cuda_version = 12080
//!
//! [[gpu]]
//! model = "NVIDIA H100 80GB HBM3"
//! memory_mib = 81559
//! sm_count = 132
//! numa_node = 0
//! nvlink_peers = [1]
//!
//! [cost]                          # see `cost.rs` for the model
//! wave_ns = 20000
//! [cost.functions.my_kernel]
//! fixed_ns = 500000
//!
//! [ioctl]                         # stand-ins for /dev/nvidiactl, /dev/nvidia-uvm
//! control = "/dev/null"
//! uvm = "/dev/zero"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::layout::{MAX_GPUS, QUEUE_CAPACITY};
use crate::pci::PciAddress;

/// Why a node description was rejected.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The file could not be read.
    #[error("cannot read node description {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for a node description.
    #[error("node description {path} is malformed: {message}")]
    Parse {
        /// The file (or `<inline>`).
        path: PathBuf,
        /// Parser message, with line and column.
        message: String,
    },
    /// A field has a value outside its accepted range.
    #[error("node description {path}: {field} {problem}")]
    Invalid {
        /// The file (or `<inline>`).
        path: PathBuf,
        /// The field, e.g. `gpu[1].sm_count`.
        field: String,
        /// What is wrong and what is accepted.
        problem: String,
    },
}

/// A simulated node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDescription {
    /// Driver version string reported by NVML, e.g. `595.45.04`. Also picks
    /// the ioctl parameter layouts (e.g. NVOS64 grew in 535).
    #[serde(default = "default_driver_version")]
    pub driver_version: String,
    /// CUDA driver API version (`cuDriverGetVersion`), e.g. 12080 for 12.8.
    #[serde(default = "default_cuda_version")]
    pub cuda_version: i32,
    /// The GPUs, in index order.
    pub gpu: Vec<GpuDescription>,
    /// Kernel and copy cost model.
    #[serde(default)]
    pub cost: CostDescription,
    /// Scheduling of contending processes on one GPU.
    #[serde(default)]
    pub scheduler: SchedulerDescription,
    /// Stand-in devices for driver ioctls.
    #[serde(default)]
    pub ioctl: IoctlDescription,
}

/// One simulated GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuDescription {
    /// Marketing name, as `nvmlDeviceGetName` and `cuDeviceGetName` report.
    pub model: String,
    /// Framebuffer size in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Maximum resident threads per SM.
    #[serde(default = "default_threads_per_sm")]
    pub max_threads_per_sm: u32,
    /// Compute capability, e.g. `[9, 0]`.
    #[serde(default = "default_compute_capability")]
    pub compute_capability: [u32; 2],
    /// NUMA node of the GPU's PCIe root, or -1 when unknown.
    #[serde(default)]
    pub numa_node: i32,
    /// Indices of GPUs reachable over NVLink.
    #[serde(default)]
    pub nvlink_peers: Vec<u32>,
    /// UUID (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`); derived from the
    /// index when absent.
    #[serde(default)]
    pub uuid: Option<String>,
    /// PCI bus id (`0000:bb:dd.f`, or any form [`PciAddress::parse`]
    /// accepts); derived from the index when absent.
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    /// PCI device id (upper 16 bits) and vendor id 0x10de (lower 16 bits).
    #[serde(default = "default_pci_device_id")]
    pub pci_device_id: u32,
    /// Memory the driver keeps for itself, in MiB (never allocatable).
    #[serde(default)]
    pub reserved_mib: u64,
    /// Whether MIG mode is reported as enabled (no MIG devices are simulated).
    #[serde(default)]
    pub mig_enabled: bool,
}

/// The cost model's parameters (see `cost.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostDescription {
    /// Time for one wave of blocks across all SMs, in ns.
    pub wave_ns: u64,
    /// Fixed cost of any kernel, in ns.
    pub kernel_fixed_ns: u64,
    /// Copy bandwidth in bytes per µs (e.g. 25000 = 25 GB/s).
    pub copy_bytes_per_us: u64,
    /// Fixed cost of any copy, in ns.
    pub copy_fixed_ns: u64,
    /// Memory a context costs on its GPU, in MiB.
    pub context_overhead_mib: u64,
    /// The device page, in KiB: the VMM granularity, what pool, managed
    /// and array allocations are rounded up to, and the page linear
    /// allocations are placed in (small ones share pages, see
    /// `gpusim_cuda::heap`).
    pub alloc_granularity_kib: u64,
    /// Per-function overrides, by kernel name.
    pub functions: BTreeMap<String, FunctionCost>,
}

/// Cost of one named kernel; each field replaces the model's value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCost {
    /// Fixed duration, ignoring the grid (ns).
    pub fixed_ns: Option<u64>,
    /// Wave time for this function (ns).
    pub wave_ns: Option<u64>,
}

/// How a GPU shares time between processes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerDescription {
    /// Time slice a process gets before the next contending one runs (µs).
    pub timeslice_us: u64,
    /// Pending launches a process may have queued on one GPU before
    /// launching blocks, like a full push buffer.
    pub queue_depth: u32,
    /// Window of `nvmlDeviceGetUtilizationRates` (ms).
    pub utilization_window_ms: u64,
}

/// Stand-in character devices for the driver's ioctls.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IoctlDescription {
    /// Issue ioctls at all.
    pub enabled: bool,
    /// Stands in for `/dev/nvidiactl` (RM escapes).
    pub control: PathBuf,
    /// Stands in for `/dev/nvidia-uvm` (UVM commands).
    pub uvm: PathBuf,
    /// Wrap every frontend escape in `NV_ESC_IOCTL_XFER_CMD`, as the driver
    /// stack does for large parameter blocks (exercises decoders).
    pub xfer: bool,
    /// Stand-ins for `/dev/nvidia<i>`, by GPU index (optional). As with a
    /// real driver, `cuInit` and `nvmlInit` enumerate only the GPUs whose
    /// entry the process can open (a GPU without one is always there),
    /// numbered from 0 in index order: a container given GPU 1 alone sees
    /// it as device 0 (see `Sim::visible_only`). A process opens GPU *i*'s
    /// entry again when it first creates a context there, so a device
    /// cgroup can still deny it then.
    pub gpu_devices: Vec<PathBuf>,
}

fn default_driver_version() -> String {
    "595.45.04".into()
}
fn default_cuda_version() -> i32 {
    12080
}
fn default_threads_per_sm() -> u32 {
    2048
}
fn default_compute_capability() -> [u32; 2] {
    [9, 0]
}
fn default_pci_device_id() -> u32 {
    0x2330_10de
}

impl Default for CostDescription {
    fn default() -> Self {
        Self {
            wave_ns: 20_000,
            kernel_fixed_ns: 3_000,
            copy_bytes_per_us: 25_000,
            copy_fixed_ns: 2_000,
            context_overhead_mib: 300,
            alloc_granularity_kib: 2048,
            functions: BTreeMap::new(),
        }
    }
}

impl Default for SchedulerDescription {
    fn default() -> Self {
        Self {
            timeslice_us: 2_000,
            queue_depth: 1024,
            utilization_window_ms: 1000,
        }
    }
}

impl Default for IoctlDescription {
    fn default() -> Self {
        Self {
            enabled: true,
            control: "/dev/null".into(),
            uvm: "/dev/zero".into(),
            xfer: false,
            gpu_devices: Vec::new(),
        }
    }
}

impl NodeDescription {
    /// Two H100 80GB GPUs on NUMA nodes 0 and 1, NVLinked.
    pub fn default_node() -> Self {
        let gpu = |i: u32| GpuDescription {
            model: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81_559,
            sm_count: 132,
            max_threads_per_sm: default_threads_per_sm(),
            compute_capability: default_compute_capability(),
            numa_node: i as i32,
            nvlink_peers: vec![1 - i],
            uuid: None,
            pci_bus_id: None,
            pci_device_id: default_pci_device_id(),
            reserved_mib: 0,
            mig_enabled: false,
        };
        Self {
            driver_version: default_driver_version(),
            cuda_version: default_cuda_version(),
            gpu: vec![gpu(0), gpu(1)],
            cost: CostDescription::default(),
            scheduler: SchedulerDescription::default(),
            ioctl: IoctlDescription::default(),
        }
    }

    /// Reads and validates a description file.
    pub fn from_file(path: &Path) -> Result<Self, NodeError> {
        let text = std::fs::read_to_string(path).map_err(|source| NodeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates description text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Self, NodeError> {
        let node: Self = toml::from_str(text).map_err(|e| NodeError::Parse {
            path: origin.to_path_buf(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        node.validate(origin)?;
        Ok(node)
    }

    /// Checks every field; the first problem found is returned.
    pub fn validate(&self, origin: &Path) -> Result<(), NodeError> {
        self.check_versions()
            .and_then(|()| self.check_gpus())
            .and_then(|()| self.cost.check())
            .and_then(|()| self.scheduler.check())
            .and_then(|()| self.check_ioctl())
            .map_err(|(field, problem)| NodeError::Invalid {
                path: origin.to_path_buf(),
                field,
                problem,
            })
    }

    /// The number of GPUs, the driver and the CUDA version.
    fn check_versions(&self) -> Result<(), Problem> {
        if self.gpu.is_empty() || self.gpu.len() > MAX_GPUS {
            return Err((
                "gpu".into(),
                format!("has {} entries; accepted: 1 to {MAX_GPUS}", self.gpu.len()),
            ));
        }
        driver_major(&self.driver_version).ok_or_else(|| {
            (
                "driver_version".into(),
                format!(
                    "is {:?}; accepted: a version like \"595.45.04\" with major 450 or later",
                    self.driver_version
                ),
            )
        })?;
        if !(9000..=99_990).contains(&self.cuda_version) {
            return Err((
                "cuda_version".into(),
                format!(
                    "is {}; accepted: 9000 to 99990 (e.g. 12080 for CUDA 12.8)",
                    self.cuda_version
                ),
            ));
        }
        Ok(())
    }

    /// Each GPU's fields, then its UUID and PCI address, which no other
    /// GPU may share.
    fn check_gpus(&self) -> Result<(), Problem> {
        let n = self.gpu.len() as u32;
        let mut uuids = Vec::new();
        let mut buses = Vec::new();
        for (i, g) in self.gpu.iter().enumerate() {
            let f = |name: &str| format!("gpu[{i}].{name}");
            g.check(n, i)
                .map_err(|(name, problem)| (f(name), problem))?;
            let uuid = self.uuid(i);
            if !valid_uuid(&uuid) {
                return Err((
                    f("uuid"),
                    format!(
                        "is {uuid:?}; accepted: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex)"
                    ),
                ));
            }
            if uuids.contains(&uuid) {
                return Err((f("uuid"), format!("{uuid} is used by another GPU")));
            }
            uuids.push(uuid);
            if let Some(text) = &g.pci_bus_id
                && PciAddress::parse(text).is_none()
            {
                return Err((
                    f("pci_bus_id"),
                    format!("is {text:?}; accepted: dddd:bb:dd.f, dddd:bb:dd or bb:dd.f (hex)"),
                ));
            }
            let bus = self.pci_address(i);
            if buses.contains(&bus) {
                return Err((f("pci_bus_id"), format!("{bus} is used by another GPU")));
            }
            buses.push(bus);
        }
        Ok(())
    }

    /// The stand-in devices: absolute paths, at most one per GPU.
    fn check_ioctl(&self) -> Result<(), Problem> {
        let paths = [
            ("ioctl.control".to_string(), &self.ioctl.control),
            ("ioctl.uvm".to_string(), &self.ioctl.uvm),
        ]
        .into_iter()
        .chain(
            self.ioctl
                .gpu_devices
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("ioctl.gpu_devices[{i}]"), p)),
        );
        for (name, p) in paths {
            if !p.is_absolute() {
                return Err((
                    name,
                    format!("is {}; accepted: an absolute path", p.display()),
                ));
            }
        }
        if self.ioctl.gpu_devices.len() > self.gpu.len() {
            return Err((
                "ioctl.gpu_devices".into(),
                format!(
                    "has {} entries for {} GPUs; accepted: at most one per GPU",
                    self.ioctl.gpu_devices.len(),
                    self.gpu.len()
                ),
            ));
        }
        Ok(())
    }

    /// The UUID of GPU `index` (given or derived).
    pub fn uuid(&self, index: usize) -> String {
        self.gpu[index]
            .uuid
            .clone()
            .unwrap_or_else(|| format!("GPU-5e1a0000-0000-4000-8000-{:012x}", 0x5151_0000 + index))
    }

    /// The PCI address of GPU `index`: given (as validated; a malformed
    /// one reads as all zeros) or derived from the index (bus 0x18, 0x20, …).
    pub fn pci_address(&self, index: usize) -> PciAddress {
        match &self.gpu[index].pci_bus_id {
            Some(text) => PciAddress::parse(text).unwrap_or_default(),
            None => PciAddress {
                bus: 0x18 + index as u32 * 0x08,
                ..PciAddress::default()
            },
        }
    }

    /// The driver's major version, e.g. 595.
    pub fn driver_major(&self) -> u32 {
        driver_major(&self.driver_version).unwrap_or(0)
    }

    /// Canonical text of this description (stored in the state file).
    pub fn canonical(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A field (named relative to what checks it) and what is wrong with it.
type Problem = (String, String);

impl GpuDescription {
    /// This GPU's own fields (`i` of `n` GPUs); the field is named
    /// without the `gpu[i].` prefix.
    fn check(&self, n: u32, i: usize) -> Result<(), (&'static str, String)> {
        if self.model.is_empty() || self.model.len() > 95 {
            return Err(("model", "must be 1 to 95 characters".into()));
        }
        if !(1..=16 * 1024 * 1024).contains(&self.memory_mib) {
            return Err((
                "memory_mib",
                format!("is {}; accepted: 1 to 16777216", self.memory_mib),
            ));
        }
        if self.reserved_mib >= self.memory_mib {
            return Err((
                "reserved_mib",
                format!(
                    "is {}; must be below memory_mib ({})",
                    self.reserved_mib, self.memory_mib
                ),
            ));
        }
        if !(1..=1024).contains(&self.sm_count) {
            return Err((
                "sm_count",
                format!("is {}; accepted: 1 to 1024", self.sm_count),
            ));
        }
        if !(32..=4096).contains(&self.max_threads_per_sm)
            || !self.max_threads_per_sm.is_multiple_of(32)
        {
            return Err((
                "max_threads_per_sm",
                format!(
                    "is {}; accepted: a multiple of 32 from 32 to 4096",
                    self.max_threads_per_sm
                ),
            ));
        }
        let [major, minor] = self.compute_capability;
        if !(3..=12).contains(&major) || minor > 9 {
            return Err((
                "compute_capability",
                format!("is [{major}, {minor}]; accepted: major 3 to 12, minor 0 to 9"),
            ));
        }
        if self.numa_node < -1 || self.numa_node > 1023 {
            return Err((
                "numa_node",
                format!("is {}; accepted: -1 (unknown) to 1023", self.numa_node),
            ));
        }
        for &p in &self.nvlink_peers {
            if p >= n || p as usize == i {
                return Err((
                    "nvlink_peers",
                    format!(
                        "names GPU {p}; accepted: indices of other GPUs (0 to {})",
                        n - 1
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl CostDescription {
    /// The model's parameters and the per-function overrides.
    fn check(&self) -> Result<(), Problem> {
        if self.wave_ns == 0 || self.wave_ns > 10_000_000_000 {
            return Err((
                "cost.wave_ns".into(),
                format!("is {}; accepted: 1 to 10000000000", self.wave_ns),
            ));
        }
        if self.copy_bytes_per_us == 0 {
            return Err((
                "cost.copy_bytes_per_us".into(),
                "is 0; accepted: 1 or more".into(),
            ));
        }
        if !self.alloc_granularity_kib.is_power_of_two() || self.alloc_granularity_kib > 1024 * 1024
        {
            return Err((
                "cost.alloc_granularity_kib".into(),
                format!(
                    "is {}; accepted: a power of two up to 1048576",
                    self.alloc_granularity_kib
                ),
            ));
        }
        for (name, fc) in &self.functions {
            if fc.fixed_ns.is_none() && fc.wave_ns.is_none() {
                return Err((
                    format!("cost.functions.{name}"),
                    "sets nothing; accepted: fixed_ns and/or wave_ns".into(),
                ));
            }
            if fc.wave_ns == Some(0) {
                return Err((
                    format!("cost.functions.{name}.wave_ns"),
                    "is 0; accepted: 1 or more".into(),
                ));
            }
        }
        Ok(())
    }
}

impl SchedulerDescription {
    /// Time slice, queue depth and utilization window.
    fn check(&self) -> Result<(), Problem> {
        if !(10..=1_000_000).contains(&self.timeslice_us) {
            return Err((
                "scheduler.timeslice_us".into(),
                format!("is {}; accepted: 10 to 1000000", self.timeslice_us),
            ));
        }
        if !(1..=QUEUE_CAPACITY as u32).contains(&self.queue_depth) {
            return Err((
                "scheduler.queue_depth".into(),
                format!("is {}; accepted: 1 to {QUEUE_CAPACITY}", self.queue_depth),
            ));
        }
        if !(10..=5_000).contains(&self.utilization_window_ms) {
            return Err((
                "scheduler.utilization_window_ms".into(),
                format!("is {}; accepted: 10 to 5000", self.utilization_window_ms),
            ));
        }
        Ok(())
    }
}

fn driver_major(v: &str) -> Option<u32> {
    let mut parts = v.split('.');
    let major: u32 = parts.next()?.parse().ok()?;
    if major < 450 {
        return None;
    }
    for p in parts {
        p.parse::<u32>().ok()?;
    }
    Some(major)
}

/// The 16 bytes of a `GPU-…` UUID.
pub fn uuid_bytes(uuid: &str) -> Option<[u8; 16]> {
    let hex: String = uuid
        .strip_prefix("GPU-")?
        .chars()
        .filter(|&c| c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn valid_uuid(uuid: &str) -> bool {
    let Some(rest) = uuid.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NodeDescription, NodeError> {
        NodeDescription::parse(text, Path::new("node.toml"))
    }

    #[test]
    fn default_node_is_valid() {
        NodeDescription::default_node()
            .validate(Path::new("<default>"))
            .unwrap();
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let n = parse(
            r#"
            [[gpu]]
            model = "NVIDIA A100-SXM4-40GB"
            memory_mib = 40960
            sm_count = 108
            "#,
        )
        .unwrap();
        assert_eq!(n.gpu.len(), 1);
        assert_eq!(n.gpu[0].max_threads_per_sm, 2048);
        assert_eq!(n.scheduler.queue_depth, 1024);
        assert_eq!(n.driver_major(), 595);
        assert_eq!(n.uuid(0), "GPU-5e1a0000-0000-4000-8000-000051510000");
        assert_eq!(uuid_bytes(&n.uuid(0)).unwrap()[15], 0x00);
    }

    #[test]
    fn errors_name_the_field_and_range() {
        let e = parse(
            r#"
            [[gpu]]
            model = "x"
            memory_mib = 1024
            sm_count = 0
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("gpu[0].sm_count"), "{e}");
        assert!(e.contains("accepted: 1 to 1024"), "{e}");

        let e = parse(
            r#"
            [[gpu]]
            model = "x"
            memory_mib = 1024
            sm_count = 10
            nvlink_peers = [0]
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("gpu[0].nvlink_peers"), "{e}");
    }

    #[test]
    fn every_section_is_checked() {
        let gpu = "[[gpu]]\nmodel = \"x\"\nmemory_mib = 1024\nsm_count = 10\n";
        for (rest, field) in [
            ("cuda_version = 100\n", "cuda_version"),
            ("driver_version = \"440.1\"\n", "driver_version"),
            ("[cost]\nwave_ns = 0\n", "cost.wave_ns"),
            ("[cost.functions.k]\n", "cost.functions.k"),
            ("[scheduler]\nqueue_depth = 0\n", "scheduler.queue_depth"),
            ("[ioctl]\nuvm = \"dev/zero\"\n", "ioctl.uvm"),
            (
                "[ioctl]\ngpu_devices = [\"/dev/a\", \"/dev/b\"]\n",
                "ioctl.gpu_devices",
            ),
        ] {
            let text = if rest.starts_with('[') {
                format!("{gpu}{rest}")
            } else {
                format!("{rest}{gpu}")
            };
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.contains(&format!("node.toml: {field} ")), "{e}");
        }
    }

    #[test]
    fn malformed_toml_reports_position() {
        let e = parse("[[gpu]\nmodel = ").unwrap_err().to_string();
        assert!(e.contains("node.toml is malformed"), "{e}");
        assert!(e.contains("line"), "{e}");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = parse(
            r#"
            [[gpu]]
            model = "x"
            memory_mib = 1024
            sm_count = 10
            colour = "green"
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn duplicate_uuid_is_rejected() {
        let e = parse(
            r#"
            [[gpu]]
            model = "x"
            memory_mib = 1024
            sm_count = 10
            uuid = "GPU-00000000-0000-0000-0000-000000000001"
            [[gpu]]
            model = "x"
            memory_mib = 1024
            sm_count = 10
            uuid = "GPU-00000000-0000-0000-0000-000000000001"
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("gpu[1].uuid"), "{e}");
    }

    #[test]
    fn pci_bus_ids_parse() {
        let t = |a: Option<PciAddress>| a.map(|a| (a.domain, a.bus, a.device, a.function));
        assert_eq!(
            t(PciAddress::parse("00000000:18:00.0")),
            Some((0, 0x18, 0, 0))
        );
        assert_eq!(
            t(PciAddress::parse("0000:3b:1f.7")),
            Some((0, 0x3b, 0x1f, 7))
        );
        assert_eq!(t(PciAddress::parse("0000:3b:20.0")), None);
        assert_eq!(t(PciAddress::parse("garbage")), None);
    }

    #[test]
    fn bus_ids_are_derived_or_given_in_any_form() {
        let mut n = NodeDescription::default_node();
        assert_eq!(n.pci_address(1).to_string(), "0000:20:00.0");
        n.gpu[0].pci_bus_id = Some("5e:00.0".into());
        n.validate(Path::new("node.toml")).unwrap();
        assert_eq!(n.pci_address(0).nvml(), "00000000:5E:00.0");
        // The same address spelt another way is still a duplicate.
        n.gpu[1].pci_bus_id = Some("0000:5E:00".into());
        let e = n.validate(Path::new("node.toml")).unwrap_err().to_string();
        assert!(e.contains("gpu[1].pci_bus_id"), "{e}");
    }
}
