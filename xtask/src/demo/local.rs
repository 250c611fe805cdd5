//! The plain demo: `tessera-agent run` and the workloads as processes of
//! this machine (each in a cgroup of its own as root), as a user outside
//! Kubernetes runs them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use gpusim::Sim;
use gpusim::state::Config;
use serde_json::Value;

use super::agent::{Agent, NodeEnv};
use super::cgroups::Cgroups;
use super::plan::{GPUS, node_toml, plans};
use super::{Node, summary, watch};
use crate::sh::{self, workspace_root};

/// A running workload process; dropping it kills and reaps it, so an
/// error or a signal leaves no workload behind.
struct Workload {
    child: Child,
    output: Arc<Mutex<Vec<String>>>,
}

impl Workload {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Lines it printed so far.
    fn output(&self) -> Vec<String> {
        self.output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the C workload (an unmodified CUDA driver API program) against
/// the simulator's `libcuda`.
fn compile_workload(sim_dir: &Path, out: &Path) -> Result<()> {
    let src = workspace_root().join("xtask/gpusim/tests/c/workload.c");
    // The flags of the simulator tests' build of the same file
    // (xtask/testkit/src/sim.rs), so a warning fails here too.
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-Wno-unused-function", "-o"])
        .arg(out)
        .arg(&src)
        .arg(format!("-L{}", sim_dir.display()))
        .arg(format!("-Wl,-rpath,{}", sim_dir.display()))
        .arg("-lcuda")
        .output()
        .context("cannot run cc (a C compiler is needed for the demo's workloads)")?;
    if !o.status.success() {
        bail!(
            "cc {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

/// Starts `program ops` under `lib` in `region`, moved into `cgroup` first
/// when given (a shell writes its own pid to `cgroup.procs`, then execs
/// the workload: the CUDA program starts inside the cgroup).
fn spawn_workload(
    env: &NodeEnv,
    program: &Path,
    lib: &Path,
    region: &Path,
    ops: &str,
    cgroup: Option<&Path>,
) -> Result<Workload> {
    let mut c = match cgroup {
        Some(cg) => {
            let mut c = env.command(Path::new("/bin/sh"));
            c.arg("-c")
                .arg(r#"echo $$ > "$0/cgroup.procs" && export LD_PRELOAD="$1" && shift && exec "$@""#)
                .arg(cg)
                .arg(lib)
                .arg(program);
            c
        }
        None => {
            let mut c = env.command(program);
            c.env("LD_PRELOAD", lib);
            c
        }
    };
    let mut child = c
        .args(ops.split_whitespace())
        .env("TESSERA_REGION_DIR", region)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", program.display()))?;
    let output = Arc::new(Mutex::new(Vec::new()));
    let streams: [Option<Box<dyn std::io::Read + Send>>; 2] = [
        child.stdout.take().map(|s| Box::new(s) as _),
        child.stderr.take().map(|s| Box::new(s) as _),
    ];
    for stream in streams.into_iter().flatten() {
        let output = output.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                output.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
    }
    Ok(Workload { child, output })
}

/// Runs the plain demo in `dir` for `seconds`; `Ok(false)` when a limit
/// did not hold.
pub(super) fn demo(seconds: u64, artifacts: &Path, dir: &Path, stop: &AtomicBool) -> Result<bool> {
    let env = NodeEnv {
        node: dir.join("node.toml"),
        state: dir.join("gpusim.state"),
        sim_dir: artifacts.join("sim"),
    };
    std::fs::write(&env.node, node_toml())
        .with_context(|| format!("cannot write {}", env.node.display()))?;
    let sim = Sim::open(&Config {
        node_path: Some(env.node.clone()),
        state_path: env.state.clone(),
    })?;
    let program = dir.join("workload");
    compile_workload(&env.sim_dir, &program)?;
    let plans = plans();

    // Dropped in reverse order: workloads, then the agent, then cgroups.
    let mut cgroups = if sh::is_root() {
        match Cgroups::create() {
            Ok(c) => {
                println!("cgroups: one per container under {}", c.parent().display());
                Some(c)
            }
            Err(e) => {
                println!(
                    "cgroups: skipped ({e:#}); the agent knows the processes from their usage regions"
                );
                None
            }
        }
    } else {
        println!(
            "cgroups: skipped (not root): containers are not cgroups; the agent knows their processes from their usage regions"
        );
        None
    };
    let root = dir.join("containers");
    let agent = Agent::start(&env, &artifacts.join("bin/tessera-agent"), &root)?;
    println!(
        "agent: tessera-agent run on a simulated {GPUS}-GPU node, http://{}/containers, root {}",
        agent.addr,
        root.display()
    );
    let lib = artifacts.join("lib/libtessera.so");
    // The workloads outlive the view, so no sample sees them wind down.
    let ms = (seconds + 30) * 1000;
    let mut regions = Vec::new();
    let mut workloads = Vec::new();
    for p in &plans {
        let cgroup = cgroups.as_mut().map(|c| c.add(p.name)).transpose()?;
        let uuid = sim.node().uuid(p.gpu);
        let target = p.sm_target.to_string();
        let spec = p.gpu_spec(&uuid);
        let mut add = vec![
            "add",
            "--id",
            p.name,
            "--gpu",
            &spec,
            "--sm-target",
            &target,
            "--mode",
            p.mode.as_str(),
        ];
        let cg = cgroup.as_ref().map(|c| c.display().to_string());
        if let Some(cg) = &cg {
            add.extend(["--cgroup", cg]);
        }
        regions.push((PathBuf::from(agent.container(&add)?), cgroup));
    }
    // `container add` writes no launch rate (unlimited) until the agent
    // takes the container over in its next period; a workload started
    // before that would run unlimited for a moment.
    let ids: Vec<String> = plans.iter().map(|p| p.name.to_owned()).collect();
    agent.wait_for_rates(&ids)?;
    for (p, (region, cgroup)) in plans.iter().zip(&regions) {
        workloads.push(spawn_workload(
            &env,
            &program,
            &lib,
            region,
            &p.ops(p.gpu, ms),
            cgroup.as_deref(),
        )?);
    }
    let pids: Vec<i32> = workloads.iter().map(Workload::pid).collect();
    let mut node = Local {
        agent,
        workloads,
        ids,
    };
    let outcome = watch(seconds, &plans, &mut node, sim, &pids, stop);
    let interrupted = stop.load(Ordering::SeqCst);
    let outputs: Vec<Vec<String>> = node.workloads.iter().map(Workload::output).collect();
    let Local {
        mut agent,
        workloads,
        ..
    } = node;
    drop(workloads);
    agent.stop();
    let (records, change_at, end_s) = outcome?;
    if interrupted {
        println!("\nstopped by a signal after {end_s:.0} s; workloads and agent stopped");
    }
    Ok(summary(
        &plans,
        &records,
        change_at,
        end_s,
        &outputs,
        interrupted,
    ))
}

/// The agent and the workload processes, for the live part.
struct Local {
    agent: Agent,
    workloads: Vec<Workload>,
    ids: Vec<String>,
}

impl Node for Local {
    fn ids(&self) -> &[String] {
        &self.ids
    }

    fn view(&mut self) -> Result<Value> {
        self.agent.view()
    }

    fn agent_gone(&mut self) -> Option<String> {
        (!self.agent.running()).then(|| self.agent.log_tail(20))
    }

    fn set_sm_target(&mut self, i: usize, to: u32) -> Result<()> {
        self.agent
            .container(&["set", "--id", &self.ids[i], "--sm-target", &to.to_string()])
            .map(|_| ())
    }

    fn how_set(&self) -> &'static str {
        "tessera-agent container set"
    }

    fn output(&mut self, i: usize) -> Vec<String> {
        self.workloads[i].output()
    }
}
