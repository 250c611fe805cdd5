//! What `libtessera.so` adds to a launch and to an allocation/free pair,
//! against calling the simulated driver directly (`cargo xtask bench`).
//!
//! A C program linked against the simulator's `libcuda.so.1` times 100 000
//! `cuLaunchKernel` calls of an empty 1-warp kernel and 20 000
//! `cuMemAlloc_v2` + `cuMemFree_v2` pairs, plain and under
//! `LD_PRELOAD=libtessera.so` with (a) no launch limit and (b) a launch
//! limit of 2³² warps/s with a 100 ms burst, high enough never to make a
//! launch wait, so the token bucket's fast path (a thread spending a batch
//! taken ahead) is what is measured. The three configurations run in turn,
//! 15 times (5 rounds each), and the best time of each is kept (the
//! machine is shared). A fourth runs the launches on a node of two GPUs
//! in a container granted both (the same limit on each), where a launch's
//! GPU depends on the thread's current context, against the simulator
//! alone on that node.
//!
//! Separate processes differ by more than the hook costs (address layout,
//! caches, the machine's load between runs), so the same program also
//! runs *paired*: in one process it alternates batches of calls bound by
//! the dynamic linker (under `LD_PRELOAD`, the hook) with batches of the
//! same calls straight into the driver library's own definitions, found
//! in its ELF symbol table (no lookup the interposer hooks), and prints
//! the median over 2000 rounds of each round's difference. Without the
//! interposer both sides reach the same function, so that row is the
//! method's zero; the runner checks which function each side reached.
//!
//! Wall-clock figures on a busy 2-core machine wobble by tens of ns, so
//! when valgrind is installed the runner also counts *instructions* per
//! call with callgrind (exact and repeatable): the difference between two
//! runs of different lengths, divided by the extra calls. (Valgrind serves
//! `clock_gettime` by a system call rather than the vDSO, which it counts
//! as one instruction: the coarse-clock read of a limited launch costs a
//! few dozen instructions more outside it.) With
//! `TESSERA_BENCH_CALLGRIND_DIR=<dir>` the launch runs also leave their
//! callgrind profiles there (`--dump-instr=yes`, one per configuration),
//! for `callgrind_annotate`.
//!
//! Use release artifacts (`TESSERA_ARTIFACTS=target/tessera/release`).

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_region::UNLIMITED;
use tessera_region::control::{ControlSpec, GpuLimits};
use tessera_region::file::{create_control, create_usage};

fn artifacts() -> PathBuf {
    std::env::var_os("TESSERA_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tessera/release"))
}

/// The bench node: one GPU, or two.
fn node_toml(gpus: usize) -> String {
    "[[gpu]]\nmodel = \"bench\"\nmemory_mib = 81920\nsm_count = 132\n".repeat(gpus)
        + "[cost.functions.empty]\nfixed_ns = 1\n[cost]\ncontext_overhead_mib = 0\n[ioctl]\nenabled = false\n"
}

fn run(program: &Path, env: &[(&str, &Path)]) -> (f64, f64) {
    let out = Command::new(program)
        .args(["100000", "20000", "5"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .output()
        .expect("run bench program");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let get = |key: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {text}"))
    };
    (get("launch"), get("allocfree"))
}

fn main() {
    let art = artifacts();
    let sim = art.join("sim");
    let lib = art.join("lib/libtessera.so");
    assert!(
        lib.is_file(),
        "{} missing: run `cargo xtask build --release`",
        lib.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bench");
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/c/bench.c"))
        .arg(format!("-L{}", sim.display()))
        .arg(format!("-Wl,-rpath,{}", sim.display()))
        .arg("-lcuda")
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed");
    // (node file, state file, GPU UUIDs) of a node of `gpus` GPUs.
    let node_of = |gpus: usize| -> (PathBuf, PathBuf, Vec<[u8; 16]>) {
        let node = dir.path().join(format!("node{gpus}.toml"));
        std::fs::write(&node, node_toml(gpus)).expect("write node");
        let state = dir.path().join(format!("state{gpus}"));
        let sim = gpusim::Sim::open(&gpusim::state::Config {
            node_path: Some(node.clone()),
            state_path: state.clone(),
        })
        .expect("open node");
        let uuids = (0..gpus).map(|i| sim.uuid_bytes(i)).collect();
        (node, state, uuids)
    };
    let (node, state, uuids) = node_of(1);
    let (node2, state2, uuids2) = node_of(2);
    let region = |name: &str, uuids: &[[u8; 16]], rate: u64, burst: u64| -> PathBuf {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).expect("region dir");
        let gpus = uuids
            .iter()
            .map(|&uuid| GpuLimits {
                memory_limit: 40 << 30,
                launch_rate: rate,
                launch_burst: burst,
                ..GpuLimits::unlimited(uuid)
            })
            .collect();
        create_control(&d, &ControlSpec { flags: 0, gpus }).expect("control");
        create_usage(&d).expect("usage");
        d
    };
    let unlimited = region("unlimited", &uuids, UNLIMITED, 0);
    let bucket = region("bucket", &uuids, 1 << 32, (1 << 32) / 10);
    let bucket2 = region("bucket2", &uuids2, 1 << 32, (1 << 32) / 10);
    let base: [(&str, &Path); 2] = [("GPUSIM_NODE", &node), ("GPUSIM_STATE", &state)];
    let base2: [(&str, &Path); 2] = [("GPUSIM_NODE", &node2), ("GPUSIM_STATE", &state2)];
    let plain = run(&bin, &base);
    let with = |r: &Path| {
        let mut env = base.to_vec();
        env.push(("LD_PRELOAD", &lib));
        env.push(("TESSERA_REGION_DIR", r));
        run(&bin, &env)
    };
    fn env_for<'a>(
        base: &[(&'a str, &'a Path)],
        lib: &'a Path,
        r: Option<&'a Path>,
    ) -> Vec<(&'a str, &'a Path)> {
        let mut env = base.to_vec();
        if let Some(r) = r {
            env.push(("LD_PRELOAD", lib));
            env.push(("TESSERA_REGION_DIR", r));
        }
        env
    }
    let (mut plain, mut a, mut b) = (plain, with(&unlimited), with(&bucket));
    let mut plain2 = run(&bin, &env_for(&base2, &lib, None));
    let mut b2 = run(&bin, &env_for(&base2, &lib, Some(&bucket2)));
    let best = |x: (f64, f64), y: (f64, f64)| (x.0.min(y.0), x.1.min(y.1));
    for _ in 0..14 {
        plain = best(plain, run(&bin, &env_for(&base, &lib, None)));
        a = best(a, run(&bin, &env_for(&base, &lib, Some(&unlimited))));
        b = best(b, run(&bin, &env_for(&base, &lib, Some(&bucket))));
        plain2 = best(plain2, run(&bin, &env_for(&base2, &lib, None)));
        b2 = best(b2, run(&bin, &env_for(&base2, &lib, Some(&bucket2))));
    }
    println!("                              ns per call   added by libtessera.so");
    println!("cuLaunchKernel, simulator      {:>10.1}", plain.0);
    println!(
        "  + libtessera, no rate limit  {:>10.1}   {:>+8.1}",
        a.0,
        a.0 - plain.0
    );
    println!(
        "  + libtessera, token bucket   {:>10.1}   {:>+8.1}",
        b.0,
        b.0 - plain.0
    );
    println!("cuLaunchKernel, 2-GPU node     {:>10.1}", plain2.0);
    println!(
        "  + libtessera, 2 buckets      {:>10.1}   {:>+8.1}",
        b2.0,
        b2.0 - plain2.0
    );
    println!("cuMemAlloc_v2+cuMemFree_v2     {:>10.1}", plain.1);
    println!(
        "  + libtessera, memory limit   {:>10.1}   {:>+8.1}",
        b.1,
        b.1 - plain.1
    );
    println!();
    println!(
        "paired in one process (median of {PAIRED_ROUNDS} rounds of {PAIRED_BATCH} calls each way):"
    );
    println!("                              direct ns   through ns   added ns");
    let show = |label: &str, env: &[(&str, &Path)]| {
        let p = paired(&bin, env, env.iter().any(|(k, _)| *k == "LD_PRELOAD"));
        for (what, (added, direct, through)) in [("cuLaunchKernel", p.0), ("alloc+free", p.1)] {
            println!("{label:<16}{what:<14}{direct:>10.1} {through:>12.1} {added:>+10.2}");
        }
    };
    show("no interposer", &env_for(&base, &lib, None));
    show("no rate limit", &env_for(&base, &lib, Some(&unlimited)));
    show("token bucket", &env_for(&base, &lib, Some(&bucket)));
    show("2 GPUs, none", &env_for(&base2, &lib, None));
    show("2 GPUs, 2 bkts", &env_for(&base2, &lib, Some(&bucket2)));
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("(install valgrind for instruction counts)");
        return;
    }
    let profiles = std::env::var_os("TESSERA_BENCH_CALLGRIND_DIR").map(PathBuf::from);
    let keep = |name: &str| {
        profiles
            .as_ref()
            .map(|d| d.join(format!("callgrind.{name}")))
    };
    if let (Some(p), Some(u), Some(t), Some(p2), Some(t2)) = (
        instructions(&bin, &env_for(&base, &lib, None), keep("plain")),
        instructions(
            &bin,
            &env_for(&base, &lib, Some(&unlimited)),
            keep("unlimited"),
        ),
        instructions(&bin, &env_for(&base, &lib, Some(&bucket)), keep("bucket")),
        instructions(&bin, &env_for(&base2, &lib, None), keep("plain2")),
        instructions(
            &bin,
            &env_for(&base2, &lib, Some(&bucket2)),
            keep("bucket2"),
        ),
    ) {
        println!();
        println!("                              instructions  added by libtessera.so");
        println!("cuLaunchKernel, simulator      {:>10.0}", p.0);
        println!(
            "  + libtessera, no rate limit  {:>10.0}   {:>+8.0}",
            u.0,
            u.0 - p.0
        );
        println!(
            "  + libtessera, token bucket   {:>10.0}   {:>+8.0}",
            t.0,
            t.0 - p.0
        );
        println!("cuLaunchKernel, 2-GPU node     {:>10.0}", p2.0);
        println!(
            "  + libtessera, 2 buckets      {:>10.0}   {:>+8.0}",
            t2.0,
            t2.0 - p2.0
        );
        println!("cuMemAlloc_v2+cuMemFree_v2     {:>10.0}", p.1);
        println!(
            "  + libtessera, memory limit   {:>10.0}   {:>+8.0}",
            t.1,
            t.1 - p.1
        );
    }
}

/// Rounds and calls per batch of the paired runs (`bench paired`).
const PAIRED_ROUNDS: u32 = 2000;
const PAIRED_BATCH: u32 = 1000;

/// `(added, direct, through)` ns per launch and per alloc/free pair,
/// medians of the bench program's paired mode.
type Paired = (f64, f64, f64);

///
/// `interposed`: whether `env` preloads the interposer; the program says
/// whether its calls bind to the driver's own definitions, which must be
/// so exactly when nothing is interposed (else both sides time one
/// function, or the direct side is not the driver's).
fn paired(program: &Path, env: &[(&str, &Path)], interposed: bool) -> (Paired, Paired) {
    let out = Command::new(program)
        .args([
            "paired".to_string(),
            PAIRED_ROUNDS.to_string(),
            PAIRED_BATCH.to_string(),
        ])
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .output()
        .expect("run bench program");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "paired bench failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let get = |key: &str| -> Paired {
        let v: Vec<f64> = text
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| {
                v.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        match v[..] {
            [added, direct, through] => (added, direct, through),
            _ => panic!("no {key} in {text}"),
        }
    };
    let bound = text
        .lines()
        .find_map(|l| l.strip_prefix("paired_bound_to_driver "))
        .unwrap_or_else(|| panic!("no paired_bound_to_driver in {text}"));
    assert_eq!(
        bound == "1",
        !interposed,
        "the calls {} to the driver's own definitions",
        if interposed { "bind" } else { "do not bind" }
    );
    (get("paired_launch "), get("paired_allocfree "))
}

/// Instructions per launch and per alloc/free pair, from callgrind; the
/// profile of the launch run is kept at `profile` if given.
fn instructions(bin: &Path, env: &[(&str, &Path)], profile: Option<PathBuf>) -> Option<(f64, f64)> {
    let count = |launches: u32, allocs: u32| -> Option<f64> {
        let mut cmd = Command::new("valgrind");
        cmd.arg("--tool=callgrind");
        match &profile {
            Some(path) if launches > 0 => cmd
                .arg("--dump-instr=yes")
                .arg(format!("--callgrind-out-file={}", path.display())),
            _ => cmd.arg("--callgrind-out-file=/dev/null"),
        };
        let out = cmd
            .arg(bin)
            .args([launches.to_string(), allocs.to_string(), "1".into()])
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .output()
            .ok()?;
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err.lines().find(|l| l.contains("Collected :"))?;
        line.split(':')
            .next_back()?
            .trim()
            .replace(',', "")
            .parse()
            .ok()
    };
    let base = count(0, 0)?;
    Some((
        (count(20_000, 0)? - base) / 20_000.0,
        (count(0, 5_000)? - base) / 5_000.0,
    ))
}
