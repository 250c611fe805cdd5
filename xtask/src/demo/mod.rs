//! `cargo xtask demo`: the node agent on a simulated 4-GPU node, holding
//! six containers' limits while their unmodified CUDA programs run under
//! `libtessera.so` (the table in [`plan::plans`]).
//!
//! What runs is what a user outside Kubernetes runs: `tessera-agent run`
//! (a free port, a root in a temporary folder), `tessera-agent container
//! add` per container, `container set` halfway to change a target live,
//! and the live view read from the agent's `/containers`. As root every
//! container is a real cgroup below the detected cgroup v2 root, its
//! workload moved into it and the path in its metadata; otherwise the demo
//! says so and the agent knows the processes from their usage regions.
//!
//! At the end (or on Ctrl-C / SIGTERM) the workloads and the agent are
//! stopped, and the simulator's own record ([`oracle`]) judges whether each
//! container stayed within its SM cap and memory limit; the command fails
//! if one did not. Cgroups and the temporary folder are removed on every
//! exit but SIGKILL.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpusim::Sim;
use gpusim::state::Config;

use crate::artifacts::Artifacts;
use crate::build;
use crate::sh::{self, workspace_root};

mod agent;
mod cgroups;
mod oracle;
mod plan;
mod screen;

use agent::{Agent, NodeEnv};
use cgroups::Cgroups;
use oracle::{Record, Sampler, TOLERANCE_PP, Verdict};
use plan::{GPUS, Plan, node_toml, plans};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// How long the workloads run (8 to 3600; the live target change is
    /// made halfway, and SM use is judged from 3 s after the start and
    /// after the change).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(8..=3600))]
    pub seconds: u64,
    /// Use release builds.
    #[arg(long)]
    pub release: bool,
    /// Use the artifacts already built in DIR (`target/tessera/<profile>`)
    /// instead of building them.
    #[arg(long, value_name = "DIR")]
    pub artifacts: Option<PathBuf>,
}

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

pub fn run(args: &Args) -> Result<()> {
    let artifacts = match &args.artifacts {
        Some(dir) => Artifacts { dir: dir.clone() },
        None => build::run(
            &build::Args {
                release: args.release,
                no_ebpf: true,
            },
            None,
        )?,
    };
    for need in ["bin/tessera-agent", "lib/libtessera.so", "sim/libcuda.so.1"] {
        let p = artifacts.dir.join(need);
        if !p.is_file() {
            bail!(
                "{} is missing: run `cargo xtask build --no-ebpf` or drop --artifacts",
                p.display()
            );
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // SIGINT, SIGTERM and SIGHUP (ctrlc's `termination` feature).
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("cannot install the SIGINT/SIGTERM handler")?;
    }
    let dir = tempfile::Builder::new()
        .prefix("tessera-demo-")
        .tempdir()
        .context("cannot create a temporary folder")?;
    let result = demo(args, &artifacts.dir, dir.path(), &stop);
    // The folder (node state, regions, the workload program) goes last,
    // after everything that used it stopped.
    drop(dir);
    if result? {
        Ok(())
    } else {
        bail!("a limit did not hold (see the summary above)")
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

/// Runs the demo; `Ok(false)` when a limit did not hold.
fn demo(args: &Args, artifacts: &Path, dir: &Path, stop: &AtomicBool) -> Result<bool> {
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
    let mut agent = Agent::start(&env, &artifacts.join("bin/tessera-agent"), &root)?;
    println!(
        "agent: tessera-agent run on a simulated {GPUS}-GPU node, http://{}/containers, root {}",
        agent.addr,
        root.display()
    );
    let lib = artifacts.join("lib/libtessera.so");
    // The workloads outlive the view, so no sample sees them wind down.
    let ms = (args.seconds + 30) * 1000;
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
    agent.wait_for_rates(&plans.iter().map(|p| p.name).collect::<Vec<_>>())?;
    for (p, (region, cgroup)) in plans.iter().zip(&regions) {
        workloads.push(spawn_workload(
            &env,
            &program,
            &lib,
            region,
            &p.ops(ms),
            cgroup.as_deref(),
        )?);
    }
    let pids: Vec<i32> = workloads.iter().map(Workload::pid).collect();
    let outcome = watch(args, &plans, &mut agent, sim, &pids, &workloads, stop);
    let interrupted = stop.load(Ordering::SeqCst);
    let outputs: Vec<Vec<String>> = workloads.iter().map(Workload::output).collect();
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

/// The live part: samples the simulator, reads the agent's view and
/// prints it once a second (in place on a terminal; plain lines every 2 s
/// otherwise) until the end or a signal; makes the live change halfway.
/// Returns the simulator's record, when the change was made and when the
/// run ended (s).
fn watch(
    args: &Args,
    plans: &[Plan],
    agent: &mut Agent,
    sim: Sim,
    pids: &[i32],
    workloads: &[Workload],
    stop: &AtomicBool,
) -> Result<(Vec<Record>, Option<f64>, f64)> {
    let tty = std::io::stdout().is_terminal();
    let mut sampler = Sampler::new(sim, GPUS);
    let mut records = vec![Record::default(); plans.len()];
    let start = Instant::now();
    let mut change_at: Option<f64> = None;
    let mut note = String::new();
    let mut drawn = 0usize;
    let mut last_launches: Vec<u64> = vec![0; plans.len()];
    let mut last = Instant::now();
    let mut tick = 0u64;
    println!(
        "tessera demo: {} containers for {} s; a target changes at {} s (Ctrl-C stops)\n",
        plans.len(),
        args.seconds,
        args.seconds / 2
    );
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if stop.load(Ordering::SeqCst) || start.elapsed() >= Duration::from_secs(args.seconds) {
            break;
        }
        if last.elapsed() < Duration::from_secs(1) {
            continue;
        }
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        tick += 1;
        let t = start.elapsed().as_secs_f64();
        sampler.sample(t, plans, pids, &mut records)?;
        // Ctrl-C on a terminal signals the whole process group: the agent
        // may be gone before this loop sees the flag.
        let signalled = || stop.load(Ordering::SeqCst);
        if !agent.running() {
            if signalled() {
                break;
            }
            bail!("the agent exited; its log:\n{}", agent.log_tail(20));
        }
        if change_at.is_none() && tick >= args.seconds / 2 {
            for p in plans {
                if let Some(to) = p.change_to {
                    agent.container(&["set", "--id", p.name, "--sm-target", &to.to_string()])?;
                    note = format!(
                        "{}'s SM target {} → {to} at {t:.0} s (tessera-agent container set)",
                        p.name, p.sm_target
                    );
                    if !tty {
                        println!("t={tick}s {note}");
                    }
                }
            }
            change_at = Some(t);
        }
        let view = match agent.view() {
            Ok(v) => v,
            Err(_) if signalled() => break,
            Err(e) => return Err(e),
        };
        let (devices, rows) = screen::rows(&view, plans);
        let per_s: Vec<f64> = rows
            .iter()
            .zip(last_launches.iter_mut())
            .map(|(r, l)| {
                let d = r.launches.saturating_sub(*l) as f64 / dt;
                *l = r.launches;
                d
            })
            .collect();
        if tty {
            let mut lines = vec![format!("t = {tick:>3} s of {}   {note}", args.seconds)];
            lines.extend(screen::table(&devices, &rows, &per_s));
            for (w, p) in workloads.iter().zip(plans).filter(|(_, p)| p.expects_oom()) {
                if let Some(l) = w.output().iter().find(|l| l.starts_with("allocs")) {
                    lines.push(format!("{}: {l}", p.name));
                }
            }
            let mut out = std::io::stdout().lock();
            if drawn > 0 {
                write!(out, "\x1b[{drawn}A")?;
            }
            for l in &lines {
                writeln!(out, "{l}\x1b[K")?;
            }
            out.flush()?;
            drawn = lines.len();
        } else if tick.is_multiple_of(2) {
            for l in screen::plain(tick, &devices, &rows, &per_s) {
                println!("{l}");
            }
        }
    }
    Ok((records, change_at, start.elapsed().as_secs_f64()))
}

/// Prints the verdict; whether every limit held.
fn summary(
    plans: &[Plan],
    records: &[Record],
    change_at: Option<f64>,
    end_s: f64,
    outputs: &[Vec<String>],
    interrupted: bool,
) -> bool {
    let verdicts = oracle::judge(plans, records, change_at, end_s);
    println!(
        "\nsummary, by the simulator's record (mean SM % of each process over each steady window, from {} s after the start and the change; held: at most cap + {TOLERANCE_PP} pp; memory: the most it held):",
        oracle::SETTLE_S
    );
    let mut ok = true;
    for v in &verdicts {
        ok &= v.held();
        print_verdict(v);
    }
    for (p, out) in plans.iter().zip(outputs).filter(|(p, _)| p.expects_oom()) {
        let line = out.iter().find(|l| l.starts_with("allocs"));
        match line {
            Some(l) if l.contains("CUDA_ERROR_OUT_OF_MEMORY") => println!(
                "  {:<9} allocation past its {} MiB limit refused: {l}",
                p.name, p.memory_mib
            ),
            Some(l) => {
                ok = false;
                println!("  {:<9} allocation past its limit NOT refused: {l}", p.name);
            }
            None if interrupted => println!(
                "  {:<9} had not tried to allocate past its limit yet",
                p.name
            ),
            None => {
                ok = false;
                println!(
                    "  {:<9} never reported its allocations: {}",
                    p.name,
                    out.join("; ")
                );
            }
        }
    }
    println!("limits held: {}", if ok { "yes" } else { "NO (see above)" });
    ok
}

fn print_verdict(v: &Verdict) {
    if v.windows.is_empty() {
        println!(
            "  {:<9} SM use not judged: the run ended before a steady window",
            v.name
        );
    }
    for w in &v.windows {
        let achieved = w.achieved.map_or("-".to_owned(), |a| format!("{a:.1}"));
        println!(
            "  {:<9} {:<7} {:>4.0}-{:<4.0}s SM {:>5} % (target {:>3}, cap {:>5.1}): {}{}",
            v.name,
            v.mode.as_str(),
            w.from_s,
            w.to_s,
            achieved,
            w.target,
            w.cap,
            if w.achieved.is_none() {
                "not judged (no sample)"
            } else if w.held() {
                "held"
            } else {
                "NOT HELD"
            },
            if w.converged() { ", converged" } else { "" }
        );
    }
    println!(
        "  {:<9} memory peak {:>7.0} MiB of {:>6} MiB: {}",
        v.name,
        v.peak_mib,
        v.limit_mib,
        if v.memory_held() { "held" } else { "NOT HELD" }
    );
}
