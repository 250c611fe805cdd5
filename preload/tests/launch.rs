//! Launch-rate limits under `libtessera.so` on the simulated node.

mod common;

use std::time::{Duration, Instant};

use common::{Container, Link, Node, field};
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
    Node::new(&format!(
        "{}\n[cost.functions.tiny]\nfixed_ns = 1000\n",
        common::sim::SMALL_NODE
    ))
}

fn rate(uuid: [u8; 16], warps_per_s: u64, burst: u64) -> GpuLimits {
    GpuLimits {
        launch_rate: warps_per_s,
        launch_burst: burst,
        ..GpuLimits::unlimited(uuid)
    }
}

/// Launches admitted so far on GPU 0 (from the usage region).
fn launches(c: &Container) -> u64 {
    c.usage().buckets[0].launches
}

/// Launches per second over `window`.
fn measure(c: &Container, window: Duration) -> f64 {
    let (n0, t0) = (launches(c), Instant::now());
    std::thread::sleep(window);
    let (n1, t1) = (launches(c), Instant::now());
    (n1 - n0) as f64 / (t1 - t0).as_secs_f64()
}

#[test]
fn a_fixed_rate_yields_that_launch_rate_within_two_percent() {
    let _serial = serial();
    let c = Container::on(node(), |u| rate(u, 20_000, 200));
    for link in [Link::Direct, Link::Dlopen] {
        let p = c.spawn_ready(link, "dev 0 ready run tiny 1 32 2500");
        std::thread::sleep(Duration::from_millis(300));
        let r = measure(&c, Duration::from_secs(1));
        drop(p);
        assert!(
            (r - 20_000.0).abs() <= 400.0,
            "{link:?}: {r:.0} launches/s for a rate of 20000 warps/s of 1-warp launches"
        );
    }
}

#[test]
fn a_launch_costs_its_warps_and_a_graph_its_kernels() {
    let _serial = serial();
    // 8 blocks of 64 threads = 16 warps each: 10000 warps/s = 625 launches/s.
    let c = Container::on(node(), |u| rate(u, 10_000, 100));
    let p = c.spawn_ready(Link::Direct, "dev 0 ready run tiny 8 64 2000");
    std::thread::sleep(Duration::from_millis(300));
    let r = measure(&c, Duration::from_secs(1));
    drop(p);
    assert!((r - 625.0).abs() <= 15.0, "{r:.0} launches/s");

    // A graph of 10 one-warp kernels costs 10 warps per launch.
    let c = Container::on(node(), |u| rate(u, 10_000, 100));
    let t = Instant::now();
    let out = c.run(Link::Dlopen, "dev 0 graph tiny 1 32 10 1000");
    let elapsed = t.elapsed();
    assert_eq!(field(&out, "graph"), ["1000"]);
    let warps = c.usage().buckets[0].warps;
    // 10 warps captured into the graph, then 1000 launches of 10.
    assert_eq!(warps, 10 + 10_000);
    assert!(
        elapsed >= Duration::from_millis(980),
        "10000 warps at 10000/s (burst 100) took {elapsed:?}"
    );
}

#[test]
fn a_new_rate_takes_effect_within_a_control_period() {
    let _serial = serial();
    let c = Container::on(node(), |u| rate(u, 1_000, 10));
    let p = c.spawn_ready(Link::Direct, "dev 0 ready run tiny 1 32 4000");
    std::thread::sleep(Duration::from_millis(200));
    let slow = measure(&c, Duration::from_millis(800));
    c.set(rate(c.uuid, 20_000, 200));
    let changed = Instant::now();
    // Within one control period (10 ms) launches speed up.
    let before = launches(&c);
    std::thread::sleep(Duration::from_millis(20));
    let early = launches(&c) - before;
    let fast = measure(&c, Duration::from_secs(1));
    drop(p);
    assert!((slow - 1_000.0).abs() <= 30.0, "{slow:.0}/s at 1000");
    assert!(
        early >= 200,
        "{early} launches in the first 20 ms after {:?}",
        changed.elapsed()
    );
    assert!((fast - 20_000.0).abs() <= 600.0, "{fast:.0}/s at 20000");
}

#[test]
fn a_zero_rate_pauses_launches_and_unlimited_does_not_throttle() {
    let _serial = serial();
    let c = Container::on(node(), |u| rate(u, 0, 0));
    let mut p = c.spawn_ready(Link::Direct, "dev 0 ready launch tiny 1 32 5 ready");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(launches(&c), 0, "paused");
    assert!(p.child.try_wait().unwrap().is_none(), "still waiting");
    c.set(rate(c.uuid, UNLIMITED, 0));
    assert_eq!(p.next_line().as_deref(), Some("launch 5"));
    assert_eq!(launches(&c), 5);

    // Unlimited: the simulator's own speed is the only bound.
    let p = c.spawn_ready(Link::Direct, "dev 0 ready run tiny 1 32 1500");
    std::thread::sleep(Duration::from_millis(200));
    let r = measure(&c, Duration::from_millis(800));
    drop(p);
    assert!(r > 25_000.0, "{r:.0} launches/s unlimited");
}

#[test]
fn a_launch_waiting_through_a_rate_change_is_charged_once() {
    let _serial = serial();
    // 10 warps/s, no burst: the second and third launches wait 100 ms
    // each; the agent changes the rate twice while they wait.
    let c = Container::on(node(), |u| rate(u, 10, 0));
    let mut p = c.spawn_ready(Link::Direct, "dev 0 ready launch tiny 1 32 3 ready");
    std::thread::sleep(Duration::from_millis(50));
    c.set(rate(c.uuid, 12, 0));
    std::thread::sleep(Duration::from_millis(50));
    c.set(rate(c.uuid, 15, 0));
    assert_eq!(p.next_line().as_deref(), Some("launch 3"));
    let bucket = &c.usage().buckets[0];
    assert_eq!((bucket.launches, bucket.warps), (3, 3));
}
