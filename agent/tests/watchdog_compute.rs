//! Compute limits without the interposer's cooperation: the real daemon
//! (`tessera-agent run` on the simulator, the built-in policy: the
//! throttle on a compute overage) against three escapes from the launch
//! bucket, each in a hard container at SM target 20 with its processes in
//! a real cgroup, alone and beside an honest neighbour (hard, 50) on the
//! same GPU:
//! - a process that never loads `libtessera.so`;
//! - a process under `libtessera.so` that drives a private copy of the
//!   driver library, loaded by path (the simulated driver binds its own
//!   symbols as NVIDIA's does, so the interposer sees none of it: its
//!   usage region counts no launch while the simulator runs its kernels);
//! - a process under `libtessera.so` whose launch bucket is reset again
//!   and again (the preload computes each launch's start before a reset
//!   can move it, so this one gains little; the tampering is reported).
//!
//! Judged by the simulator's record (each process's share of the GPU in
//! each second, from its own timeline): from the second second on, the
//! escape's mean is within the margin of its cap and no 2 s hold more than
//! that and one burst (a slice and the queue it refilled), and the
//! neighbour gets what the GPU's round robin leaves it, all of a hard 50
//! (seconds
//! in which the simulated GPU itself stalled, at most three, are not
//! judged: see `stalled`). Also:
//! kernels a freeze cannot stop are killed, and a cgroup a stopped
//! throttle left frozen is thawed by the next agent. Needs root; prints
//! "skipped: <reason>" otherwise.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;
mod watchdog_support;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use daemon_support::{Agent, add_container, uuid};
use tessera_agent::watchdog::compute::MARGIN_PP;
use tessera_region::layout::{Bucket, usage_offsets};
use tessera_testkit::sim::Node;
use watchdog_support::{
    Pins, Tenant, TestCgroup, escape_probe, libtessera, node_spec, skip_reason, watchdog_toml,
    workload,
};

/// The escape's SM target.
const CAP: u32 = 20;
/// The neighbour's.
const NEIGHBOUR: u32 = 50;
/// Seconds each run is judged over.
const SECONDS: u32 = 10;
/// Most seconds left out of the judgement because the simulated GPU
/// stalled ([`stalled`]): one stall across a second's boundary and the
/// second after it.
const MAX_UNJUDGED: usize = 3;
/// The workload: 200 µs kernels, launched as fast as the bucket (if any)
/// lets, for the run.
const KERNEL: [&str; 3] = ["spin", "100", "1024"];

/// Who shares the GPU: the escape's container (its target and mode) and
/// the honest neighbour's target (hard).
#[derive(Clone, Copy, Debug)]
struct Sharing {
    target: u32,
    mode: &'static str,
    neighbour: u32,
    /// What the escape's container may take beside the neighbour (its
    /// target when hard; its allocation when elastic).
    share: u32,
}

const HARD: Sharing = Sharing {
    target: CAP,
    mode: "hard",
    neighbour: NEIGHBOUR,
    share: CAP,
};

/// One scenario at a time: each is judged by wall-clock shares.
static SERIAL: Mutex<()> = Mutex::new(());

#[derive(Clone, Copy, Debug, PartialEq)]
enum Escape {
    NoPreload,
    DriverCopy,
    BucketReset,
}

/// Each second's share of the GPU (whole percent, the simulator's record),
/// and the watchdog's actions on the escape's container at the end.
struct Shares {
    sharing: Sharing,
    escape: Vec<u32>,
    neighbour: Vec<u32>,
    actions: Vec<(String, String)>,
    /// From the escape's start to the throttle's first action (the view).
    throttled_after: Option<Duration>,
}

impl Shares {
    fn acted(&self, reason: &str, action: &str) -> bool {
        self.actions.iter().any(|(r, a)| r == reason && a == action)
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn share(node: &Node, since_us: u64, pid: u32) -> u32 {
    node.sim()
        .process_samples(0, since_us)
        .unwrap()
        .iter()
        .filter(|p| p.pid as u32 == pid)
        .map(|p| p.sm_percent)
        .sum()
}

/// Starts the escape's process in `cg` (container region `dir`).
fn start_escape(node: &Node, cg: &TestCgroup, dir: &Path, escape: Escape, work: &Path) -> Tenant {
    let ms = (SECONDS * 1000 + 500).to_string();
    let lib = libtessera();
    let preload: [(&str, &Path); 2] = [("LD_PRELOAD", &lib), ("TESSERA_REGION_DIR", dir)];
    let mut run = vec!["dev", "0", "ready", "wait", "run"];
    run.extend(KERNEL);
    run.push(&ms);
    match escape {
        Escape::NoPreload => Tenant::start(node, cg, &workload(), &run, &[]),
        Escape::BucketReset => Tenant::start(node, cg, &workload(), &run, &preload),
        Escape::DriverCopy => {
            let private = work.join("private");
            std::fs::create_dir_all(&private).unwrap();
            let copy = private.join("libcuda.so.1");
            std::fs::copy(tessera_testkit::sim::artifact("sim/libcuda.so.1"), &copy).unwrap();
            // Synchronising after every 1000 launches: a queue as deep as
            // the workload's.
            let mut args = vec![copy.to_str().unwrap(), "run"];
            args.extend(KERNEL);
            args.extend(["1000", &ms]);
            Tenant::start(node, cg, &escape_probe(), &args, &preload)
        }
    }
}

/// Resets the launch bucket of GPU 0 in usage region `usage` every
/// 200 µs until `stop`.
fn reset_bucket(usage: PathBuf, stop: &AtomicBool) {
    let f = std::fs::OpenOptions::new().write(true).open(usage).unwrap();
    let tat = (usage_offsets::BUCKETS + std::mem::offset_of!(Bucket, tat_ns)) as u64;
    while !stop.load(Ordering::Relaxed) {
        f.write_at(&0u64.to_le_bytes(), tat).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn scenario(name: &str, escape: Escape, with_neighbour: bool) -> Option<Shares> {
    scenario_sharing(name, escape, with_neighbour, HARD)
}

fn scenario_sharing(
    name: &str,
    escape: Escape,
    with_neighbour: bool,
    sharing: Sharing,
) -> Option<Shares> {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return None;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = node_spec().build();
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("containers");
    let gpu = uuid(&node, 0);
    let cg = TestCgroup::new(name);
    let cgroup = cg.dir.to_str().unwrap().to_owned();
    let dir = add_container(
        &root,
        name,
        &gpu,
        1000,
        sharing.target,
        &["--cgroup", &cgroup, "--mode", sharing.mode],
    );
    let honest_cg = TestCgroup::new(&format!("{name}-n"));
    let honest_cgroup = honest_cg.dir.to_str().unwrap().to_owned();
    let honest_dir = add_container(
        &root,
        &format!("{name}-n"),
        &gpu,
        1000,
        sharing.neighbour,
        &["--cgroup", &honest_cgroup],
    );
    let pins = Pins::new(name);
    let config = node.dir.path().join("agent.toml");
    std::fs::write(&config, watchdog_toml("off", &pins.0)).unwrap();
    let agent = Agent::start(&node, &root, &["--config", config.to_str().unwrap()]);
    agent.wait_ready();

    let ms = (SECONDS * 1000 + 500).to_string();
    let lib = libtessera();
    let mut honest = with_neighbour.then(|| {
        let mut run = vec!["dev", "0", "ready", "wait", "run"];
        run.extend(KERNEL);
        run.push(&ms);
        Tenant::start(
            &node,
            &honest_cg,
            &workload(),
            &run,
            &[("LD_PRELOAD", &lib), ("TESSERA_REGION_DIR", &honest_dir)],
        )
    });
    let mut t = start_escape(&node, &cg, &dir, escape, work.path());
    let stop = AtomicBool::new(false);
    let shares = std::thread::scope(|s| {
        if escape == Escape::BucketReset {
            let usage = dir.join("usage");
            let stop = &stop;
            s.spawn(move || reset_bucket(usage, stop));
        }
        if let Some(h) = honest.as_mut() {
            h.go();
        }
        t.go();
        let start = Instant::now();
        let stop = &stop;
        let agent = &agent;
        let throttled = s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let v = agent.view();
                let acted = Agent::container(&v, name).is_some_and(|c| {
                    c["enforcement"]["actions"].as_array().is_some_and(|a| {
                        a.iter()
                            .any(|a| a["reason"] == "compute_overage" && a["action"] == "throttle")
                    })
                });
                if acted {
                    return Some(start.elapsed());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        });
        let mut shares = Shares {
            sharing,
            escape: Vec::new(),
            neighbour: Vec::new(),
            actions: Vec::new(),
            throttled_after: None,
        };
        for second in 1..=SECONDS {
            let from = now_us();
            std::thread::sleep(
                (start + Duration::from_secs(second.into()))
                    .saturating_duration_since(Instant::now()),
            );
            shares.escape.push(share(&node, from, t.pid()));
            if let Some(h) = &honest {
                shares.neighbour.push(share(&node, from, h.pid()));
            }
        }
        stop.store(true, Ordering::Relaxed);
        shares.throttled_after = throttled.join().unwrap();
        shares
    });
    println!(
        "{name} ({escape:?}, neighbour {with_neighbour}): escape {:?} %, neighbour {:?} % by second; throttled {:?} after its start",
        shares.escape, shares.neighbour, shares.throttled_after
    );
    if std::env::var_os("TESSERA_TEST_LOG").is_some() {
        for l in agent.log() {
            println!("agent: {l}");
        }
    }
    let v = agent.view();
    let c = Agent::container(&v, name).unwrap();
    let mut shares = shares;
    shares.actions = watchdog_support::actions_of(c);
    assert!(t.alive(), "throttled, not killed: {c:#}");
    assert!(!shares.acted("compute_overage", "kill"), "{c:#}");
    if escape == Escape::DriverCopy {
        // The interposer saw none of its launches; the simulator ran them.
        assert_eq!(c["gpus"][0]["launches"], 0, "{c:#}");
        let ran: u64 = node
            .sim()
            .launches(0)
            .unwrap()
            .iter()
            .filter(|l| l.pid as u32 == t.pid())
            .map(|l| l.kernels)
            .sum();
        assert!(ran > 1000, "{ran} kernels");
    }
    if shares.acted("compute_overage", "throttle") {
        agent.wait_log("the throttle, naming the container", |l| {
            l.contains("watchdog acted") && l.contains("compute_overage") && l.contains(name)
        });
    }
    if let Some(h) = honest.as_mut() {
        let n = Agent::container(&v, &format!("{name}-n")).unwrap();
        assert_eq!(n["enforcement"]["actions"], serde_json::json!([]), "{n:#}");
        assert!(h.alive());
    }
    Some(shares)
}

/// What the honest neighbour keeps in a second in which the escape took
/// `escape` % (the simulator's round robin): while the escape's queue
/// runs, the two alternate slices, so the neighbour gets as much GPU time
/// as the escape then; for the rest of the second, its target's share of
/// it. A hard neighbour cannot make up later what it lost (its cap holds
/// it then too), so above half the GPU it keeps
/// `target - escape * (2 * target / 100 - 1)`: all of it at 50 or less,
/// 70 - 0.4 * 30 = 58 beside an escape held to an allocation of 30.
fn neighbour_keeps(target: u32, escape: f64) -> f64 {
    let t = f64::from(target);
    t - escape * (2.0 * t / 100.0 - 1.0).max(0.0)
}

/// Seconds the simulated GPU stalled, and the one after each: the
/// neighbour (hard, wanting more than its share) got 10 less than it
/// keeps beside the escape ([`neighbour_keeps`]) while the GPU had room
/// (the two together under 90 %). Its
/// kernels were not run, not outrun: the host starved the simulator's
/// processes of CPU (a loaded machine), or the neighbour's driver call
/// waited for an escape frozen inside the simulated driver's lock (see
/// `gpusim::Patience`). A real GPU runs queued work whatever the host's
/// load. In the second after, both catch up (the neighbour's bucket and
/// the escape's credit both allow it), so it is left out too.
fn stalled(s: &Shares) -> Vec<bool> {
    let n = s.escape.len();
    let stall: Vec<bool> = (0..n)
        .map(|k| {
            s.neighbour.get(k).is_some_and(|&x| {
                let keeps = neighbour_keeps(s.sharing.neighbour, f64::from(s.escape[k]));
                f64::from(x) + 10.0 < keeps && s.escape[k] + x < 90
            })
        })
        .collect();
    // (The first second holds the start and the agent's first action.)
    (0..n)
        .map(|k| k > 0 && (stall[k] || (k > 1 && stall[k - 1])))
        .collect()
}

/// What one burst of a throttled escape adds to a 2 s mean (pp): a freeze
/// cannot stop the work a slice queued, here up to 1000 launches of
/// 200 µs kernels (the workload's queue depth: 200 ms of GPU time) after
/// a slice of up to 50 ms; its debt is paid later, by longer freezes.
const BURST_PP: f64 = 12.5;

/// The judgement: from the second second on, the escape's mean from then
/// is within the margin of its cap (for an elastic escape: at most its
/// allocation and the margin, at least its target less the margin), and no 2 s hold more than its cap
/// plus the margin and one burst ([`BURST_PP`]); the neighbour gets what
/// it keeps beside the escape ([`neighbour_keeps`]). Seconds the simulated GPU stalled ([`stalled`]) are not
/// judged, at most [`MAX_UNJUDGED`].
fn judge(s: &Shares) {
    let cap = f64::from(s.sharing.share);
    let neighbour = s.sharing.neighbour;
    let out = stalled(s);
    let skipped: Vec<usize> = (1..out.len()).filter(|&k| out[k]).map(|k| k + 1).collect();
    if !skipped.is_empty() {
        println!("seconds {skipped:?} not judged: the simulated GPU stalled");
    }
    assert!(
        skipped.len() <= MAX_UNJUDGED,
        "the simulated GPU stalled in seconds {skipped:?} (escape {:?}, neighbour {:?}): too few seconds left to judge; is the machine loaded?",
        s.escape,
        s.neighbour
    );
    let judged: Vec<usize> = (1..s.escape.len()).filter(|&k| !out[k]).collect();
    for k in judged.iter().copied().filter(|k| judged.contains(&(k + 1))) {
        let two = f64::from(s.escape[k] + s.escape[k + 1]) / 2.0;
        assert!(
            two <= cap + MARGIN_PP + BURST_PP,
            "seconds {} and {}: escape {two} % over {cap} + {MARGIN_PP} + a burst of {BURST_PP}: {:?}",
            k + 1,
            k + 2,
            s.escape
        );
    }
    let mean_of =
        |xs: &[u32]| judged.iter().map(|&k| f64::from(xs[k])).sum::<f64>() / judged.len() as f64;
    // Not above what it may take, nor held below what it is guaranteed
    // (its target: an elastic container's allocation above it is lent).
    let mean = mean_of(&s.escape);
    let target = f64::from(s.sharing.target);
    assert!(
        mean <= cap + MARGIN_PP && mean >= target - MARGIN_PP,
        "mean {mean} outside {target} - {MARGIN_PP} to {cap} + {MARGIN_PP}: {:?}",
        s.escape
    );
    // The neighbour: what it keeps beside the escape
    // ([`neighbour_keeps`]) in every judged second from the second on,
    // and within 2 pp of it on average.
    if !s.neighbour.is_empty() {
        let mean = mean_of(&s.neighbour);
        let keeps = neighbour_keeps(neighbour, mean_of(&s.escape));
        assert!(
            mean + 2.0 >= keeps,
            "neighbour's mean {mean} < {keeps} (of {neighbour}): {:?} beside {:?}",
            s.neighbour,
            s.escape
        );
        for &k in &judged {
            let x = f64::from(s.neighbour[k]);
            let keeps = neighbour_keeps(neighbour, f64::from(s.escape[k]));
            assert!(
                x + 10.0 >= keeps,
                "second {}: neighbour {x} % < {keeps} (of {neighbour}): {:?} beside {:?}",
                k + 1,
                s.neighbour,
                s.escape
            );
        }
    }
}

#[test]
fn a_process_without_the_preload_is_held_to_its_cap() {
    for neighbour in [false, true] {
        if let Some(s) = scenario("nopre", Escape::NoPreload, neighbour) {
            assert!(s.acted("compute_overage", "throttle"), "{:?}", s.actions);
            assert!(s.acted("bypass", "alert"), "{:?}", s.actions);
            judge(&s);
        }
    }
}

#[test]
fn a_private_copy_of_the_driver_is_unseen_by_the_interposer_and_held_to_its_cap() {
    for neighbour in [false, true] {
        if let Some(s) = scenario("copy", Escape::DriverCopy, neighbour) {
            // Before the agent acted, the copy ran unpaced.
            assert!(
                f64::from(s.escape[0]) > f64::from(CAP) + MARGIN_PP,
                "{:?}",
                s.escape
            );
            assert!(s.acted("compute_overage", "throttle"), "{:?}", s.actions);
            judge(&s);
        }
    }
}

/// An elastic container is held to its allocation: at target 20 beside a
/// hard 70, the split gives it 20 and lends it the 10 nobody claims. On
/// a GPU committed to the full, the throttled escape's bursts (a slice
/// and the queue it refilled) cost the hard neighbour what it cannot make
/// up later ([`neighbour_keeps`]: 58 of its 70 beside an escape at its
/// 30, where it would get about 50 unthrottled; `kill` leaves it all of
/// it). Judged as the hard escapes are, against the allocation.
#[test]
fn an_elastic_escape_is_held_to_its_allocation() {
    let sharing = Sharing {
        target: CAP,
        mode: "elastic",
        neighbour: 70,
        share: 30,
    };
    if let Some(s) = scenario_sharing("elastic", Escape::NoPreload, true, sharing) {
        assert!(s.acted("compute_overage", "throttle"), "{:?}", s.actions);
        judge(&s);
    }
}

#[test]
fn a_reset_launch_bucket_is_held_to_its_cap() {
    for neighbour in [false, true] {
        if let Some(s) = scenario("reset", Escape::BucketReset, neighbour) {
            // Seen (the bucket's time went back without a new control
            // epoch); held by the preload, which computes each launch's
            // start before a reset can move it, and, past the margin, by
            // the throttle.
            assert!(s.acted("tampering", "alert"), "{:?}", s.actions);
            judge(&s);
        }
    }
}

/// The throttle's freeze is the kernel's state, marked as the throttle's:
/// an agent that finds a cgroup frozen with the mark (its predecessor
/// stopped mid-throttle) thaws it and removes the mark; one frozen
/// without it (the freeze action's) stays frozen.
#[test]
fn a_cgroup_left_frozen_by_a_stopped_throttle_is_thawed_by_the_next_agent() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = node_spec().build();
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("containers");
    let gpu = uuid(&node, 0);
    let left = TestCgroup::new("left");
    let held = TestCgroup::new("held");
    for (cg, id) in [(&left, "left"), (&held, "held")] {
        let cgroup = cg.dir.to_str().unwrap().to_owned();
        add_container(&root, id, &gpu, 1000, CAP, &["--cgroup", &cgroup]);
        // (Killed with its cgroup when the test ends.)
        std::mem::forget(Tenant::start(
            &node,
            cg,
            &workload(),
            &["ready", "hold"],
            &[],
        ));
        std::fs::write(cg.dir.join("cgroup.freeze"), "1").unwrap();
    }
    rustix::fs::setxattr(
        &left.dir,
        tessera_agent::watchdog::throttle::MARK,
        b"1",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    assert!(
        watchdog_support::wait_for(Duration::from_secs(5), || (left.frozen() && held.frozen())
            .then_some(()))
        .is_some()
    );
    let pins = Pins::new("left");
    let config = node.dir.path().join("agent.toml");
    std::fs::write(&config, watchdog_toml("off", &pins.0)).unwrap();
    let agent = Agent::start(&node, &root, &["--config", config.to_str().unwrap()]);
    agent.wait_ready();
    let thawed =
        watchdog_support::wait_for(Duration::from_secs(5), || (!left.frozen()).then_some(()));
    assert!(thawed.is_some(), "still frozen: {:#?}", agent.log());
    assert!(!tessera_agent::watchdog::throttle::marked(&left.dir));
    agent.wait_log("the thaw, naming the container", |l| {
        l.contains("a stopped throttle left frozen") && l.contains("left")
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(held.frozen(), "the freeze action's freeze was undone");
}

/// GPU work a freeze cannot stop (kernels of 3 s, queued before the
/// throttle began): the throttle gives up after five periods frozen
/// throughout with the share still over, and kills; judged by the kernel
/// (the process's SIGKILL) and the simulator (its share until then).
#[test]
fn kernels_the_freezes_cannot_stop_are_killed() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = node_spec().fixed_kernel("long", 3_000_000_000).build();
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("containers");
    let cg = TestCgroup::new("long");
    let cgroup = cg.dir.to_str().unwrap().to_owned();
    add_container(
        &root,
        "long",
        &uuid(&node, 0),
        1000,
        CAP,
        &["--cgroup", &cgroup],
    );
    let pins = Pins::new("long");
    let config = node.dir.path().join("agent.toml");
    std::fs::write(&config, watchdog_toml("off", &pins.0)).unwrap();
    let agent = Agent::start(&node, &root, &["--config", config.to_str().unwrap()]);
    agent.wait_ready();
    let mut t = Tenant::start(
        &node,
        &cg,
        &workload(),
        &[
            "dev", "0", "ready", "wait", "launch", "long", "1", "32", "4", "sync", "hold",
        ],
        &[],
    );
    t.go();
    let start = Instant::now();
    let (status, at) = t
        .exit_within(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("still running 10 s on: {:#?}", agent.log()));
    let took = at.duration_since(start);
    println!(
        "kernels a freeze cannot stop: killed {} ms after they started",
        took.as_millis()
    );
    assert!(watchdog_support::killed(status), "{status:?}");
    assert!(took < Duration::from_secs(3), "{} ms", took.as_millis());
    let v = agent.wait_view("the kill in the view", |v| {
        Agent::container(v, "long").is_some_and(|c| {
            c["enforcement"]["actions"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|a| a["reason"] == "compute_overage" && a["action"] == "kill")
            })
        })
    });
    let c = Agent::container(&v, "long").unwrap();
    let last = c["enforcement"]["last_event"].as_str().unwrap();
    assert!(last.contains("outran the throttle"), "{last}");
}
