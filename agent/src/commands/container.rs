//! `tessera-agent container add|set|rm|list|show`: containers outside
//! Kubernetes (plain `docker run`, systemd units, Slurm jobs).
//!
//! GPU specs are the region writer's (`tessera_region::spec`):
//! `GPU-<uuid>[,memory=<MiB>][,overhead=<MiB>]`; the launch rate is not
//! given here, the daemon derives it from the SM target.
//!
//! Mode and priority are optional: given, they are explicit and win over
//! the node policy; left out (or `set --mode policy` / `--priority
//! policy`), the policy decides. Labels (`--label key=value`, Kubernetes
//! syntax; `set --label key-` removes one) are what policy rules match,
//! with the namespace.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use tessera_region::layout::UNLIMITED;
use tessera_region::spec::{SpecError, format_uuid, parse_gpu};

use crate::cgroup::cgroup2_root;
use crate::config::DEFAULT_ROOT;
use crate::containers::id::ContainerId;
use crate::containers::labels::{LabelEdit, LabelError, parse_label_arg};
use crate::containers::meta::{
    GpuGrant, IdentityError, META_VERSION, Metadata, Mode, check_cgroup,
};
use crate::containers::store::{Store, StoreError};

/// `tessera-agent container …`.
#[derive(Debug, clap::Args)]
pub struct ContainerArgs {
    /// The root of the region directories (the daemon's `root`).
    #[arg(long, value_name = "DIR", env = "TESSERA_ROOT", default_value = DEFAULT_ROOT)]
    pub root: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: ContainerCommand,
}

/// The container subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ContainerCommand {
    /// Create a container's region directory `<root>/<id>`; prints it (the
    /// directory to mount at /run/tessera, or TESSERA_REGION_DIR).
    Add(AddArgs),
    /// Change a container's memory limits, SM target, mode, priority or
    /// cgroup; running processes see the change without a restart.
    Set(SetArgs),
    /// Remove a container's region directory (running processes keep the
    /// limits they have mapped).
    Rm {
        /// The container.
        #[arg(long)]
        id: ContainerId,
    },
    /// List the containers (and the entries skipped, with the reason).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print a container's metadata, limits and usage as JSON.
    Show {
        /// The container.
        #[arg(long)]
        id: ContainerId,
    },
    /// Undo the watchdog's freeze: thaw the container's cgroup (a
    /// container still over its limit is frozen again by the watchdog).
    Thaw {
        /// The container.
        #[arg(long)]
        id: ContainerId,
    },
    /// Undo the watchdog's deny: remove the container's device guard.
    Allow {
        /// The container.
        #[arg(long)]
        id: ContainerId,
        /// The deny action's pin directory (the daemon's
        /// `watchdog.deny_pin_dir`).
        #[arg(long, value_name = "DIR", default_value_os_t = crate::watchdog::settings::default_deny_pin_dir())]
        deny_pin_dir: PathBuf,
    },
}

/// `container add`.
#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// The container's id: 1 to 128 of [A-Za-z0-9_.-], starting with a
    /// letter or digit.
    #[arg(long)]
    pub id: ContainerId,
    /// A GPU and its memory limit: GPU-<uuid>[,memory=<MiB>][,overhead=<MiB>].
    /// Repeat for several GPUs.
    #[arg(long = "gpu", required = true)]
    pub gpus: Vec<String>,
    /// Percent of each GPU's time (1 to 100).
    #[arg(long, default_value_t = 100)]
    pub sm_target: u32,
    /// hard (capped always) or elastic (idle SMs lent, capped under
    /// contention); left out: the node policy decides (hard without one).
    #[arg(long)]
    pub mode: Option<Mode>,
    /// Priority under contention (0 to 100, higher first); left out: the
    /// node policy decides (0 without one).
    #[arg(long)]
    pub priority: Option<u32>,
    /// A label (key=value, Kubernetes syntax) that node policy rules match.
    /// Repeat for several.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// The container's cgroup: a path below the cgroup v2 mount (e.g.
    /// /sys/fs/cgroup/system.slice/docker-<id>.scope) or relative to it
    /// (/system.slice/docker-<id>.scope).
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// Kubernetes namespace (informational outside Kubernetes).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Pod name.
    #[arg(long)]
    pub pod: Option<String>,
    /// Container name.
    #[arg(long)]
    pub container: Option<String>,
    /// Let CUDA calls pass unlimited if the region becomes unusable.
    #[arg(long)]
    pub fail_open: bool,
}

/// `container set`.
#[derive(Debug, clap::Args)]
pub struct SetArgs {
    /// The container.
    #[arg(long)]
    pub id: ContainerId,
    /// New memory limit of one of the container's GPUs:
    /// GPU-<uuid>[,memory=<MiB>|unlimited][,overhead=<MiB>] (an omitted
    /// memory means unlimited, an omitted overhead keeps the current one).
    #[arg(long = "gpu")]
    pub gpus: Vec<String>,
    /// New SM target (1 to 100).
    #[arg(long)]
    pub sm_target: Option<u32>,
    /// New mode: hard, elastic, or policy (unset: the node policy decides).
    #[arg(long, value_name = "hard|elastic|policy")]
    pub mode: Option<OrPolicy<Mode>>,
    /// New priority: 0 to 100, or policy (unset: the node policy decides).
    #[arg(long, value_name = "0-100|policy")]
    pub priority: Option<OrPolicy<u32>>,
    /// Set a label (key=value) or remove one (key-). Repeat for several.
    #[arg(long = "label", value_name = "KEY=VALUE|KEY-")]
    pub labels: Vec<String>,
    /// New cgroup (as for `add`).
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
}

/// A value, or `policy`: leave the field unset so the node policy decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrPolicy<T> {
    /// An explicit value.
    Value(T),
    /// Unset.
    Policy,
}

/// A value that is neither `T` nor `policy`: `T`'s error, and the
/// alternative.
#[derive(Debug, thiserror::Error)]
#[error("{0} (or policy: unset, the node policy decides)")]
pub struct NotValueOrPolicy<E>(pub E);

impl<T: FromStr<Err: std::fmt::Display>> FromStr for OrPolicy<T> {
    type Err = NotValueOrPolicy<T::Err>;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "policy" {
            return Ok(Self::Policy);
        }
        s.parse().map(Self::Value).map_err(NotValueOrPolicy)
    }
}

impl<T> OrPolicy<T> {
    fn into_option(self) -> Option<T> {
        match self {
            Self::Value(v) => Some(v),
            Self::Policy => None,
        }
    }
}

/// Why a container command failed.
#[derive(Debug, thiserror::Error)]
pub enum ContainerCommandError {
    /// A `--gpu` value is malformed.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A `--gpu` value names a launch rate.
    #[error(
        "gpu spec {0:?}: rate, burst and floor are set by the agent from --sm-target; accepted keys: memory, overhead"
    )]
    Rate(String),
    /// A `--cgroup` value is not accepted.
    #[error("--cgroup: {0}")]
    Cgroup(IdentityError),
    /// A `--label` value is not accepted.
    #[error("--label: {0}")]
    Label(LabelError),
    /// `add` was given a `--label key-` (a removal).
    #[error("--label: {0}- removes a label, which add cannot; accepted here: key=value")]
    RemoveOnAdd(String),
    /// The store refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Thawing or allowing failed.
    #[error(transparent)]
    Watchdog(#[from] crate::watchdog::ActionError),
}

fn grant(spec: &str) -> Result<(GpuGrant, bool), ContainerCommandError> {
    let g = parse_gpu(spec)?;
    if g.launch_rate != UNLIMITED || g.launch_burst != 0 || g.launch_floor != 0 {
        return Err(ContainerCommandError::Rate(spec.to_owned()));
    }
    let overhead_given = spec.split(',').skip(1).any(|p| {
        p.split_once('=')
            .is_some_and(|(k, _)| k.trim() == "overhead")
    });
    Ok((
        GpuGrant {
            uuid: format_uuid(&g.uuid),
            memory_limit_bytes: (g.memory_limit != UNLIMITED).then_some(g.memory_limit),
            context_overhead_bytes: g.context_overhead,
        },
        overhead_given,
    ))
}

/// A `--cgroup` value as a path relative to the v2 root.
pub fn cgroup_rel(path: &Path, v2_root: Option<&Path>) -> Result<String, ContainerCommandError> {
    let rel = match v2_root.and_then(|r| path.strip_prefix(r).ok()) {
        Some(rest) => format!("/{}", rest.display()),
        None => path.display().to_string(),
    };
    let rel = if rel.len() > 1 {
        rel.trim_end_matches('/').to_owned()
    } else {
        rel
    };
    check_cgroup(&rel).map_err(ContainerCommandError::Cgroup)?;
    Ok(rel)
}

fn cgroup_arg(path: &Option<PathBuf>) -> Result<Option<String>, ContainerCommandError> {
    let root = cgroup2_root().ok();
    path.as_deref()
        .map(|p| cgroup_rel(p, root.as_deref()))
        .transpose()
}

fn label_edits(args: &[String]) -> Result<Vec<LabelEdit>, ContainerCommandError> {
    args.iter()
        .map(|a| parse_label_arg(a).map_err(ContainerCommandError::Label))
        .collect()
}

fn add(store: &Store, a: &AddArgs) -> Result<String, ContainerCommandError> {
    let mut labels = std::collections::BTreeMap::new();
    for edit in label_edits(&a.labels)? {
        match edit {
            LabelEdit::Set(k, v) => {
                labels.insert(k, v);
            }
            LabelEdit::Remove(k) => {
                return Err(ContainerCommandError::RemoveOnAdd(k));
            }
        }
    }
    let gpus = a
        .gpus
        .iter()
        .map(|s| grant(s).map(|(g, _)| g))
        .collect::<Result<Vec<_>, _>>()?;
    let meta = Metadata {
        version: META_VERSION,
        namespace: a.namespace.clone(),
        pod: a.pod.clone(),
        container: a.container.clone(),
        claim: None,
        pod_uid: None,
        cgroup: cgroup_arg(&a.cgroup)?,
        sm_target: a.sm_target,
        mode: a.mode,
        priority: a.priority,
        labels,
        fail_open: a.fail_open,
        gpus,
    };
    let c = store.add(&a.id, &meta)?;
    Ok(c.dir.display().to_string())
}

fn set(store: &Store, a: &SetArgs) -> Result<String, ContainerCommandError> {
    let grants = a
        .gpus
        .iter()
        .map(|s| grant(s))
        .collect::<Result<Vec<_>, _>>()?;
    let cgroup = cgroup_arg(&a.cgroup)?;
    let edits = label_edits(&a.labels)?;
    let c = store.set(&a.id, |m| {
        for (g, overhead_given) in &grants {
            let Some(cur) = m
                .gpus
                .iter_mut()
                .find(|c| c.uuid.eq_ignore_ascii_case(&g.uuid))
            else {
                return Err(format!(
                    "has no GPU {}; its GPUs: {} (GPUs cannot be added to a running container)",
                    g.uuid,
                    m.gpus
                        .iter()
                        .map(|g| g.uuid.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            };
            cur.memory_limit_bytes = g.memory_limit_bytes;
            if *overhead_given {
                cur.context_overhead_bytes = g.context_overhead_bytes;
            }
        }
        if let Some(t) = a.sm_target {
            m.sm_target = t;
        }
        if let Some(mode) = a.mode {
            m.mode = mode.into_option();
        }
        if let Some(p) = a.priority {
            m.priority = p.into_option();
        }
        for e in &edits {
            match e {
                LabelEdit::Set(k, v) => {
                    m.labels.insert(k.clone(), v.clone());
                }
                LabelEdit::Remove(k) => {
                    m.labels.remove(k);
                }
            }
        }
        if cgroup.is_some() {
            m.cgroup.clone_from(&cgroup);
        }
        Ok(())
    })?;
    Ok(format!("updated {}", c.dir.display()))
}

fn mib(b: Option<u64>) -> String {
    b.map_or_else(|| "unlimited".to_owned(), |b| format!("{}", b >> 20))
}

fn list(store: &Store, json: bool) -> Result<String, ContainerCommandError> {
    let l = store.list()?;
    if json {
        let v = serde_json::json!({
            "root": store.root(),
            "containers": l.containers.iter().map(|c| serde_json::json!({
                "id": c.id.as_str(),
                "dir": c.dir,
                "meta": c.meta,
            })).collect::<Vec<_>>(),
            "skipped": l.skipped.iter().map(|s| serde_json::json!({
                "name": s.name,
                "reason": s.reason,
            })).collect::<Vec<_>>(),
        });
        return Ok(serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string()));
    }
    let mut out = format!(
        "{:<24} {:>4} {:<8} {:>4}  {:<40} {:>10}\n",
        "ID", "SM%", "MODE", "PRIO", "GPU", "MEMORY_MIB"
    );
    for c in &l.containers {
        for (i, g) in c.meta.gpus.iter().enumerate() {
            let (id, sm, mode, prio) = if i == 0 {
                (
                    c.id.to_string(),
                    c.meta.sm_target.to_string(),
                    c.meta
                        .mode
                        .map_or_else(|| "policy".to_owned(), |m| m.to_string()),
                    c.meta
                        .priority
                        .map_or_else(|| "-".to_owned(), |p| p.to_string()),
                )
            } else {
                Default::default()
            };
            out.push_str(&format!(
                "{id:<24} {sm:>4} {mode:<8} {prio:>4}  {:<40} {:>10}\n",
                g.uuid,
                mib(g.memory_limit_bytes)
            ));
        }
    }
    for s in &l.skipped {
        out.push_str(&format!("skipped {:?}: {}\n", s.name, s.reason));
    }
    Ok(out.trim_end().to_owned())
}

/// Runs `args`; returns what to print.
pub fn run(args: &ContainerArgs) -> Result<String, ContainerCommandError> {
    let store = Store::new(&args.root);
    match &args.command {
        ContainerCommand::Add(a) => add(&store, a),
        ContainerCommand::Set(a) => set(&store, a),
        ContainerCommand::Rm { id } => {
            store.remove(id)?;
            Ok(format!("removed {}", store.dir(id).display()))
        }
        ContainerCommand::List { json } => list(&store, *json),
        ContainerCommand::Thaw { id } => {
            let c = store.load(id)?;
            Ok(crate::watchdog::actions::thaw_container(&c.meta)?)
        }
        ContainerCommand::Allow { id, deny_pin_dir } => {
            store.load(id)?;
            Ok(crate::watchdog::actions::allow_container(
                deny_pin_dir,
                id.as_str(),
            )?)
        }
        ContainerCommand::Show { id } => {
            let c = store.load(id)?;
            let region = super::region::show(&c.dir).unwrap_or_else(
                |e| serde_json::json!({"error": crate::error_chain::with_causes(&e)}),
            );
            let v = serde_json::json!({"id": c.id.as_str(), "dir": c.dir, "meta": c.meta, "region": region});
            Ok(serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_become_relative_to_the_v2_root() {
        let root = Path::new("/sys/fs/cgroup/unified");
        assert_eq!(
            cgroup_rel(
                Path::new("/sys/fs/cgroup/unified/system.slice/x.scope/"),
                Some(root)
            )
            .unwrap(),
            "/system.slice/x.scope"
        );
        assert_eq!(
            cgroup_rel(Path::new("/system.slice/x.scope"), Some(root)).unwrap(),
            "/system.slice/x.scope"
        );
        assert!(cgroup_rel(Path::new("/a/../../etc"), Some(root)).is_err());
        assert!(cgroup_rel(Path::new("rel"), None).is_err());
    }

    #[test]
    fn specs_with_a_rate_are_refused() {
        let u = "GPU-5e1a0000-0000-4000-8000-000051510000";
        let e = grant(&format!("{u},rate=5")).unwrap_err().to_string();
        assert!(e.contains("--sm-target"), "{e}");
        let (g, o) = grant(&format!("{u},memory=10")).unwrap();
        assert_eq!((g.memory_limit_bytes, o), (Some(10 << 20), false));
        assert!(grant(&format!("{u},overhead=3")).unwrap().1);
    }
}
