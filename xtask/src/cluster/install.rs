//! `cargo xtask cluster install | uninstall`: Tessera on the local cluster,
//! as an operator installs it on theirs: the images (`cargo xtask images`,
//! imported into the node's containerd, since no registry is reachable),
//! the GPU node label, then `helm install` of `deploy/helm/tessera` with
//! the Helm SDK (`xtask/testkit/helm_release.py`: CRDs, RBAC, the agent
//! DaemonSet, the scheduler with its extender, the webhook and its
//! `caBundle`), waiting until its workloads are ready.
//!
//! The values this node needs besides the chart's defaults
//! ([`local_values`]): images already present (`pullPolicy: Never`), the
//! kubelet's root directory for PodResources (the cluster's, under
//! `target/cluster/run/`; kubelet keeps device-plugin sockets in
//! `/var/lib/kubelet/device-plugins` whatever its root, the default),
//! the agent's state under the cluster's run folder (so `down` takes it
//! away), the cgroup v2 tree, and the simulated device nodes for the eBPF
//! observer (a real node's NVIDIA devices are found in `/proc`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::{Layout, NODE_NAME, State, gpu};
use crate::images;
use crate::sh::{self, workspace_root};

/// The release and its namespace.
pub const RELEASE: &str = "tessera";
pub const NAMESPACE: &str = "tessera-system";
/// The label the chart's agent selects nodes by.
const GPU_LABEL: &str = "nvidia.com/gpu.present=true";

#[derive(clap::Args, Clone, Debug)]
pub struct InstallArgs {
    /// More values (YAML), merged over the local cluster's, as `helm -f`.
    #[arg(long, value_name = "FILE")]
    pub values: Vec<PathBuf>,
    /// Seconds to wait for the release's workloads to be ready.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    /// Use the images already imported (skip `cargo xtask images`).
    #[arg(long)]
    pub no_images: bool,
    /// Build the images from the artifacts in DIR (`target/tessera/<profile>`)
    /// instead of a release build.
    #[arg(long, value_name = "DIR", conflicts_with = "no_images")]
    pub artifacts: Option<PathBuf>,
}

/// The values the local cluster needs, for a node with `gpus` GPUs and
/// its cgroup v2 tree at `cgroup_v2`.
pub fn local_values(layout: &Layout, gpus: usize, cgroup_v2: &Path) -> serde_json::Value {
    let kubelet = layout.kubelet_dir();
    let mut devices = vec![
        format!("control={}", gpu::CONTROL_DEVICE),
        format!("uvm={}", gpu::UVM_DEVICE),
    ];
    devices.extend((0..gpus).map(|i| format!("gpu={}", gpu::gpu_device(i).display())));
    json!({
        "image": {"pullPolicy": "Never"},
        "agent": {
            "hostPaths": {
                "state": layout.run().join("tessera"),
                "podResources": kubelet.join("pod-resources"),
                "cgroup": cgroup_v2,
                // DRA mode (`dra.enabled`): kubelet's plugin folders under
                // its root, and the folder containerd reads CDI specs from.
                "pluginsRegistry": kubelet.join("plugins_registry"),
                "kubeletPlugins": kubelet.join("plugins"),
                "cdi": layout.run().join("cdi"),
            },
            "watchdog": {"devices": devices},
        },
    })
}

fn helm_script() -> PathBuf {
    workspace_root().join("xtask/testkit/helm_release.py")
}

fn require_up(layout: &Layout) -> Result<()> {
    match State::load(&layout.state_file())? {
        Some(state) if state.complete && state.processes.iter().all(|p| p.alive()) => Ok(()),
        _ => bail!("the cluster is not up: run `cargo xtask cluster up` first"),
    }
}

/// The mount point of the cgroup v2 hierarchy on this host.
fn cgroup_v2_root() -> Result<PathBuf> {
    let mounts = tessera_mountinfo::read().context("cannot read the mount table")?;
    mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point.clone())
        .min_by_key(|p| p.components().count())
        .context("no cgroup v2 hierarchy is mounted (the agent needs one)")
}

pub fn install(layout: &Layout, args: &InstallArgs) -> Result<()> {
    require_up(layout)?;
    if !args.no_images {
        let built = images::build(&images::Args {
            artifacts: args.artifacts.clone(),
            ..images::Args::default()
        })?;
        images::import_with(&built, || layout.ctr())?;
    }
    sh::output(
        layout
            .kubectl()
            .args(["label", "node", NODE_NAME, GPU_LABEL, "--overwrite"]),
    )
    .with_context(|| format!("cannot label node {NODE_NAME} {GPU_LABEL}"))?;
    let node = gpusim::NodeDescription::from_file(&layout.gpusim_node()).with_context(|| {
        format!(
            "cannot read the node's GPUs from {}",
            layout.gpusim_node().display()
        )
    })?;
    let values = local_values(layout, node.gpu.len(), &cgroup_v2_root()?);
    let mut helm = Command::new("python3");
    helm.arg(helm_script())
        .arg("install")
        .arg(layout.kubeconfig())
        .args([NAMESPACE, RELEASE])
        .arg(workspace_root().join("deploy/helm/tessera"))
        .arg(values.to_string())
        .arg(args.timeout.to_string())
        .args(&args.values);
    let out = sh::output(&mut helm).context(
        "helm install of deploy/helm/tessera failed (the SDK's error above; `cargo xtask setup` installs helm-python-sdk)",
    )?;
    eprintln!("{}", out.trim());
    eprintln!(
        "installed: release {RELEASE} in namespace {NAMESPACE}\nsee it:    {} kubectl --kubeconfig {} -n {NAMESPACE} get pods",
        layout.tessera_kube().display(),
        layout.kubeconfig().display()
    );
    Ok(())
}

pub fn uninstall(layout: &Layout) -> Result<()> {
    require_up(layout)?;
    let out = sh::output(
        Command::new("python3")
            .arg(helm_script())
            .arg("uninstall")
            .arg(layout.kubeconfig())
            .args([NAMESPACE, RELEASE]),
    )
    .context("helm uninstall of the tessera release failed")?;
    eprintln!("{}", out.trim());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_values_name_the_cluster_s_paths_and_every_gpu() {
        let layout = Layout::at("/t/cluster".into());
        let v = local_values(&layout, 2, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(v["image"]["pullPolicy"], "Never");
        let a = &v["agent"];
        assert_eq!(a["hostPaths"]["state"], "/t/cluster/run/tessera");
        // kubelet keeps device-plugin sockets under /var/lib/kubelet
        // whatever its root: the chart's default stands.
        assert!(a["hostPaths"]["devicePlugins"].is_null());
        assert_eq!(
            a["hostPaths"]["podResources"],
            "/t/cluster/run/kubelet/pod-resources"
        );
        assert_eq!(
            a["hostPaths"]["kubeletPlugins"],
            "/t/cluster/run/kubelet/plugins"
        );
        assert_eq!(a["hostPaths"]["cgroup"], "/sys/fs/cgroup/unified");
        assert_eq!(
            a["watchdog"]["devices"],
            json!([
                "control=/dev/nvidiactl",
                "uvm=/dev/nvidia-uvm",
                "gpu=/dev/nvidia0",
                "gpu=/dev/nvidia1"
            ])
        );
    }
}
