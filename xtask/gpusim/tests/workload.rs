//! The simulated GPU node, driven by unmodified C programs through
//! `libcuda.so.1`: both loading paths, memory capacity, process death,
//! utilisation under saturation and contention.

use tessera_testkit::sim as support;

use std::time::{Duration, Instant};

use support::{Gpu, Link, Node, NodeSpec, field};

const MIB: u64 = 1 << 20;

#[test]
fn both_loading_paths_work() {
    let node = Node::small();
    for link in [Link::Direct, Link::Dlopen] {
        let out = node.run(
            link,
            "procaddress dev 0 alloc 64 meminfo launch spin 1 1 10 sync free-all",
        );
        assert!(out.contains("dev ok"), "{link:?}: {out}");
        assert!(out.contains("alloc CUDA_SUCCESS"), "{link:?}: {out}");
        assert!(out.contains("launch 10"), "{link:?}: {out}");
        assert!(out.contains("freed 1"), "{link:?}: {out}");
        let mem = field(&out, "meminfo");
        let total: u64 = mem[1].parse().unwrap();
        let free: u64 = mem[0].parse().unwrap();
        assert_eq!(total, 4096 * MIB);
        assert_eq!(free, (4096 - 300 - 64) * MIB, "context + allocation");
        if link == Link::Dlopen {
            // cuMemAlloc at 12080 is cuMemAlloc_v2; the per-thread flag gives
            // cuLaunchKernel_ptsz; cuGetProcAddress resolves to itself;
            // unknown names fail with CUDA_ERROR_NOT_FOUND and status 1.
            assert_eq!(
                field(&out, "procaddress"),
                ["v2", "ptsz", "nested", "CUDA_ERROR_NOT_FOUND", "1"]
            );
        }
    }
}

#[test]
fn devices_are_found_by_every_documented_bus_id_form() {
    let node = NodeSpec::small_with(Gpu::sim(4096).pci_bus_id("0000:3b:00.0")).build();
    // domain:bus:device.function, domain:bus:device, bus:device.function
    // (the last was refused), then a malformed id and an absent device.
    let out = node.run(
        Link::Direct,
        "bybus 0000:3B:00.0 bybus 0000:3b:00 bybus 3b:00.0 bybus 3b bybus 5e:00.0",
    );
    let answers: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().skip(1).collect())
        .collect();
    assert_eq!(
        answers,
        [
            vec!["CUDA_SUCCESS", "0"],
            vec!["CUDA_SUCCESS", "0"],
            vec!["CUDA_SUCCESS", "0"],
            vec!["CUDA_ERROR_INVALID_VALUE", "-1"],
            vec!["CUDA_ERROR_INVALID_DEVICE", "-1"],
        ],
        "{out}"
    );
}

#[test]
fn the_driver_version_is_the_same_before_and_after_cu_init() {
    let node = NodeSpec::small().cuda_version(12040).build();
    let exe = node.dir.path().join("driver_version");
    let src = support::workspace().join("xtask/gpusim/tests/c/driver_version.c");
    let sim = support::sim_dir();
    support::cc(&[
        src.to_str().unwrap(),
        "-o",
        exe.to_str().unwrap(),
        &format!("-L{}", sim.display()),
        &format!("-Wl,-rpath,{}", sim.display()),
        "-lcuda",
    ]);
    let run = |with_node: bool| {
        let mut c = node.command(&exe);
        if !with_node {
            c.env_remove("GPUSIM_NODE");
        }
        let out = c.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}");
        (
            field(&stdout, "before")[0].to_string(),
            field(&stdout, "after")[0].to_string(),
        )
    };
    // No state file yet: the given description.
    assert_eq!(run(true), ("12040".into(), "12040".into()));
    // Once the state file exists it is the node, whatever GPUSIM_NODE says
    // (before cuInit the default node's 12080 was reported).
    assert!(node.state.exists());
    assert_eq!(run(false), ("12040".into(), "12040".into()));
}

#[test]
fn allocation_beyond_capacity_fails_with_out_of_memory() {
    let node = Node::small();
    // 4096 MiB - 300 MiB context = 3796 MiB: seven 512 MiB chunks fit.
    let out = node.run(Link::Direct, "dev 0 alloc-until-oom 512 meminfo");
    assert_eq!(field(&out, "allocs"), ["7", "CUDA_ERROR_OUT_OF_MEMORY"]);
    let free: u64 = field(&out, "meminfo")[0].parse().unwrap();
    assert_eq!(
        free,
        (3796 - 7 * 512) * MIB,
        "the failed call allocated nothing"
    );
    // A second process sees the first one's memory.
    let holder = node.spawn_ready(Link::Direct, "dev 0 alloc 3000 ready hold");
    let out = node.run(Link::Dlopen, "dev 0 alloc 600 meminfo");
    assert_eq!(field(&out, "alloc"), ["CUDA_ERROR_OUT_OF_MEMORY"]);
    holder.kill();
}

#[test]
fn sigkilled_process_memory_is_freed_within_a_second() {
    let node = Node::small();
    let sim = node.sim();
    let p = node.spawn_ready(Link::Direct, "dev 0 alloc 1000 ready hold");
    let pid = p.pid();
    let procs = sim.processes(0).unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, pid);
    assert_eq!(procs[0].bytes, 1300 * MIB);
    let killed = Instant::now();
    p.kill();
    loop {
        let used = sim.memory_info(0).unwrap().used;
        if used == 0 {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "still {used} bytes used 1 s after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(sim.processes(0).unwrap().is_empty());
}

/// The launch log is the judge of launch limits, often read after the
/// process is gone: its record (with its pid) outlives the process and the
/// reaping of its channel, until another process claims the channel.
#[test]
fn an_exited_process_keeps_its_launch_record_until_its_channel_is_claimed() {
    let node = Node::small();
    let sim = node.sim();
    let p = node.spawn_ready(Link::Direct, "dev 0 launch spin 3 64 25 sync ready hold");
    let pid = p.pid();
    p.kill();
    // Memory queries reap dead processes first: the channel is freed.
    let killed = Instant::now();
    while !sim.processes(0).unwrap().is_empty() {
        assert!(killed.elapsed() < Duration::from_secs(1), "not reaped");
        std::thread::sleep(Duration::from_millis(10));
    }
    let log = sim.launches(0).unwrap();
    let mine: Vec<_> = log.iter().filter(|l| l.pid == pid).collect();
    assert_eq!(mine.len(), 1, "{log:?}");
    assert_eq!((mine[0].active, mine[0].kernels), (false, 25));
    assert_eq!(mine[0].warps, 25 * 3 * 2);
    // A new process claims the channel: the record is its own from then.
    let q = node.spawn_ready(Link::Direct, "dev 0 launch spin 1 32 1 sync ready hold");
    let log = sim.launches(0).unwrap();
    assert!(log.iter().all(|l| l.pid != pid), "{log:?}");
    let theirs: Vec<_> = log.iter().filter(|l| l.pid == q.pid()).collect();
    assert_eq!((theirs.len(), theirs[0].kernels), (1, 1), "{log:?}");
}

#[test]
fn saturating_workload_keeps_the_gpu_busy() {
    let node = Node::small();
    let sim = node.sim();
    let run = node.spawn_ready(Link::Direct, "dev 0 ready run spin 1 1 2500");
    // Past the 1 s utilisation window's start.
    std::thread::sleep(Duration::from_millis(1500));
    let util = sim.utilization(0).unwrap();
    let samples = sim.process_samples(0, now_us() - 1_000_000).unwrap();
    drop(run);
    assert!(util.gpu >= 97, "device utilisation {}%", util.gpu);
    assert_eq!(samples.len(), 1);
    assert!(samples[0].sm_percent >= 97, "{samples:?}");
}

#[test]
fn two_saturating_processes_share_the_gpu_equally() {
    let node = Node::small();
    let sim = node.sim();
    let a = node.spawn_ready(Link::Direct, "dev 0 ready run spin 1 1 3000");
    let b = node.spawn_ready(Link::Dlopen, "dev 0 ready run spin 1 1 3000");
    std::thread::sleep(Duration::from_millis(1500));
    let samples = sim.process_samples(0, now_us() - 1_000_000).unwrap();
    let util = sim.utilization(0).unwrap();
    let pids = (a.pid(), b.pid());
    drop((a, b));
    assert_eq!(samples.len(), 2, "{samples:?}");
    for s in &samples {
        assert!(s.pid == pids.0 || s.pid == pids.1, "{s:?}");
        assert!(
            (47..=53).contains(&s.sm_percent),
            "each gets 50 ± 3 %: {samples:?}"
        );
    }
    assert!(util.gpu >= 97, "device utilisation {}%", util.gpu);
}

#[test]
fn events_time_work_on_the_timeline() {
    let node = Node::small();
    // 20 launches of the 5 ms kernel: 100 ms of GPU time.
    let out = node.run(Link::Dlopen, "dev 0 time slow 1 1 20");
    let ms: f64 = field(&out, "elapsed")[0].parse().unwrap();
    assert!((99.0..=101.0).contains(&ms), "elapsed {ms} ms");
}

fn now_us() -> u64 {
    gpusim::realtime_ns() / 1_000
}

#[test]
fn nvml_agrees_with_what_the_processes_did() {
    let node = Node::small();
    let dir = tempfile::tempdir().unwrap();
    let view = dir.path().join("nvml_view");
    support::cc(&[
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/nvml_view.c"),
        "-o",
        view.to_str().unwrap(),
        "-ldl",
    ]);
    let busy = node.spawn_ready(Link::Direct, "dev 0 alloc 100 ready run spin 1 1 3000");
    let idle = node.spawn_ready(Link::Dlopen, "dev 0 alloc 200 ready hold");
    std::thread::sleep(Duration::from_millis(1500));
    let out = node.command(&view).output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let (b, i) = (busy.pid(), idle.pid());
    drop((busy, idle));
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let find = |kind: &str, pid: i32| -> u64 {
        lines
            .iter()
            .find(|l| l[0] == kind && l[1] == pid.to_string())
            .unwrap_or_else(|| panic!("no {kind} for {pid} in {out}"))[2]
            .parse()
            .unwrap()
    };
    // Memory: each process's allocations plus its context.
    assert_eq!(find("proc", b), 400 * MIB, "{out}");
    assert_eq!(find("proc", i), 500 * MIB, "{out}");
    // Utilisation: the busy process had the GPU, the idle one nothing.
    assert!(find("sample", b) >= 97, "{out}");
    // (NVML lists only processes that ran; an idle one is absent or 0.)
    assert!(
        !lines
            .iter()
            .any(|l| l[0] == "sample" && l[1] == i.to_string() && l[2] != "0"),
        "{out}"
    );
    let util: u64 = field(&out, "util")[0].parse().unwrap();
    assert!(util >= 97, "{out}");
}

#[test]
fn destroying_a_context_frees_what_was_allocated_in_it() {
    let node = Node::small();
    let sim = node.sim();
    let p = node.spawn_ready(
        Link::Direct,
        "dev 0 ctx 0 alloc 1000 ctx-destroy ready hold",
    );
    let procs = sim.processes(0).unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(
        procs[0].bytes,
        300 * MIB,
        "only the primary context is left"
    );
    p.kill();
}
