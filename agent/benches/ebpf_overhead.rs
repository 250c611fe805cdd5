//! What the eBPF ioctl observer costs, per attach mode that loads here:
//! ns per call of an ioctl on a watched device (`/dev/zero`), on an
//! unwatched device of the same major (`/dev/null`, the costliest reject:
//! the device number must be read), on a socket (what network stacks
//! issue all day), and of `getppid` (a syscall the observer does not care
//! about), each against the same call without observer; plus the ioctl
//! program's own mean run time per call from the kernel's run-time
//! statistics (`BPF_STATS_RUN_TIME`), which is steadier than syscall
//! timings on a busy machine.
//!
//! Each mode is also measured with the program attached but unconfigured
//! (`no-op`: it returns at its first instruction), which is the floor the
//! attach point itself costs. The bypass check runs on every
//! watched-device ioctl, so the tracepoint mode is measured again with this
//! process registered (one hash lookup) and already reported from a watched
//! cgroup; the plain rows are an unregistered process outside every watched
//! cgroup.
//!
//! Needs root and the object: `$TESSERA_EBPF_OBJECT`, else
//! `$TESSERA_ARTIFACTS/ebpf/tessera.bpf.o`, else the debug artifacts.
//! Run: `cargo xtask build && cargo bench -p tessera-agent --bench ebpf_overhead`
//! (pin it for steadier figures: `taskset -c 1 cargo bench ...`;
//! `TESSERA_BENCH_ITERS` sets the calls per round, 200000 by default).
#![allow(
    clippy::unwrap_used,
    reason = "a benchmark binary: failing loudly is fine"
)]

#[path = "../tests/ebpf_support/mod.rs"]
mod ebpf_support;
use ebpf_support as support;

use std::fs::File;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Instant;

use aya::programs::{ProgramInfo, RawTracePoint, TracePoint};
use support::{artifact_in, artifacts, device, or_skip, skip_if};
use tessera_agent::cgroup;
use tessera_agent::ebpf::{AttachMode, Device, ModeRequest, Observer, ObserverConfig};

const ROUNDS: usize = 7;

fn object() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("TESSERA_EBPF_OBJECT") {
        return Ok(path.into());
    }
    let dir = artifacts().unwrap_or_else(|_| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tessera/debug")
    });
    artifact_in(&dir, "ebpf/tessera.bpf.o")
}

/// The calls measured, in table order.
const OPS: [&str; 4] = [
    "ioctl watched",
    "ioctl unwatched",
    "ioctl socket",
    "getppid",
];

/// What the calls act on.
struct Targets {
    watched: File,
    unwatched: File,
    socket: UnixDatagram,
}

impl Targets {
    fn open() -> Self {
        Self {
            watched: File::open("/dev/zero").unwrap(),
            unwatched: File::open("/dev/null").unwrap(),
            socket: UnixDatagram::unbound().unwrap(),
        }
    }

    /// One call of op `i` of [`OPS`]. `is_terminal` is one
    /// `ioctl(TCGETS)`, which all three reject.
    fn call(&self, i: usize) {
        match i {
            0 => std::hint::black_box(self.watched.is_terminal()),
            1 => std::hint::black_box(self.unwatched.is_terminal()),
            2 => std::hint::black_box(self.socket.as_fd().is_terminal()),
            _ => std::hint::black_box(std::os::unix::process::parent_id() != 0),
        };
    }
}

/// One op's figures.
#[derive(Clone, Copy, Default)]
struct Cell {
    /// Min and median ns per call over the rounds.
    min: f64,
    median: f64,
    /// Mean ns per run of the ioctl program while the op ran.
    program: Option<f64>,
}

struct Row {
    label: String,
    cells: [Cell; OPS.len()],
}

/// Measures every op, `iters` calls per round, then once more with the
/// kernel's run-time statistics on (they cost two clock reads per run, so
/// the timed rounds run without them); `info` reads the attached
/// program's statistics.
fn run(label: &str, iters: u32, info: &dyn Fn() -> Option<ProgramInfo>) -> Row {
    let targets = Targets::open();
    let mut cells = [Cell::default(); OPS.len()];
    for (i, cell) in cells.iter_mut().enumerate() {
        for _ in 0..iters / 10 {
            targets.call(i);
        }
        let mut per_call: Vec<f64> = (0..ROUNDS)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..iters {
                    targets.call(i);
                }
                start.elapsed().as_nanos() as f64 / f64::from(iters)
            })
            .collect();
        per_call.sort_by(f64::total_cmp);
        *cell = Cell {
            min: per_call[0],
            median: per_call[ROUNDS / 2],
            program: program_ns(iters, &|| targets.call(i), info),
        };
    }
    Row {
        label: label.to_owned(),
        cells,
    }
}

/// Mean ns per run of the program over `iters` calls of `op`, with
/// run-time statistics on; `None` without statistics or when the program
/// ran mostly for other processes (the op does not trigger it).
fn program_ns(iters: u32, op: &dyn Fn(), info: &dyn Fn() -> Option<ProgramInfo>) -> Option<f64> {
    info()?;
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok()?;
    let before = info()?;
    for _ in 0..iters {
        op();
    }
    let after = info()?;
    let runs = after.run_count().checked_sub(before.run_count())?;
    if runs < u64::from(iters) {
        return None;
    }
    mean_run_ns(&before, &after)
}

/// Mean ns per program run between two readings (other processes' calls
/// during the loop add a little noise).
fn mean_run_ns(before: &ProgramInfo, after: &ProgramInfo) -> Option<f64> {
    let runs = after.run_count().checked_sub(before.run_count())?;
    let time = after.run_time().checked_sub(before.run_time())?;
    (runs > 0).then(|| time.as_nanos() as f64 / runs as f64)
}

/// The mode's ioctl program attached from an object loaded without
/// configuration, so it returns at once: what the attach point costs.
fn no_op_row(object: &Path, mode: AttachMode, iters: u32) -> Option<Row> {
    let mut ebpf = aya::Ebpf::load_file(object)
        .map_err(|e| println!("{mode} no-op: cannot load the object ({e})"))
        .ok()?;
    // The probe build: the object is not patched here (its marked kfunc
    // calls would not load), and unconfigured both return at once.
    let name = mode.probe_program();
    let attached = match mode {
        AttachMode::Tracepoint => {
            let p: &mut TracePoint = ebpf.program_mut(name)?.try_into().ok()?;
            p.load()
                .and_then(|()| p.attach("syscalls", "sys_enter_ioctl").map(drop))
        }
        AttachMode::RawTracepoint => {
            let p: &mut RawTracePoint = ebpf.program_mut(name)?.try_into().ok()?;
            p.load().and_then(|()| p.attach("sys_enter").map(drop))
        }
        AttachMode::Kprobe => return None,
    };
    if let Err(e) = attached {
        println!("{mode} no-op: not available here ({e})");
        return None;
    }
    let info = || ebpf.program(name).and_then(|p| p.info().ok());
    Some(run(&format!("{mode}, no-op"), iters, &info))
}

/// Rounds of the paired measurement ([`paired`]).
const PAIRED_ROUNDS: usize = 31;

/// Per op, the medians over the rounds of (no-op − none) and
/// (observer − no-op), ns per call.
struct Paired {
    attach: [f64; OPS.len()],
    program: [f64; OPS.len()],
}

/// The program's own cost by the wall clock, without the run-time
/// statistics' clock reads: per round, every op is timed (`iters` calls)
/// with no program attached, with the mode's program attached but
/// unconfigured (no-op), and with the observer attached, in an order that
/// rotates between rounds; each round's differences are taken within the
/// round, so the machine's drift between rounds cancels, and the medians
/// of the differences are kept. The observer is started afresh each round
/// (its verdict caches start empty, as after an agent restart).
fn paired(object: &Path, zero: &Device, mode: AttachMode, iters: u32) -> Option<Paired> {
    let mut ebpf = aya::Ebpf::load_file(object).ok()?;
    let name = mode.probe_program();
    let targets = Targets::open();
    let time = |i: usize| {
        for _ in 0..iters / 20 {
            targets.call(i);
        }
        let start = Instant::now();
        for _ in 0..iters {
            targets.call(i);
        }
        start.elapsed().as_nanos() as f64 / f64::from(iters)
    };
    let time_all = || -> [f64; OPS.len()] { std::array::from_fn(time) };
    let mut config = ObserverConfig::new(object, vec![zero.clone()]);
    config.mode = ModeRequest::Only(mode);
    match mode {
        AttachMode::Tracepoint => {
            let p: &mut TracePoint = ebpf.program_mut(name)?.try_into().ok()?;
            p.load().ok()?;
        }
        AttachMode::RawTracepoint => {
            let p: &mut RawTracePoint = ebpf.program_mut(name)?.try_into().ok()?;
            p.load().ok()?;
        }
        AttachMode::Kprobe => return None,
    }
    // Times every op with the no-op program attached.
    let mut no_op = || -> Option<[f64; OPS.len()]> {
        let program = ebpf.program_mut(name)?;
        Some(match mode {
            AttachMode::Tracepoint => {
                let p: &mut TracePoint = program.try_into().ok()?;
                let link = p.attach("syscalls", "sys_enter_ioctl").ok()?;
                let t = time_all();
                p.detach(link).ok()?;
                t
            }
            _ => {
                let p: &mut RawTracePoint = program.try_into().ok()?;
                let link = p.attach("sys_enter").ok()?;
                let t = time_all();
                p.detach(link).ok()?;
                t
            }
        })
    };
    let observed = || -> Option<[f64; OPS.len()]> {
        let observer = Observer::start(&config).ok()?;
        let t = time_all();
        drop(observer);
        Some(t)
    };
    let (mut attach, mut program) = (Vec::new(), Vec::new());
    for round in 0..PAIRED_ROUNDS {
        let (mut none, mut idle, mut full) = (None, None, None);
        for side in 0..3 {
            match (side + round) % 3 {
                0 => none = Some(time_all()),
                1 => idle = Some(no_op()?),
                _ => full = Some(observed()?),
            }
        }
        let (none, idle, full) = (none?, idle?, full?);
        attach.push(std::array::from_fn::<f64, { OPS.len() }, _>(|i| {
            idle[i] - none[i]
        }));
        program.push(std::array::from_fn::<f64, { OPS.len() }, _>(|i| {
            full[i] - idle[i]
        }));
    }
    let median = |rows: &[[f64; OPS.len()]], i: usize| {
        let mut v: Vec<f64> = rows.iter().map(|r| r[i]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Some(Paired {
        attach: std::array::from_fn(|i| median(&attach, i)),
        program: std::array::from_fn(|i| median(&program, i)),
    })
}

fn print_paired(mode: AttachMode, p: &Paired, iters: u32) {
    println!(
        "{mode}, paired (median over {PAIRED_ROUNDS} rounds of {iters} calls each way, statistics off), ns per call:"
    );
    print!("{:<18}", "");
    for op in OPS {
        print!(" {op:>16}");
    }
    println!();
    for (label, row) in [("attach point", &p.attach), ("program", &p.program)] {
        print!("{label:<18}");
        for ns in row {
            print!(" {ns:>+16.1}");
        }
        println!();
    }
}

/// The tracepoint mode again, with this process registered, then reported.
fn bypass_rows(observer: &mut Observer, rows: &mut Vec<Row>, iters: u32) {
    let pid = std::process::id();
    observer.register_tgid(pid).unwrap();
    rows.push(run("tp, registered", iters, &|| {
        observer.ioctl_program_info().ok()
    }));
    observer.unregister_tgid(pid).unwrap();
    match own_cgroup_id() {
        Some(id) => {
            observer.watch_cgroup(id).unwrap();
            observer.register_tgid(pid).unwrap();
            rows.push(run("tp, pod, registered", iters, &|| {
                observer.ioctl_program_info().ok()
            }));
            observer.unregister_tgid(pid).unwrap();
            rows.push(run("tp, reported", iters, &|| {
                observer.ioctl_program_info().ok()
            }));
            assert!(observer.reported_tgids().unwrap().contains(&pid));
            observer.unwatch_cgroup(id).unwrap();
        }
        None => println!("tp, reported: cannot find this process's cgroup v2 id"),
    }
}

/// The cgroup v2 id of this process (`0::<path>` in /proc/self/cgroup).
fn own_cgroup_id() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let root = cgroup::cgroup2_root().ok()?;
    cgroup::cgroup_id(&root.join(path.trim_start_matches('/'))).ok()
}

fn print(rows: &[Row], iters: u32) {
    println!(
        "ns per call, min / median of {ROUNDS} rounds x {iters} calls; (Δ) = median minus the median without observer"
    );
    println!(
        "[bpf N] = mean run time of the ioctl program per run over one more loop with BPF_STATS_RUN_TIME on, ns"
    );
    print!("{:<18}", "observer");
    for op in OPS {
        print!(" {op:>30}");
    }
    println!();
    let base = &rows[0].cells;
    for row in rows {
        print!("{:<18}", row.label);
        for (cell, base) in row.cells.iter().zip(base) {
            let program = cell
                .program
                .map_or(String::new(), |ns| format!(" [bpf {ns:.0}]"));
            let text = format!(
                "{:.0} / {:.0} ({:+.0}){program}",
                cell.min,
                cell.median,
                cell.median - base.median
            );
            print!(" {text:>30}");
        }
        println!();
    }
}

fn main() {
    skip_if!(support::not_root());
    let object = or_skip!(object());
    let iters: u32 = std::env::var("TESSERA_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let zero = device("/dev/zero");
    // Before any tracepoint is attached: aya looks for tracefs once per
    // process and keeps the answer.
    if let Err(e) = tessera_agent::ebpf::mounts::ensure_tracefs() {
        println!("tracefs unavailable ({e})");
    }

    if let Err(e) = aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        println!("no program run-time statistics ({e})");
    }
    let mut rows = vec![run("no observer", iters, &|| None)];
    for mode in [
        AttachMode::Tracepoint,
        AttachMode::RawTracepoint,
        AttachMode::Kprobe,
    ] {
        rows.extend(no_op_row(&object, mode, iters));
        let mut config = ObserverConfig::new(&object, vec![zero.clone()]);
        config.mode = ModeRequest::Only(mode);
        match Observer::start(&config) {
            Ok(mut observer) => {
                println!("{mode}: program {}", observer.ioctl_program());
                rows.push(run(mode.name(), iters, &|| {
                    observer.ioctl_program_info().ok()
                }));
                let counted = observer.snapshot().unwrap().ioctls_counted();
                assert!(
                    counted >= u64::from(iters),
                    "{mode}: only {counted} ioctls counted"
                );
                if mode == AttachMode::Tracepoint {
                    bypass_rows(&mut observer, &mut rows, iters);
                }
            }
            Err(e) => println!("{mode}: not available here ({e})"),
        }
    }
    print(&rows, iters);
    let paired_iters = (iters / 10).max(1000);
    for mode in [AttachMode::Tracepoint, AttachMode::RawTracepoint] {
        match paired(&object, &zero, mode, paired_iters) {
            Some(p) => print_paired(mode, &p, paired_iters),
            None => println!("{mode}, paired: not available here"),
        }
    }
}
