//! The cluster's configuration files (under `target/cluster/run/`) and each
//! component's command line.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::host::CgroupLayout;
use super::state::Component;
use super::{
    APISERVER_PORT, BRIDGE, CONTROLLER_MANAGER_PORT, ETCD_CLIENT_PORT, ETCD_PEER_PORT,
    KUBELET_HEALTHZ_PORT, KUBELET_PORT, Layout, NODE_IP, NODE_NAME, PAUSE_IMAGE, POD_CIDR,
    SCHEDULER_PORT, SERVICE_CIDR, SERVICE_IP,
};

/// The name of the pod network (CNI).
const NETWORK: &str = "tessera";

impl Layout {
    fn config_dir(&self) -> PathBuf {
        self.run().join("config")
    }
    fn component_kubeconfig(&self, user: &str) -> PathBuf {
        self.config_dir().join(format!("{user}.kubeconfig"))
    }
    fn containerd_config(&self) -> PathBuf {
        self.containerd_dir().join("config.toml")
    }
    fn kubelet_config(&self) -> PathBuf {
        self.config_dir().join("kubelet.yaml")
    }
    fn cni_conf_dir(&self) -> PathBuf {
        self.run().join("cni/net.d")
    }
    fn cert(&self, name: &str) -> PathBuf {
        self.pki().join(format!("{name}.crt"))
    }
    fn key(&self, name: &str) -> PathBuf {
        self.pki().join(format!("{name}.key"))
    }
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// The API server's URL.
fn server() -> String {
    format!("https://{NODE_IP}:{APISERVER_PORT}")
}

/// A kubeconfig for `user`, authenticated by the client certificate
/// `pki/<cert>.crt`; file paths, not inline data.
fn kubeconfig(layout: &Layout, user: &str, cert: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: tessera
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: {user}@tessera
  context:
    cluster: tessera
    user: {user}
current-context: {user}@tessera
",
        server = server(),
        ca = p(&layout.cert("ca")),
        crt = p(&layout.cert(cert)),
        key = p(&layout.key(cert)),
    )
}

/// Writes every configuration file and the admin kubeconfig.
pub fn write_all(layout: &Layout, cgroups: &CgroupLayout) -> Result<()> {
    write(&layout.kubeconfig(), &kubeconfig(layout, "admin", "admin"))?;
    for (user, cert) in [
        ("kube-controller-manager", "kube-controller-manager"),
        ("kube-scheduler", "kube-scheduler"),
        ("kubelet", "kubelet"),
    ] {
        write(
            &layout.component_kubeconfig(user),
            &kubeconfig(layout, user, cert),
        )?;
    }
    write(&layout.containerd_config(), &containerd(layout))?;
    write(&layout.kubelet_config(), &kubelet(layout, cgroups))?;
    write(
        &layout.cni_conf_dir().join("10-tessera.conflist"),
        &cni(layout),
    )?;
    fs::create_dir_all(layout.run().join("cdi")).context("cannot create the CDI folder")?;
    Ok(())
}

/// containerd 2.x's configuration (version 3): every path under
/// `run/containerd`, CRI with runc from this build, the CNI bridge, the
/// pause image named, `restrict_oom_score_adj` (root here may lack
/// CAP_SYS_RESOURCE, which lowering a score needs), network namespaces
/// under the state folder, CDI specs from `run/cdi`, NRI off. Two
/// runtime handlers: `runc`, and `nvidia`, the default (as NVIDIA's GPU
/// operator makes its runtime), the simulated node's GPU runtime that
/// wraps the same runc ([`super::gpu`]).
pub fn containerd(layout: &Layout) -> String {
    let dir = layout.containerd_dir();
    format!(
        "version = 3
root = \"{root}\"
state = \"{state}\"
temp = \"{temp}\"

[grpc]
  address = \"{socket}\"

[ttrpc]
  address = \"{socket}.ttrpc\"

[plugins.'io.containerd.internal.v1.opt']
  path = \"{opt}\"

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = \"overlayfs\"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = \"{pause}\"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = [\"{cdi}\"]

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = \"{gpu_handler}\"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = \"io.containerd.runc.v2\"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = \"{runc}\"
  Root = \"{runc_root}\"
  SystemdCgroup = false

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{gpu_handler}]
  runtime_type = \"io.containerd.runc.v2\"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{gpu_handler}.options]
  BinaryName = \"{gpu_runtime}\"
  Root = \"{runc_root}\"
  SystemdCgroup = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [\"{cni_bin}\"]
  conf_dir = \"{cni_conf}\"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = \"127.0.0.1\"
  stream_server_port = \"0\"
",
        root = p(&dir.join("root")),
        state = p(&dir.join("state")),
        temp = p(&dir.join("tmp")),
        socket = p(&layout.containerd_socket()),
        opt = p(&dir.join("opt")),
        pause = PAUSE_IMAGE,
        cdi = p(&layout.run().join("cdi")),
        runc = p(&layout.bin().join("runc")),
        gpu_handler = super::gpu::RUNTIME_HANDLER,
        gpu_runtime = p(&layout.gpu_runtime()),
        runc_root = p(&dir.join("runc")),
        cni_bin = p(&layout.cni_bin()),
        cni_conf = p(&layout.cni_conf_dir()),
    )
}

/// The pod network: the CNI bridge plugin on [`BRIDGE`] (which `up`
/// creates with the node's address), addresses from host-local, a
/// default route through the node; no masquerading (traffic stays on the
/// node, and this machine may have no iptables).
pub fn cni(layout: &Layout) -> String {
    let config = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": p(&layout.run().join("cni/ipam")),
            },
        }],
    });
    serde_json::to_string_pretty(&config).expect("a json value serialises")
}

/// The kubelet's configuration file.
pub fn kubelet(layout: &Layout, cgroups: &CgroupLayout) -> String {
    // The kubelet refuses cgroup v1 unless told otherwise (KEP-5573).
    let fail_cgroup_v1 = if cgroups.is_v1() { "false" } else { "true" };
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: {KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {KUBELET_HEALTHZ_PORT}
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
failCgroupV1: {fail_cgroup_v1}
failSwapOn: false
podLogsDir: {pod_logs}
tlsCertFile: {tls_crt}
tlsPrivateKeyFile: {tls_key}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
clusterDomain: cluster.local
# A build machine's disk may be fuller than the defaults allow (nodefs
# 10 %, imagefs 15 % free); the imported images cannot be pulled again.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
",
        socket = p(&layout.containerd_socket()),
        pod_logs = p(&layout.run().join("pod-logs")),
        tls_crt = p(&layout.cert("kubelet-serving")),
        tls_key = p(&layout.key("kubelet-serving")),
        ca = p(&layout.cert("ca")),
    )
}

/// The program and arguments of `component`.
pub fn command_line(layout: &Layout, component: Component) -> (PathBuf, Vec<OsString>) {
    let kube = layout.tessera_kube();
    let pki = |name: &str| p(&layout.pki().join(name));
    let kubeconfig = |user: &str| p(&layout.component_kubeconfig(user));
    let args: Vec<String> = match component {
        Component::Containerd => {
            return (
                layout.bin().join("containerd"),
                vec!["--config".into(), layout.containerd_config().into()],
            );
        }
        Component::ServiceProxy => {
            return (
                layout.bin().join("service-proxy"),
                vec![
                    "--listen".into(),
                    format!("{SERVICE_IP}:443").into(),
                    "--to".into(),
                    format!("{NODE_IP}:{APISERVER_PORT}").into(),
                ],
            );
        }
        Component::Etcd => vec![
            "etcd".into(),
            format!("--data-dir={}", p(&layout.run().join("etcd"))),
            format!("--client-url=http://127.0.0.1:{ETCD_CLIENT_PORT}"),
            format!("--peer-url=http://127.0.0.1:{ETCD_PEER_PORT}"),
        ],
        Component::ApiServer => vec![
            "kube-apiserver".into(),
            format!("--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}"),
            format!("--bind-address={NODE_IP}"),
            format!("--advertise-address={NODE_IP}"),
            format!("--secure-port={APISERVER_PORT}"),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!("--client-ca-file={}", pki("ca.crt")),
            format!("--tls-cert-file={}", pki("apiserver.crt")),
            format!("--tls-private-key-file={}", pki("apiserver.key")),
            format!(
                "--kubelet-client-certificate={}",
                pki("apiserver-kubelet-client.crt")
            ),
            format!(
                "--kubelet-client-key={}",
                pki("apiserver-kubelet-client.key")
            ),
            format!("--kubelet-certificate-authority={}", pki("ca.crt")),
            "--kubelet-preferred-address-types=InternalIP".into(),
            format!("--service-account-key-file={}", pki("sa.pub")),
            format!("--service-account-signing-key-file={}", pki("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            // Webhooks and aggregated APIs are called at their service's
            // endpoints (pod IPs on the node's bridge): there is no
            // kube-proxy to carry cluster IPs.
            "--enable-aggregator-routing=true".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ],
        Component::ControllerManager => vec![
            "kube-controller-manager".into(),
            format!("--kubeconfig={}", kubeconfig("kube-controller-manager")),
            format!(
                "--authentication-kubeconfig={}",
                kubeconfig("kube-controller-manager")
            ),
            format!(
                "--authorization-kubeconfig={}",
                kubeconfig("kube-controller-manager")
            ),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={CONTROLLER_MANAGER_PORT}"),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=true".into(),
            format!("--service-account-private-key-file={}", pki("sa.key")),
            format!("--root-ca-file={}", pki("ca.crt")),
            format!("--cluster-signing-cert-file={}", pki("ca.crt")),
            format!("--cluster-signing-key-file={}", pki("ca.key")),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--profiling=false".into(),
        ],
        Component::Scheduler => vec![
            "kube-scheduler".into(),
            format!("--kubeconfig={}", kubeconfig("kube-scheduler")),
            format!(
                "--authentication-kubeconfig={}",
                kubeconfig("kube-scheduler")
            ),
            format!(
                "--authorization-kubeconfig={}",
                kubeconfig("kube-scheduler")
            ),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={SCHEDULER_PORT}"),
            "--leader-elect=false".into(),
            "--profiling=false".into(),
        ],
        Component::Kubelet => vec![
            "kubelet".into(),
            format!("--config={}", p(&layout.kubelet_config())),
            format!("--kubeconfig={}", kubeconfig("kubelet")),
            format!("--root-dir={}", p(&layout.kubelet_dir())),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={NODE_IP}"),
            "--v=1".into(),
        ],
    };
    (kube, args.into_iter().map(OsString::from).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::at(PathBuf::from("/w/target/cluster"))
    }

    #[test]
    fn containerd_names_the_pause_image_and_keeps_to_its_folders() {
        let text = containerd(&layout());
        assert!(text.contains(&format!("sandbox = \"{PAUSE_IMAGE}\"")));
        assert!(text.contains("restrict_oom_score_adj = true"));
        assert!(text.contains("default_runtime_name = \"nvidia\""));
        assert!(text.contains(&format!(
            "BinaryName = \"{}\"",
            layout().gpu_runtime().display()
        )));
        for line in text.lines().filter(|l| l.contains("= \"/")) {
            assert!(line.contains("\"/w/target/cluster/"), "{line}");
        }
    }

    #[test]
    fn the_kubelet_accepts_cgroup_v1_only_where_the_machine_has_it() {
        let v1 = kubelet(&layout(), &CgroupLayout::V1 { hybrid: true });
        assert!(v1.contains("failCgroupV1: false"));
        let v2 = kubelet(&layout(), &CgroupLayout::Unified);
        assert!(v2.contains("failCgroupV1: true"));
        assert!(v2.contains("cgroupDriver: cgroupfs"));
    }

    #[test]
    fn the_pod_network_is_the_nodes_bridge() {
        let value: serde_json::Value = serde_json::from_str(&cni(&layout())).unwrap();
        let bridge = &value["plugins"][0];
        assert_eq!(bridge["bridge"], BRIDGE);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["gateway"], NODE_IP);
        assert_eq!(bridge["ipMasq"], false);
    }

    #[test]
    fn every_kube_component_runs_from_the_multi_call_binary() {
        for component in [
            Component::Etcd,
            Component::ApiServer,
            Component::ControllerManager,
            Component::Scheduler,
            Component::Kubelet,
        ] {
            let (program, args) = command_line(&layout(), component);
            assert!(program.ends_with("bin/tessera-kube"));
            assert_eq!(args[0], component.name());
        }
        let (program, _) = command_line(&layout(), Component::Containerd);
        assert!(program.ends_with("bin/containerd"));
    }
}
