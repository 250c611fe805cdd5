//! What the eBPF ioctl observer costs: ns per ioctl on a watched device, on
//! an unwatched device, and per `getppid` (a syscall the observer does not
//! care about), with no observer and in each attach mode that loads here.
//!
//! The bypass check runs on every watched-device ioctl, so the tracepoint
//! mode is also measured with this process registered (one hash lookup),
//! and already reported from a watched cgroup (two lookups); the plain
//! rows are the costliest case, an unregistered process outside every
//! watched cgroup, which walks its cgroup ancestry on each ioctl.
//!
//! Needs root and the object: `$TESSERA_EBPF_OBJECT`, else
//! `$TESSERA_ARTIFACTS/ebpf/tessera.bpf.o`, else the debug artifacts.
//! Run: `cargo xtask build && cargo bench -p tessera-agent --bench ebpf_overhead`
//! (pin it for steadier figures: `taskset -c 1 cargo bench ...`).
#![allow(
    clippy::unwrap_used,
    reason = "a benchmark binary: failing loudly is fine"
)]

#[path = "../tests/ebpf_support/mod.rs"]
mod support;

use std::fs::File;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use support::{artifact_in, artifacts, device, or_skip, skip_if};
use tessera_agent::cgroup;
use tessera_agent::ebpf::{AttachMode, ModeRequest, Observer, ObserverConfig};

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

/// (min, median) ns per call of `op` over `ROUNDS` rounds of `iters` calls.
fn measure(iters: u32, mut op: impl FnMut()) -> (f64, f64) {
    for _ in 0..iters / 10 {
        op();
    }
    let mut per_call: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters {
                op();
            }
            start.elapsed().as_nanos() as f64 / f64::from(iters)
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    (per_call[0], per_call[ROUNDS / 2])
}

struct Row {
    label: String,
    watched: (f64, f64),
    unwatched: (f64, f64),
    getppid: (f64, f64),
    /// Mean run time of the ioctl program per watched-device ioctl, ns,
    /// from the kernel's run-time statistics.
    program: Option<f64>,
}

fn run(label: &str, iters: u32, observer: Option<&Observer>) -> Row {
    let zero = File::open("/dev/zero").unwrap();
    let null = File::open("/dev/null").unwrap();
    // isatty() is one ioctl(TCGETS), which the memory devices reject.
    Row {
        label: label.to_owned(),
        program: observer.and_then(|o| program_ns(o, &zero, iters)),
        watched: measure(iters, || {
            std::hint::black_box(zero.is_terminal());
        }),
        unwatched: measure(iters, || {
            std::hint::black_box(null.is_terminal());
        }),
        getppid: measure(iters, || {
            std::hint::black_box(std::os::unix::process::parent_id());
        }),
    }
}

/// Mean ns per run of the ioctl program over `iters` watched ioctls
/// (other processes' ioctls during the loop add a little noise).
fn program_ns(observer: &Observer, watched: &File, iters: u32) -> Option<f64> {
    let before = observer.ioctl_program_info().ok()?;
    for _ in 0..iters {
        std::hint::black_box(watched.is_terminal());
    }
    let after = observer.ioctl_program_info().ok()?;
    let runs = after.run_count().checked_sub(before.run_count())?;
    let time = after.run_time().checked_sub(before.run_time())?;
    (runs > 0).then(|| time.as_nanos() as f64 / runs as f64)
}

/// The tracepoint mode again, with this process registered, then reported.
fn bypass_rows(observer: &mut Observer, rows: &mut Vec<Row>, iters: u32) {
    let pid = std::process::id();
    observer.register_tgid(pid).unwrap();
    rows.push(run("tp, registered", iters, Some(observer)));
    observer.unregister_tgid(pid).unwrap();
    match own_cgroup_id() {
        Some(id) => {
            observer.watch_cgroup(id).unwrap();
            rows.push(run("tp, reported", iters, Some(observer)));
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

fn main() {
    skip_if!(support::not_root());
    let object = or_skip!(object());
    let iters: u32 = std::env::var("TESSERA_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let zero = device("/dev/zero");

    // Run-time statistics for the program column; dropped at exit.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| println!("no program run-time statistics ({e})"))
        .ok();
    let mut rows = vec![run("no observer", iters, None)];
    for mode in [
        AttachMode::Tracepoint,
        AttachMode::RawTracepoint,
        AttachMode::Kprobe,
    ] {
        let mut config = ObserverConfig::new(&object, vec![zero.clone()]);
        config.mode = ModeRequest::Only(mode);
        match Observer::start(&config) {
            Ok(mut observer) => {
                rows.push(run(mode.name(), iters, Some(&observer)));
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

    println!(
        "ns per call, min / median of {ROUNDS} rounds x {iters} calls; Δ = median minus the median without observer"
    );
    println!(
        "bpf ns/run = mean run time of the ioctl program per watched ioctl (BPF_STATS_RUN_TIME)"
    );
    println!(
        "{:<16} {:>24} {:>24} {:>24} {:>12}",
        "observer", "ioctl watched dev", "ioctl unwatched dev", "getppid", "bpf ns/run"
    );
    let base = (rows[0].watched.1, rows[0].unwatched.1, rows[0].getppid.1);
    let cell =
        |(min, med): (f64, f64), base: f64| format!("{min:.0} / {med:.0} ({:+.0})", med - base);
    for row in &rows {
        println!(
            "{:<16} {:>24} {:>24} {:>24} {:>12}",
            row.label,
            cell(row.watched, base.0),
            cell(row.unwatched, base.1),
            cell(row.getppid, base.2),
            row.program.map_or("-".to_owned(), |ns| format!("{ns:.0}"))
        );
    }
}
