//! Closed-loop runs of the compute controller on the simulated node, for
//! the integration tests (`control_sim.rs`) and the accuracy benchmark
//! (`benches/control_accuracy.rs`).
//!
//! A run plays the daemon's part: a region directory per container, the C
//! workload started in each under `libtessera.so`, and every
//! [`control::PERIOD`] NVML's per-process samples (through nvml-wrapper,
//! [`control::sampling::read_sm_samples`]) and the usage regions' counters
//! fed to a [`GpuController`], whose rates are written into the control
//! regions. NVML reads `GPUSIM_NODE`/`GPUSIM_STATE` at `nvmlInit`, so a run
//! happens in a child process started with the node's environment
//! ([`in_child`]); it prints its trace as one JSON line.
//!
//! The judge is the simulator's own timeline ([`Run::oracle`]: each
//! process's kernel time over an interval, from the state file), not the
//! controller's numbers.

// Each test file and benchmark that includes this module uses part of it.
#![allow(dead_code, unused_imports)]
use tessera_testkit::sim;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tessera_agent::control::sampling::{SmSamples, now_us, read_sm_samples};
use tessera_agent::control::{
    self, ContainerControl, ContainerSample, ControllerConfig, GpuController, GpuSample, Mode,
};
use tessera_agent::gpu::{GpuBackend, NvmlBackend};
use tessera_region::control::{ControlSpec, GpuLimits};
use tessera_region::file::{create_control, create_usage, read_usage_bytes};
use tessera_region::reader::read_usage;

pub use sim::Node;
use sim::{Gpu, NodeSpec};

/// One GPU of 100 SMs; kernels: the default wave model (23 µs for up to
/// 800 blocks of 256 threads), `spin` 200 µs, `slow` 5 ms, `infer` 1 ms.
pub fn node_spec() -> NodeSpec {
    NodeSpec::new()
        .gpu(Gpu::sim(16384))
        .fixed_kernel("spin", 200_000)
        .fixed_kernel("slow", 5_000_000)
        .fixed_kernel("infer", 1_000_000)
}

/// Workload shapes (ops of the C workload, after `dev 0 ready`), each
/// saturating for `secs` seconds.
pub fn tiny_kernels(secs: f64) -> String {
    format!("run k 1 32 {}", (secs * 1000.0) as u64)
}
/// Medium kernels: 800 blocks of 256 threads (6400 warps, 23 µs).
pub fn wide_kernels(secs: f64) -> String {
    format!("run k 800 256 {}", (secs * 1000.0) as u64)
}
/// Few huge kernels: 5 ms each, one warp.
pub fn huge_kernels(secs: f64) -> String {
    format!("run slow 1 32 {}", (secs * 1000.0) as u64)
}
/// 200 µs kernels of 8 warps.
pub fn spin_kernels(secs: f64) -> String {
    format!("run spin 1 256 {}", (secs * 1000.0) as u64)
}
/// Inference-like: requests of 100 × 1 ms kernels (256 warps each), then
/// 150 ms of think time, repeated.
pub fn bursty(secs: f64) -> String {
    let n = (secs / 0.25).ceil() as usize;
    vec!["launch infer 64 128 100 sync sleep 150"; n].join(" ")
}

/// A container of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spec {
    pub id: String,
    pub control: ContainerControl,
    /// Workload ops.
    pub ops: String,
    /// When it starts (s after the run's start).
    pub start_s: f64,
    /// Whether a hostile process in the container inflates its usage
    /// region's counters meanwhile (`scribble.c`).
    #[serde(default)]
    pub hostile: bool,
    /// A program and its arguments that the container runs instead of
    /// the C workload (`ops` then unused), e.g. a CuPy script.
    #[serde(default)]
    pub command: Vec<String>,
}

impl Spec {
    pub fn new(id: &str, target: f64, mode: Mode, ops: String) -> Self {
        Self {
            id: id.into(),
            control: ContainerControl {
                target_percent: target,
                mode,
                priority: 0,
            },
            ops,
            start_s: 0.0,
            hostile: false,
            command: Vec::new(),
        }
    }
}

/// A live change of a container's control.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Change {
    pub at_s: f64,
    pub id: String,
    pub control: ContainerControl,
}

/// Which limiter drives the rates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Limiter {
    /// [`GpuController`].
    Tessera,
    /// A bang-bang limiter like HAMi's (for comparison): each period the
    /// rate steps up while under the target and down while over, by
    /// `max(5, |error|)` percent of itself (HAMi's step also grows with
    /// the error).
    BangBang,
}

/// A scenario.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Scenario {
    pub containers: Vec<Spec>,
    pub changes: Vec<Change>,
    pub seconds: f64,
    pub limiter: Limiter,
    /// Intervals (s) over which the oracle measures each container.
    pub windows: Vec<(f64, f64)>,
}

/// One period of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Period {
    pub t: f64,
    /// Per container (scenario order): NVML-measured SM percent.
    pub used: Vec<Option<f64>>,
    pub rate: Vec<u64>,
    pub cap: Vec<f64>,
    /// Device busy, NVML (sum over all processes).
    pub busy: f64,
}

/// What a run produced.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    pub periods: Vec<Period>,
    /// Per window of the scenario, per container: the simulator's record
    /// of the container's SM percent over that window; and the device's.
    pub oracle: Vec<Vec<f64>>,
    pub oracle_busy: Vec<f64>,
    /// 1-minute load average of the machine when the run ended.
    pub load: f64,
    /// Ticks that ran more than half a period late.
    pub late_ticks: usize,
}

impl Run {
    /// The first time (s) after which container `i`'s NVML-measured use
    /// stays within `tol` pp of `want` in every period up to `until_s`.
    pub fn settled_at(
        &self,
        i: usize,
        want: f64,
        tol: f64,
        from_s: f64,
        until_s: f64,
    ) -> Option<f64> {
        let mut at = None;
        for p in self
            .periods
            .iter()
            .filter(|p| p.t >= from_s && p.t <= until_s)
        {
            match p.used[i] {
                Some(u) if (u - want).abs() <= tol => {
                    at.get_or_insert(p.t - from_s);
                }
                _ => at = None,
            }
        }
        at
    }

    /// Container `i`'s NVML-measured use per period, as text.
    pub fn series(&self, i: usize) -> String {
        self.periods
            .iter()
            .map(|p| p.used[i].map_or("-".into(), |u| format!("{u:.0}")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

const CHILD: &str = "TESSERA_CONTROL_RUN";

/// Runs `scenario` on a fresh node in a child process (this executable
/// again, with `child_args` selecting the code that calls [`child_main`])
/// and returns its trace.
pub fn in_child(scenario: &Scenario, child_args: &[&str]) -> Run {
    let node = node_spec().build();
    let spec = node.dir.path().join("scenario.json");
    std::fs::write(&spec, serde_json::to_string(scenario).unwrap()).unwrap();
    let out = node
        .command(&std::env::current_exe().unwrap())
        .env(CHILD, &spec)
        .env("TESSERA_ARTIFACTS", sim::artifacts())
        .args(child_args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "control run failed: {stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("run="))
        .unwrap_or_else(|| panic!("no run line in {stdout}"));
    serde_json::from_str(line).unwrap()
}

/// In the child: whether this process is one, and if so runs the scenario
/// and prints the trace. Returns true when it did.
pub fn child_main() -> bool {
    let Some(spec) = std::env::var_os(CHILD) else {
        return false;
    };
    let scenario: Scenario = serde_json::from_slice(&std::fs::read(&spec).unwrap()).unwrap();
    let dir = Path::new(&spec).parent().unwrap().to_path_buf();
    let run = run_here(&scenario, &dir);
    println!("run={}", serde_json::to_string(&run).unwrap());
    true
}

struct Live {
    spec: Spec,
    region: PathBuf,
    control: tessera_region::file::Mapped<tessera_region::layout::ControlRegion>,
    child: Option<Child>,
    scribbler: Option<Child>,
    rate: u64,
    cap: f64,
    bang: f64,
}

impl Drop for Live {
    fn drop(&mut self) {
        for c in [&mut self.child, &mut self.scribbler].into_iter().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The hostile counter scribbler, compiled once.
fn scribbler() -> PathBuf {
    static BUILT: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("scribble");
            let src = sim::workspace().join("xtask/testkit/c/scribble.c");
            sim::cc(&[src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
            (dir, out)
        })
        .1
        .clone()
}

fn limits(uuid: [u8; 16], rate: u64, burst: u64, floor: u64) -> ControlSpec {
    ControlSpec {
        flags: 0,
        gpus: vec![GpuLimits {
            launch_rate: rate,
            launch_burst: burst,
            launch_floor: floor,
            ..GpuLimits::unlimited(uuid)
        }],
    }
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The simulator's record since `since_us`: each container's SM percent
/// and the device's.
fn judge(simulator: &gpusim::Sim, live: &[Live], since_us: Option<u64>) -> (Vec<f64>, f64) {
    let s = simulator.process_samples(0, since_us.unwrap_or(0)).unwrap();
    let per = live
        .iter()
        .map(|l| {
            let pid = l.child.as_ref().map_or(0, |c| c.id() as i32);
            s.iter()
                .filter(|p| p.pid == pid)
                .map(|p| f64::from(p.sm_percent))
                .sum()
        })
        .collect();
    (per, s.iter().map(|p| f64::from(p.sm_percent)).sum())
}

/// The simulator's record of each container over each window of a
/// scenario, taken when the window closes (or the run ends).
struct Oracle {
    since: Vec<Option<u64>>,
    per: Vec<Vec<f64>>,
    busy: Vec<f64>,
}

impl Oracle {
    fn new(windows: usize) -> Self {
        Self {
            since: vec![None; windows],
            per: vec![Vec::new(); windows],
            busy: vec![0.0; windows],
        }
    }

    /// Opens the windows that begin by `t` and judges those that end by it.
    fn observe(&mut self, windows: &[(f64, f64)], t: f64, simulator: &gpusim::Sim, live: &[Live]) {
        for (w, (from, to)) in windows.iter().enumerate() {
            if self.since[w].is_none() && t >= *from {
                self.since[w] = Some(now_us());
            }
            if self.per[w].is_empty() && t >= *to {
                (self.per[w], self.busy[w]) = judge(simulator, live, self.since[w]);
            }
        }
    }

    /// Judges the windows still open at the end of the run.
    fn close(&mut self, simulator: &gpusim::Sim, live: &[Live]) {
        for w in 0..self.per.len() {
            if self.per[w].is_empty() {
                (self.per[w], self.busy[w]) = judge(simulator, live, self.since[w]);
            }
        }
    }
}

/// Each container's region (its control at the `initial` rate, an empty
/// usage record), nothing started yet.
fn create_regions(
    scenario: &Scenario,
    dir: &Path,
    uuid: [u8; 16],
    initial: u64,
    floor: u64,
) -> Vec<Live> {
    scenario
        .containers
        .iter()
        .map(|s| {
            let region = dir.join(&s.id);
            std::fs::create_dir_all(&region).unwrap();
            let control = create_control(
                &region,
                &limits(uuid, initial, (initial / 200).max(1), floor),
            )
            .unwrap();
            create_usage(&region).unwrap();
            Live {
                spec: s.clone(),
                region,
                control,
                child: None,
                scribbler: None,
                rate: initial,
                cap: s.control.target_percent,
                bang: initial as f64,
            }
        })
        .collect()
}

/// Starts container `l`'s workload (`program`, or its own command, under
/// the preload `lib`),
/// and for a hostile one the scribbler, until `seconds` have passed.
fn start_workload(l: &mut Live, program: &Path, lib: &Path, seconds: f64) {
    let mut c = match l.spec.command.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest);
            c
        }
        None => {
            let mut c = Command::new(program);
            c.args(["dev", "0"]).args(l.spec.ops.split_whitespace());
            c
        }
    };
    c.env("LD_PRELOAD", lib)
        .env("TESSERA_REGION_DIR", &l.region)
        .stdout(Stdio::null());
    l.child = Some(c.spawn().unwrap());
    if l.spec.hostile {
        let offset = tessera_region::layout::usage_offsets::BUCKETS.to_string();
        let usage = l.region.join("usage");
        l.scribbler = Some(
            Command::new(scribbler())
                .arg(&usage)
                .arg(&offset)
                .arg(format!("{}", seconds.ceil() as u64 + 1))
                .spawn()
                .unwrap(),
        );
    }
}

/// Applies the changes due by `t` (to the controller and the containers)
/// and keeps the others.
fn apply_changes(
    changes: &mut Vec<Change>,
    t: f64,
    controller: &mut GpuController,
    live: &mut [Live],
) {
    changes.retain(|c| {
        if t >= c.at_s {
            controller.upsert(&c.id, c.control).unwrap();
            if let Some(l) = live.iter_mut().find(|l| l.spec.id == c.id) {
                l.spec.control = c.control;
            }
            false
        } else {
            true
        }
    });
}

/// Per container: its NVML-measured SM percent in `samples` (none before
/// it starts) and, where its usage region reads, its sample for the
/// controller.
fn measure(samples: &SmSamples, live: &[Live]) -> (Vec<Option<f64>>, Vec<ContainerSample>) {
    let mut containers = Vec::new();
    let mut used = Vec::new();
    for l in live {
        let Some(child) = &l.child else {
            used.push(None);
            continue;
        };
        let u = samples.sum_over([child.id()]);
        used.push(Some(u));
        if let Ok(usage) = read_usage_bytes(&l.region.join("usage")).and_then(|b| read_usage(&b)) {
            containers.push(ContainerSample::from_usage(&l.spec.id, Some(u), &usage, 0));
        }
    }
    (used, containers)
}

/// The controller's tick: its decisions written to the containers'
/// control regions.
fn steer_with_controller(
    controller: &mut GpuController,
    sample: &GpuSample,
    live: &mut [Live],
    uuid: [u8; 16],
) {
    for d in controller.tick(Instant::now(), sample) {
        let l = live.iter_mut().find(|l| l.spec.id == d.id).unwrap();
        l.rate = d.pacing.rate;
        l.cap = d.cap_percent;
        l.control
            .write(&limits(uuid, d.pacing.rate, d.pacing.burst, d.pacing.floor))
            .unwrap();
    }
}

/// The bang-bang limiter's step (see [`Limiter::BangBang`]) for each
/// started container, written to its control region.
fn steer_bang_bang(live: &mut [Live], used: &[Option<f64>], uuid: [u8; 16], floor: u64) {
    for (l, u) in live.iter_mut().zip(used) {
        let Some(u) = u else { continue };
        let target = l.spec.control.target_percent;
        let step = 1.0 + (u - target).abs().max(5.0) / 100.0;
        if *u <= target {
            l.bang *= step;
        } else {
            l.bang /= step;
        }
        l.bang = l.bang.clamp(1.0, 1e15);
        l.cap = l.spec.control.target_percent;
        l.rate = l.bang as u64;
        let burst = (l.bang * 0.005).ceil() as u64;
        l.control
            .write(&limits(uuid, l.rate, burst.max(1), floor))
            .unwrap();
    }
}

fn run_here(scenario: &Scenario, dir: &Path) -> Run {
    let config = gpusim::state::Config::from_env();
    let simulator = gpusim::Sim::open(&config).unwrap();
    let uuid = simulator.uuid_bytes(0);
    let backend = NvmlBackend::load(sim::artifact("sim/libnvidia-ml.so.1").as_os_str()).unwrap();
    let device = backend.nvml().device_by_index(0).unwrap();
    // Tessera's limiter charges kernels at least the GPU's launch floor,
    // as the agent writes it; the bang-bang one charges warps, as HAMi
    // charges blocks.
    let floor = match scenario.limiter {
        Limiter::Tessera => backend.device(0).unwrap().launch_floor(),
        Limiter::BangBang => 0,
    };
    let cfg = ControllerConfig::default().with_launch_floor(floor);
    let initial = cfg.start_rate() as u64;
    let mut controller = GpuController::new(cfg);
    let program = sim::workload(sim::Link::Direct);
    let lib = sim::artifact("lib/libtessera.so");
    let mut live = create_regions(scenario, dir, uuid, initial, floor);
    let start = Instant::now();
    let mut since = now_us();
    let mut periods = Vec::new();
    let mut oracle = Oracle::new(scenario.windows.len());
    let mut changes = scenario.changes.clone();
    let mut late_ticks = 0;
    let mut k = 0u32;
    loop {
        let t = start.elapsed().as_secs_f64();
        if t > scenario.seconds {
            oracle.close(&simulator, &live);
            break;
        }
        // Start workloads that are due.
        for l in &mut live {
            if l.child.is_none() && t >= l.spec.start_s {
                start_workload(l, &program, &lib, scenario.seconds);
                controller.upsert(&l.spec.id, l.spec.control).unwrap();
            }
        }
        apply_changes(&mut changes, t, &mut controller, &mut live);
        oracle.observe(&scenario.windows, t, &simulator, &live);
        // Measure.
        let samples = read_sm_samples(&device, since).unwrap();
        since = samples.newest_us;
        let (used, containers) = measure(&samples, &live);
        let busy = samples.total();
        match scenario.limiter {
            Limiter::Tessera => {
                let sample = GpuSample {
                    busy_percent: Some(busy),
                    containers,
                };
                steer_with_controller(&mut controller, &sample, &mut live, uuid);
            }
            Limiter::BangBang => steer_bang_bang(&mut live, &used, uuid, floor),
        }
        periods.push(Period {
            t,
            used,
            rate: live.iter().map(|l| l.rate).collect(),
            cap: live.iter().map(|l| l.cap).collect(),
            busy,
        });
        k += 1;
        let next = start + control::PERIOD * k;
        let now = Instant::now();
        if now > next + control::PERIOD / 2 {
            late_ticks += 1;
        }
        std::thread::sleep(next.saturating_duration_since(now));
    }
    Run {
        periods,
        oracle: oracle.per,
        oracle_busy: oracle.busy,
        load: load_average(),
        late_ticks,
    }
}

/// Prints a per-period table of a run (for failures and the benchmark).
pub fn table(run: &Run) -> String {
    let mut s = String::new();
    for p in &run.periods {
        s.push_str(&format!("{:6.2}", p.t));
        for (u, r) in p.used.iter().zip(&p.rate) {
            s.push_str(&format!(
                " | {:>4} {:>12}",
                u.map_or("-".into(), |u| format!("{u:.0}")),
                r
            ));
        }
        s.push_str(&format!(" | busy {:.0}\n", p.busy));
    }
    s
}

/// The sleep a test can afford between checks.
pub const TICK: Duration = control::PERIOD;
