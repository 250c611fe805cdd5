//! The agent's own footprint: `tessera-agent run` on a simulated 8-GPU
//! node managing 100 containers, each granted all 8 GPUs (800 controller
//! loops), a few of them running workloads under `libtessera.so`, more
//! with a process that holds its memory and launches nothing (an
//! inference server between requests), the rest empty. After it settles, it prints the agent process's resident memory
//! (VmRSS, and its peak VmHWM, from `/proc/<pid>/status`) and its CPU use
//! (utime + stime from `/proc/<pid>/stat` over a steady window, in percent
//! of one core) against the aims (≤ 50 MiB, ≤ 2 % of one core). For
//! comparison it measures the same agent managing no container first.
//!
//! The figures are the kernel's accounting of the agent process, not the
//! agent's own numbers; the mean period duration (from the agent's
//! `/metrics`, scraped once before and once after the window — nothing
//! polls the agent during it) is printed beside them as a hint only. On the simulator the stand-in
//! NVML maps the node's shared state file into the agent (about 3.7 MiB
//! per GPU once touched), which a real NVML does not: the resident part of
//! that mapping (from `/proc/<pid>/smaps`) is printed separately, and the
//! RSS aim is judged both with and without it.
//!
//! Run: `cargo xtask build --release --no-ebpf &&
//! TESSERA_ARTIFACTS=$PWD/target/tessera/release cargo bench -p tessera-agent
//! --bench footprint` (release simulator libraries: the stand-in NVML runs
//! inside the agent); arguments after `--`:
//! `quick` (a 10 s window instead of 30 s), `containers=N`, `gpus=N`.
#![allow(
    clippy::unwrap_used,
    reason = "a benchmark binary: failing loudly is fine"
)]

#[path = "../tests/daemon_support/mod.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{Agent, Link, Node, container_ok, libtessera, uuid, wait_for};

/// Aims of issue 8.
const AIM_RSS_MIB: f64 = 50.0;
const AIM_CPU_PERCENT: f64 = 2.0;
/// Containers that run a workload (one per GPU, from GPU 0 on).
const LIVE: usize = 4;
/// Containers after those whose process holds 100 MiB and launches
/// nothing.
const HOLDING: usize = 16;

fn node_toml(gpus: usize) -> String {
    let mut t = String::new();
    for _ in 0..gpus {
        t.push_str(
            "[[gpu]]\nmodel = \"NVIDIA H100 80GB HBM3\"\nmemory_mib = 81559\nsm_count = 132\n\n",
        );
    }
    t.push_str("[cost]\ncontext_overhead_mib = 300\n[cost.functions.spin]\nfixed_ns = 200000\n");
    t
}

/// Resident KiB of the mappings of `file` in `pid` (`/proc/<pid>/smaps`).
fn resident_of(pid: u32, file: &Path) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let file = file.to_string_lossy();
    let mut inside = false;
    let mut kib = 0;
    for line in smaps.lines() {
        // A mapping's header: `start-end perms offset dev inode [path]`.
        let header = line
            .split_whitespace()
            .next()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'));
        if header {
            inside = line.split_whitespace().nth(5) == Some(file.as_ref());
        } else if inside && let Some(v) = line.strip_prefix("Rss:") {
            kib += v
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    kib
}

/// Kernel's accounting of one process.
#[derive(Clone, Copy, Debug)]
struct Proc {
    rss_kib: u64,
    hwm_kib: u64,
    threads: u64,
    /// utime + stime, clock ticks.
    cpu_ticks: u64,
}

fn read_proc(pid: u32) -> Proc {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces), from field 3.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 here.
    Proc {
        rss_kib: kib("VmRSS:"),
        hwm_kib: kib("VmHWM:"),
        threads: kib("Threads:"),
        cpu_ticks: f[11] + f[12],
    }
}

fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

struct Figures {
    rss_mib: f64,
    /// Of `rss_mib`: the simulator's state file mapped by its NVML.
    sim_state_mib: f64,
    hwm_mib: f64,
    cpu_percent: f64,
    threads: u64,
    /// The agent's own report: mean period duration over the window (µs).
    period_us: f64,
}

/// The agent's `tessera_agent_period_duration_seconds` sum and count.
fn period_totals(agent: &Agent) -> (f64, f64) {
    let (code, text) = agent.get("/metrics");
    assert_eq!(code, 200, "{text}");
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    (
        value("tessera_agent_period_duration_seconds_sum "),
        value("tessera_agent_period_duration_seconds_count "),
    )
}

/// Measures `agent` over `window` once every container is in its view.
fn measure(agent: &Agent, node: &Node, containers: usize, window: Duration) -> Figures {
    let v = wait_for(Duration::from_secs(60), || {
        let v = agent.view();
        (v["containers"].as_array().map_or(0, Vec::len) == containers).then_some(v)
    });
    assert!(
        v.is_some(),
        "the agent never listed {containers} containers: {:#}",
        agent.view()
    );
    // Settle: the controllers ramp up, the workloads' usage slots appear.
    std::thread::sleep(Duration::from_secs(5));
    let pid = agent.child.id();
    let hz = clock_ticks() as f64;
    // Nothing asks the agent for its view during the window (serialising
    // 100 containers × 8 GPUs to JSON is not part of its period); its own
    // period durations come from two scrapes of /metrics around it.
    let p0 = period_totals(agent);
    let a = read_proc(pid);
    let t0 = Instant::now();
    std::thread::sleep(window);
    let b = read_proc(pid);
    let secs = t0.elapsed().as_secs_f64();
    let p1 = period_totals(agent);
    let periods = (p1.1 - p0.1).max(1.0);
    Figures {
        rss_mib: b.rss_kib as f64 / 1024.0,
        sim_state_mib: resident_of(pid, &node.state) as f64 / 1024.0,
        hwm_mib: b.hwm_kib as f64 / 1024.0,
        cpu_percent: (b.cpu_ticks - a.cpu_ticks) as f64 / hz / secs * 100.0,
        threads: b.threads,
        period_us: (p1.0 - p0.0) / periods * 1e6,
    }
}

fn add_containers(node: &Node, root: &Path, containers: usize, gpus: usize) {
    let uuids: Vec<String> = (0..gpus).map(|g| uuid(node, g)).collect();
    for i in 0..containers {
        let id = format!("c{i:03}");
        let mut args = vec!["add".to_owned(), "--id".to_owned(), id];
        for u in &uuids {
            args.push("--gpu".to_owned());
            args.push(format!("{u},memory=2000,overhead=300"));
        }
        args.extend(["--sm-target".to_owned(), (10 + i % 5 * 10).to_string()]);
        args.extend([
            "--mode".to_owned(),
            if i % 2 == 0 { "hard" } else { "elastic" }.to_owned(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        container_ok(root, &args);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |key: &str, default: usize| {
        args.iter()
            .find_map(|a| a.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(default)
    };
    let containers = get("containers", 100);
    let gpus = get("gpus", 8);
    let window = Duration::from_secs(if args.iter().any(|a| a == "quick") {
        10
    } else {
        30
    });
    let node = Node::new(&node_toml(gpus));
    let root = node.dir.path().join("containers");
    std::fs::create_dir_all(&root).unwrap();

    println!(
        "footprint of tessera-agent run on a simulated {gpus}-GPU node (window {} s, load average {})",
        window.as_secs(),
        load_average()
    );
    let idle = {
        let agent = Agent::start(&node, &root, &[]);
        agent.wait_ready();
        measure(&agent, &node, 0, window)
    };

    add_containers(&node, &root, containers, gpus);
    let agent = Agent::start(&node, &root, &[]);
    agent.wait_ready();
    let program = support::workload(Link::Direct);
    let live: Vec<_> = (0..LIVE.min(containers))
        .map(|i| {
            let mut c = node.command(&program);
            c.env("LD_PRELOAD", libtessera())
                .env("TESSERA_REGION_DIR", root.join(format!("c{i:03}")));
            let ops = format!(
                "dev {} ready run spin 1 256 {}",
                i % gpus,
                (window.as_secs() + 90) * 1000
            );
            c.args(ops.split_whitespace());
            support::sim::spawn_command_ready(c, &ops)
        })
        .collect();
    let holding: Vec<_> = (LIVE.min(containers)..(LIVE + HOLDING).min(containers))
        .map(|i| {
            let mut c = node.command(&program);
            c.env("LD_PRELOAD", libtessera())
                .env("TESSERA_REGION_DIR", root.join(format!("c{i:03}")));
            let ops = format!("dev {} alloc 100 ready hold", i % gpus);
            c.args(ops.split_whitespace());
            support::sim::spawn_command_ready(c, &ops)
        })
        .collect();
    let busy = measure(&agent, &node, containers, window);
    drop(live);
    drop(holding);

    let row = |name: &str, f: &Figures| {
        println!(
            "{name:<44} {:>8.1} {:>8.1} {:>10.1} {:>8.2} {:>8} {:>10.0}",
            f.rss_mib,
            f.hwm_mib,
            f.rss_mib - f.sim_state_mib,
            f.cpu_percent,
            f.threads,
            f.period_us
        );
    };
    println!(
        "{:<44} {:>8} {:>8} {:>10} {:>8} {:>8} {:>10}",
        "case", "RSS MiB", "HWM MiB", "-sim MiB", "CPU %", "threads", "period µs"
    );
    row("no container", &idle);
    row(
        &format!("{containers} containers × {gpus} GPUs, {LIVE} busy, {HOLDING} idle"),
        &busy,
    );
    let verdict = |ok: bool| if ok { "within" } else { "MISSES" };
    println!(
        "RSS {:.1} MiB (peak {:.1}): {} the aim of ≤ {AIM_RSS_MIB} MiB",
        busy.rss_mib,
        busy.hwm_mib,
        verdict(busy.hwm_mib <= AIM_RSS_MIB)
    );
    let own = busy.rss_mib - busy.sim_state_mib;
    println!(
        "RSS without the simulator's state file ({:.1} MiB of it resident): {own:.1} MiB: {} the aim",
        busy.sim_state_mib,
        verdict(own <= AIM_RSS_MIB)
    );
    println!(
        "CPU {:.2} % of one core: {} the aim of ≤ {AIM_CPU_PERCENT} %",
        busy.cpu_percent,
        verdict(busy.cpu_percent <= AIM_CPU_PERCENT)
    );
    println!("load average at the end: {}", load_average());
}
