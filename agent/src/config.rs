//! The daemon's settings (`tessera-agent run`): a TOML file, then flags
//! and environment variables over it, then checks.
//!
//! Every field has a default that works on a GPU node, so no file is
//! needed. The file (`--config FILE`, or `TESSERA_AGENT_CONFIG`):
//!
//! ```toml
//! # Region directories, one per container.
//! root = "/var/lib/tessera/containers"
//! # Control period (milliseconds, 10 to 10000).
//! period_ms = 100
//! # Address of /healthz and /readyz.
//! listen = "0.0.0.0:9400"
//! # The NVML library (a file name or a path).
//! nvml_lib = "libnvidia-ml.so.1"
//! # Mount point of the cgroup v2 hierarchy; detected when absent
//! # (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts).
//! # cgroup_root = "/sys/fs/cgroup"
//! # The proc file system (host pids).
//! proc_root = "/proc"
//! # A container with nothing running in it is looked at this often (ms;
//! # one period to 60000); a new process on any GPU (NVML), a change of
//! # its metadata or of the policy, or a bypass report has it looked at in
//! # the next period regardless.
//! quiet_revisit_ms = 1000
//! # /healthz fails when no period has completed for this long (ms).
//! stall_after_ms = 5000
//! # How often a failed NVML initialisation is retried (ms).
//! nvml_retry_ms = 5000
//! # Log filter (tracing EnvFilter syntax); RUST_LOG wins when set.
//! log = "info"
//! # The node policy (YAML; deploy/examples/policy.yaml),
//! # checked once per period and reloaded when it changes. A missing file
//! # at this default path means the built-in defaults; a path set here,
//! # by --policy or by TESSERA_AGENT_POLICY that is missing is reported.
//! policy = "/var/lib/tessera/policy/policy.yaml"
//! # The watchdog and the eBPF observer: see `watchdog::settings`.
//! [watchdog]
//! ebpf = "auto"
//! # The device plugin: see [`KubeletFile`].
//! [kubelet]
//! enabled = false
//! plugin_dir = "/var/lib/kubelet/device-plugins"
//! pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"
//! resource_name = "nvidia.com/gpu"
//! split = 10
//! placement = "binpack"   # or "spread"
//! preload_dir = "/var/lib/tessera/lib"
//! # Garbage collection of departed pods' region directories (seconds).
//! gc_interval_s = 30
//! gc_timeout_s = 5
//! gc_grace_s = 120
//! gc_settle_s = 60
//! gc_confirm_s = 60
//! # The DRA driver gpu.tessera.dev (kubelet plugin and ResourceSlice):
//! # see [`DraFile`]. It uses [kubelet]'s preload_dir and the node name.
//! [dra]
//! enabled = false
//! registry_dir = "/var/lib/kubelet/plugins_registry"
//! plugins_dir = "/var/lib/kubelet/plugins"
//! cdi_dir = "/var/run/cdi"
//! # The node's GpuNode status for the scheduler (with the device plugin):
//! # written at most once per interval and only on change, and at least
//! # once per heartbeat.
//! [telemetry]
//! enabled = true
//! interval_ms = 10000
//! heartbeat_ms = 60000
//! ```
//!
//! Unknown fields are refused, so a misspelt setting is never silently
//! ignored; errors name the file, the field (with line and column for
//! syntax and type errors) and what is accepted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Where region directories live unless configured otherwise.
pub const DEFAULT_ROOT: &str = "/var/lib/tessera/containers";
/// The control period unless configured otherwise (ms).
pub const DEFAULT_PERIOD_MS: u64 = 100;
/// The health endpoint's address unless configured otherwise.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9400";
/// The node policy file unless configured otherwise.
pub const DEFAULT_POLICY: &str = "/var/lib/tessera/policy/policy.yaml";
/// Accepted control periods (ms).
pub const PERIOD_RANGE_MS: std::ops::RangeInclusive<u64> = 10..=10_000;

/// The file as written (every field optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// See [`Config::root`].
    pub root: Option<PathBuf>,
    /// See [`Config::period`].
    pub period_ms: Option<u64>,
    /// See [`Config::listen`].
    pub listen: Option<String>,
    /// See [`Config::nvml_lib`].
    pub nvml_lib: Option<PathBuf>,
    /// See [`Config::cgroup_root`].
    pub cgroup_root: Option<PathBuf>,
    /// See [`Config::proc_root`].
    pub proc_root: Option<PathBuf>,
    /// See [`Config::quiet_revisit`].
    pub quiet_revisit_ms: Option<u64>,
    /// See [`Config::stall_after`].
    pub stall_after_ms: Option<u64>,
    /// See [`Config::nvml_retry`].
    pub nvml_retry_ms: Option<u64>,
    /// See [`Config::log`].
    pub log: Option<String>,
    /// See [`Config::policy`].
    pub policy: Option<PathBuf>,
    /// See [`Config::watchdog`].
    pub watchdog: Option<crate::watchdog::WatchdogFile>,
    /// See [`Config::telemetry`].
    pub telemetry: Option<crate::telemetry::TelemetryFile>,
    /// See [`Config::kubelet`].
    pub kubelet: Option<KubeletFile>,
    /// See [`Config::dra`].
    pub dra: Option<DraFile>,
}

/// The `[dra]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraFile {
    /// Run the DRA driver `gpu.tessera.dev` inside `tessera-agent run`
    /// (default false): the kubelet plugin and the node's ResourceSlice.
    pub enabled: Option<bool>,
    /// Kubelet's plugin registry (where the registration socket goes).
    pub registry_dir: Option<PathBuf>,
    /// Kubelet's plugin directory (the driver's socket goes in
    /// `<plugins_dir>/gpu.tessera.dev/`).
    pub plugins_dir: Option<PathBuf>,
    /// Where prepared claims' CDI specs go (a directory the container
    /// runtime reads CDI specs from).
    pub cdi_dir: Option<PathBuf>,
}

/// The CDI spec directory unless configured otherwise.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

/// The `[dra]` section, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraSettings {
    /// Whether `run` serves the DRA driver.
    pub enabled: bool,
    /// Kubelet's plugin registry.
    pub registry_dir: PathBuf,
    /// Kubelet's plugin directory.
    pub plugins_dir: PathBuf,
    /// Where CDI specs go.
    pub cdi_dir: PathBuf,
}

/// The `[kubelet]` section as written (the Helm chart renders these keys).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeletFile {
    /// Run the device plugin inside `tessera-agent run` (default false:
    /// outside Kubernetes nothing changes).
    pub enabled: Option<bool>,
    /// Kubelet's device plugin directory (`kubelet.sock` and our socket).
    pub plugin_dir: Option<PathBuf>,
    /// Kubelet's PodResources socket.
    pub pod_resources_socket: Option<PathBuf>,
    /// The extended resource advertised.
    pub resource_name: Option<String>,
    /// vGPUs per GPU.
    pub split: Option<u32>,
    /// Placement of single-vGPU requests: `binpack` or `spread`.
    pub placement: Option<crate::kubelet::Placement>,
    /// Host directory of the preload libraries by version:
    /// `<preload_dir>/<version>/libtessera.so` and `…/ld.so.preload`.
    pub preload_dir: Option<PathBuf>,
    /// Seconds between garbage-collection rounds of departed pods' region
    /// directories (default 30).
    pub gc_interval_s: Option<u64>,
    /// Bound of one PodResources call (s, default 5).
    pub gc_timeout_s: Option<u64>,
    /// A region directory changed more recently is kept (s, default 120).
    pub gc_grace_s: Option<u64>,
    /// A kubelet restarted more recently is not believed about absences
    /// (s, default 60).
    pub gc_settle_s: Option<u64>,
    /// How long a container must stay absent from kubelet's answers before
    /// its directory goes (s, default 60; at least `gc_interval_s`).
    pub gc_confirm_s: Option<u64>,
}

/// Kubelet's PodResources socket unless configured otherwise.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The preload libraries' host directory unless configured otherwise.
pub const DEFAULT_PRELOAD_DIR: &str = "/var/lib/tessera/lib";
/// The environment variable naming the installed preload version.
pub const PRELOAD_VERSION_ENV: &str = "TESSERA_PRELOAD_VERSION";

/// The environment variable naming this node (the chart sets it from
/// `spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// The `[kubelet]` section, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletSettings {
    /// Whether `run` serves the device plugin.
    pub enabled: bool,
    /// The device plugin's own settings (directory, resource, split,
    /// placement).
    pub device_plugin: crate::kubelet::KubeletConfig,
    /// Kubelet's PodResources socket.
    pub pod_resources_socket: PathBuf,
    /// The preload libraries' host directory.
    pub preload_dir: PathBuf,
    /// The version directory under `preload_dir` that Allocate mounts (a
    /// plain directory name).
    pub preload_version: String,
    /// This node's name (from `NODE_NAME`); always set when `enabled`.
    pub node_name: Option<String>,
    /// The garbage collection of departed pods' region directories (runs
    /// when `enabled`).
    pub gc: crate::kubelet::gc_task::GcConfig,
}

/// Settings given on the command line or in the environment (they win
/// over the file).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ConfigArgs {
    /// The configuration file (TOML); see the README for its fields.
    #[arg(long, value_name = "FILE", env = "TESSERA_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Root of the region directories.
    #[arg(long, value_name = "DIR", env = "TESSERA_ROOT")]
    pub root: Option<PathBuf>,
    /// Control period in milliseconds (10 to 10000; default 100).
    #[arg(long, value_name = "MS", env = "TESSERA_PERIOD_MS")]
    pub period_ms: Option<u64>,
    /// Address of /healthz and /readyz (default 0.0.0.0:9400; port 0
    /// picks a free one, logged at start).
    #[arg(long, value_name = "ADDR", env = "TESSERA_LISTEN")]
    pub listen: Option<String>,
    /// Mount point of the cgroup v2 hierarchy (default: detected).
    #[arg(long, value_name = "DIR", env = "TESSERA_CGROUP_ROOT")]
    pub cgroup_root: Option<PathBuf>,
    /// Log filter (default info; RUST_LOG wins when set).
    #[arg(long, value_name = "FILTER", env = "TESSERA_LOG")]
    pub log: Option<String>,
    /// The node policy file (YAML; default
    /// /var/lib/tessera/policy/policy.yaml, whose absence means the
    /// built-in defaults); reloaded when it changes.
    #[arg(long, value_name = "FILE", env = "TESSERA_AGENT_POLICY")]
    pub policy: Option<PathBuf>,
    /// This node's name (needed with `[kubelet] enabled = true`; the Helm
    /// chart sets NODE_NAME from spec.nodeName).
    #[arg(long, value_name = "NAME", env = NODE_NAME_ENV)]
    pub node_name: Option<String>,
    /// The preload library version Allocate mounts from
    /// `<preload_dir>/<version>/` (the Helm chart sets the version its
    /// init step installed; default: this agent's own version).
    #[arg(long, value_name = "VERSION", env = PRELOAD_VERSION_ENV)]
    pub preload_version: Option<String>,
}

/// The daemon's settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Root of the region directories.
    pub root: PathBuf,
    /// Control period.
    pub period: Duration,
    /// Address of the HTTP endpoint.
    pub listen: SocketAddr,
    /// NVML library.
    pub nvml_lib: PathBuf,
    /// cgroup v2 mount point; `None`: detect.
    pub cgroup_root: Option<PathBuf>,
    /// The proc file system.
    pub proc_root: PathBuf,
    /// How often a quiet container (nothing running in it) is looked at.
    pub quiet_revisit: Duration,
    /// `/healthz` fails after this long without a completed period.
    pub stall_after: Duration,
    /// Retry interval of a failed NVML initialisation.
    pub nvml_retry: Duration,
    /// Log filter.
    pub log: String,
    /// The node policy file.
    pub policy: PathBuf,
    /// Whether `policy` was configured (file, flag or environment) rather
    /// than the default: a missing configured file is reported.
    pub policy_explicit: bool,
    /// The watchdog and the eBPF observer (`[watchdog]`, see
    /// [`crate::watchdog::settings`]).
    pub watchdog: crate::watchdog::WatchdogSettings,
    /// The node's `GpuNode` status writer (`[telemetry]`: `enabled`,
    /// `interval_ms`, `heartbeat_ms`); it runs with the device plugin, in
    /// Kubernetes only.
    pub telemetry: crate::telemetry::Settings,
    /// The device plugin (`[kubelet]`).
    pub kubelet: KubeletSettings,
    /// The DRA driver (`[dra]`).
    pub dra: DraSettings,
}

/// Why the settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML of the accepted shape.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (line, column, field, what is accepted).
        message: String,
    },
    /// A value is out of range.
    #[error("{origin}: field {field}: {problem}")]
    Field {
        /// `config file PATH` or `command line/environment`.
        origin: String,
        /// The field.
        field: &'static str,
        /// What is wrong and what is accepted.
        problem: String,
    },
}

/// Where a value came from, for messages.
fn origin(from_flag: bool, file: Option<&Path>) -> String {
    match (from_flag, file) {
        (false, Some(p)) => format!("config file {}", p.display()),
        _ => "command line/environment".to_owned(),
    }
}

impl ConfigFile {
    /// Parses file text.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| {
                let before = &text[..s.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let start = before.rfind('\n').map_or(0, |i| i + 1);
                let column = before.len() - start + 1;
                // The line itself names the field of a type error.
                let source: String = text[start..]
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .chars()
                    .take(80)
                    .collect();
                format!("line {line}, column {column} ({source}): ")
            });
            ConfigError::Parse {
                path: path.to_path_buf(),
                message: format!("{}{}", at.unwrap_or_default(), e.message()),
            }
        })
    }

    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }
}

impl Config {
    /// The file named by `args` (if any), `args` over it, the NVML library
    /// `nvml_flag` when given on the command line or in the environment.
    pub fn load(args: &ConfigArgs, nvml_flag: Option<&Path>) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(p) => ConfigFile::read(p)?,
            None => ConfigFile::default(),
        };
        Self::merge(file, args.config.as_deref(), args, nvml_flag)
    }

    /// `args` over `file` (read from `path`), checked.
    pub fn merge(
        file: ConfigFile,
        path: Option<&Path>,
        args: &ConfigArgs,
        nvml_flag: Option<&Path>,
    ) -> Result<Self, ConfigError> {
        let field = |(field, from_flag, problem): FieldError| ConfigError::Field {
            origin: origin(from_flag, path),
            field,
            problem,
        };
        let period_ms = period_ms(args, &file).map_err(field)?;
        let listen = listen(args, &file).map_err(field)?;
        let intervals = Intervals::check(&file, period_ms).map_err(field)?;
        let paths = Paths::check(args, &file).map_err(field)?;
        let log = log_filter(args, &file).map_err(field)?;
        let watchdog =
            crate::watchdog::WatchdogSettings::from_file(file.watchdog.unwrap_or_default())
                .map_err(|(name, problem)| field((name, false, problem)))?;
        let telemetry = crate::telemetry::Settings::new(&file.telemetry.unwrap_or_default())
            .map_err(|e| {
                let name = match e.key {
                    "interval_ms" => "telemetry.interval_ms",
                    "heartbeat_ms" => "telemetry.heartbeat_ms",
                    _ => "telemetry",
                };
                field((name, false, e.problem))
            })?;
        let kubelet = kubelet_settings(
            file.kubelet.unwrap_or_default(),
            args.node_name.clone(),
            args.preload_version.clone(),
        )
        .map_err(field)?;
        let dra = dra_settings(file.dra.unwrap_or_default(), &kubelet).map_err(field)?;
        Ok(Self {
            kubelet,
            dra,
            root: paths.root,
            period: Duration::from_millis(period_ms),
            listen,
            nvml_lib: nvml_flag
                .map(Path::to_path_buf)
                .or(file.nvml_lib)
                .unwrap_or_else(|| crate::gpu::args::DEFAULT_NVML_LIB.into()),
            cgroup_root: paths.cgroup_root,
            proc_root: paths.proc_root,
            quiet_revisit: intervals.quiet_revisit,
            stall_after: intervals.stall_after,
            nvml_retry: intervals.nvml_retry,
            log,
            policy: paths.policy,
            policy_explicit: paths.policy_explicit,
            watchdog,
            telemetry,
        })
    }
}

/// A setting refused: (field, set on the command line or in the
/// environment, problem).
type FieldError = (&'static str, bool, String);

/// The control period (milliseconds), checked.
fn period_ms(args: &ConfigArgs, file: &ConfigFile) -> Result<u64, FieldError> {
    let period_ms = args
        .period_ms
        .or(file.period_ms)
        .unwrap_or(DEFAULT_PERIOD_MS);
    if !PERIOD_RANGE_MS.contains(&period_ms) {
        return Err((
            "period_ms",
            args.period_ms.is_some(),
            format!(
                "is {period_ms}; accepted: {} to {} (milliseconds)",
                PERIOD_RANGE_MS.start(),
                PERIOD_RANGE_MS.end()
            ),
        ));
    }
    Ok(period_ms)
}

/// The HTTP endpoint's address, checked.
fn listen(args: &ConfigArgs, file: &ConfigFile) -> Result<SocketAddr, FieldError> {
    let listen_text = args
        .listen
        .clone()
        .or(file.listen.clone())
        .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    listen_text.parse().map_err(|_| {
        (
            "listen",
            args.listen.is_some(),
            format!(
                "{listen_text:?} is not an address; accepted: IP:PORT, e.g. 0.0.0.0:9400 or [::1]:9400"
            ),
        )
    })
}

/// The intervals set in the file only, checked against the period.
struct Intervals {
    quiet_revisit: Duration,
    stall_after: Duration,
    nvml_retry: Duration,
}

impl Intervals {
    fn check(file: &ConfigFile, period_ms: u64) -> Result<Self, FieldError> {
        let revisit_ms = file.quiet_revisit_ms.unwrap_or(1000);
        if !(period_ms..=60_000).contains(&revisit_ms) {
            return Err((
                "quiet_revisit_ms",
                false,
                format!(
                    "is {revisit_ms}; accepted: {period_ms} (one period) to 60000 (milliseconds)"
                ),
            ));
        }
        let stall_ms = file.stall_after_ms.unwrap_or(5000);
        let min_stall = 3 * period_ms;
        if stall_ms < min_stall || stall_ms > 600_000 {
            return Err((
                "stall_after_ms",
                false,
                format!(
                    "is {stall_ms}; accepted: {min_stall} (3 periods) to 600000 (milliseconds)"
                ),
            ));
        }
        let retry_ms = file.nvml_retry_ms.unwrap_or(5000);
        if !(100..=600_000).contains(&retry_ms) {
            return Err((
                "nvml_retry_ms",
                false,
                format!("is {retry_ms}; accepted: 100 to 600000 (milliseconds)"),
            ));
        }
        Ok(Self {
            quiet_revisit: Duration::from_millis(revisit_ms),
            stall_after: Duration::from_millis(stall_ms),
            nvml_retry: Duration::from_millis(retry_ms),
        })
    }
}

/// The host paths, each absolute.
struct Paths {
    root: PathBuf,
    cgroup_root: Option<PathBuf>,
    proc_root: PathBuf,
    policy: PathBuf,
    policy_explicit: bool,
}

impl Paths {
    fn check(args: &ConfigArgs, file: &ConfigFile) -> Result<Self, FieldError> {
        let relative = |name, from_flag, p: &Path| {
            Err((
                name,
                from_flag,
                format!("{} is relative; accepted: an absolute path", p.display()),
            ))
        };
        let root = args
            .root
            .clone()
            .or(file.root.clone())
            .unwrap_or_else(|| DEFAULT_ROOT.into());
        if !root.is_absolute() {
            return relative("root", args.root.is_some(), &root);
        }
        let cgroup_root = args.cgroup_root.clone().or(file.cgroup_root.clone());
        if let Some(c) = &cgroup_root
            && !c.is_absolute()
        {
            return relative("cgroup_root", args.cgroup_root.is_some(), c);
        }
        let proc_root = file.proc_root.clone().unwrap_or_else(|| "/proc".into());
        if !proc_root.is_absolute() {
            return relative("proc_root", false, &proc_root);
        }
        let policy_explicit = args.policy.is_some() || file.policy.is_some();
        let policy = args
            .policy
            .clone()
            .or(file.policy.clone())
            .unwrap_or_else(|| DEFAULT_POLICY.into());
        if !policy.is_absolute() {
            return relative("policy", args.policy.is_some(), &policy);
        }
        Ok(Self {
            root,
            cgroup_root,
            proc_root,
            policy,
            policy_explicit,
        })
    }
}

/// The log filter, checked.
fn log_filter(args: &ConfigArgs, file: &ConfigFile) -> Result<String, FieldError> {
    let log = args
        .log
        .clone()
        .or(file.log.clone())
        .unwrap_or_else(|| "info".to_owned());
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log) {
        return Err((
            "log",
            args.log.is_some(),
            format!(
                "{log:?} is not a tracing filter ({e}); accepted e.g. info, debug, tessera_agent=debug"
            ),
        ));
    }
    Ok(log)
}

/// An absolute path setting (`default` when absent).
fn absolute(field: &'static str, p: Option<PathBuf>, default: &str) -> Result<PathBuf, FieldError> {
    let p = p.unwrap_or_else(|| default.into());
    if p.is_absolute() {
        Ok(p)
    } else {
        Err((
            field,
            false,
            format!("{} is relative; accepted: an absolute path", p.display()),
        ))
    }
}

/// Checks the `[dra]` section against the checked `[kubelet]` one (the
/// node name and the preload directory are shared).
fn dra_settings(file: DraFile, kubelet: &KubeletSettings) -> Result<DraSettings, FieldError> {
    let enabled = file.enabled.unwrap_or(false);
    if enabled && kubelet.node_name.is_none() {
        return Err((
            "dra.enabled",
            false,
            format!(
                "is true but {NODE_NAME_ENV} is not set; the DRA driver needs this node's name (the Helm chart sets {NODE_NAME_ENV} from spec.nodeName)"
            ),
        ));
    }
    Ok(DraSettings {
        enabled,
        registry_dir: absolute(
            "dra.registry_dir",
            file.registry_dir,
            tessera_kubelet_api::pluginregistration::REGISTRY_PATH,
        )?,
        plugins_dir: absolute(
            "dra.plugins_dir",
            file.plugins_dir,
            tessera_kubelet_api::dra::PLUGINS_PATH,
        )?,
        cdi_dir: absolute("dra.cdi_dir", file.cdi_dir, DEFAULT_CDI_DIR)?,
    })
}

/// Checks the `[kubelet]` section; an error is (field, from the
/// environment, problem).
fn kubelet_settings(
    file: KubeletFile,
    node_name: Option<String>,
    preload_version: Option<String>,
) -> Result<KubeletSettings, FieldError> {
    let d = crate::kubelet::KubeletConfig::default();
    let enabled = file.enabled.unwrap_or(false);
    let abs = absolute;
    let device_plugin = crate::kubelet::KubeletConfig {
        plugin_dir: abs(
            "kubelet.plugin_dir",
            file.plugin_dir,
            tessera_kubelet_api::deviceplugin::DEVICE_PLUGIN_PATH,
        )?,
        resource_name: file.resource_name.unwrap_or(d.resource_name.clone()),
        split: file.split.unwrap_or(d.split),
        placement: file.placement.unwrap_or(d.placement),
        ..d
    };
    if let Err(crate::kubelet::KubeletError::Config { field, why }) = device_plugin.validate() {
        let field = match field {
            "resource_name" => "kubelet.resource_name",
            "split" => "kubelet.split",
            other => other,
        };
        return Err((field, false, why));
    }
    let pod_resources_socket = abs(
        "kubelet.pod_resources_socket",
        file.pod_resources_socket,
        DEFAULT_POD_RESOURCES_SOCKET,
    )?;
    let preload_dir = abs("kubelet.preload_dir", file.preload_dir, DEFAULT_PRELOAD_DIR)?;
    let preload_version = preload_version.unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned());
    let plain = |c: char| c.is_ascii_alphanumeric() || "._+-".contains(c);
    if preload_version.is_empty()
        || preload_version.len() > 128
        || preload_version.starts_with('.')
        || !preload_version.chars().all(plain)
    {
        return Err((
            "preload_version",
            true,
            format!(
                "{PRELOAD_VERSION_ENV}={preload_version:?} is not a version directory name; accepted: 1 to 128 of A-Z a-z 0-9 . _ + -, not starting with '.'"
            ),
        ));
    }
    let node_name = node_name.filter(|n| !n.trim().is_empty());
    if let Some(n) = &node_name
        && (n.len() > 253 || n.chars().any(|c| c.is_control() || c == '/' || c == ','))
    {
        return Err((
            "node_name",
            true,
            format!("{NODE_NAME_ENV}={n:?} is not a node name"),
        ));
    }
    if enabled && node_name.is_none() {
        return Err((
            "kubelet.enabled",
            false,
            format!(
                "is true but {NODE_NAME_ENV} is not set; the device plugin needs this node's name (the Helm chart sets {NODE_NAME_ENV} from spec.nodeName)"
            ),
        ));
    }
    let dg = crate::kubelet::gc_task::GcConfig::default();
    let secs = |v: Option<u64>, d: Duration| v.map_or(d, Duration::from_secs);
    let gc = crate::kubelet::gc_task::GcConfig {
        pod_resources_socket: pod_resources_socket.clone(),
        resource_name: device_plugin.resource_name.clone(),
        interval: secs(file.gc_interval_s, dg.interval),
        timeout: secs(file.gc_timeout_s, dg.timeout),
        settings: crate::kubelet::gc::GcSettings {
            grace: secs(file.gc_grace_s, dg.settings.grace),
            settle: secs(file.gc_settle_s, dg.settings.settle),
            confirm: secs(file.gc_confirm_s, dg.settings.confirm),
        },
    };
    if let Err(e) = gc.validate() {
        let field = match e.field {
            "gc_interval_s" => "kubelet.gc_interval_s",
            "gc_timeout_s" => "kubelet.gc_timeout_s",
            "gc_confirm_s" => "kubelet.gc_confirm_s",
            "gc_grace_s/gc_settle_s" => "kubelet.gc_grace_s/gc_settle_s",
            other => other,
        };
        return Err((field, false, e.why));
    }
    Ok(KubeletSettings {
        enabled,
        device_plugin,
        pod_resources_socket,
        preload_dir,
        preload_version,
        node_name,
        gc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dra_section_is_read_and_checked() {
        let named = ConfigArgs {
            node_name: Some("gpu-7".into()),
            ..ConfigArgs::default()
        };
        let d = merge("", &ConfigArgs::default()).unwrap().dra;
        assert!(!d.enabled);
        assert_eq!(
            d.registry_dir,
            PathBuf::from("/var/lib/kubelet/plugins_registry/")
        );
        assert_eq!(d.cdi_dir, PathBuf::from("/var/run/cdi"));
        let d = merge("[dra]\nenabled = true\ncdi_dir = \"/etc/cdi\"\n", &named)
            .unwrap()
            .dra;
        assert!(d.enabled);
        assert_eq!(d.cdi_dir, PathBuf::from("/etc/cdi"));
        let e = merge("[dra]\nenabled = true\n", &ConfigArgs::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("field dra.enabled: is true but NODE_NAME is not set"),
            "{e}"
        );
        let e = merge("[dra]\nplugins_dir = \"plugins\"\n", &named).unwrap_err();
        assert!(
            e.to_string()
                .contains("field dra.plugins_dir: plugins is relative"),
            "{e}"
        );
        let e = merge("[dra]\ncdi = \"/x\"\n", &named).unwrap_err();
        assert!(e.to_string().contains("unknown field `cdi`"), "{e}");
    }

    #[test]
    fn the_garbage_collection_keys_are_read_and_checked() {
        let args = ConfigArgs {
            node_name: Some("gpu-7".into()),
            ..ConfigArgs::default()
        };
        let c = merge(
            "[kubelet]\nenabled = true\ngc_interval_s = 10\ngc_confirm_s = 20\ngc_grace_s = 5\n",
            &args,
        )
        .unwrap()
        .kubelet;
        assert_eq!(c.gc.interval, Duration::from_secs(10));
        assert_eq!(c.gc.settings.confirm, Duration::from_secs(20));
        assert_eq!(c.gc.settings.grace, Duration::from_secs(5));
        assert_eq!(c.gc.settings.settle, Duration::from_secs(60));
        assert_eq!(c.gc.pod_resources_socket, c.pod_resources_socket);
        for (text, field) in [
            (
                "gc_interval_s = 10\ngc_confirm_s = 5",
                "kubelet.gc_confirm_s",
            ),
            ("gc_interval_s = 0", "kubelet.gc_interval_s"),
            ("gc_timeout_s = 600", "kubelet.gc_timeout_s"),
        ] {
            let e = merge(&format!("[kubelet]\n{text}\n"), &args)
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{text}: {e}");
        }
    }

    #[test]
    fn the_kubelet_section_reads_the_shared_keys_and_needs_node_name() {
        let text = r#"
[kubelet]
enabled = true
plugin_dir = "/k/device-plugins"
pod_resources_socket = "/k/pod-resources/kubelet.sock"
resource_name = "nvidia.com/gpu"
split = 4
placement = "spread"
preload_dir = "/t/lib"
"#;
        let args = ConfigArgs {
            node_name: Some("gpu-7".into()),
            ..ConfigArgs::default()
        };
        let c = merge(text, &args).unwrap().kubelet;
        assert!(c.enabled);
        assert_eq!(c.device_plugin.plugin_dir, Path::new("/k/device-plugins"));
        assert_eq!(c.device_plugin.split, 4);
        assert_eq!(c.device_plugin.placement, crate::kubelet::Placement::Spread);
        assert_eq!(
            c.pod_resources_socket,
            Path::new("/k/pod-resources/kubelet.sock")
        );
        assert_eq!(c.preload_dir, Path::new("/t/lib"));
        assert_eq!(c.node_name.as_deref(), Some("gpu-7"));
        let e = merge(text, &ConfigArgs::default()).unwrap_err().to_string();
        assert!(
            e.contains("NODE_NAME") && e.contains("kubelet.enabled"),
            "{e}"
        );
        // Disabled (the default): no node name needed, defaults apply.
        let c = merge("", &ConfigArgs::default()).unwrap().kubelet;
        assert!(!c.enabled);
        assert_eq!(c.preload_dir, Path::new(DEFAULT_PRELOAD_DIR));
        assert_eq!(c.device_plugin.resource_name, "nvidia.com/gpu");
        for (bad, field) in [
            ("[kubelet]\nsplit = 0\n", "kubelet.split"),
            ("[kubelet]\npreload_dir = \"lib\"\n", "kubelet.preload_dir"),
            (
                "[kubelet]\nresource_name = \"gpu\"\n",
                "kubelet.resource_name",
            ),
            ("[kubelet]\nplacement = \"random\"\n", "placement"),
            ("[kubelet]\nenable = true\n", "enable"),
        ] {
            let e = merge(bad, &ConfigArgs::default()).unwrap_err().to_string();
            assert!(e.contains(field), "{bad}: {e}");
        }
    }

    fn merge(text: &str, args: &ConfigArgs) -> Result<Config, ConfigError> {
        let p = Path::new("/etc/tessera/agent.toml");
        Config::merge(ConfigFile::parse(p, text)?, Some(p), args, None)
    }

    #[test]
    fn defaults_work_without_a_file() {
        let c = Config::merge(ConfigFile::default(), None, &ConfigArgs::default(), None).unwrap();
        assert_eq!(c.root, Path::new(DEFAULT_ROOT));
        assert_eq!(c.period, Duration::from_millis(100));
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.nvml_lib, Path::new("libnvidia-ml.so.1"));
        assert_eq!(c.cgroup_root, None);
        assert_eq!(
            (c.policy.as_path(), c.policy_explicit),
            (Path::new(DEFAULT_POLICY), false)
        );
    }

    #[test]
    fn the_policy_path_comes_from_flag_or_file() {
        let c = merge("policy = \"/etc/p.yaml\"\n", &ConfigArgs::default()).unwrap();
        assert_eq!(
            (c.policy.as_path(), c.policy_explicit),
            (Path::new("/etc/p.yaml"), true)
        );
        let args = ConfigArgs {
            policy: Some("/run/q.yaml".into()),
            ..ConfigArgs::default()
        };
        let c = merge("policy = \"/etc/p.yaml\"\n", &args).unwrap();
        assert_eq!(c.policy, Path::new("/run/q.yaml"));
        let e = merge("policy = \"p.yaml\"\n", &ConfigArgs::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("field policy") && e.contains("absolute"), "{e}");
    }

    #[test]
    fn flags_win_over_the_file() {
        let args = ConfigArgs {
            period_ms: Some(50),
            root: Some("/tmp/r".into()),
            ..ConfigArgs::default()
        };
        let c = merge(
            "period_ms = 200\nroot = \"/x\"\nlisten = \"127.0.0.1:0\"\n",
            &args,
        )
        .unwrap();
        assert_eq!(c.period, Duration::from_millis(50));
        assert_eq!(c.root, Path::new("/tmp/r"));
        assert_eq!(c.listen.to_string(), "127.0.0.1:0");
        let c = Config::merge(
            ConfigFile::parse(Path::new("f"), "nvml_lib = \"/a.so\"").unwrap(),
            None,
            &ConfigArgs::default(),
            Some(Path::new("/b.so")),
        )
        .unwrap();
        assert_eq!(c.nvml_lib, Path::new("/b.so"));
    }

    #[test]
    fn bad_values_name_file_field_and_range() {
        let e = merge("period_ms = 1\n", &ConfigArgs::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("config file /etc/tessera/agent.toml"), "{e}");
        assert!(e.contains("period_ms") && e.contains("10 to 10000"), "{e}");
        let e = merge("perod_ms = 100\n", &ConfigArgs::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field") && e.contains("perod_ms"), "{e}");
        assert!(e.contains("line 1"), "{e}");
        let e = merge("\n\nperiod_ms = \"fast\"\n", &ConfigArgs::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3") && e.contains("period_ms"), "{e}");
        let e = merge("listen = \"nowhere\"\n", &ConfigArgs::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("field listen") && e.contains("IP:PORT"), "{e}");
        let args = ConfigArgs {
            period_ms: Some(0),
            ..ConfigArgs::default()
        };
        let e = merge("", &args).unwrap_err().to_string();
        assert!(
            e.starts_with("command line/environment: field period_ms"),
            "{e}"
        );
        let e = merge("root = \"rel\"\n", &ConfigArgs::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("field root"), "{e}");
        // The revisit of quiet containers: at least one period.
        let e = merge(
            "period_ms = 200\nquiet_revisit_ms = 100\n",
            &ConfigArgs::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("field quiet_revisit_ms") && e.contains("200 (one period) to 60000"),
            "{e}"
        );
        let c = merge("quiet_revisit_ms = 5000\n", &ConfigArgs::default()).unwrap();
        assert_eq!(c.quiet_revisit, Duration::from_secs(5));
    }
}
