//! `cargo xtask demo`: a simulated GPU node running four containers'
//! workloads under `libtessera.so`, with a live view showing the limits
//! hold.
//!
//! Node: two simulated H100s. Containers (each a region directory, as the
//! agent will create them):
//!
//! | container | GPU | memory limit | launch limit | workload |
//! |---|---|---|---|---|
//! | train-a | 0 | 20000 MiB | none | 16000 MiB, saturating 2 ms kernels |
//! | serve-b | 0 | 8000 MiB | 4000 warps/s | 6000 MiB, 64-warp 2 ms kernels as fast as allowed |
//! | greedy-c | 1 | 4000 MiB | none | allocates 500 MiB chunks until refused |
//! | batch-d | 1 | 8000 MiB | 2000 → 8000 warps/s halfway | 32-warp 1 ms kernels |
//!
//! Everything lives in a temporary folder that is removed at the end or on
//! Ctrl-C.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpusim::Sim;
use gpusim::state::Config;
use tessera_region::file::{Mapped, create_control, create_usage};
use tessera_region::layout::ControlRegion;
use tessera_region::reader::read_usage;

use crate::build;
use crate::sh::workspace_root;

mod plan;

use plan::{MIB, Plan, control_spec, node_toml, plans};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// How long the workloads run.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Use release builds.
    #[arg(long)]
    pub release: bool,
}

/// A started container.
struct Container {
    plan: Plan,
    /// Its launch limit now (the plan's, or `raise_to` once raised).
    rate: Option<u64>,
    ops: String,
    region: PathBuf,
    control: Mapped<ControlRegion>,
    workload: Workload,
    output: Arc<Mutex<Vec<String>>>,
    peak: u64,
    last_launches: u64,
}

impl Container {
    /// Writes the plan's limits with the current rate to the control region.
    fn write_limits(&self, sim: &Sim) -> Result<()> {
        self.control
            .write(&control_spec(sim, &self.plan, self.rate))?;
        Ok(())
    }

    /// Lines the workload printed so far.
    fn output(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.output.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running workload process; dropping it kills and reaps it, so an
/// error or Ctrl-C leaves no workload behind (greedy-c would hold its
/// memory forever).
struct Workload {
    child: Child,
}

impl Workload {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn run(args: &Args) -> Result<()> {
    let artifacts = build::run(
        &build::Args {
            release: args.release,
            no_ebpf: true,
        },
        None,
    )?;
    let dir = tempfile::Builder::new()
        .prefix("tessera-demo-")
        .tempdir()
        .context("cannot create a temporary folder")?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("cannot install the Ctrl-C handler")?;
    }
    let result = demo(args, &artifacts.dir, dir.path(), &stop);
    // The folder (regions, state, programs) goes with `dir`.
    drop(dir);
    result
}

fn demo(args: &Args, artifacts: &Path, dir: &Path, stop: &AtomicBool) -> Result<()> {
    let node = dir.join("node.toml");
    std::fs::write(&node, node_toml())?;
    let state = dir.join("gpusim.state");
    let sim = Sim::open(&Config {
        node_path: Some(node.clone()),
        state_path: state.clone(),
    })?;
    let sim_dir = artifacts.join("sim");
    let workload = dir.join("workload");
    let src = workspace_root().join("preload/gpusim/tests/c/workload.c");
    // The flags of the simulator tests' build of the same file
    // (preload/gpusim/tests/support/mod.rs), so a warning fails here too.
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-Wno-unused-function", "-o"])
        .arg(&workload)
        .arg(&src)
        .arg(format!("-L{}", sim_dir.display()))
        .arg(format!("-Wl,-rpath,{}", sim_dir.display()))
        .arg("-lcuda")
        .output()
        .context("cannot run cc (a C compiler is needed for the demo's workloads)")?;
    if !out.status.success() {
        bail!(
            "cc {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The workloads outlive the view, so no sample sees them wind down.
    let ms = (args.seconds + 10) * 1000;
    let lib = artifacts.join("lib/libtessera.so");
    let mut containers = Vec::new();
    for plan in plans() {
        let name = plan.name;
        let ops = plan.ops(ms);
        let region = dir.join("regions").join(name);
        std::fs::create_dir_all(&region)?;
        let control = create_control(&region, &control_spec(&sim, &plan, plan.rate))?;
        create_usage(&region)?;
        let child = Command::new(&workload)
            .args(ops.split_whitespace())
            .env("GPUSIM_NODE", &node)
            .env("GPUSIM_STATE", &state)
            .env("LD_LIBRARY_PATH", &sim_dir)
            .env("LD_PRELOAD", &lib)
            .env("TESSERA_REGION_DIR", &region)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let mut workload = Workload { child };
        let output = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            workload
                .child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            workload
                .child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let output = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    output.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            });
        }
        containers.push(Container {
            rate: plan.rate,
            plan,
            ops,
            region,
            control,
            workload,
            output,
            peak: 0,
            last_launches: 0,
        });
    }
    // Dropping `containers` (also on an error above) stops the workloads.
    watch(args, &sim, &mut containers, stop)
}

fn watch(args: &Args, sim: &Sim, cs: &mut [Container], stop: &AtomicBool) -> Result<()> {
    let tty = std::io::stdout().is_terminal();
    let start = Instant::now();
    let mut last = Instant::now();
    let mut raised_at: Option<u64> = None;
    // Relative error of each rate-limited per-second sample.
    let mut rate_errors: Vec<f64> = Vec::new();
    let mut tick = 0u64;
    println!(
        "tessera demo: {} containers on a simulated 2-GPU node for {} s (Ctrl-C stops)\n",
        cs.len(),
        args.seconds
    );
    let raised_note: String = cs
        .iter()
        .filter_map(|c| {
            let to = c.plan.raise_to?;
            Some(format!(
                "   ({}'s rate raised to {to} warps/s)",
                c.plan.name
            ))
        })
        .collect();
    while start.elapsed() < Duration::from_secs(args.seconds) && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() < Duration::from_secs(1) {
            continue;
        }
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        tick += 1;
        if raised_at.is_none() && start.elapsed() >= Duration::from_secs(args.seconds / 2) {
            for c in cs.iter_mut() {
                if let Some(to) = c.plan.raise_to {
                    c.rate = Some(to);
                    c.write_limits(sim)?;
                }
            }
            raised_at = Some(tick);
        }
        let mut lines = Vec::new();
        lines.push(format!(
            "{:<9} {:>3} {:>18} {:>10} {:>14} {:>5}  {}",
            "container",
            "gpu",
            "memory MiB (limit)",
            "launches/s",
            "limit warps/s",
            "SM %",
            "notes"
        ));
        let since = gpusim::realtime_ns() / 1000 - 1_000_000;
        for c in cs.iter_mut() {
            let plan = &c.plan;
            let usage = read_usage(&std::fs::read(c.region.join("usage"))?)?;
            let used = usage.used[0];
            c.peak = c.peak.max(used);
            if used > plan.memory_mib * MIB {
                bail!(
                    "{}: {used} bytes used over its {} MiB limit",
                    plan.name,
                    plan.memory_mib
                );
            }
            let launches = usage.buckets[0].launches;
            let per_s = (launches - c.last_launches) as f64 / dt;
            c.last_launches = launches;
            let pid = c.workload.pid();
            let sm: u32 = sim
                .process_samples(plan.gpu, since)?
                .iter()
                .filter(|s| s.pid == pid)
                .map(|s| s.sm_percent)
                .sum();
            let settled = tick > 2 && raised_at.is_none_or(|at| tick > at + 2);
            if let (Some(rate), Some(warps)) = (c.rate, plan.warps_per_launch())
                && settled
            {
                let expected = rate as f64 / warps as f64;
                rate_errors.push((per_s - expected) / expected);
            }
            let notes = c
                .output()
                .iter()
                .filter(|l| {
                    l.starts_with("allocs") || l.starts_with("error") || l.starts_with("tessera")
                })
                .cloned()
                .collect::<Vec<_>>()
                .join("; ");
            lines.push(format!(
                "{:<9} {:>3} {:>8} ({:>6}) {:>10.1} {:>14} {:>5}  {}",
                plan.name,
                plan.gpu,
                used / MIB,
                plan.memory_mib,
                per_s,
                c.rate.map_or("none".into(), |r| r.to_string()),
                sm,
                notes
            ));
        }
        if tty {
            print!("\x1b[{}A", lines.len() + 1);
        }
        println!(
            "t = {:>3} s{}",
            start.elapsed().as_secs(),
            if raised_at.is_some() {
                raised_note.as_str()
            } else {
                ""
            }
        );
        for l in &lines {
            println!("{l}\x1b[K");
        }
        std::io::stdout().flush()?;
    }
    println!();
    if stop.load(Ordering::SeqCst) {
        println!("stopped by Ctrl-C; cleaning up");
    }
    println!("summary:");
    for c in cs.iter() {
        println!(
            "  {:<9} peak memory {:>6} MiB of {:>6} MiB ({})",
            c.plan.name,
            c.peak / MIB,
            c.plan.memory_mib,
            c.ops
        );
    }
    for c in cs.iter().filter(|c| c.plan.expects_oom()) {
        let refused = c
            .output()
            .iter()
            .any(|l| l.contains("CUDA_ERROR_OUT_OF_MEMORY"));
        println!(
            "  {}'s allocation beyond its limit was {}",
            c.plan.name,
            if refused {
                "refused with CUDA_ERROR_OUT_OF_MEMORY"
            } else {
                "not attempted yet"
            }
        );
    }
    if !rate_errors.is_empty() {
        let worst = rate_errors.iter().map(|e| e.abs()).fold(0.0, f64::max);
        println!(
            "  rate-limited containers stayed within {:.1}% of their launch limits (per-second samples, after the first 2 s and around the change)",
            worst * 100.0
        );
    }
    println!("  every container stayed within its memory limit at every sample");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_workload_is_killed_and_reaped() {
        let workload = Workload {
            child: Command::new("sleep").arg("1000").spawn().unwrap(),
        };
        let proc_dir = PathBuf::from(format!("/proc/{}", workload.pid()));
        assert!(proc_dir.exists());
        drop(workload);
        // Reaped, not a zombie: the pid is gone from /proc.
        assert!(!proc_dir.exists(), "{} is still there", proc_dir.display());
    }
}
