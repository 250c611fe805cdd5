//! `cargo xtask cluster up|down|status`: a real single-node Kubernetes on
//! this machine, from upstream code, for the tests and demos that need one.
//!
//! - `up` builds (once, cached: [`build`]) the project's two Go modules
//!   under `xtask/cluster/`: `kube/`, one multi-call binary `tessera-kube`
//!   (etcd embedded, kube-apiserver, kube-controller-manager,
//!   kube-scheduler, kubelet, kubectl of k8s.io/kubernetes v1.37.2), and
//!   `node/` (containerd 2.x with its runc shim and ctr, runc, the CNI
//!   bridge, host-local and loopback plugins, and the small programs of
//!   the images it imports: no registry is reachable, so the pause image
//!   and the test workload's image are made from the repository). It
//!   writes keys and configuration under `target/cluster/run/`, starts
//!   each component as a process of its own (logs in
//!   `target/cluster/logs/`), waits for the node to be Ready and writes
//!   the admin kubeconfig to `target/cluster/kubeconfig`. A second `up`
//!   finds the cluster running and changes nothing.
//! - `down` stops what `up` started, by the pids it recorded (checked
//!   against their start times, so a reused pid is never signalled),
//!   kills the pods' processes (the `kubepods` cgroups; only when the
//!   state file shows that this cluster's kubelet made them) and the runc
//!   shims of this cluster (by their executable), unmounts what the
//!   cluster mounted, deletes its bridge, restores the kernel tunables
//!   that the kubelet and the CNI bridge change, and removes
//!   `target/cluster/run/` and the kubeconfig. It keeps the build cache
//!   (`bin/`, `images/`) and the logs.
//! - `status` says what runs, with each component's pid and health.
//!
//! Traffic stays on the node: etcd, the controller manager, the scheduler
//! and the kubelet's health port listen on loopback; the API server and the
//! kubelet on the node's own pod network bridge ([`NODE_IP`]), which is
//! also the node's address (the kubelet refuses a loopback node IP).
//! There is no kube-proxy: the `kubernetes` service's cluster IP is an
//! address of the node, where `service-proxy` (a component like the
//! others) relays to the API server, so pods reach the API the standard
//! way; the API server calls webhooks at their endpoints (aggregator
//! routing); other services' cluster IPs carry nothing.
//!
//! `install` and `uninstall` put Tessera on the cluster by its Helm chart
//! ([`install`]).
//!
//! The node's GPUs are the simulator's ([`gpu`]): `up` makes stand-in
//! device nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia<i>`),
//! one shared simulator state, and configures containerd's default runtime
//! (handler and RuntimeClass `nvidia`) as the simulated node's counterpart
//! of NVIDIA's container runtime: a container whose environment has
//! `NVIDIA_VISIBLE_DEVICES` gets the simulator's `libcuda.so.1` and
//! `libnvidia-ml.so.1`, its state and the device nodes, so an unmodified
//! CUDA program runs on the simulated GPUs. `down` removes the device
//! nodes it made.

mod build;
mod config;
pub mod gpu;
mod host;
pub mod install;
mod state;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::sh::{self, workspace_root};
use state::{Component, Process, State};

/// The node's name.
pub const NODE_NAME: &str = "tessera-node";
/// The bridge of the node's pod network.
const BRIDGE: &str = "tessera0";
/// The node's address: the pod network's gateway, on [`BRIDGE`].
pub const NODE_IP: &str = "10.88.0.1";
/// The pod network.
const POD_CIDR: &str = "10.88.0.0/16";
/// The prefix length of [`POD_CIDR`].
const POD_PREFIX: u8 = 16;
/// The service network.
const SERVICE_CIDR: &str = "10.96.0.0/12";
/// The `kubernetes` service's cluster IP (the first of [`SERVICE_CIDR`]).
const SERVICE_IP: &str = "10.96.0.1";
/// The API server's port, on [`NODE_IP`].
const APISERVER_PORT: u16 = 6443;
/// etcd's client and peer ports, on loopback.
const ETCD_CLIENT_PORT: u16 = 2379;
const ETCD_PEER_PORT: u16 = 2380;
/// The kubelet's API port (on [`NODE_IP`]) and health port (loopback).
const KUBELET_PORT: u16 = 10250;
const KUBELET_HEALTHZ_PORT: u16 = 10248;
/// The secure ports of the controller manager and the scheduler, loopback.
const CONTROLLER_MANAGER_PORT: u16 = 10257;
const SCHEDULER_PORT: u16 = 10259;
/// The sandbox image: containerd 2.4's default (`DefaultSandboxImage` in
/// containerd's `internal/cri/config/config.go`), which its configuration
/// also names ([`config::containerd`]) and under which the repository's
/// pause program is imported.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";
/// The test workload's image: the repository's `probe` program.
pub const PROBE_IMAGE: &str = "tessera.local/probe:v1";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Clone, Debug)]
pub enum Action {
    /// Build (cached) and start the cluster; wait for its node to be Ready.
    Up(UpArgs),
    /// Stop everything `up` started and remove what it made.
    Down,
    /// Say what runs: each component's pid and health, and the node.
    Status,
    /// Install Tessera by its Helm chart (images built and imported first).
    Install(install::InstallArgs),
    /// Remove the Tessera release.
    Uninstall,
    /// Stop one component and start it again (e.g. `kubelet`), as a
    /// node's service manager restarts it; its log goes on.
    Restart {
        /// The component, as `status` names it.
        component: String,
    },
}

#[derive(clap::Args, Clone, Debug)]
pub struct UpArgs {
    /// Seconds to wait for each component, and for the node, to be ready.
    #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    /// The simulated GPUs: a gpusim node description (TOML); its `[ioctl]`
    /// stand-ins give the device nodes' numbers. Default: the demo's four
    /// H100s.
    #[arg(long, value_name = "FILE")]
    pub node: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<()> {
    let layout = Layout::new();
    match &args.action {
        Action::Up(up_args) => up(
            &layout,
            Duration::from_secs(up_args.timeout),
            up_args.node.as_deref(),
        ),
        Action::Down => down(&layout),
        Action::Status => status(&layout).map(|_| ()),
        Action::Install(a) => install::install(&layout, a),
        Action::Uninstall => install::uninstall(&layout),
        Action::Restart { component } => restart(&layout, component),
    }
}

/// Where the cluster's files are, all under `target/cluster/`.
#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new() -> Self {
        Self::at(workspace_root().join("target/cluster"))
    }

    fn at(root: PathBuf) -> Self {
        Self { root }
    }

    /// The built programs (kept by `down`).
    pub fn bin(&self) -> PathBuf {
        self.root.join("bin")
    }
    /// The CNI plugins.
    fn cni_bin(&self) -> PathBuf {
        self.bin().join("cni")
    }
    /// The image archives (kept by `down`).
    fn images(&self) -> PathBuf {
        self.root.join("images")
    }
    /// One log per component (kept by `down`, replaced by `up`).
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    /// Everything a running cluster has: keys, configuration, data,
    /// sockets, the state file (removed by `down`).
    fn run(&self) -> PathBuf {
        self.root.join("run")
    }
    fn pki(&self) -> PathBuf {
        self.run().join("pki")
    }
    fn state_file(&self) -> PathBuf {
        self.run().join("state.json")
    }
    fn containerd_dir(&self) -> PathBuf {
        self.run().join("containerd")
    }
    fn containerd_socket(&self) -> PathBuf {
        self.containerd_dir().join("containerd.sock")
    }
    fn kubelet_dir(&self) -> PathBuf {
        self.run().join("kubelet")
    }
    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.root.join("kubeconfig")
    }
    fn tessera_kube(&self) -> PathBuf {
        self.bin().join("tessera-kube")
    }
    /// `kubectl` of the cluster's own build, with the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.tessera_kube());
        cmd.arg("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig());
        cmd
    }
    fn ctr(&self) -> Command {
        let mut cmd = Command::new(self.bin().join("ctr"));
        cmd.arg("--address")
            .arg(self.containerd_socket())
            .args(["--namespace", "k8s.io"]);
        cmd
    }
}

impl Default for Layout {
    fn default() -> Self {
        Self::new()
    }
}

/// Why `up` cannot run on this machine, if it cannot: the reason a test
/// skips with.
pub fn unsupported_reason() -> Option<String> {
    if !cfg!(target_os = "linux") {
        return Some("the cluster runs on linux only".to_owned());
    }
    if !sh::is_root() {
        return Some("the cluster needs root (containerd, runc, the kubelet)".to_owned());
    }
    if build::go_program().is_none() {
        return Some(
            "no go toolchain (neither `go` on PATH nor /usr/local/go/bin/go) to build the cluster"
                .to_owned(),
        );
    }
    if let Some(missing) = build::missing_build_deps() {
        return Some(missing);
    }
    if sh::on_path("ip").is_none() {
        return Some("no `ip` (iproute2) for the pod network's bridge".to_owned());
    }
    None
}

fn up(layout: &Layout, timeout: Duration, node_file: Option<&Path>) -> Result<()> {
    if let Some(reason) = unsupported_reason() {
        bail!("cannot start the cluster: {reason}");
    }
    if let Some(missing) = gpu::missing_libraries() {
        bail!("cannot start the cluster: {missing}");
    }
    if let Some(state) = State::load(&layout.state_file())? {
        let dead: Vec<&Process> = state.processes.iter().filter(|p| !p.alive()).collect();
        if dead.is_empty() && !state.processes.is_empty() && state.complete {
            eprintln!("the cluster is already up");
            status(layout)?;
            return Ok(());
        }
        let names: Vec<&str> = dead.iter().map(|p| p.component.name()).collect();
        bail!(
            "the cluster is partly up ({} not running; logs in {}): run `cargo xtask cluster down` first",
            if names.is_empty() {
                "its start did not finish".to_owned()
            } else {
                names.join(", ")
            },
            layout.logs().display()
        );
    }
    let sim_node = gpu::sim_node(node_file)?;
    let cgroups = host::CgroupLayout::detect()?;
    eprintln!("cgroups: {cgroups}");
    host::check_ports_free(&[
        ("127.0.0.1", ETCD_CLIENT_PORT),
        ("127.0.0.1", ETCD_PEER_PORT),
        ("127.0.0.1", CONTROLLER_MANAGER_PORT),
        ("127.0.0.1", SCHEDULER_PORT),
        ("127.0.0.1", KUBELET_HEALTHZ_PORT),
        ("0.0.0.0", APISERVER_PORT),
        ("0.0.0.0", KUBELET_PORT),
    ])?;

    let started = Instant::now();
    build::all(layout)?;
    eprintln!("build: ready in {:.0?}", started.elapsed());

    for dir in [layout.run(), layout.logs()] {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Recorded before anything changes them, and saved before anything
    // starts, so that `down` can undo a start that fails halfway.
    let mut state = State {
        tunables: host::read_tunables(),
        created_paths: host::SYSTEM_PATHS
            .iter()
            .filter(|p| !Path::new(p).exists())
            .map(PathBuf::from)
            .collect(),
        bridge_created: false,
        made_shared: Vec::new(),
        processes: Vec::new(),
        complete: false,
    };
    state.save(&layout.state_file())?;

    sh::run(
        Command::new(layout.bin().join("cluster-pki"))
            .arg("--dir")
            .arg(layout.pki())
            .args([
                "--node",
                NODE_NAME,
                "--service-ip",
                SERVICE_IP,
                "--node-ip",
                NODE_IP,
            ]),
    )
    .context("cannot write the cluster's keys and certificates")?;
    state.bridge_created = host::create_bridge(BRIDGE, NODE_IP, POD_PREFIX)?;
    state.save(&layout.state_file())?;
    // The kubernetes service's cluster IP is the node's too (pods route to
    // it through the bridge), where the service proxy answers.
    host::add_address(BRIDGE, SERVICE_IP)?;
    // The agent's pods mount bpffs with Bidirectional propagation (their
    // pins outlive them), which needs a shared mount, as systemd leaves
    // every mount on most nodes.
    for point in host::SHARED_MOUNTS {
        if host::make_shared(Path::new(point))? {
            state.made_shared.push(PathBuf::from(point));
            state.save(&layout.state_file())?;
        }
    }
    let made = gpu::make_devices(&sim_node.stand_ins, &mut state.created_paths);
    state.save(&layout.state_file())?;
    made?;
    gpu::write_files(layout, &sim_node)?;
    eprintln!(
        "gpus: {} simulated ({}), state {}",
        sim_node.description.gpu.len(),
        node_file.map_or_else(|| "the demo's node".to_owned(), |f| f.display().to_string()),
        layout.gpusim_state().display()
    );
    config::write_all(layout, &cgroups)?;

    let start = |state: &mut State, component: Component| -> Result<()> {
        let process = state::spawn(layout, component, false)?;
        eprintln!(
            "started {} (pid {}), log {}",
            component.name(),
            process.pid,
            process.log.display()
        );
        state.processes.push(process);
        state.save(&layout.state_file())?;
        wait_ready(layout, state, component, timeout)
    };
    start(&mut state, Component::Containerd)?;
    build::import_images(layout)?;
    start(&mut state, Component::Etcd)?;
    start(&mut state, Component::ApiServer)?;
    let class = layout.gpusim_dir().join("runtimeclass.json");
    std::fs::write(&class, gpu::runtime_class())
        .with_context(|| format!("cannot write {}", class.display()))?;
    sh::output(layout.kubectl().arg("apply").arg("-f").arg(&class))
        .context("cannot create the RuntimeClass of GPU containers")?;
    start(&mut state, Component::ControllerManager)?;
    start(&mut state, Component::Scheduler)?;
    start(&mut state, Component::Kubelet)?;
    start(&mut state, Component::ServiceProxy)?;
    wait_node_ready(layout, &state, timeout)?;
    state.complete = true;
    state.save(&layout.state_file())?;

    eprintln!(
        "the cluster is up in {:.0?}: node {NODE_NAME} is Ready",
        started.elapsed()
    );
    status(layout)?;
    eprintln!(
        "kubeconfig: {}\nkubectl:    {} kubectl --kubeconfig {} get pods -A\nlogs:       {}\nstop with:  cargo xtask cluster down",
        layout.kubeconfig().display(),
        layout.tessera_kube().display(),
        layout.kubeconfig().display(),
        layout.logs().display()
    );
    Ok(())
}

/// Stops `name` and starts it again; waits until it is ready.
fn restart(layout: &Layout, name: &str) -> Result<()> {
    let component = Component::from_name(name).with_context(|| {
        format!("there is no component {name:?}; `cargo xtask cluster status` lists them")
    })?;
    let mut state = match State::load(&layout.state_file())? {
        Some(s) if s.complete => s,
        _ => bail!("the cluster is not up: run `cargo xtask cluster up` first"),
    };
    let mut problems = Vec::new();
    if let Some(p) = state.process(component) {
        p.stop(&mut problems);
    }
    if !problems.is_empty() {
        bail!("cannot stop {name}: {}", problems.join("; "));
    }
    let process = state::spawn(layout, component, true)?;
    eprintln!("restarted {name} (pid {})", process.pid);
    state.processes.retain(|p| p.component != component);
    state.processes.push(process);
    state.save(&layout.state_file())?;
    wait_ready(layout, &state, component, Duration::from_secs(120))
}

/// Waits until `component` answers its health check; fails early, with
/// the end of its log, when a started process exits.
fn wait_ready(
    layout: &Layout,
    state: &State,
    component: Component,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        for process in &state.processes {
            if !process.alive() {
                bail!(
                    "{} exited while the cluster was starting; the end of its log ({}):\n{}",
                    process.component.name(),
                    process.log.display(),
                    state::log_tail(&process.log, 30)
                );
            }
        }
        match health(layout, component) {
            Ok(()) => {
                eprintln!("ready: {}", component.name());
                return Ok(());
            }
            Err(e) if Instant::now() >= deadline => {
                let log = layout.logs().join(format!("{}.log", component.name()));
                bail!(
                    "{} is not ready after {timeout:?} ({e:#}); the end of its log ({}):\n{}",
                    component.name(),
                    log.display(),
                    state::log_tail(&log, 30)
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// One health check of `component`.
fn health(layout: &Layout, component: Component) -> Result<()> {
    match component {
        Component::Containerd => {
            sh::output(layout.ctr().arg("version")).map(|_| ())?;
        }
        Component::Etcd => http_ok(ETCD_CLIENT_PORT, "/health", "\"health\":\"true\"")?,
        Component::ApiServer => {
            let out = sh::output(layout.kubectl().args(["get", "--raw", "/readyz"]))?;
            if out.trim() != "ok" {
                bail!("/readyz says {out:?}");
            }
        }
        Component::ControllerManager => https_ok(CONTROLLER_MANAGER_PORT)?,
        Component::Scheduler => https_ok(SCHEDULER_PORT)?,
        Component::Kubelet => http_ok(KUBELET_HEALTHZ_PORT, "/healthz", "ok")?,
        Component::ServiceProxy => {
            let addr = std::net::SocketAddr::from((SERVICE_IP.parse::<std::net::Ipv4Addr>()?, 443));
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
                .with_context(|| format!("cannot connect to {addr}"))?;
        }
    }
    Ok(())
}

fn http_ok(port: u16, path: &str, expect: &str) -> Result<()> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (code, body) = tessera_testkit::poll::http_get(addr, path)
        .with_context(|| format!("cannot get http://{addr}{path}"))?;
    if code != 200 || !body.contains(expect) {
        bail!("http://{addr}{path} answers {code}: {}", body.trim());
    }
    Ok(())
}

/// `/healthz` of a component serving its own self-signed certificate on
/// loopback; through curl, which setup installs (without it the check is
/// that the port accepts connections).
fn https_ok(port: u16) -> Result<()> {
    let url = format!("https://127.0.0.1:{port}/healthz");
    if sh::on_path("curl").is_none() {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .with_context(|| format!("nothing listens on 127.0.0.1:{port}"))?;
        return Ok(());
    }
    let out = sh::output(Command::new("curl").args(["-sSk", "--max-time", "5", &url]))?;
    if out.trim() != "ok" {
        bail!("{url} says {:?}", out.trim());
    }
    Ok(())
}

fn wait_node_ready(layout: &Layout, state: &State, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(dead) = state.processes.iter().find(|p| !p.alive()) {
            bail!(
                "{} exited while the node was getting ready; the end of its log ({}):\n{}",
                dead.component.name(),
                dead.log.display(),
                state::log_tail(&dead.log, 30)
            );
        }
        // Pods need the namespace's service account, which the
        // controller manager makes.
        match node_ready(layout).map(|ready| ready && default_account(layout)) {
            Ok(true) => return Ok(()),
            Ok(false) | Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_secs(1));
            }
            Ok(false) => bail!(
                "node {NODE_NAME} is not Ready (or namespace default has no service account) after {timeout:?}; see {}",
                layout.logs().join("kubelet.log").display()
            ),
            Err(e) => return Err(e.context(format!("node {NODE_NAME} is not Ready"))),
        }
    }
}

/// Whether namespace `default` has its service account.
fn default_account(layout: &Layout) -> bool {
    sh::output(
        layout
            .kubectl()
            .args(["get", "serviceaccount", "default", "-o", "name"]),
    )
    .is_ok()
}

/// Whether the node reports Ready.
fn node_ready(layout: &Layout) -> Result<bool> {
    let out = sh::output(layout.kubectl().args([
        "get",
        "node",
        NODE_NAME,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ]))?;
    Ok(out.trim() == "True")
}

/// Prints what runs; returns whether every recorded component is alive
/// and healthy and the node Ready.
pub fn status(layout: &Layout) -> Result<bool> {
    let Some(state) = State::load(&layout.state_file())? else {
        println!("the cluster is down (no {})", layout.state_file().display());
        return Ok(false);
    };
    let mut all_well = state.complete;
    println!("{:<24} {:>8}  {:<8} health", "component", "pid", "process");
    for process in &state.processes {
        let alive = process.alive();
        let health = if alive {
            match health(layout, process.component) {
                Ok(()) => "ok".to_owned(),
                Err(e) => format!("{e:#}"),
            }
        } else {
            "-".to_owned()
        };
        all_well &= alive && health == "ok";
        println!(
            "{:<24} {:>8}  {:<8} {health}",
            process.component.name(),
            process.pid,
            if alive { "running" } else { "exited" },
        );
    }
    let node = match node_ready(layout) {
        Ok(true) => "Ready".to_owned(),
        Ok(false) => "not Ready".to_owned(),
        Err(e) => format!("unknown ({e:#})"),
    };
    all_well &= node == "Ready";
    println!("node {NODE_NAME}: {node}");
    println!(
        "gpus: simulated, node description {}, state {}, runtime handler and RuntimeClass {}",
        layout.gpusim_node().display(),
        layout.gpusim_state().display(),
        gpu::RUNTIME_HANDLER
    );
    if !state.complete {
        println!("the last `up` did not finish: `cargo xtask cluster down` cleans up");
    }
    println!(
        "kubeconfig {}; logs in {}",
        layout.kubeconfig().display(),
        layout.logs().display()
    );
    Ok(all_well)
}

fn down(layout: &Layout) -> Result<()> {
    let state = State::load(&layout.state_file())?;
    // Without a record of this cluster, the `kubepods` cgroups may be
    // another kubelet's: they are left alone.
    let recorded = state.is_some();
    if !recorded {
        eprintln!(
            "no state file ({}): nothing recorded to stop; removing what is left",
            layout.state_file().display()
        );
    }
    let state = state.unwrap_or_default();
    let mut problems = Vec::new();

    // The kubelet first, so that nothing restarts the pods; the
    // components that act on the cluster next; the pods' processes; then
    // the runtime and the store.
    for component in [
        Component::Kubelet,
        Component::ServiceProxy,
        Component::Scheduler,
        Component::ControllerManager,
    ] {
        if let Some(p) = state.process(component) {
            p.stop(&mut problems);
        }
    }
    if recorded {
        host::kill_pods(&mut problems);
    }
    if let Some(p) = state.process(Component::Containerd) {
        p.stop(&mut problems);
    }
    host::kill_shims(&layout.bin().join("containerd-shim-runc-v2"), &mut problems);
    for component in [Component::ApiServer, Component::Etcd] {
        if let Some(p) = state.process(component) {
            p.stop(&mut problems);
        }
    }
    if recorded {
        host::remove_pod_cgroups(&mut problems);
    }
    host::unmount_under(&layout.run(), &mut problems);
    // Only the bridge this cluster made: another checkout's cluster uses
    // the same name.
    if state.bridge_created && host::link_exists(BRIDGE) {
        host::delete_link(BRIDGE, &mut problems);
    }
    host::restore_tunables(&state.tunables, &mut problems);
    for point in &state.made_shared {
        host::make_private(point, &mut problems);
    }
    for path in &state.created_paths {
        host::remove_created(path, &mut problems);
    }
    for path in [layout.run(), layout.kubeconfig()] {
        host::remove_created(&path, &mut problems);
    }
    let left: Vec<String> = state
        .processes
        .iter()
        .filter(|p| p.alive())
        .map(|p| format!("{} (pid {})", p.component.name(), p.pid))
        .collect();
    if !left.is_empty() {
        problems.push(format!("still running: {}", left.join(", ")));
    }
    if problems.is_empty() && !recorded {
        eprintln!("the cluster is down: nothing was recorded, nothing is left");
        Ok(())
    } else if problems.is_empty() {
        eprintln!(
            "the cluster is down: no process of it is left, tunables restored; build cache and logs kept in {}",
            layout.root.display()
        );
        Ok(())
    } else {
        bail!(
            "the cluster is down with problems:\n  {}",
            problems.join("\n  ")
        )
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        action: Action,
    }

    #[test]
    fn the_actions_parse_and_bad_ones_are_refused() {
        assert!(matches!(
            Cli::try_parse_from(["cluster", "up", "--timeout", "30"]).map(|c| c.action),
            Ok(Action::Up(UpArgs {
                timeout: 30,
                node: None
            }))
        ));
        assert!(matches!(
            Cli::try_parse_from(["cluster", "up", "--node", "n.toml"]).map(|c| c.action),
            Ok(Action::Up(UpArgs { node: Some(n), .. })) if n == Path::new("n.toml")
        ));
        assert!(matches!(
            Cli::try_parse_from(["cluster", "down"]).map(|c| c.action),
            Ok(Action::Down)
        ));
        for bad in [
            &["cluster", "start"][..],
            &["cluster", "up", "--timeout", "0"],
            &["cluster", "down", "now"],
            &["cluster"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_layout_keeps_the_build_cache_out_of_what_down_removes() {
        let layout = Layout::at(PathBuf::from("/x/target/cluster"));
        assert!(!layout.bin().starts_with(layout.run()));
        assert!(!layout.images().starts_with(layout.run()));
        assert!(!layout.logs().starts_with(layout.run()));
        assert!(layout.state_file().starts_with(layout.run()));
        assert!(layout.kubelet_dir().starts_with(layout.run()));
        // A unix socket path has at most 107 bytes.
        assert!(layout.containerd_socket().as_os_str().len() < 80);
    }
}
