//! A new GPU set in the control region (the agent rewrote it with other
//! GPUs, or in another order) takes effect in running processes: memory
//! is charged to, and launches drawn from, the GPU the call is on. The
//! simulator's per-GPU accounting and timeline are the judges.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::sim::{Gpu, NodeSpec};
use common::{Container, Link, MIB, field};
use gpusim::launch_log::Launches;
use tessera_region::UNLIMITED;
use tessera_region::control::{ControlSpec, GpuLimits};

/// Two 4 GiB GPUs, contexts free (so only allocations are charged), and a
/// 1 µs kernel.
fn two_gpus() -> NodeSpec {
    NodeSpec::new()
        .gpu(Gpu::sim(4096))
        .gpu(Gpu::sim(4096))
        .context_overhead_mib(0)
        .fixed_kernel("tiny", 1000)
}

fn limits(uuid: [u8; 16], mib: u64) -> GpuLimits {
    GpuLimits {
        memory_limit: mib * MIB,
        context_overhead: 0,
        ..GpuLimits::unlimited(uuid)
    }
}

/// Runs `ops` (which contain one `wait`), publishes `gpus` once the
/// workload is ready, and returns the workload's lines after that point
/// (it ends with `ready hold`) and its pid.
fn rewrite_mid_run(
    c: &Container,
    ops: &str,
    gpus: Vec<GpuLimits>,
) -> (Vec<String>, common::sim::Running) {
    let mut cmd = c.command(&common::sim::workload(Link::Direct));
    cmd.args(ops.split_whitespace()).stdin(Stdio::piped());
    let mut p = common::sim::spawn_command_ready(cmd, ops);
    c.control
        .write(&ControlSpec { flags: 0, gpus })
        .expect("write the control region");
    let mut stdin = p.child.stdin.take().expect("piped stdin");
    stdin.write_all(b"go\n").expect("write to the workload");
    drop(stdin);
    let mut after = Vec::new();
    while let Some(line) = p.next_line() {
        assert!(!line.starts_with("error"), "{ops}: {line}");
        if line == "ready" {
            return (after, p);
        }
        after.push(line);
    }
    panic!("{ops} ended early: {after:?}");
}

#[test]
fn memory_follows_a_reordered_gpu_set() {
    let node = two_gpus().build();
    let sim = node.sim();
    let (g0, g1) = (sim.uuid_bytes(0), sim.uuid_bytes(1));
    let c = Container::on(node, |u| limits(u, 600));
    c.control
        .write(&ControlSpec {
            flags: 0,
            gpus: vec![limits(g0, 600), limits(g1, 900)],
        })
        .unwrap();
    // Both devices are looked up (and their indices cached) before the
    // agent swaps them and changes the limits.
    let (after, p) = rewrite_mid_run(
        &c,
        "dev 0 meminfo dev 1 meminfo ready wait \
         dev 0 alloc-until-oom 100 dev 1 alloc-until-oom 100 ready hold",
        vec![limits(g1, 300), limits(g0, 500)],
    );
    let allocs: Vec<&String> = after.iter().filter(|l| l.starts_with("allocs")).collect();
    assert_eq!(
        allocs,
        [
            "allocs 5 CUDA_ERROR_OUT_OF_MEMORY",
            "allocs 3 CUDA_ERROR_OUT_OF_MEMORY"
        ],
        "GPU 0 now allows 500 MiB, GPU 1 300 MiB"
    );
    let held = |gpu| -> u64 {
        sim.processes(gpu)
            .unwrap()
            .iter()
            .filter(|x| x.pid == p.pid())
            .map(|x| x.bytes)
            .sum()
    };
    assert_eq!(held(0), 500 * MIB, "the simulator holds GPU 0's limit");
    assert_eq!(held(1), 300 * MIB, "the simulator holds GPU 1's limit");
    // The charges are where the GPUs now are: index 0 is GPU 1.
    let u = c.usage();
    assert_eq!(u.used[0], 300 * MIB, "{u:?}");
    assert_eq!(u.used[1], 500 * MIB, "{u:?}");
    p.kill();
}

#[test]
fn launches_on_a_gpu_added_later_draw_from_its_own_bucket() {
    let node = two_gpus().build();
    let sim = node.sim();
    let (g0, g1) = (sim.uuid_bytes(0), sim.uuid_bytes(1));
    // One GPU, unlimited launches: launches need no device lookup.
    let c = Container::on(node, GpuLimits::unlimited);
    // Then GPU 1 joins, limited to 2000 warps/s with a burst of 10: 410
    // one-warp launches on it take (410 - 10) / 2000 s = 200 ms of GPU
    // time, as the simulator's events measure it.
    let (after, p) = rewrite_mid_run(
        &c,
        "dev 0 launch tiny 1 32 10 ready wait dev 1 time tiny 1 32 410 ready hold",
        vec![
            GpuLimits::unlimited(g0),
            GpuLimits {
                launch_rate: 2000,
                launch_burst: 10,
                ..GpuLimits::unlimited(g1)
            },
        ],
    );
    let elapsed: f64 = field(&after.join("\n"), "elapsed")[0].parse().unwrap();
    assert!(
        (190.0..1000.0).contains(&elapsed),
        "410 launches on GPU 1 took {elapsed} ms of GPU time; its bucket allows them in 200 ms"
    );
    p.kill();
}

/// Asserts that the simulator's log `ran` (one process on GPU `gpu`) never
/// exceeds `rate` one-warp launches/s with `burst`
/// ([`common::assert_within_bucket`], one 1-warp launch alone).
fn assert_within_rate(ran: &Launches, rate: u64, burst: u64, gpu: usize) {
    let (first, last) = (ran.per_ms[0].0, ran.last_ms);
    let log: Vec<u64> = (first..=last)
        .map(|m| ran.warps_between(m, m + 1))
        .collect();
    common::assert_within_bucket(&log, rate, burst, 1, &format!("GPU {gpu}"));
}

/// What process `pid` launched on GPU `gpu`, by the simulator's log.
fn launched(sim: &gpusim::Sim, gpu: usize, pid: i32) -> Launches {
    sim.launches(gpu)
        .expect("read the simulator's launch log")
        .into_iter()
        .find(|l| l.pid == pid)
        .unwrap_or_else(|| panic!("no launches of {pid} on GPU {gpu}"))
}

/// One thread alternating between two GPUs, launch after launch: each
/// launch is drawn from the bucket of the GPU its context is on, never
/// from the one the thread's previous launch (or its batch) was for. One
/// GPU is limited to 1000 one-warp launches/s with a burst of 10, the
/// other is unlimited, then the other way round; the simulator's per-GPU
/// launch log judges.
#[test]
fn a_thread_switching_gpus_draws_each_launch_from_its_gpus_bucket() {
    let (rate, burst) = (1000u64, 10u64);
    // 4 × 30 launches on the limited GPU between 4 × 500 on the other,
    // then single launches alternating every time.
    let mut ops = String::new();
    for _ in 0..4 {
        ops += "dev L launch tiny 1 32 30 dev U launch tiny 1 32 500 ";
    }
    for _ in 0..20 {
        ops += "dev L launch tiny 1 32 1 dev U launch tiny 1 32 1 ";
    }
    for limited in [0usize, 1] {
        let node = two_gpus().build();
        let sim = node.sim();
        let c = Container::on(node, GpuLimits::unlimited);
        let gpus = (0..2)
            .map(|i| GpuLimits {
                launch_rate: if i == limited { rate } else { UNLIMITED },
                launch_burst: burst,
                ..GpuLimits::unlimited(sim.uuid_bytes(i))
            })
            .collect();
        c.control.write(&ControlSpec { flags: 0, gpus }).unwrap();
        let ops = ops
            .replace('L', &limited.to_string())
            .replace('U', &(1 - limited).to_string());
        let mut cmd = c.command(&common::sim::workload(Link::Direct));
        cmd.args(ops.split_whitespace());
        let child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let pid = child.id() as i32;
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        let (lim, free) = (
            launched(&sim, limited, pid),
            launched(&sim, 1 - limited, pid),
        );
        assert_eq!((lim.kernels, free.kernels), (140, 2020), "{stdout}");
        // Its launches drawn from the other GPU's unlimited bucket (or
        // batch) would exceed the limited GPU's rate.
        assert_within_rate(&lim, rate, burst, limited);
        let (first, last) = (lim.per_ms[0].0, lim.last_ms);
        // The unlimited GPU is not held back: its 2020 launches drawn from
        // the limited bucket would take over 2 s; drawn from its own, the
        // whole run takes about the 130 ms the limited GPU's launches need.
        let span = free.last_ms.max(last) - free.per_ms[0].0.min(first);
        assert!(
            span < 1000,
            "the run took {span} ms: GPU {}'s launches were held back",
            1 - limited
        );
    }
}

/// A context destroyed and its handle given to a new context on another
/// GPU (the simulator reuses handles on request): the new context's
/// launches are drawn from its own GPU's bucket, not from the batch the
/// thread took for the old context under the same handle. GPU 1 is
/// unlimited, GPU 0 limited to 1000 one-warp launches/s with a burst of
/// 10; the simulator's launch log judges.
#[test]
fn a_reused_context_handle_draws_from_its_new_gpus_bucket() {
    let (rate, burst) = (1000u64, 10u64);
    let node = two_gpus().build();
    let sim = node.sim();
    let c = Container::on(node, GpuLimits::unlimited);
    let gpus = vec![
        GpuLimits {
            launch_rate: rate,
            launch_burst: burst,
            ..GpuLimits::unlimited(sim.uuid_bytes(0))
        },
        GpuLimits::unlimited(sim.uuid_bytes(1)),
    ];
    c.control.write(&ControlSpec { flags: 0, gpus }).unwrap();
    let ops = "ctx 1 launch tiny 1 32 5 ctx-destroy ctx 0 launch tiny 1 32 100";
    let mut cmd = c.command(&common::sim::workload(Link::Direct));
    cmd.env("GPUSIM_REUSE_CONTEXT_HANDLES", "1")
        .args(ops.split_whitespace());
    let child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id() as i32;
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let on0 = launched(&sim, 0, pid);
    assert_eq!(on0.kernels, 100, "{stdout}");
    assert_within_rate(&on0, rate, burst, 0);
}
