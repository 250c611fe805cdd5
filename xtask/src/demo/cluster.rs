//! `cargo xtask demo --cluster`: the demo's containers as pods on the local
//! Kubernetes of `cargo xtask cluster`, under Tessera installed by its Helm
//! chart, as a user of a cluster runs them: each pod asks HAMi's resources
//! (`nvidia.com/gpu: 1`, `nvidia.com/gpumem`, `nvidia.com/gpucores`: its
//! SM target), `tessera.dev/compute-mode` says hard or elastic and
//! `tessera.dev/gpu-uuid-include` pins it to its plan's GPU, so the
//! webhook, the extender, the kube-scheduler, the agent's `Allocate` and
//! the node's runtime place it; the workload sees its GPU as device 0.
//!
//! A cluster that is down is brought up on the demo's node
//! ([`plan::node_toml`]) and a release that is not installed is installed
//! (images from the artifacts); at the end the demo's namespace is
//! deleted, and what the demo brought up or installed is removed again,
//! unless `--keep`. A cluster already up must have the demo's GPUs.
//!
//! The live part and the judge are the plain demo's ([`super::watch`],
//! [`super::summary`]): the view is the agent pod's `/containers`, the
//! record the node's simulator state, each workload known by its host pid
//! (the process in the pod's cgroup), and the live change is
//! `tessera-agent container set` run in the agent's pod.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpusim::Sim;
use gpusim::state::Config;
use serde_json::{Value, json};

use super::plan::{GPUS, Plan, node_toml, plans, same_node};
use super::{Args, Node, screen, summary, watch};
use crate::cluster::{self as k8s, Layout};

/// The namespace of the demo's pods (deleted at the end).
const NAMESPACE: &str = "tessera-demo";
/// The simulator's C workload (`cargo xtask images`).
const IMAGE: &str = "localhost/tessera/workload:dev";
const WORKLOAD: &str = "/usr/local/bin/workload";
/// Each pod's one container.
const CONTAINER: &str = "main";
/// The agent pods' label and the port of their `/containers` (the chart's
/// `agent.metricsPort`).
const AGENT_SELECTOR: &str = "app.kubernetes.io/component=agent";
const AGENT_PORT: u16 = 9400;
const AGENT_BIN: &str = "/usr/bin/tessera-agent";
/// How long each pod gets to be scheduled and start.
const START_WITHIN: Duration = Duration::from_secs(120);

/// A pod of `plan` on the GPU `uuid`, running for `ms`.
fn pod(plan: &Plan, uuid: &str, ms: u64) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": plan.name,
            "namespace": NAMESPACE,
            "annotations": {
                "tessera.dev/compute-mode": plan.mode.as_str(),
                "tessera.dev/gpu-uuid-include": uuid,
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": CONTAINER,
                "image": IMAGE,
                "imagePullPolicy": "Never",
                // A pod sees only its own GPU, as device 0.
                "args": plan.ops(0, ms).split_whitespace().collect::<Vec<_>>(),
                "resources": {"limits": {
                    "nvidia.com/gpu": "1",
                    "nvidia.com/gpumem": plan.pod_gpumem_mib().to_string(),
                    "nvidia.com/gpucores": plan.sm_target.to_string(),
                }},
            }],
        },
    })
}

fn kubectl(layout: &Layout, args: &[&str]) -> Result<String> {
    crate::sh::output(layout.kubectl().args(args))
}

fn kubectl_json(layout: &Layout, args: &[&str]) -> Result<Value> {
    let out = kubectl(layout, &[args, &["-o", "json"]].concat())?;
    serde_json::from_str(&out).with_context(|| format!("kubectl {}: not JSON", args.join(" ")))
}

/// What the demo changed on the cluster; undone when dropped (on every
/// exit but SIGKILL), unless kept.
struct Cluster {
    layout: Layout,
    keep: bool,
    brought_up: bool,
    installed: bool,
    namespace: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.keep {
            if self.namespace {
                println!(
                    "kept: the cluster, Tessera and namespace {NAMESPACE} (`cargo xtask cluster down` ends it)"
                );
            }
            return;
        }
        if self.brought_up {
            // `down` kills the pods with everything else.
            match k8s::run(&k8s::Args {
                action: k8s::Action::Down,
            }) {
                Ok(()) => println!("cluster: down again, as the demo found it"),
                Err(e) => eprintln!("cluster: down failed: {e:#}"),
            }
            return;
        }
        if self.namespace {
            let _ = kubectl(
                &self.layout,
                &[
                    "delete",
                    "namespace",
                    NAMESPACE,
                    "--wait=true",
                    "--timeout=60s",
                ],
            )
            .map_err(|e| eprintln!("cluster: cannot delete namespace {NAMESPACE}: {e:#}"));
        }
        if self.installed {
            let _ = k8s::run(&k8s::Args {
                action: k8s::Action::Uninstall,
            })
            .map_err(|e| eprintln!("cluster: cannot uninstall Tessera: {e:#}"));
        }
        println!(
            "cluster: left as the demo found it (namespace {NAMESPACE} deleted{})",
            if self.installed {
                ", Tessera uninstalled"
            } else {
                ""
            }
        );
    }
}

fn stopped(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::SeqCst) {
        bail!("stopped by a signal before the workloads ran");
    }
    Ok(())
}

/// Whether the cluster is up: its kubeconfig is there and its API server
/// ready (a kubeconfig without one is a broken cluster).
fn is_up(layout: &Layout) -> Result<bool> {
    if !layout.kubeconfig().is_file() {
        return Ok(false);
    }
    kubectl(layout, &["get", "--raw", "/readyz", "--request-timeout=5s"]).context(
        "the cluster has a kubeconfig but its API server is not ready: see `cargo xtask cluster status`, `cluster down` cleans up",
    )?;
    Ok(true)
}

/// Brings the cluster up and Tessera on it where they are not.
fn prepare(c: &mut Cluster, artifacts: &Path, stop: &AtomicBool) -> Result<()> {
    if !is_up(&c.layout)? {
        println!("cluster: down; bringing it up on the demo's node (cargo xtask cluster up)");
        let node = tempfile::Builder::new()
            .prefix("tessera-demo-node-")
            .suffix(".toml")
            .tempfile()
            .context("cannot create a temporary file")?;
        std::fs::write(node.path(), node_toml())
            .with_context(|| format!("cannot write {}", node.path().display()))?;
        // A failed `up` leaves what it made for `down`.
        c.brought_up = true;
        k8s::run(&k8s::Args {
            action: k8s::Action::Up(k8s::UpArgs {
                timeout: 180,
                node: Some(node.path().to_owned()),
            }),
        })?;
    } else {
        let file = c.layout.gpusim_node();
        let node = gpusim::NodeDescription::from_file(&file)
            .with_context(|| format!("cannot read the cluster's node {}", file.display()))?;
        if !same_node(&node) {
            bail!(
                "the cluster that is up has other GPUs ({}) than the demo's: `cargo xtask cluster down` first",
                file.display()
            );
        }
        println!("cluster: up already (left up at the end)");
    }
    stopped(stop)?;
    let agents = kubectl(
        &c.layout,
        &[
            "-n",
            k8s::install::NAMESPACE,
            "get",
            "daemonset",
            "-l",
            AGENT_SELECTOR,
            "-o",
            "name",
        ],
    )
    .unwrap_or_default();
    if agents.trim().is_empty() {
        println!("tessera: not installed; installing its chart (cargo xtask cluster install)");
        c.installed = true;
        k8s::run(&k8s::Args {
            action: k8s::Action::Install(k8s::install::InstallArgs {
                values: Vec::new(),
                timeout: 300,
                no_images: false,
                artifacts: Some(artifacts.to_owned()),
            }),
        })?;
    } else {
        println!("tessera: installed already (its images are not rebuilt)");
    }
    stopped(stop)?;
    wait_for_telemetry(&c.layout, stop)?;
    // A namespace a kept run left behind.
    kubectl(
        &c.layout,
        &[
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ],
    )?;
    c.namespace = true;
    kubectl(&c.layout, &["create", "namespace", NAMESPACE])?;
    Ok(())
}

/// Waits until the agent has written its node's GpuNode status with the
/// GPUs: the extender refuses every node without one, and the
/// kube-scheduler retries a pod refused so only minutes later.
fn wait_for_telemetry(layout: &Layout, stop: &AtomicBool) -> Result<()> {
    let end = Instant::now() + START_WITHIN;
    loop {
        stopped(stop)?;
        let nodes = kubectl_json(layout, &["get", "gpunodes"]).unwrap_or_default();
        let ready = nodes["items"].as_array().is_some_and(|items| {
            items.iter().any(|n| {
                n["metadata"]["name"] == k8s::NODE_NAME
                    && n["status"]["devices"]
                        .as_array()
                        .is_some_and(|d| d.len() == GPUS)
            })
        });
        if ready {
            // The extender's watch sees it within its own moment.
            std::thread::sleep(Duration::from_secs(2));
            return Ok(());
        }
        if Instant::now() >= end {
            bail!(
                "the agent wrote no GpuNode status for {} within {} s",
                k8s::NODE_NAME,
                START_WITHIN.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The agent pod: its name, `/containers` address and region root.
struct AgentPod {
    name: String,
    addr: std::net::SocketAddr,
    root: PathBuf,
}

fn agent_pod(layout: &Layout) -> Result<AgentPod> {
    let pods = kubectl_json(
        layout,
        &[
            "-n",
            k8s::install::NAMESPACE,
            "get",
            "pods",
            "-l",
            AGENT_SELECTOR,
            "--field-selector=status.phase=Running",
        ],
    )?;
    let Some(pod) = pods["items"].as_array().and_then(|p| p.first()) else {
        bail!("no running agent pod in {}", k8s::install::NAMESPACE);
    };
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
    let addr = format!("{ip}:{AGENT_PORT}")
        .parse()
        .with_context(|| format!("agent pod {name} has no pod IP yet"))?;
    // Its state folder is a host path at the same path (the chart's
    // `agent.hostPaths.state`); regions are in `containers/` of it.
    let state = pod["spec"]["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "state"))
        .and_then(|v| v["hostPath"]["path"].as_str())
        .with_context(|| format!("agent pod {name} has no state volume"))?;
    Ok(AgentPod {
        name: name.to_owned(),
        addr,
        root: Path::new(state).join("containers"),
    })
}

/// The host pid of the workload in the pod with UID `uid` (its cgroup
/// names the pod: `pod<uid>` under the cgroupfs driver, with `_` under
/// systemd's).
fn workload_pid(uid: &str) -> Option<i32> {
    let needles = [format!("pod{uid}"), format!("pod{}", uid.replace('-', "_"))];
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        (needles.iter().any(|n| cgroup.contains(n.as_str()))
            && cmdline.starts_with(WORKLOAD.as_bytes()))
        .then_some(pid)
    })
}

/// Waits until every pod runs and its workload's host pid is known;
/// returns each pod's UID and pid, in plan order.
fn wait_running(
    layout: &Layout,
    plans: &[Plan],
    stop: &AtomicBool,
) -> Result<(Vec<String>, Vec<i32>)> {
    let end = Instant::now() + START_WITHIN;
    loop {
        stopped(stop)?;
        let pods = kubectl_json(layout, &["-n", NAMESPACE, "get", "pods"])?;
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        let mut found = Vec::new();
        let mut waiting = Vec::new();
        for p in plans {
            let pod = items.iter().find(|i| i["metadata"]["name"] == p.name);
            let phase = pod.and_then(|i| i["status"]["phase"].as_str());
            if matches!(phase, Some("Failed" | "Succeeded")) {
                let logs = kubectl(layout, &["-n", NAMESPACE, "logs", p.name]).unwrap_or_default();
                bail!("pod {} ended early ({phase:?}); its log:\n{logs}", p.name);
            }
            let uid = pod.and_then(|i| i["metadata"]["uid"].as_str());
            match (phase, uid) {
                (Some("Running"), Some(uid)) => match workload_pid(uid) {
                    Some(pid) => found.push((uid.to_owned(), pid)),
                    None => waiting.push(format!("{} (no workload process yet)", p.name)),
                },
                _ => waiting.push(format!("{} ({})", p.name, phase.unwrap_or("not listed"))),
            }
        }
        if waiting.is_empty() {
            return Ok(found.into_iter().unzip());
        }
        if Instant::now() >= end {
            let describe =
                kubectl(layout, &["-n", NAMESPACE, "describe", "pods"]).unwrap_or_default();
            bail!(
                "pods not running within {} s: {}\n{describe}",
                START_WITHIN.as_secs(),
                waiting.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs the demo on the cluster; `Ok(false)` when a limit did not hold.
pub(super) fn demo(args: &Args, artifacts: &Path, stop: &AtomicBool) -> Result<bool> {
    let mut cluster = Cluster {
        layout: Layout::new(),
        keep: args.keep,
        brought_up: false,
        installed: false,
        namespace: false,
    };
    prepare(&mut cluster, artifacts, stop)?;
    let layout = cluster.layout.clone();
    let sim = Sim::open(&Config {
        node_path: None,
        state_path: layout.gpusim_state(),
    })?;
    let plans = plans();
    // The workloads outlive the view (and the pods' staggered starts, a
    // few seconds each), so no sample sees them wind down.
    let ms = (args.seconds + 90) * 1000;
    // One pod at a time, each running before the next is made: the
    // agent's `Allocate` learns which pod it serves from the pods bound to
    // the node, and pods bound in the same second could be told apart
    // wrongly (seen: a pod's workload ran on another pod's GPU).
    let dir = tempfile::Builder::new()
        .prefix("tessera-demo-pods-")
        .tempdir()
        .context("cannot create a temporary folder")?;
    let (mut uids, mut pids) = (Vec::new(), Vec::new());
    for (i, p) in plans.iter().enumerate() {
        let file = dir.path().join(format!("{}.json", p.name));
        std::fs::write(&file, pod(p, &sim.node().uuid(p.gpu), ms).to_string())
            .with_context(|| format!("cannot write {}", file.display()))?;
        kubectl(&layout, &["apply", "-f", &file.to_string_lossy()])?;
        let (uid, pid) = wait_running(&layout, &plans[i..=i], stop)?;
        uids.extend(uid);
        pids.extend(pid);
    }
    let agent = agent_pod(&layout)?;
    println!(
        "agent: pod {}/{} on a simulated {GPUS}-GPU node, http://{}/containers, root {}",
        k8s::install::NAMESPACE,
        agent.name,
        agent.addr,
        agent.root.display()
    );
    println!(
        "pods: {} in namespace {NAMESPACE}, each pinned to its GPU (kubectl -n {NAMESPACE} get pods)",
        plans.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
    );
    let mut node = Pods {
        layout,
        ids: uids.iter().map(|u| format!("{u}_{CONTAINER}")).collect(),
        names: plans.iter().map(|p| p.name).collect(),
        agent,
    };
    node.wait_for_rates(stop)?;
    let outcome = watch(args.seconds, &plans, &mut node, sim, &pids, stop);
    let interrupted = stop.load(Ordering::SeqCst);
    let outputs: Vec<Vec<String>> = (0..plans.len()).map(|i| node.output(i)).collect();
    let (records, change_at, end_s) = outcome?;
    if interrupted {
        println!("\nstopped by a signal after {end_s:.0} s");
    }
    let held = summary(&plans, &records, change_at, end_s, &outputs, interrupted);
    drop(cluster);
    Ok(held)
}

/// The pods and the agent's pod, for the live part.
struct Pods {
    layout: Layout,
    /// The agent's id of each pod's container (`<pod uid>_<container>`).
    ids: Vec<String>,
    names: Vec<&'static str>,
    agent: AgentPod,
}

impl Pods {
    /// Waits (at most 10 s) until the agent's view lists every container
    /// with a launch rate in force.
    fn wait_for_rates(&mut self, stop: &AtomicBool) -> Result<()> {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            stopped(stop)?;
            let view = self.view()?;
            let missing = screen::not_taken_over(&view, &self.ids);
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= end {
                bail!(
                    "the agent did not take over {} within 10 s",
                    missing.join(", ")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Node for Pods {
    fn ids(&self) -> &[String] {
        &self.ids
    }

    fn view(&mut self) -> Result<Value> {
        let addr = self.agent.addr;
        let (code, body) =
            tessera_testkit::poll::http_get_within(addr, "/containers", Duration::from_secs(5))
                .with_context(|| format!("cannot reach the agent pod at {addr}"))?;
        if code != 200 {
            bail!("the agent's /containers answered {code}: {body}");
        }
        serde_json::from_str(&body)
            .with_context(|| format!("the agent's /containers is not JSON: {body}"))
    }

    fn agent_gone(&mut self) -> Option<String> {
        // The DaemonSet replaces an agent pod; its view then fails.
        None
    }

    fn set_sm_target(&mut self, i: usize, to: u32) -> Result<()> {
        let root = self.agent.root.to_string_lossy().into_owned();
        kubectl(
            &self.layout,
            &[
                "-n",
                k8s::install::NAMESPACE,
                "exec",
                &self.agent.name,
                "-c",
                "agent",
                "--",
                AGENT_BIN,
                "container",
                "--root",
                &root,
                "set",
                "--id",
                &self.ids[i],
                "--sm-target",
                &to.to_string(),
            ],
        )
        .map(|_| ())
    }

    fn how_set(&self) -> &'static str {
        "tessera-agent container set, in the agent's pod"
    }

    fn output(&mut self, i: usize) -> Vec<String> {
        kubectl(&self.layout, &["-n", NAMESPACE, "logs", self.names[i]])
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pod_asks_its_plan_s_limits_on_its_gpu_in_hami_s_words() {
        let plans = plans();
        let p = pod(&plans[3], "GPU-x", 1000);
        assert_eq!(p["metadata"]["name"], "greedy-d");
        assert_eq!(p["metadata"]["namespace"], NAMESPACE);
        let a = &p["metadata"]["annotations"];
        assert_eq!(
            (
                &a["tessera.dev/compute-mode"],
                &a["tessera.dev/gpu-uuid-include"]
            ),
            (&json!("hard"), &json!("GPU-x"))
        );
        let c = &p["spec"]["containers"][0];
        assert_eq!(
            c["resources"]["limits"],
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3500", "nvidia.com/gpucores": "25"})
        );
        // Its one GPU is device 0 in the pod.
        assert_eq!(
            c["args"],
            json!([
                "dev",
                "0",
                "ready",
                "alloc-until-oom",
                "500",
                "meminfo",
                "run",
                "spin",
                "1",
                "256",
                "1000"
            ])
        );
        assert_eq!(
            pod(&plans[2], "GPU-y", 1)["metadata"]["annotations"]["tessera.dev/compute-mode"],
            "elastic"
        );
    }
}
