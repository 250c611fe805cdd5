//! End to end on the simulated node: a fake kubelet calls `Allocate` (the
//! pod found through a scripted fake API server), then starts the
//! "container" as a runtime would from the answer alone: a process in a
//! private mount namespace with exactly the answer's mounts bind-mounted
//! (read-only where it says so) and its device nodes, and exactly the
//! answer's environment (plus the simulator's own `GPUSIM_*` variables,
//! which stand for the hardware). No `LD_PRELOAD`, no region override:
//! `libtessera.so` is loaded through the mounted `/etc/ld.so.preload` and
//! finds its region at `/run/tessera`. The agent (`tessera-agent run`)
//! controls it. Judged by the simulator: the memory the process holds,
//! the out-of-memory answer at the pod's limit, and its SM share.
//!
//! Needs root (mount namespaces, bind mounts) and `unshare(1)`; prints
//! "skipped: <reason>" otherwise. The host's mounts are never touched:
//! targets that do not exist on the host are made in overlays inside the
//! namespace.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;
mod kubelet_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use daemon_support::sim::{Gpu, NodeSpec, spawn_command_ready};
use daemon_support::{Agent, Link, agent_bin, libtessera, nvml_lib, workload};
use kubelet_support::allocate::{MIB, allocate, mounts, single, start, uid};
use kubelet_support::on_node_with;
use serde_json::Value;
use tessera_kubelet_api::deviceplugin::v1beta1 as dp;

const GPU: &str = "GPU-0e0e0e0e-1111-2222-3333-444444444444";

/// One GPU of 100 SMs and a 200 µs `spin` kernel (as the control tests
/// use), so a share is measurable in seconds.
fn node_spec() -> NodeSpec {
    NodeSpec::new()
        .gpu(Gpu::sim(16384).uuid(GPU))
        .fixed_kernel("spin", 200_000)
}

fn skip() -> Option<String> {
    // The effective uid, from /proc.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !root {
        return Some("needs root (mount namespaces and bind mounts)".into());
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        return Some("unshare(1) is not installed (util-linux)".into());
    }
    None
}

/// Mount points strictly under `dir`, outermost only (from this process's
/// mountinfo), relative to `dir`.
fn submounts(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut under: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p != dir && p.starts_with(dir))
        .collect();
    under.sort();
    under.dedup();
    let mut outer: Vec<PathBuf> = Vec::new();
    for p in under {
        if !outer.iter().any(|o| p.starts_with(o)) {
            outer.push(p);
        }
    }
    outer
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap().to_owned())
        .collect()
}

fn q(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// The shell script that sets up the container's mounts and devices from
/// `r` in the (already private) mount namespace, checks that the
/// read-only mounts refuse writes, and execs `argv` with exactly `env`.
fn container_script(
    r: &dp::ContainerAllocateResponse,
    scratch: &Path,
    env: &[(String, String)],
    argv: &[String],
) -> String {
    // (container path, host path, read-only, is a directory)
    let mut binds: Vec<(PathBuf, PathBuf, bool, bool)> = r
        .mounts
        .iter()
        .map(|m| {
            let host = PathBuf::from(&m.host_path);
            let dir = host.is_dir();
            (m.container_path.clone().into(), host, m.read_only, dir)
        })
        .collect();
    for d in &r.devices {
        assert_eq!(d.permissions, "rw");
        binds.push((
            d.container_path.clone().into(),
            d.host_path.clone().into(),
            false,
            false,
        ));
    }
    // Where a target is missing, overlay its nearest existing ancestor so
    // the target can be made without touching the host.
    let mut overlays = BTreeSet::new();
    for (target, ..) in &binds {
        if target.exists() {
            continue;
        }
        let mut p = target.parent().unwrap().to_owned();
        while !p.exists() {
            p = p.parent().unwrap().to_owned();
        }
        overlays.insert(p);
    }
    let mut s = String::from("set -e\n");
    for (i, o) in overlays.iter().enumerate() {
        let base = scratch.join(format!("ov{i}"));
        let (orig, upper, work) = (base.join("orig"), base.join("upper"), base.join("work"));
        for d in [&orig, &upper, &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        s += &format!("mount --rbind {} {}\n", q(o), q(&orig));
        s += &format!(
            "mount -t overlay overlay -o lowerdir={},upperdir={},workdir={} {}\n",
            o.display(),
            upper.display(),
            work.display(),
            q(o)
        );
        for sub in submounts(o) {
            s += &format!(
                "mount --rbind {} {}\n",
                q(&orig.join(&sub)),
                q(&o.join(&sub))
            );
        }
    }
    for (target, host, ro, dir) in &binds {
        if *dir {
            s += &format!("mkdir -p {}\n", q(target));
        } else {
            s += &format!(
                "mkdir -p {} && touch {}\n",
                q(target.parent().unwrap()),
                q(target)
            );
        }
        s += &format!("mount --bind {} {}\n", q(host), q(target));
        if *ro {
            s += &format!("mount -o remount,bind,ro {}\n", q(target));
        }
    }
    // A read-only mount refuses even root in the namespace.
    for (target, _, ro, dir) in &binds {
        if *ro && !*dir {
            s += &format!(
                "if (printf x >> {}) 2>/dev/null; then echo \"error: {} is writable\"; exit 1; fi\n",
                q(target),
                target.display()
            );
        }
    }
    s += "exec env -i";
    for (k, v) in env {
        s += &format!(" '{k}={v}'");
    }
    for a in argv {
        s += &format!(" '{a}'");
    }
    s.push('\n');
    s
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[test]
fn allocate_then_a_container_from_the_answer_runs_at_the_pods_limits() {
    if let Some(why) = skip() {
        println!("skipped: {why}");
        return;
    }
    on_node_with(
        &node_spec(),
        "allocate_then_a_container_from_the_answer_runs_at_the_pods_limits",
        || {
            kubelet_support::runtime().block_on(async {
                let mut pod = single("e2e", 42, GPU, 1000, 25, 1);
                pod["metadata"]["annotations"]["tessera.dev/compute-mode"] =
                    Value::String("hard".into());
                let mut env = start(vec![pod]).await;
                // The real library at the versioned host path.
                std::fs::copy(libtessera(), env.library_dir().join("libtessera.so")).unwrap();
                let r = allocate(&mut env.client, &[format!("{GPU}::0")])
                    .await
                    .unwrap();
                let region = env.root().join(format!("{}_main", uid(42)));
                assert_eq!(
                    mounts(&r)["/run/tessera/control"],
                    (region.join("control").to_string_lossy().into_owned(), true)
                );

                // The agent controls the root the plugin wrote into.
                let mut c = Command::new(agent_bin());
                c.env_remove("TESSERA_NVML_LIB")
                    .env_remove("RUST_LOG")
                    .arg("--nvml-lib")
                    .arg(nvml_lib())
                    .args(["run", "--listen", "127.0.0.1:0", "--root"])
                    .arg(env.root());
                let agent = Agent::spawn(c);
                agent.wait_ready();

                // The container: the answer's env, the simulated hardware.
                let mut vars: Vec<(String, String)> = r.envs.clone().into_iter().collect();
                vars.extend(std::env::vars().filter(|(k, _)| k.starts_with("GPUSIM_")));
                let argv: Vec<String> =
                    std::iter::once(workload(Link::Direct).display().to_string())
                        .chain(
                            "dev 0 alloc 600 ready alloc 600 run spin 1 256 16000 hold"
                                .split_whitespace()
                                .map(str::to_owned),
                        )
                        .collect();
                let scratch = tempfile::tempdir().unwrap();
                let script = container_script(&r, scratch.path(), &vars, &argv);
                let mut cmd = Command::new("unshare");
                cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
                let mut work = spawn_command_ready(cmd, "the container");
                let pid = work.pid();
                let held = || {
                    gpusim::Sim::from_env()
                        .unwrap()
                        .processes(0)
                        .unwrap()
                        .iter()
                        .find(|p| p.pid == pid)
                        .map_or(0, |p| p.bytes)
                };
                // Memory: the pod's 1000 MiB, enforced by the library the
                // mounted /etc/ld.so.preload loaded.
                assert_eq!(
                    work.next_line().as_deref(),
                    Some("alloc CUDA_ERROR_OUT_OF_MEMORY"),
                    "the second 600 MiB must exceed the pod's 1000 MiB"
                );
                let bytes = held();
                assert!(
                    (600 * MIB..1200 * MIB).contains(&bytes),
                    "the simulator charges {bytes} bytes"
                );
                // The agent sees the process in the pod's region.
                let id = format!("{}_main", uid(42));
                agent.wait_view("the pod's process", |v| {
                    Agent::container(v, &id).is_some_and(|c| {
                        c["processes"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|p| p["host_pid"] == pid)
                    })
                });
                // Compute: the pod's 25 % (hard), after the controller's
                // settling time, from the simulator's samples.
                tokio::time::sleep(Duration::from_secs(4)).await;
                let since = unix_us() - 2_000_000;
                let share: f64 = gpusim::Sim::from_env()
                    .unwrap()
                    .process_samples(0, since)
                    .unwrap()
                    .iter()
                    .filter(|s| s.pid == pid)
                    .map(|s| f64::from(s.sm_percent))
                    .sum();
                println!("figure: the container's SM share {share:.1} % at a 25 % target");
                assert!((share - 25.0).abs() <= 3.0, "share {share}");
                drop(work);
                let mut agent = agent;
                let status = agent.signal_and_wait(libc::SIGTERM);
                assert_eq!(status.code(), Some(0), "{status:?}");
                env.stop().await;
            });
        },
    );
}
