//! `cargo xtask demo`: the node agent on a simulated 4-GPU node, holding
//! six containers' limits while their unmodified CUDA programs run under
//! `libtessera.so` (the table in [`plan::plans`]).
//!
//! What runs is what a user outside Kubernetes runs ([`local`]):
//! `tessera-agent run` (a free port, a root in a temporary folder),
//! `tessera-agent container add` per container, `container set` halfway to
//! change a target live, and the live view read from the agent's
//! `/containers`. As root every container is a real cgroup below the
//! detected cgroup v2 root, its workload moved into it and the path in its
//! metadata; otherwise the demo says so and the agent knows the processes
//! from their usage regions.
//!
//! With `--cluster` the same containers are pods on the local Kubernetes
//! of `cargo xtask cluster`, under Tessera installed by its Helm chart
//! ([`cluster`]).
//!
//! Either way the same live part ([`watch`], the table of [`screen`]) and
//! the same judge ([`summary`], [`oracle`]) run over a [`Node`]. At the end
//! (or on Ctrl-C / SIGTERM) the workloads and the agent are stopped, and
//! the simulator's own record ([`oracle`]) judges whether each container
//! stayed within its SM cap and memory limit; the command fails if one did
//! not. Cgroups and the temporary folder are removed on every exit but
//! SIGKILL.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpusim::Sim;
use serde_json::Value;

use crate::artifacts::Artifacts;
use crate::build;

mod agent;
mod cgroups;
mod cluster;
mod local;
mod oracle;
mod plan;
mod screen;

use oracle::{Record, Sampler, TOLERANCE_PP, Verdict};
use plan::{GPUS, Plan};

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
    /// Use the artifacts already built in DIR (`target/tessera/<profile>`;
    /// with `ebpf/` for `--cluster`) instead of building them.
    #[arg(long, value_name = "DIR")]
    pub artifacts: Option<PathBuf>,
    /// Run the containers as pods on the local Kubernetes of `cargo xtask
    /// cluster` (as root), Tessera installed by its Helm chart; a cluster
    /// or release that is not there is brought up or installed first and
    /// removed at the end.
    #[arg(long)]
    pub cluster: bool,
    /// With --cluster: leave the cluster up, Tessera installed and the
    /// demo's pods in their namespace at the end.
    #[arg(long, requires = "cluster")]
    pub keep: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let artifacts = match &args.artifacts {
        Some(dir) => Artifacts { dir: dir.clone() },
        None => build::run(
            &build::Args {
                release: args.release,
                // The agent's image carries the eBPF objects.
                no_ebpf: !args.cluster,
            },
            None,
        )?,
    };
    let mut needs = vec!["bin/tessera-agent", "lib/libtessera.so", "sim/libcuda.so.1"];
    if args.cluster {
        // The images' programs (the agent's carries the eBPF objects).
        needs.extend(["bin/tessera-scheduler", "ebpf/tessera.bpf.o"]);
    }
    for need in needs {
        let p = artifacts.dir.join(need);
        if !p.is_file() {
            bail!(
                "{} is missing: run `cargo xtask build{}` or drop --artifacts",
                p.display(),
                if args.cluster { "" } else { " --no-ebpf" }
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
    let held = if args.cluster {
        cluster::demo(args, &artifacts.dir, &stop)?
    } else {
        let dir = tempfile::Builder::new()
            .prefix("tessera-demo-")
            .tempdir()
            .context("cannot create a temporary folder")?;
        let result = local::demo(args.seconds, &artifacts.dir, dir.path(), &stop);
        // The folder (node state, regions, the workload program) goes
        // last, after everything that used it stopped.
        drop(dir);
        result?
    };
    if held {
        Ok(())
    } else {
        bail!("a limit did not hold (see the summary above)")
    }
}

/// Where the containers run, as the live part sees them: the plain demo's
/// agent and processes ([`local`]) or the cluster's agent pod and pods
/// ([`cluster`]). Container `i` is `plans[i]`.
trait Node {
    /// The agent's id of each container.
    fn ids(&self) -> &[String];
    /// The agent's view (`/containers`).
    fn view(&mut self) -> Result<Value>;
    /// The tail of the agent's log if it exited.
    fn agent_gone(&mut self) -> Option<String>;
    /// Sets container `i`'s SM target to `to` while it runs.
    fn set_sm_target(&mut self, i: usize, to: u32) -> Result<()>;
    /// How [`Node::set_sm_target`] does it (for the live view's note).
    fn how_set(&self) -> &'static str;
    /// What container `i`'s workload printed so far.
    fn output(&mut self, i: usize) -> Vec<String>;
}

/// The live part: samples the simulator, reads the agent's view and
/// prints it once a second (in place on a terminal; plain lines every 2 s
/// otherwise) until the end or a signal; makes the live change halfway.
/// Returns the simulator's record, when the change was made and when the
/// run ended (s).
fn watch(
    seconds: u64,
    plans: &[Plan],
    node: &mut dyn Node,
    sim: Sim,
    pids: &[i32],
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
        seconds,
        seconds / 2
    );
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if stop.load(Ordering::SeqCst) || start.elapsed() >= Duration::from_secs(seconds) {
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
        if let Some(log) = node.agent_gone() {
            if signalled() {
                break;
            }
            bail!("the agent exited; its log:\n{log}");
        }
        if change_at.is_none() && tick >= seconds / 2 {
            for (i, p) in plans.iter().enumerate() {
                if let Some(to) = p.change_to {
                    node.set_sm_target(i, to)?;
                    note = format!(
                        "{}'s SM target {} → {to} at {t:.0} s ({})",
                        p.name,
                        p.sm_target,
                        node.how_set()
                    );
                    if !tty {
                        println!("t={tick}s {note}");
                    }
                }
            }
            change_at = Some(t);
        }
        let view = match node.view() {
            Ok(v) => v,
            Err(_) if signalled() => break,
            Err(e) => return Err(e),
        };
        let (devices, rows) = screen::rows(&view, plans, node.ids());
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
            let mut lines = vec![format!("t = {tick:>3} s of {}   {note}", seconds)];
            lines.extend(screen::table(&devices, &rows, &per_s));
            for (i, p) in plans.iter().enumerate().filter(|(_, p)| p.expects_oom()) {
                if let Some(l) = node.output(i).iter().find(|l| l.starts_with("allocs")) {
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
    if !v.seen() {
        println!(
            "  {:<9} NOT SEEN: its process held no memory on GPU {} at any sample of the simulator's record",
            v.name, v.gpu
        );
    }
}
