//! What the eBPF ioctl observer costs: ns per ioctl on a watched device, on
//! an unwatched device, and per `getppid` (a syscall the observer does not
//! care about), with no observer and in each attach mode that loads here.
//!
//! Needs root and the object: `$TESSERA_EBPF_OBJECT`, else
//! `$TESSERA_ARTIFACTS/ebpf/tessera.bpf.o`, else the debug artifacts.
//! Run: `cargo xtask build && cargo bench -p tessera-agent --bench ebpf_overhead`
//! (pin it for steadier figures: `taskset -c 1 cargo bench ...`).
#![allow(
    clippy::unwrap_used,
    reason = "a benchmark binary: failing loudly is fine"
)]

use std::fs::File;
use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Instant;

use tessera_agent::ebpf::{AttachMode, DeviceSpec, ModeRequest, Observer, ObserverConfig};

const ROUNDS: usize = 7;

fn object() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TESSERA_EBPF_OBJECT") {
        return Some(path.into());
    }
    let artifacts = std::env::var_os("TESSERA_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tessera/debug")
        });
    let path = artifacts.join("ebpf/tessera.bpf.o");
    path.is_file().then_some(path)
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
}

fn run(label: &str, iters: u32) -> Row {
    let zero = File::open("/dev/zero").unwrap();
    let null = File::open("/dev/null").unwrap();
    // isatty() is one ioctl(TCGETS), which the memory devices reject.
    Row {
        label: label.to_owned(),
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

fn main() {
    let euid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    if euid != 0 {
        println!("skipped: not root");
        return;
    }
    let Some(object) = object() else {
        println!("skipped: no tessera.bpf.o (run `cargo xtask build`)");
        return;
    };
    let iters: u32 = std::env::var("TESSERA_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let zero = DeviceSpec::path("/dev/zero").resolve().unwrap();

    let mut rows = vec![run("no observer", iters)];
    for mode in [
        AttachMode::Tracepoint,
        AttachMode::RawTracepoint,
        AttachMode::Kprobe,
    ] {
        let mut config = ObserverConfig::new(&object, vec![zero.clone()]);
        config.mode = ModeRequest::Only(mode);
        match Observer::start(&config) {
            Ok(observer) => {
                rows.push(run(mode.name(), iters));
                let counted = observer.stats().unwrap().ioctls_counted;
                assert!(
                    counted >= u64::from(iters),
                    "{mode}: only {counted} ioctls counted"
                );
            }
            Err(e) => println!("{mode}: not available here ({e})"),
        }
    }

    println!(
        "ns per call, min / median of {ROUNDS} rounds x {iters} calls; Δ = median minus the median without observer"
    );
    println!(
        "{:<16} {:>24} {:>24} {:>24}",
        "observer", "ioctl watched dev", "ioctl unwatched dev", "getppid"
    );
    let base = (rows[0].watched.1, rows[0].unwatched.1, rows[0].getppid.1);
    let cell =
        |(min, med): (f64, f64), base: f64| format!("{min:.0} / {med:.0} ({:+.0})", med - base);
    for row in &rows {
        println!(
            "{:<16} {:>24} {:>24} {:>24}",
            row.label,
            cell(row.watched, base.0),
            cell(row.unwatched, base.1),
            cell(row.getppid, base.2)
        );
    }
}
