//! The node's GPUs: the simulator's, injected into GPU containers as
//! NVIDIA's container toolkit injects the real driver.
//!
//! `up` makes, under `target/cluster/run/gpusim/`:
//! - `node.toml`, the node description every process on the node uses (the
//!   demo's four H100s, or `up --node FILE`), its `[ioctl]` stand-ins
//!   renamed to NVIDIA's device nodes: `/dev/nvidiactl`, `/dev/nvidia-uvm`
//!   and `/dev/nvidia<i>` per GPU;
//! - `state`, the simulator's one shared state file for the node (host
//!   processes, the agent and every GPU container map the same file);
//! - `lib/`, a copy of the simulator's `libcuda.so.1` and
//!   `libnvidia-ml.so.1` (from the artifacts of `cargo xtask build`);
//! - `runtime/`, the OCI runtime containerd runs as its `nvidia` handler
//!   (the default one, as NVIDIA's GPU operator configures it): a link to
//!   the `gpusim-container-runtime` program and its `config.json`;
//! - and `run/cdi/nvidia.com-gpu.json`, the same edits as a CDI spec
//!   (`nvidia.com/gpu=0`, `=<uuid>`, `=all`), for device plugins that
//!   answer with CDI names and for DRA.
//!
//! The device nodes are made on the host, in `/dev`, as character devices
//! with the numbers of the devices that the input description's `[ioctl]`
//! section names as stand-ins (`/dev/null` for the control device,
//! `/dev/zero` for UVM, `/dev/full` for a GPU without one): opening them
//! and their ioctls are harmless, the eBPF observer sees both, and kubelet
//! and runc find the nodes that the agent's `Allocate` names. Every GPU
//! without its own stand-in shares `/dev/full`'s numbers, so a device
//! cgroup cannot tell such GPUs apart. `up` records each node it made in
//! the cluster's state; `down` removes exactly those. An existing node of
//! another kind (a real NVIDIA driver's) stops `up`.

use std::fs;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use gpusim::NodeDescription;
use serde_json::json;

use super::Layout;
use crate::files::replace_symlink;
use crate::sh::{self, workspace_root};

/// The runtime handler (and RuntimeClass) of GPU containers, as NVIDIA's.
pub const RUNTIME_HANDLER: &str = "nvidia";
/// The program containerd runs for [`RUNTIME_HANDLER`], in `bin/`.
pub const RUNTIME_PROGRAM: &str = "gpusim-container-runtime";
/// The simulator's libraries that a GPU container gets.
pub const LIBRARIES: [&str; 2] = ["libcuda.so.1", "libnvidia-ml.so.1"];
/// The shared device nodes.
pub const CONTROL_DEVICE: &str = "/dev/nvidiactl";
pub const UVM_DEVICE: &str = "/dev/nvidia-uvm";

/// Stand-in for a GPU whose description names none.
const DEFAULT_GPU_STAND_IN: &str = "/dev/full";

/// The demo's node (`xtask/src/demo/plan.rs`): four H100s, two per NUMA
/// node, 500 MiB per context, `spin` kernels of 1 ms.
pub const DEFAULT_NODE: &str = "driver_version = \"595.45.04\"

[[gpu]]
model = \"NVIDIA H100 80GB HBM3\"
memory_mib = 81559
sm_count = 132
numa_node = 0

[[gpu]]
model = \"NVIDIA H100 80GB HBM3\"
memory_mib = 81559
sm_count = 132
numa_node = 0

[[gpu]]
model = \"NVIDIA H100 80GB HBM3\"
memory_mib = 81559
sm_count = 132
numa_node = 1

[[gpu]]
model = \"NVIDIA H100 80GB HBM3\"
memory_mib = 81559
sm_count = 132
numa_node = 1

[cost]
context_overhead_mib = 500
[cost.functions.spin]
fixed_ns = 1000000
";

impl Layout {
    /// The simulated node's files.
    pub fn gpusim_dir(&self) -> PathBuf {
        self.run().join("gpusim")
    }
    /// The node description every process on the node uses.
    pub fn gpusim_node(&self) -> PathBuf {
        self.gpusim_dir().join("node.toml")
    }
    /// The simulator's shared state file.
    pub fn gpusim_state(&self) -> PathBuf {
        self.gpusim_dir().join("state")
    }
    fn gpusim_lib(&self) -> PathBuf {
        self.gpusim_dir().join("lib")
    }
    /// What containerd runs for the `nvidia` handler: a link named as
    /// NVIDIA's runtime, beside the configuration it reads.
    pub fn gpu_runtime(&self) -> PathBuf {
        self.gpusim_dir().join("runtime/nvidia-container-runtime")
    }
    fn gpu_runtime_config(&self) -> PathBuf {
        self.gpusim_dir().join("runtime/config.json")
    }
    /// The CDI spec of the simulated GPUs (kind `nvidia.com/gpu`), in the
    /// folder containerd reads CDI specs from.
    pub fn cdi_spec(&self) -> PathBuf {
        self.run().join("cdi/nvidia.com-gpu.json")
    }
    /// One line per container the runtime gave GPUs.
    pub fn gpu_runtime_log(&self) -> PathBuf {
        self.logs().join("gpusim-container-runtime.log")
    }
}

/// The folder holding the simulator's libraries: `sim/` of the artifacts
/// (`TESSERA_ARTIFACTS`, default `target/tessera/debug`).
pub fn sim_libraries() -> PathBuf {
    std::env::var_os("TESSERA_ARTIFACTS")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || workspace_root().join("target/tessera/debug"),
            PathBuf::from,
        )
        .join("sim")
}

/// What is missing for the simulated GPUs, if anything.
pub fn missing_libraries() -> Option<String> {
    let dir = sim_libraries();
    LIBRARIES.iter().find(|l| !dir.join(l).is_file()).map(|l| {
        format!(
            "no {} for the simulated GPUs: run `cargo xtask build` first",
            dir.join(l).display()
        )
    })
}

/// The `/dev/nvidia<i>` node of GPU `i`.
pub fn gpu_device(i: usize) -> PathBuf {
    PathBuf::from(format!("/dev/nvidia{i}"))
}

/// A device node the node needs: where, and which existing device's
/// numbers it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StandIn {
    pub path: PathBuf,
    pub like: PathBuf,
}

/// The node as `up` sets it up.
#[derive(Debug)]
pub struct SimNode {
    /// The description's text, with the `[ioctl]` stand-ins renamed.
    pub toml: String,
    pub description: NodeDescription,
    pub stand_ins: Vec<StandIn>,
}

/// Reads the input description (`None`: the demo's node) and renames its
/// stand-ins to NVIDIA's device nodes.
pub fn sim_node(input: Option<&Path>) -> Result<SimNode> {
    let (text, origin) = match input {
        Some(path) => (
            fs::read_to_string(path)
                .with_context(|| format!("cannot read node description {}", path.display()))?,
            path.to_path_buf(),
        ),
        None => (DEFAULT_NODE.to_owned(), PathBuf::from("<default node>")),
    };
    let given = NodeDescription::parse(&text, &origin)?;
    let gpus = given.gpu.len();
    let mut stand_ins = vec![
        StandIn {
            path: CONTROL_DEVICE.into(),
            like: given.ioctl.control.clone(),
        },
        StandIn {
            path: UVM_DEVICE.into(),
            like: given.ioctl.uvm.clone(),
        },
    ];
    for i in 0..gpus {
        stand_ins.push(StandIn {
            path: gpu_device(i),
            like: given
                .ioctl
                .gpu_devices
                .get(i)
                .cloned()
                .unwrap_or_else(|| DEFAULT_GPU_STAND_IN.into()),
        });
    }
    let devices: Vec<String> = (0..gpus)
        .map(|i| format!("{:?}", gpu_device(i).display().to_string()))
        .collect();
    let mut toml = without_table(&text, "ioctl");
    toml.push_str(&format!(
        "\n# The stand-ins under NVIDIA's names (made by `cargo xtask cluster up`).\n[ioctl]\nenabled = {}\nxfer = {}\ncontrol = {CONTROL_DEVICE:?}\nuvm = {UVM_DEVICE:?}\ngpu_devices = [{}]\n",
        given.ioctl.enabled,
        given.ioctl.xfer,
        devices.join(", ")
    ));
    let description = NodeDescription::parse(&toml, &origin)
        .with_context(|| format!("{}: write [ioctl] as a table of its own", origin.display()))?;
    if description.ioctl.control != Path::new(CONTROL_DEVICE) {
        bail!(
            "{}: write [ioctl] as a table of its own (not dotted keys or an inline table)",
            origin.display()
        );
    }
    Ok(SimNode {
        toml,
        description,
        stand_ins,
    })
}

/// `text` without the TOML table `[name]` (its header line up to the next
/// table header).
fn without_table(text: &str, name: &str) -> String {
    let header = format!("[{name}]");
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            let head = trimmed.split('#').next().unwrap_or("").trim();
            skipping = head.replace(' ', "") == header;
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The device numbers of the character device at `path`.
fn char_device(path: &Path) -> Result<Option<u64>> {
    match fs::metadata(path) {
        Ok(meta) if meta.file_type().is_char_device() => Ok(Some(meta.rdev())),
        Ok(_) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot look at {}", path.display())),
    }
}

/// Makes the stand-in device nodes that are missing; returns those it
/// made. One already there with the stand-in's numbers is used as it is
/// (and not recorded: `down` leaves it); any other stops `up`.
pub fn make_devices(stand_ins: &[StandIn], made: &mut Vec<PathBuf>) -> Result<()> {
    for s in stand_ins {
        let rdev = char_device(&s.like)?.with_context(|| {
            format!(
                "stand-in {} for {} is not a character device",
                s.like.display(),
                s.path.display()
            )
        })?;
        match fs::symlink_metadata(&s.path) {
            Ok(meta) if meta.file_type().is_char_device() && meta.rdev() == rdev => {
                eprintln!(
                    "gpus: {} is there already (as {})",
                    s.path.display(),
                    s.like.display()
                );
                continue;
            }
            Ok(_) => bail!(
                "{} exists and is not the simulator's stand-in (a real NVIDIA driver's node?): the simulated node would shadow it; remove it or start the cluster elsewhere",
                s.path.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot look at {}", s.path.display()));
            }
        }
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &s.path,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rdev,
        )
        .with_context(|| format!("cannot make device node {}", s.path.display()))?;
        // The umask may have taken bits off.
        fs::set_permissions(&s.path, fs::Permissions::from_mode(0o666))
            .with_context(|| format!("cannot open up {}", s.path.display()))?;
        made.push(s.path.clone());
        eprintln!(
            "gpus: made {} (numbers of {})",
            s.path.display(),
            s.like.display()
        );
    }
    Ok(())
}

/// Writes the node description, the state file, the libraries and the
/// runtime's configuration.
pub fn write_files(layout: &Layout, node: &SimNode) -> Result<()> {
    let lib = layout.gpusim_lib();
    let runtime_dir = layout
        .gpu_runtime()
        .parent()
        .expect("the runtime has a folder")
        .to_path_buf();
    for dir in [&lib, &runtime_dir] {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let write = |path: &Path, text: &str| {
        fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
    };
    write(&layout.gpusim_node(), &node.toml)?;
    // The runtime's log starts afresh with each cluster, as the others.
    match fs::remove_file(layout.gpu_runtime_log()) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e)
                .with_context(|| format!("cannot remove {}", layout.gpu_runtime_log().display()));
        }
        _ => {}
    }
    let sources = sim_libraries();
    let mut libraries = Vec::new();
    for name in LIBRARIES {
        let to = lib.join(name);
        fs::copy(sources.join(name), &to).with_context(|| {
            format!(
                "cannot copy {} (run `cargo xtask build` first)",
                sources.join(name).display()
            )
        })?;
        libraries.push(to);
    }
    // The state file: made now, with this description, root's, and
    // writable by every uid, so containers running as any user use the
    // GPUs (the simulator accepts a root-owned file named explicitly, as
    // the runtime names it in GPUSIM_STATE, whatever its mode); the node
    // description readable by all.
    let cfg = gpusim::state::Config {
        node_path: Some(layout.gpusim_node()),
        state_path: layout.gpusim_state(),
    };
    drop(gpusim::Sim::open(&cfg).with_context(|| {
        format!(
            "cannot create the simulator's state {}",
            layout.gpusim_state().display()
        )
    })?);
    {
        use std::os::unix::fs::PermissionsExt as _;
        for (path, mode) in [
            (layout.gpusim_state(), 0o666),
            (layout.gpusim_node(), 0o644),
        ] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .with_context(|| format!("cannot set the mode of {}", path.display()))?;
        }
    }

    let gpus: Vec<_> = (0..node.description.gpu.len())
        .map(|i| json!({"uuid": node.description.uuid(i), "device": gpu_device(i)}))
        .collect();
    let config = json!({
        "runc": layout.bin().join("runc"),
        "libraries": libraries,
        "state": layout.gpusim_state(),
        "node": layout.gpusim_node(),
        "control": CONTROL_DEVICE,
        "uvm": UVM_DEVICE,
        "gpus": gpus,
        "log": layout.gpu_runtime_log(),
    });
    write(
        &layout.gpu_runtime_config(),
        &serde_json::to_string_pretty(&config)?,
    )?;
    replace_symlink(layout.bin().join(RUNTIME_PROGRAM), &layout.gpu_runtime())?;
    sh::run(
        Command::new(layout.bin().join(RUNTIME_PROGRAM))
            .arg("cdi")
            .arg("--config")
            .arg(layout.gpu_runtime_config())
            .arg("--output")
            .arg(layout.cdi_spec()),
    )
    .context("cannot write the CDI spec of the simulated GPUs")?;
    Ok(())
}

/// The RuntimeClass of GPU containers, for pods that name it.
pub fn runtime_class() -> String {
    json!({
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": RUNTIME_HANDLER},
        "handler": RUNTIME_HANDLER,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_node_is_four_h100s_with_nvidias_device_names() {
        let node = sim_node(None).unwrap();
        assert_eq!(node.description.gpu.len(), 4);
        assert!(
            node.description
                .gpu
                .iter()
                .all(|g| g.model.contains("H100"))
        );
        assert_eq!(node.description.ioctl.control, Path::new(CONTROL_DEVICE));
        assert_eq!(node.description.ioctl.uvm, Path::new(UVM_DEVICE));
        assert_eq!(node.description.ioctl.gpu_devices[3], gpu_device(3));
        assert_eq!(
            node.stand_ins[..3],
            [
                StandIn {
                    path: CONTROL_DEVICE.into(),
                    like: "/dev/null".into()
                },
                StandIn {
                    path: UVM_DEVICE.into(),
                    like: "/dev/zero".into()
                },
                StandIn {
                    path: "/dev/nvidia0".into(),
                    like: "/dev/full".into()
                },
            ]
        );
    }

    #[test]
    fn a_given_nodes_stand_ins_give_the_numbers_and_its_ioctl_table_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        fs::write(
            &file,
            "[[gpu]]\nmodel = \"NVIDIA A100\"\nmemory_mib = 40000\nsm_count = 108\n\n[ioctl]\ncontrol = \"/dev/zero\"\nxfer = true\ngpu_devices = [\"/dev/random\"]\n\n[cost]\nwave_ns = 1000\n",
        )
        .unwrap();
        let node = sim_node(Some(&file)).unwrap();
        assert_eq!(node.description.gpu.len(), 1);
        assert!(node.description.ioctl.xfer);
        assert_eq!(node.description.cost.wave_ns, 1000);
        assert_eq!(node.stand_ins[0].like, Path::new("/dev/zero"));
        assert_eq!(node.stand_ins[2].like, Path::new("/dev/random"));
        assert_eq!(node.description.ioctl.gpu_devices, [gpu_device(0)]);
        assert_eq!(node.toml.matches("[ioctl]").count(), 1);

        fs::write(&file, "[[gpu]]\nmodel = \"x\"\nmemory_mib = 0\n").unwrap();
        assert!(sim_node(Some(&file)).is_err());
    }

    #[test]
    fn a_device_node_of_another_kind_stops_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvidiactl");
        fs::write(&path, "").unwrap();
        let mut made = Vec::new();
        let err = make_devices(
            &[StandIn {
                path: path.clone(),
                like: "/dev/null".into(),
            }],
            &mut made,
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("not the simulator's stand-in"));
        assert!(made.is_empty());
    }
}
