//! Launch-rate limits under `libtessera.so` on the simulated node, judged
//! by what the simulated driver was given (its per-process launch log),
//! never by the limiter's own counters.

mod common;

use std::time::{Duration, Instant};

use common::sim::NodeSpec;
use common::{Container, Link, Node, field};
use gpusim::launch_log::Launches;
use tessera_region::UNLIMITED;
use tessera_region::control::GpuLimits;

/// Rate measurements need the CPU: these tests run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The test node plus a 1 µs kernel, so the launch rate, not GPU time,
/// is what limits the workload.
fn node() -> Node {
    NodeSpec::small().fixed_kernel("tiny", 1000).build()
}

fn rate(uuid: [u8; 16], warps_per_s: u64, burst: u64) -> GpuLimits {
    GpuLimits {
        launch_rate: warps_per_s,
        launch_burst: burst,
        ..GpuLimits::unlimited(uuid)
    }
}

/// What process `pid` launched on GPU 0, as the simulator saw it.
fn executed(c: &Container, pid: i32) -> Launches {
    c.node
        .sim()
        .launches(0)
        .expect("read the simulator's launch log")
        .into_iter()
        .find(|l| l.pid == pid)
        .unwrap_or(Launches {
            pid,
            active: false,
            kernels: 0,
            warps: 0,
            last_ms: 0,
            per_ms: Vec::new(),
        })
}

/// Warps per second the simulator was given between two snapshots (by its
/// own timestamps: the millisecond of the latest launch of each).
fn warps_per_s(a: &Launches, b: &Launches) -> f64 {
    let ms = b.last_ms.saturating_sub(a.last_ms).max(1);
    (b.warps - a.warps) as f64 * 1000.0 / ms as f64
}

/// Warps per second the simulator was given by `pid` over about `window`.
fn measure(c: &Container, pid: i32, window: Duration) -> f64 {
    let a = executed(c, pid);
    std::thread::sleep(window);
    warps_per_s(&a, &executed(c, pid))
}

fn now_ms() -> u64 {
    gpusim::monotonic_ns() / 1_000_000
}

#[test]
fn a_fixed_rate_yields_that_launch_rate_within_one_percent() {
    let _serial = serial();
    // Launches of 8 warps (one block of 256 threads): 2500 launches/s, so
    // the workload keeps up with the rate on a busy machine.
    // A tenth of a second of burst: a workload descheduled for less than
    // that catches up from the bucket, so the long-window rate is exact on
    // a loaded machine too.
    let c = Container::on(node(), |u| rate(u, 20_000, 2_000));
    for link in [Link::Direct, Link::Dlopen] {
        let p = c.spawn_ready(link, "dev 0 ready run tiny 1 256 2500");
        std::thread::sleep(Duration::from_millis(300));
        let r = measure(&c, p.pid(), Duration::from_millis(1500));
        drop(p);
        assert!(
            (r - 20_000.0).abs() <= 200.0,
            "{link:?}: the simulator ran {r:.0} warps/s for a rate of 20000 warps/s"
        );
    }
}

/// Processes sharing the container's bucket, each spending batches taken
/// ahead: together they get the rate, and in no window of the
/// simulator's log do they launch more than rate × window + burst.
#[test]
fn processes_together_keep_to_rate_plus_burst() {
    let _serial = serial();
    let (rate_w, burst) = (20_000u64, 200u64);
    let c = Container::on(node(), |u| rate(u, rate_w, burst));
    let ps: Vec<_> = (0..3)
        .map(|_| c.spawn_ready(Link::Direct, "dev 0 ready run tiny 1 256 2500"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let a: Vec<_> = ps.iter().map(|p| executed(&c, p.pid())).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let b: Vec<_> = ps.iter().map(|p| executed(&c, p.pid())).collect();
    drop(ps);
    let warps: u64 = a.iter().zip(&b).map(|(a, b)| b.warps - a.warps).sum();
    let ms =
        b.iter().map(|l| l.last_ms).max().unwrap() - a.iter().map(|l| l.last_ms).min().unwrap();
    let together = warps as f64 * 1000.0 / ms as f64;
    assert!(
        (together - 20_000.0).abs() <= 200.0,
        "3 processes ran {together:.0} warps/s together at 20000"
    );
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        assert!(
            b.warps - a.warps >= warps / 10,
            "process {i} starved: {a:?} {b:?}"
        );
    }
    // Every window of the last 500 ms: k whole milliseconds span less
    // than k ms, so at most rate × k ms + burst, plus one launch (8 warps)
    // taken alone that may end a window, as in any GCRA.
    let end = b.iter().map(|l| l.last_ms).min().unwrap();
    let per_ms = |m: u64| -> u64 { b.iter().map(|l| l.warps_between(m, m + 1)).sum() };
    let log: Vec<u64> = (end - 500..end).map(per_ms).collect();
    common::assert_within_bucket(&log, rate_w, burst, 8, "3 processes together");
}

#[test]
fn a_launch_costs_its_warps_and_a_graph_its_kernels() {
    let _serial = serial();
    // 8 blocks of 64 threads = 16 warps each: 10000 warps/s = 625 launches/s
    // (a tenth of a second of burst, as above).
    let c = Container::on(node(), |u| rate(u, 10_000, 1_000));
    let p = c.spawn_ready(Link::Direct, "dev 0 ready run tiny 8 64 2000");
    std::thread::sleep(Duration::from_millis(300));
    let a = executed(&c, p.pid());
    std::thread::sleep(Duration::from_millis(1200));
    let b = executed(&c, p.pid());
    drop(p);
    let r = warps_per_s(&a, &b);
    assert!((r - 10_000.0).abs() <= 100.0, "{r:.0} warps/s");
    assert_eq!((b.warps - a.warps), (b.kernels - a.kernels) * 16);

    // A graph of 10 one-warp kernels costs 10 warps per launch: the
    // 10 captured warps plus 1000 graph launches are charged, so the
    // 10000 kernels the simulator runs take ≥ (10010 − 100) / 10000 s.
    let c = Container::on(node(), |u| rate(u, 10_000, 100));
    let mut cmd = c.command(&common::sim::workload(Link::Dlopen));
    cmd.args("dev 0 graph tiny 1 32 10 1000".split_whitespace());
    let t = Instant::now();
    let child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let pid = child.id() as i32;
    let out = child.wait_with_output().unwrap();
    let elapsed = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(field(&stdout, "graph"), ["1000"], "{stdout}");
    let ran = executed(&c, pid);
    assert_eq!((ran.kernels, ran.warps), (10_000, 10_000));
    assert!(
        elapsed >= Duration::from_millis(990),
        "10000 warps at 10000/s (burst 100) took {elapsed:?}"
    );
}

/// The agent changes the rate while launches wait (40 ms each at the old
/// rate, longer than a control period) and the workload keeps running:
/// from the simulator's timestamps, the new rate applies within 10 ms of
/// the change, and launches before and after it follow the old and the new
/// rate.
#[test]
fn a_new_rate_takes_effect_within_a_control_period() {
    let _serial = serial();
    // Launches of 2 warps (64 threads): 25/s before, 10000/s after.
    let c = Container::on(node(), |u| rate(u, 50, 2));
    let p = c.spawn_ready(Link::Direct, "dev 0 ready run tiny 1 64 6000");
    let pid = p.pid();
    std::thread::sleep(Duration::from_millis(300));
    let a = executed(&c, pid);
    std::thread::sleep(Duration::from_millis(2400));
    // Change it just after a launch, so the next one is mid-wait (about
    // 40 ms from its start).
    let seen = executed(&c, pid).kernels;
    let deadline = Instant::now() + Duration::from_secs(1);
    while executed(&c, pid).kernels == seen {
        assert!(Instant::now() < deadline, "no launch for 1 s at 50 warps/s");
        std::thread::sleep(Duration::from_micros(500));
    }
    let before = executed(&c, pid);
    let asked = now_ms();
    c.set(rate(c.uuid, 20_000, 200));
    let set = now_ms();
    std::thread::sleep(Duration::from_millis(300));
    let after = executed(&c, pid);
    // The long-window rate, with a tenth of a second of burst so a
    // workload descheduled on a loaded machine catches up (as in
    // `a_fixed_rate_…`); the burst change itself is one more rate change.
    c.set(rate(c.uuid, 20_000, 2_000));
    std::thread::sleep(Duration::from_millis(100));
    let steady = executed(&c, pid);
    std::thread::sleep(Duration::from_millis(1000));
    let later = executed(&c, pid);
    drop(p);

    // Before: 50 warps/s (one launch is 2 warps in 2.4 s: 0.8 warps/s).
    let old = warps_per_s(&a, &before);
    assert!((old - 50.0).abs() <= 1.0, "{old:.1} warps/s at 50");
    // The first launch after the change came within 10 ms of it (plus the
    // millisecond the timestamps are rounded to); at the old rate it
    // would have come about 40 ms after the previous one.
    let first = after
        .per_ms
        .iter()
        .find(|&&(m, _)| m > before.last_ms)
        .map(|&(m, _)| m)
        .expect("launches after the change");
    assert!(
        first <= set + 11,
        "first launch {} ms after the change was asked (written after {} ms); the previous at -{} ms",
        first - asked,
        set - asked,
        asked - before.last_ms
    );
    // From 10 ms after the change on: 20000 warps/s. The first 10 ms may
    // hold the new burst.
    let window = (set + 10, after.last_ms.min(set + 290));
    let got = after.warps_between(window.0, window.1);
    let want = 20 * (window.1 - window.0);
    assert!(
        got.abs_diff(want) <= want / 50,
        "{got} warps in the {} ms from 10 ms after the change; 20000/s is {want}",
        window.1 - window.0
    );
    let new = warps_per_s(&steady, &later);
    assert!((new - 20_000.0).abs() <= 200.0, "{new:.0} warps/s at 20000");
}

#[test]
fn a_zero_rate_pauses_launches_and_unlimited_does_not_throttle() {
    let _serial = serial();
    let c = Container::on(node(), |u| rate(u, 0, 0));
    let mut p = c.spawn_ready(Link::Direct, "dev 0 ready launch tiny 1 32 5 ready");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(executed(&c, p.pid()).kernels, 0, "paused");
    assert!(p.child.try_wait().unwrap().is_none(), "still waiting");
    c.set(rate(c.uuid, UNLIMITED, 0));
    assert_eq!(p.next_line().as_deref(), Some("launch 5"));
    assert_eq!(executed(&c, p.pid()).kernels, 5);
    // Once it exited, the usage region's counters (the agent's view)
    // agree with the simulator.
    assert!(p.child.wait().unwrap().success());
    let usage = c.usage();
    assert_eq!((usage.buckets[0].launches, usage.buckets[0].warps), (5, 5));

    // Unlimited: the simulator's own speed is the only bound.
    let p = c.spawn_ready(Link::Direct, "dev 0 ready run tiny 1 32 1500");
    std::thread::sleep(Duration::from_millis(200));
    let r = measure(&c, p.pid(), Duration::from_millis(800));
    drop(p);
    assert!(r > 25_000.0, "{r:.0} warps/s unlimited");
}

#[test]
fn a_launch_waiting_through_a_rate_change_is_charged_once() {
    let _serial = serial();
    // 10 warps/s, no burst: the second launch waits 100 ms; the agent
    // changes the rate to 12/s after 50 ms and to 15/s after 100 ms.
    // Charged once and rescaled, the second launch starts at about 92 ms
    // and the third at about 160 ms; charged again after a change, the
    // third would start after 220 ms.
    let c = Container::on(node(), |u| rate(u, 10, 0));
    let mut p = c.spawn_ready(Link::Direct, "dev 0 ready launch tiny 1 32 3 ready");
    std::thread::sleep(Duration::from_millis(50));
    c.set(rate(c.uuid, 12, 0));
    std::thread::sleep(Duration::from_millis(50));
    c.set(rate(c.uuid, 15, 0));
    assert_eq!(p.next_line().as_deref(), Some("launch 3"));
    let ran = executed(&c, p.pid());
    assert_eq!((ran.kernels, ran.warps), (3, 3), "{ran:?}");
    let (first, last) = (ran.per_ms[0].0, ran.per_ms[ran.per_ms.len() - 1].0);
    assert!(
        (150..=200).contains(&(last - first)),
        "3 launches over {} ms",
        last - first
    );
}

/// Under a launch floor a kernel smaller than the floor is charged the
/// floor, and a larger one its warps: the launches per second the
/// simulator was given follow `rate / max(warps, floor)`, whatever the
/// shape.
#[test]
fn a_kernel_is_charged_at_least_the_launch_floor() {
    let _serial = serial();
    let (rate_w, floor) = (25_600u64, 256u64);
    let c = Container::on(node(), |u| GpuLimits {
        launch_floor: floor,
        ..rate(u, rate_w, 2_560)
    });
    // (shape, warps per launch): one warp, 8 warps, then 512 warps.
    for (shape, warps) in [("1 32", 1u64), ("1 256", 8), ("64 256", 512)] {
        let p = c.spawn_ready(Link::Direct, &format!("dev 0 ready run tiny {shape} 2500"));
        std::thread::sleep(Duration::from_millis(300));
        let a = executed(&c, p.pid());
        std::thread::sleep(Duration::from_millis(1500));
        let b = executed(&c, p.pid());
        drop(p);
        let ms = b.last_ms.saturating_sub(a.last_ms).max(1) as f64;
        let per_s = (b.kernels - a.kernels) as f64 * 1000.0 / ms;
        assert_eq!(b.warps - a.warps, (b.kernels - a.kernels) * warps);
        let want = rate_w as f64 / warps.max(floor) as f64;
        assert!(
            (per_s - want).abs() <= want * 0.03,
            "kernels of {warps} warps: the simulator ran {per_s:.1} launches/s; \
             at {rate_w} warps/s and a floor of {floor}, want {want:.1}"
        );
    }
}
