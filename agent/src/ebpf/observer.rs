//! Loading `tessera.bpf.o`, attaching the ioctl observer in the best mode
//! the kernel offers (plus the process-exit hook), and reading what it
//! counted. Registration and bypass events are in [`super::bypass`].

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::{HashMap, MapData, MapError, PerCpuArray, PerCpuHashMap},
    programs::{CgroupAttachMode, CgroupDevice, ProgramError},
    util::KernelVersion,
};
use tessera_ebpf_common::{
    config::ProgramConfig,
    dev::WatchedDevice,
    keys::{IoctlKey, OpenKey},
    names,
    rm::RmProcess,
    stats,
    uvm::{GpuUse, GpuUseKey},
};

use super::btf::{Btf, BtfError};
use super::counts::{ProgramStats, Snapshot};
use super::devices::Device;
use super::driver;
use super::kfunc;
use super::load;
use super::mode::{self, AttachMode, KernelFacts, ModeRequest};
use super::mounts;
use super::verdict::{AgentEpoch, VerdictCache};
use crate::error_chain::with_causes;

/// The kernel struct holding the `sched_process_exit` record, and its
/// member that says the whole process is gone (6.16+).
const EXIT_RECORD: (&str, &str) = ("trace_event_raw_sched_process_exit", "group_dead");

/// Errors of the observer.
#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    /// The kernel struct offsets could not be read.
    #[error("cannot read kernel struct offsets from btf")]
    Offsets(#[source] BtfError),
    /// The object file could not be read.
    #[error("cannot read ebpf object {path}")]
    Read {
        /// The object file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The object could not be loaded.
    #[error("cannot load ebpf object {path}")]
    Load {
        /// The object file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<EbpfError>,
    },
    /// The object lacks a map or program the agent expects.
    #[error("ebpf object has no {0}")]
    Missing(&'static str),
    /// A map operation failed.
    #[error("cannot access ebpf map {map}")]
    Map {
        /// The map.
        map: &'static str,
        /// The cause.
        #[source]
        source: MapError,
    },
    /// A program could not be loaded or attached.
    #[error("cannot load or attach ebpf program {program}")]
    Program {
        /// The program.
        program: &'static str,
        /// The cause.
        #[source]
        source: ProgramError,
    },
    /// Every candidate attach mode failed.
    #[error("cannot attach the ebpf ioctl observer in any mode ({tried})")]
    NoAttachMode {
        /// Each mode tried or skipped, with the reason.
        tried: String,
    },
    /// The kernel is too old for a shared cgroup attachment.
    #[error("ebpf open audit needs linux 5.7 or later (bpf links), this is {0}")]
    KernelTooOld(String),
    /// The cgroup for the open audit could not be opened.
    #[error("cannot open cgroup directory {path}")]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl ObserverError {
    /// [`ObserverError::Program`] of program `name`, for `map_err`.
    pub fn program(name: &'static str) -> impl Fn(ProgramError) -> Self + Copy {
        move |source| Self::Program {
            program: name,
            source,
        }
    }

    /// [`ObserverError::Map`] of map `name`, for `map_err`.
    pub fn map(name: &'static str) -> impl Fn(MapError) -> Self + Copy {
        move |source| Self::Map { map: name, source }
    }
}

/// What to load and how.
#[derive(Clone, Debug)]
pub struct ObserverConfig {
    /// `tessera.bpf.o`.
    pub object: PathBuf,
    /// Attach mode.
    pub mode: ModeRequest,
    /// Devices to count.
    pub devices: Vec<Device>,
    /// NVIDIA driver major version, for the parameter layouts the
    /// memory estimate decodes; `None`: the running module's, else the
    /// newest known (see [`driver`]).
    pub driver_major: Option<u32>,
    /// Load the `*_probe` ioctl program (`bpf_probe_read_kernel`) even
    /// where the kernel has `bpf_rdonly_cast`: the fallback's own tests.
    pub probe_reads: bool,
}

impl ObserverConfig {
    /// Auto mode, the given object and devices.
    pub fn new(object: impl Into<PathBuf>, devices: Vec<Device>) -> Self {
        Self {
            object: object.into(),
            mode: ModeRequest::Auto,
            devices,
            driver_major: None,
            probe_reads: false,
        }
    }
}

/// Which device program counts opens ([`Observer::audit_opens`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenAudit {
    /// Counts, and reports the first open by an unregistered process in a
    /// watched cgroup (Linux 6.4+).
    Full,
    /// Only counts.
    CountOnly,
}

impl OpenAudit {
    /// The program's name in the object.
    pub fn program(self) -> &'static str {
        match self {
            Self::Full => names::PROG_DEVICE_AUDIT,
            Self::CountOnly => names::PROG_DEVICE_COUNT,
        }
    }
}

/// The loaded observer. Dropping it detaches every program.
pub struct Observer {
    pub(super) ebpf: Ebpf,
    mode: AttachMode,
    /// The ioctl program attached ([`AttachMode::program`] or its probe
    /// build).
    program: &'static str,
    open_audit: Option<PathBuf>,
    exit_hook: bool,
    verdicts: VerdictCache,
    pub(super) cgroup_epoch: AgentEpoch,
    pub(super) task_epoch: AgentEpoch,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("mode", &self.mode)
            .field("program", &self.program)
            .field("open_audit", &self.open_audit)
            .field("exit_hook", &self.exit_hook)
            .field("verdicts", &self.verdicts)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// Loads the object (its `bpf_rdonly_cast` calls patched for this
    /// kernel, module `kfunc`), fills the watched devices, turns the
    /// device cache on, attaches the process-exit hook and the ioctl
    /// program in the first mode that works.
    pub fn start(config: &ObserverConfig) -> Result<Self, ObserverError> {
        let btf = Btf::from_kernel().map_err(ObserverError::Offsets)?;
        let offsets = btf.kernel_offsets().map_err(ObserverError::Offsets)?;
        let exit_group_dead_offset = btf.member_offset(EXIT_RECORD.0, EXIT_RECORD.1).unwrap_or(0);
        if exit_group_dead_offset == 0 {
            tracing::info!(
                "no group_dead in the process-exit record: a process counts as gone when its leader exits"
            );
        }
        let (rm, driver_major) = driver::rm_layout(config.driver_major);
        tracing::info!(
            driver_major,
            "ebpf memory estimate uses this driver's layouts"
        );
        let mut object = std::fs::read(&config.object).map_err(|source| ObserverError::Read {
            path: config.object.clone(),
            source,
        })?;
        // The kfunc walk where the kernel has the kfunc and the types;
        // otherwise the `*_probe` programs.
        let casts = match (btf.func_id(kfunc::RDONLY_CAST), btf.cast_config()) {
            _ if config.probe_reads => None,
            (Some(id), Ok(casts)) if kfunc::patch_rdonly_cast(&mut object, id) > 0 => Some(casts),
            (None, _) => {
                tracing::info!(
                    "no bpf_rdonly_cast in this kernel: the ioctl program reads kernel structs with bpf_probe_read_kernel"
                );
                None
            }
            (Some(_), Err(e)) => {
                tracing::warn!(error = %with_causes(&e), "the ioctl program reads kernel structs with bpf_probe_read_kernel");
                None
            }
            (Some(_), Ok(_)) => {
                tracing::warn!(object = %config.object.display(), "the object has no marked kfunc call: the ioctl program reads kernel structs with bpf_probe_read_kernel");
                None
            }
        };
        let program_config = ProgramConfig {
            offsets,
            ioctl_syscall_nr: libc::SYS_ioctl as u32,
            exit_group_dead_offset,
            rm,
            casts: casts.unwrap_or_default(),
        };
        let facts = KernelFacts::probe_for(config.mode);
        let plan = mode::plan(config.mode, &facts);
        let mut tried = Vec::new();
        for (mode, why) in &plan.skipped {
            tracing::info!(%mode, reason = %why, "ebpf attach mode skipped");
            tried.push(format!("{mode}: {why}"));
        }
        // Tracepoints (the exit hook, and maybe the ioctl observer) need
        // tracefs for their ids.
        match mounts::ensure_tracefs() {
            Ok(true) => tracing::info!(path = mounts::TRACEFS, "mounted tracefs"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %with_causes(&e), "tracefs unavailable"),
        }

        let mut ebpf = EbpfLoader::new()
            .override_global(names::CONFIG_GLOBAL, &program_config, true)
            .load(&object)
            .map_err(|source| ObserverError::Load {
                path: config.object.clone(),
                source: Box::new(source),
            })?;
        set_devices(&mut ebpf, &config.devices)?;
        let exit_hook = match load::attach_exit_hook(&mut ebpf) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %with_causes(&e), "exited processes will not be forgotten (registrations, reports, memory estimates)");
                false
            }
        };

        let verdicts = VerdictCache::enable(&mut ebpf)?;

        let mut cgroup_epoch = AgentEpoch::cgroups();
        cgroup_epoch.advance(&mut ebpf)?;
        let mut task_epoch = AgentEpoch::tasks();
        task_epoch.advance(&mut ebpf)?;

        for mode in plan.candidates {
            match load::attach_ioctl(&mut ebpf, mode, casts.is_some(), &facts) {
                Ok(program) => {
                    tracing::info!(%mode, program, devices = config.devices.len(), "ebpf ioctl observer attached");
                    return Ok(Self {
                        ebpf,
                        mode,
                        program,
                        open_audit: None,
                        exit_hook,
                        verdicts,
                        cgroup_epoch,
                        task_epoch,
                    });
                }
                Err(e) => {
                    let why = with_causes(&e);
                    tracing::warn!(%mode, error = %why, "ebpf attach mode failed, trying the next");
                    tried.push(format!("{mode}: {why}"));
                }
            }
        }
        Err(ObserverError::NoAttachMode {
            tried: tried.join("; "),
        })
    }

    /// The mode the ioctl observer runs in.
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// The name of the ioctl program attached: [`AttachMode::program`]
    /// (plain loads after `bpf_rdonly_cast`), or
    /// [`AttachMode::probe_program`] where the kernel lacks that kfunc or
    /// refused the program.
    pub fn ioctl_program(&self) -> &'static str {
        self.program
    }

    /// The kernel's view of the attached ioctl program: with run-time
    /// statistics enabled (`aya::sys::enable_stats`), its run count and
    /// time, which the overhead benchmark reads.
    pub fn ioctl_program_info(&self) -> Result<aya::programs::ProgramInfo, ObserverError> {
        let name = self.program;
        let program = self
            .ebpf
            .program(name)
            .ok_or(ObserverError::Missing(name))?;
        program.info().map_err(ObserverError::program(name))
    }

    /// Whether the process-exit hook is attached (exited processes are
    /// forgotten in the kernel maps).
    pub fn exit_hook(&self) -> bool {
        self.exit_hook
    }

    /// Attaches an open-counting device program to cgroup v2 directory
    /// `cgroup` (it covers the whole subtree; the agent uses the cgroup2
    /// root). It never denies, and coexists with other device programs.
    ///
    /// The program that also reports bypassing opens needs helpers that
    /// device programs get only on newer kernels (Linux 6.4); where the
    /// kernel refuses it, the count-only program is attached instead, with
    /// a warning (a bypass is then reported at the first ioctl). Returns
    /// which one is attached.
    pub fn audit_opens(&mut self, cgroup: &Path) -> Result<OpenAudit, ObserverError> {
        match self.audit_opens_with(cgroup, OpenAudit::Full) {
            Err(ObserverError::Program {
                program,
                source: source @ ProgramError::LoadError { .. },
            }) => {
                let kernel = KernelVersion::current()
                    .map_or_else(|e| format!("unknown ({e})"), |v| v.to_string());
                let refused = ObserverError::program(program)(source);
                tracing::warn!(
                    %kernel,
                    error = %with_causes(&refused),
                    "this kernel refuses the open audit that reports bypasses; counting opens only"
                );
                self.audit_opens_with(cgroup, OpenAudit::CountOnly)
            }
            other => other,
        }
    }

    /// As [`Observer::audit_opens`], with exactly the program `audit`.
    pub fn audit_opens_with(
        &mut self,
        cgroup: &Path,
        audit: OpenAudit,
    ) -> Result<OpenAudit, ObserverError> {
        // Before bpf links, aya would attach exclusively, which would stop
        // container runtimes from attaching their own device programs.
        let links = KernelVersion::new(5, 7, 0);
        match KernelVersion::current() {
            Ok(v) if v >= links => {}
            Ok(v) => return Err(ObserverError::KernelTooOld(v.to_string())),
            Err(e) => return Err(ObserverError::KernelTooOld(format!("unknown ({e})"))),
        }
        let dir = std::fs::File::open(cgroup).map_err(|source| ObserverError::Cgroup {
            path: cgroup.to_owned(),
            source,
        })?;
        let name = audit.program();
        // aya attaches through a bpf link (5.7+), which takes no flags and
        // always coexists with other programs; `Single` passes flags 0.
        load::load_attach(&mut self.ebpf, name, |p: &mut CgroupDevice| {
            p.attach(dir, CgroupAttachMode::Single).map(drop)
        })?;
        tracing::info!(cgroup = %cgroup.display(), program = name, "ebpf open audit attached");
        self.open_audit = Some(cgroup.to_owned());
        Ok(audit)
    }

    /// Replaces the set of watched devices, then voids the programs'
    /// cached device verdicts (module `verdict`).
    pub fn set_devices(&mut self, devices: &[Device]) -> Result<(), ObserverError> {
        set_devices(&mut self.ebpf, devices)?;
        self.verdicts.invalidate(&mut self.ebpf)
    }

    /// Reads the count, GPU-use and memory-estimate maps.
    pub fn snapshot(&self) -> Result<Snapshot, ObserverError> {
        Ok(Snapshot {
            ioctls: per_cpu_sums::<IoctlKey>(&self.ebpf, names::IOCTL_COUNTS)?,
            opens: per_cpu_sums::<OpenKey>(&self.ebpf, names::OPEN_COUNTS)?,
            gpu_use: entries::<GpuUseKey, GpuUse>(&self.ebpf, names::GPU_USE)?,
            rm_procs: entries::<u32, RmProcess>(&self.ebpf, names::RM_PROCS)?,
            stats: self.stats()?,
        })
    }

    /// Reads the programs' own counters.
    pub fn stats(&self) -> Result<ProgramStats, ObserverError> {
        let name = names::STATS;
        let err = ObserverError::map(name);
        let map = self.ebpf.map(name).ok_or(ObserverError::Missing(name))?;
        let array = PerCpuArray::<&MapData, u64>::try_from(map).map_err(err)?;
        let mut sums = Vec::new();
        for index in 0..stats::LEN {
            sums.push(array.get(&index, 0).map_err(err)?.iter().sum());
        }
        Ok(ProgramStats::from_sums(&sums))
    }
}

fn set_devices(ebpf: &mut Ebpf, devices: &[Device]) -> Result<(), ObserverError> {
    let name = names::WATCHED_DEVICES;
    let err = ObserverError::map(name);
    let map = ebpf.map_mut(name).ok_or(ObserverError::Missing(name))?;
    let mut watched = HashMap::<&mut MapData, u32, WatchedDevice>::try_from(map).map_err(err)?;
    let wanted: HashSet<u32> = devices.iter().map(Device::kdev).collect();
    let stale: Vec<u32> = watched
        .keys()
        .filter_map(Result::ok)
        .filter(|k| !wanted.contains(k))
        .collect();
    for key in stale {
        watched.remove(&key).map_err(err)?;
    }
    for device in devices {
        watched
            .insert(device.kdev(), device.watched(), 0)
            .map_err(err)?;
    }
    Ok(())
}

fn per_cpu_sums<K: aya::Pod + Ord>(
    ebpf: &Ebpf,
    name: &'static str,
) -> Result<std::collections::BTreeMap<K, u64>, ObserverError> {
    let err = ObserverError::map(name);
    let map = ebpf.map(name).ok_or(ObserverError::Missing(name))?;
    let counts = PerCpuHashMap::<&MapData, K, u64>::try_from(map).map_err(err)?;
    let mut out = std::collections::BTreeMap::new();
    for item in counts.iter() {
        let (key, values) = item.map_err(err)?;
        out.insert(key, values.iter().sum());
    }
    Ok(out)
}

/// Every entry of hash map `name`.
pub(super) fn entries<K: aya::Pod + Ord, V: aya::Pod>(
    ebpf: &Ebpf,
    name: &'static str,
) -> Result<std::collections::BTreeMap<K, V>, ObserverError> {
    let err = ObserverError::map(name);
    let map = ebpf.map(name).ok_or(ObserverError::Missing(name))?;
    let map = HashMap::<&MapData, K, V>::try_from(map).map_err(err)?;
    map.iter().map(|item| item.map_err(err)).collect()
}
