//! A new GPU set in the control region (the agent rewrote it with other
//! GPUs, or in another order) takes effect in running processes: memory
//! is charged to, and launches drawn from, the GPU the call is on. The
//! simulator's per-GPU accounting and timeline are the judges.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::{Container, Link, MIB, Node, field};
use tessera_region::control::{ControlSpec, GpuLimits};

/// Two 4 GiB GPUs, contexts free (so only allocations are charged), and a
/// 1 µs kernel.
const TWO_GPUS: &str = r#"
[[gpu]]
model = "Tessera Sim GPU"
memory_mib = 4096
sm_count = 100

[[gpu]]
model = "Tessera Sim GPU"
memory_mib = 4096
sm_count = 100

[cost]
context_overhead_mib = 0
[cost.functions.tiny]
fixed_ns = 1000

[ioctl]
control = "/dev/null"
uvm = "/dev/zero"
"#;

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
    let node = Node::new(TWO_GPUS);
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
    let node = Node::new(TWO_GPUS);
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
