//! `gpusim show`: the node at a glance, like `nvidia-smi`.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use gpusim::state::Config;
use gpusim::{Sim, SimError};
use serde::Serialize;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// Everything `show` prints.
#[derive(Debug, Serialize)]
struct Report {
    state_file: String,
    driver_version: String,
    cuda_version: String,
    gpus: Vec<Gpu>,
    processes: Vec<Process>,
}

#[derive(Debug, Serialize)]
struct Gpu {
    index: usize,
    name: String,
    uuid: String,
    bus_id: String,
    memory_used_mib: u64,
    /// Exact, for checks that a MiB rounding would hide.
    memory_used_bytes: u64,
    memory_total_mib: u64,
    utilization_gpu_percent: u32,
    utilization_memory_percent: u32,
    xids: u64,
    lost: bool,
}

#[derive(Debug, Serialize)]
struct Process {
    gpu: usize,
    pid: i32,
    name: String,
    memory_mib: u64,
    memory_bytes: u64,
    sm_percent: u32,
}

pub fn run(cfg: &Config, args: &Args) -> Result<()> {
    let sim = crate::open(cfg)?;
    let report = collect(&sim).context("cannot read the simulated node")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

/// `12080` → `12.8`.
fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn process_name(pid: i32) -> String {
    u32::try_from(pid)
        .ok()
        .and_then(gpusim::procfs::comm)
        .unwrap_or_else(|| "?".into())
}

fn collect(sim: &Sim) -> Result<Report, SimError> {
    let node = sim.node();
    let now_us = gpusim::realtime_ns() / 1_000;
    let window_us = node.scheduler.utilization_window_ms * 1_000;
    let mut gpus = Vec::new();
    let mut processes = Vec::new();
    for (i, g) in node.gpu.iter().enumerate() {
        let mem = sim.memory_info(i)?;
        let util = sim.utilization(i)?;
        gpus.push(Gpu {
            index: i,
            name: g.model.clone(),
            uuid: node.uuid(i),
            // As NVML prints it.
            bus_id: sim.pci_address(i).nvml(),
            memory_used_mib: mem.used >> 20,
            memory_used_bytes: mem.used,
            memory_total_mib: mem.total >> 20,
            utilization_gpu_percent: util.gpu,
            utilization_memory_percent: util.memory,
            xids: sim.xid_cursor(i)?,
            lost: sim.is_lost(i)?,
        });
        let samples = sim.process_samples(i, now_us.saturating_sub(window_us))?;
        for p in sim.processes(i)? {
            processes.push(Process {
                gpu: i,
                pid: p.pid,
                name: process_name(p.pid),
                memory_mib: p.bytes >> 20,
                memory_bytes: p.bytes,
                sm_percent: samples
                    .iter()
                    .find(|s| s.pid == p.pid)
                    .map_or(0, |s| s.sm_percent),
            });
        }
    }
    Ok(Report {
        state_file: sim.state().path().display().to_string(),
        driver_version: node.driver_version.clone(),
        cuda_version: cuda_version(node.cuda_version),
        gpus,
        processes,
    })
}

fn table(r: &Report) -> String {
    let mut out = String::new();
    let name_w = r
        .gpus
        .iter()
        .map(|g| g.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "Driver Version: {}   CUDA Version: {}   State: {}",
        r.driver_version, r.cuda_version, r.state_file
    );
    let _ = writeln!(
        out,
        "{:<3}  {:<name_w$}  {:<40}  {:<16}  {:>17}  {:>4}  {:>4}  {:>4}  Lost",
        "GPU", "Name", "UUID", "Bus-Id", "Memory (MiB)", "Util", "Mem", "Xids"
    );
    for g in &r.gpus {
        let mem = format!("{} / {}", g.memory_used_mib, g.memory_total_mib);
        let _ = writeln!(
            out,
            "{:<3}  {:<name_w$}  {:<40}  {:<16}  {:>17}  {:>3}%  {:>3}%  {:>4}  {}",
            g.index,
            g.name,
            g.uuid,
            g.bus_id,
            mem,
            g.utilization_gpu_percent,
            g.utilization_memory_percent,
            g.xids,
            if g.lost { "LOST" } else { "no" }
        );
    }
    let _ = writeln!(out, "\nProcesses:");
    if r.processes.is_empty() {
        let _ = writeln!(out, "  none");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<3}  {:>8}  {:<16}  {:>12}  {:>4}",
        "GPU", "PID", "Name", "Memory (MiB)", "SM %"
    );
    for p in &r.processes {
        let _ = writeln!(
            out,
            "{:<3}  {:>8}  {:<16}  {:>12}  {:>4}",
            p.gpu, p.pid, p.name, p.memory_mib, p.sm_percent
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_bus_ids_are_formatted_like_nvidia_smi() {
        assert_eq!(cuda_version(12080), "12.8");
        assert_eq!(cuda_version(11040), "11.4");
        // Bus ids come from gpusim::pci (an unparsable one cannot pass the
        // node description's validation).
        let a = gpusim::pci::PciAddress::parse("0000:3b:00.0").unwrap();
        assert_eq!(a.nvml(), "00000000:3B:00.0");
    }
}
