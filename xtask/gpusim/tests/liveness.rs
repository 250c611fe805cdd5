//! Channel owners that die are reaped by the next query, whether the
//! querying process has a pidfd of theirs cached or not: killed and
//! waited for, killed and left a zombie, and killed with their pid handed
//! to a new process (pid reuse). Judged by the simulator's answers
//! (`processes`, `memory_info`), which the kernel's own view of the
//! children (their exit, `/proc`) makes true or false.
//!
//! The channel owners are this test binary run again as a child
//! (`GPUSIM_LIVENESS_CHILD=hold`): it attaches to GPU 0 through the
//! simulator library, allocates, says `ready` and sleeps.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpusim::Sim;
use tessera_testkit::sim::Node;

const MIB: u64 = 1 << 20;
/// What a holder allocates beyond its context.
const HELD_MIB: u64 = 64;
/// The small test node's context overhead.
const CONTEXT_MIB: u64 = 300;
const CHILD_ENV: &str = "GPUSIM_LIVENESS_CHILD";

/// In a child run: attach, allocate, say `ready`, sleep until killed.
fn child_side() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let sim = Sim::from_env().unwrap();
    let a = sim.attach(0).unwrap();
    sim.alloc(&a, HELD_MIB * MIB).unwrap();
    // On a line of its own: libtest has just printed `test NAME ... `.
    println!("\nready {}", std::process::id());
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A process holding a channel on GPU 0 of `node`; killed when dropped.
struct Holder(Child);

impl Holder {
    fn spawn(node: &Node, test: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "hold")
            .env("GPUSIM_NODE", &node.node)
            .env("GPUSIM_STATE", &node.state)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let me = format!("ready {}", child.id());
        let holder = Self(child);
        for line in out.lines() {
            if line.unwrap() == me {
                return holder;
            }
        }
        panic!("the holder ended before it was ready");
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// SIGKILL, not waited for.
    fn kill(&mut self) {
        self.0.kill().unwrap();
    }

    /// SIGKILL and wait: its pid is free again.
    fn kill_and_wait(mut self) {
        self.kill();
        self.0.wait().unwrap();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pids(sim: &Sim) -> Vec<i32> {
    let mut v: Vec<i32> = sim.processes(0).unwrap().iter().map(|p| p.pid).collect();
    v.sort_unstable();
    v
}

fn used_mib(sim: &Sim) -> u64 {
    sim.memory_info(0).unwrap().used / MIB
}

/// Waits until `pid` is a zombie whose every thread has exited (what its
/// parent could now wait for), per `/proc`.
fn wait_zombie(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let state = stat[stat.rfind(')').unwrap() + 2..].chars().next();
        let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count();
        if state == Some('Z') && threads == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "{pid} did not become a zombie");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_killed_owner_is_reaped_with_or_without_a_cached_pidfd() {
    child_side();
    let test = "a_killed_owner_is_reaped_with_or_without_a_cached_pidfd";
    let node = Node::small();
    let sim = node.sim();
    let cached = Holder::spawn(&node, test);
    assert_eq!(pids(&sim), [cached.pid()]);
    assert_eq!(sim.cached_pidfds(), 1, "the owner's pidfd is cached");
    // Asked about only after its death.
    let fresh = Holder::spawn(&node, test);
    let (a, b) = (cached.pid(), fresh.pid());
    cached.kill_and_wait();
    fresh.kill_and_wait();
    assert_eq!(pids(&sim), Vec::<i32>::new(), "{a} and {b} were killed");
    assert_eq!(used_mib(&sim), 0);
    assert_eq!(sim.cached_pidfds(), 0, "the dead owner's pidfd was closed");
}

#[test]
fn a_zombie_owner_is_reaped_with_or_without_a_cached_pidfd() {
    child_side();
    let test = "a_zombie_owner_is_reaped_with_or_without_a_cached_pidfd";
    let node = Node::small();
    let sim = node.sim();
    let mut cached = Holder::spawn(&node, test);
    assert_eq!(pids(&sim), [cached.pid()]);
    assert_eq!(used_mib(&sim), CONTEXT_MIB + HELD_MIB);
    assert_eq!(sim.cached_pidfds(), 1);
    // Asked about only once it is a zombie already.
    let mut fresh = Holder::spawn(&node, test);
    cached.kill();
    fresh.kill();
    wait_zombie(cached.pid());
    wait_zombie(fresh.pid());
    assert_eq!(pids(&sim), Vec::<i32>::new(), "zombies hold no memory");
    assert_eq!(used_mib(&sim), 0);
    assert_eq!(sim.cached_pidfds(), 0);
}

/// Where the kernel's next pid is set (this pid namespace).
const NS_LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";

/// Why the pid of a dead process cannot be handed to a new one here.
fn reuse_skip_reason() -> Option<String> {
    let last = match std::fs::read_to_string(NS_LAST_PID) {
        Ok(t) => t,
        Err(e) => return Some(format!("cannot read {NS_LAST_PID}: {e}")),
    };
    // Writing back what it says changes nothing but proves the right.
    std::fs::write(NS_LAST_PID, last.trim())
        .err()
        .map(|e| format!("cannot write {NS_LAST_PID} (needs root): {e}"))
}

/// Start time of `pid` (clock ticks after boot, `/proc/<pid>/stat` field 22).
fn start_time(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    fields[19].parse().unwrap()
}

/// A new process (`sleep`, not using the simulator) with pid `pid`, which
/// must be free, started at another clock tick than `old_start`: within
/// one tick a reused pid cannot be told apart from the original (by
/// `/proc` or by this simulator).
fn process_with_pid(pid: i32, old_start: u64) -> Child {
    std::thread::sleep(Duration::from_millis(50));
    // Other processes on the machine fork too: try until one gets it.
    for _ in 0..500 {
        std::fs::write(NS_LAST_PID, (pid - 1).to_string()).unwrap();
        let mut child = Command::new("sleep").arg("60").spawn().unwrap();
        if child.id() as i32 == pid {
            assert_ne!(start_time(pid), old_start, "started in the same tick");
            return child;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not hand pid {pid} to a new process");
}

#[test]
fn an_owner_whose_pid_was_reused_is_reaped() {
    child_side();
    let test = "an_owner_whose_pid_was_reused_is_reaped";
    if let Some(why) = reuse_skip_reason() {
        println!("skipped: {why}");
        return;
    }
    let node = Node::small();
    let sim = node.sim();
    // Cached: the pidfd refers to the first owner, dead before the reuse.
    let first = Holder::spawn(&node, test);
    let pid = first.pid();
    let old_start = start_time(pid);
    assert_eq!(pids(&sim), [pid]);
    assert_eq!(sim.cached_pidfds(), 1);
    first.kill_and_wait();
    let mut other = process_with_pid(pid, old_start);
    assert_eq!(
        pids(&sim),
        Vec::<i32>::new(),
        "pid {pid} is another process"
    );
    assert_eq!(used_mib(&sim), 0);
    let _ = other.kill();
    let _ = other.wait();
    // Not cached: the first question opens a pidfd of the new process.
    let second = Holder::spawn(&node, test);
    let pid = second.pid();
    let old_start = start_time(pid);
    second.kill_and_wait();
    let mut other = process_with_pid(pid, old_start);
    assert_eq!(
        pids(&sim),
        Vec::<i32>::new(),
        "pid {pid} is another process"
    );
    assert_eq!(used_mib(&sim), 0);
    assert_eq!(
        sim.cached_pidfds(),
        0,
        "no pidfd of the new process is kept"
    );
    let _ = other.kill();
    let _ = other.wait();
}
