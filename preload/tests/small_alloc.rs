//! Linear allocations of every size under a memory limit: the container
//! can allocate up to its limit (within one page per GPU) whatever the
//! size, because it is charged the device pages the driver really holds
//! (small allocations share 2 MiB pages), and the device memory it really
//! holds — the simulator's record, what NVML reports — never exceeds the
//! limit, whatever sizes and frees a tenant chooses.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use common::sim::NodeSpec;
use common::{Container, Link, MIB, field, memory_limit};
use tessera_region::control::GpuLimits;

const PAGE: u64 = 2 * MIB;
/// The small node's (and the containers') context overhead.
const CONTEXT: u64 = 300 * MIB;

/// What the simulator charges `pid` on GPU 0.
fn held_by(c: &Container, pid: i32) -> u64 {
    c.node
        .sim()
        .processes(0)
        .unwrap()
        .iter()
        .filter(|x| x.pid == pid)
        .map(|x| x.bytes)
        .sum()
}

/// Samples the simulator's total on GPU 0 until stopped; returns the peak.
struct Judge {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(u64, u64)>,
}

impl Judge {
    fn start(c: &Container) -> Self {
        let sim = c.node.sim();
        let stop = Arc::new(AtomicBool::new(false));
        let peak = AtomicU64::new(0);
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = 0;
            while !s.load(Ordering::Relaxed) {
                let total: u64 = sim.processes(0).unwrap().iter().map(|p| p.bytes).sum();
                peak.fetch_max(total, Ordering::Relaxed);
                samples += 1;
            }
            (peak.load(Ordering::Relaxed), samples)
        });
        Self { stop, thread }
    }

    /// The peak total the simulator held while it watched.
    fn peak(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let (peak, samples) = self.thread.join().unwrap();
        assert!(samples > 0, "the judge never looked");
        peak
    }
}

/// Allocations of `size` bytes the driver fits in `pages` pages: small
/// ones (≤ 1 MiB) packed in 512-byte units, larger ones in whole pages.
fn fits(size: u64, pages: u64) -> u64 {
    if size <= PAGE / 2 {
        pages * (PAGE / size.div_ceil(512) / 512)
    } else {
        pages / size.div_ceil(PAGE)
    }
}

/// Allocations of `size` in one page (1 for a large size).
fn per_page(size: u64) -> u64 {
    fits(size, 1).max(1)
}

#[test]
fn every_size_allocates_up_to_the_limit_and_holds_no_more() {
    // 64 MiB after the context: 32 pages.
    let limit = CONTEXT + 64 * MIB;
    let c = Container::new(|u| memory_limit(u, limit / MIB));
    for size in [
        512,
        1000,
        4096,
        777_777,
        MIB,
        MIB + 1,
        3 * MIB / 2,
        2 * MIB,
        3 * MIB + 5,
        7 * MIB,
        64 * MIB,
    ] {
        let judge = Judge::start(&c);
        let p = c.spawn_ready(Link::Direct, &format!("dev 0 sweep {size} ready hold"));
        let held = held_by(&c, p.pid());
        let peak = judge.peak();
        let swept = p.seen.iter().find(|l| l.starts_with("swept")).unwrap();
        let n: u64 = swept.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(
            swept.ends_with("CUDA_ERROR_OUT_OF_MEMORY"),
            "{size}: {swept}"
        );
        // The driver holds no more than the limit, at any moment.
        assert!(held <= limit, "{size} B: holds {held} > {limit}");
        assert!(peak <= limit, "{size} B: peaked at {peak} > {limit}");
        // It was refused only within a page of the limit: as many
        // allocations as the driver fits in the limit, less one page's.
        assert!(held + PAGE >= limit, "{size} B: refused at {held}");
        let want = fits(size, 32);
        assert!(
            n + per_page(size) >= want && n <= want,
            "{size} B: {n} allocations, the limit holds {want}"
        );
        p.kill();
    }
}

#[test]
fn frees_return_the_pages_and_the_room() {
    let limit = CONTEXT + 16 * MIB;
    let c = Container::new(|u| memory_limit(u, limit / MIB));
    // Fill with 4 KiB pieces, free all, fill with 1 MiB pieces: the same
    // 8 pages serve both, and afterwards only the context is held.
    let p = c.spawn_ready(
        Link::Direct,
        "dev 0 sweep 4096 sweep-free sweep 1048576 sweep-free ready hold",
    );
    assert_eq!(
        field(&p.seen.join("\n"), "swept"),
        ["4096", "CUDA_ERROR_OUT_OF_MEMORY"]
    );
    let second = p
        .seen
        .iter()
        .filter(|l| l.starts_with("swept"))
        .nth(1)
        .unwrap();
    assert_eq!(second, "swept 16 CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(held_by(&c, p.pid()), CONTEXT, "every page is back");
    assert_eq!(c.usage().used[0], CONTEXT, "and so is the room");
    p.kill();
}

#[test]
fn a_fragmenting_tenant_pays_for_every_page_it_keeps() {
    // 8 pages of 512-byte pieces; keeping one piece in 4096 (one per page)
    // keeps every page, so nothing large fits; the holes still take small
    // pieces (the driver fills them first), never a new page.
    let limit = CONTEXT + 16 * MIB;
    let c = Container::new(|u| memory_limit(u, limit / MIB));
    let judge = Judge::start(&c);
    let p = c.spawn_ready(
        Link::Direct,
        "dev 0 sweep 512 sweep-thin 4096 sweep 1572864 sweep 1048576 sweep 512 ready hold",
    );
    let peak = judge.peak();
    let swept: Vec<&String> = p.seen.iter().filter(|l| l.starts_with("swept")).collect();
    assert_eq!(swept[0], "swept 32768 CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(
        field(&p.seen.join("\n"), "thinned"),
        ["32760", "8"],
        "one piece left per page"
    );
    assert_eq!(
        swept[1], "swept 0 CUDA_ERROR_OUT_OF_MEMORY",
        "no page is free"
    );
    // A 1 MiB piece fits the second half of each page.
    assert_eq!(swept[2], "swept 8 CUDA_ERROR_OUT_OF_MEMORY");
    // The rest of the first halves: 2047 per page.
    assert_eq!(
        swept[3],
        &format!("swept {} CUDA_ERROR_OUT_OF_MEMORY", 8 * 2047)
    );
    assert_eq!(held_by(&c, p.pid()), limit);
    assert!(peak <= limit, "peaked at {peak} > {limit}");
    p.kill();
}

#[test]
fn interleaved_sizes_and_frees_stay_within_the_limit() {
    let limit = CONTEXT + 64 * MIB;
    let c = Container::new(|u| memory_limit(u, limit / MIB));
    let judge = Judge::start(&c);
    let mut ops = String::from("dev 0");
    for round in 0..6 {
        ops += &format!(
            " sweep-n 300 1000 sweep-n 2 1572864 sweep-n 40 65536 sweep-n 1 7340032 sweep-n 3 777777 sweep-thin {}",
            2 + round
        );
    }
    ops += " sweep 3145733 sweep 777777 sweep 512 ready hold";
    let p = c.spawn_ready(Link::Direct, &ops);
    let held = held_by(&c, p.pid());
    let peak = judge.peak();
    assert!(peak <= limit, "peaked at {peak} > {limit}");
    assert!(
        held <= limit && held + PAGE >= limit,
        "filled to {held} of {limit}"
    );
    // The preload charges exactly what the driver holds.
    assert_eq!(c.usage().used[0], held);
    p.kill();
}

#[test]
fn each_process_pays_for_its_own_pages() {
    // Contexts cost nothing here, so four processes share 32 MiB of pages.
    let limit = 32 * MIB;
    let node = NodeSpec::small().context_overhead_mib(0).build();
    let c = Container::on(node, |u| GpuLimits {
        context_overhead: 0,
        ..memory_limit(u, limit / MIB)
    });
    let judge = Judge::start(&c);
    // Three sweep at once (each prints `ready` first, then sweeps).
    let mut ps: Vec<_> = [4096, 1000, 777_777]
        .iter()
        .map(|size| c.spawn_ready(Link::Direct, &format!("dev 0 ready sweep {size} hold")))
        .collect();
    for p in &mut ps {
        let line = p.next_line().unwrap();
        assert!(line.starts_with("swept"), "{line}");
    }
    // A late one takes what is left.
    let last = c.spawn_ready(Link::Direct, "dev 0 sweep 512 ready hold");
    let peak = judge.peak();
    let held: Vec<u64> = ps
        .iter()
        .chain([&last])
        .map(|p| held_by(&c, p.pid()))
        .collect();
    let total: u64 = held.iter().sum();
    assert!(peak <= limit, "peaked at {peak} > {limit}");
    assert!(total <= limit && total + PAGE >= limit, "{held:?}");
    // Each holds whole pages of its own (none shares another's).
    for (p, h) in ps.iter().chain([&last]).zip(&held) {
        assert!(h % PAGE == 0, "pid {}: {h} is whole pages", p.pid());
    }
    assert!(held.iter().filter(|&&h| h > 0).count() >= 2, "{held:?}");
    assert_eq!(c.usage().used[0], total);
}

#[test]
fn a_destroyed_context_returns_its_pages() {
    // Primary + explicit context (2 × 300 MiB) and pages in the explicit
    // one; destroying it gives the driver's pages and the charge back.
    let limit = 2 * CONTEXT + 64 * MIB;
    let c = Container::new(|u| memory_limit(u, limit / MIB));
    let p = c.spawn_ready(
        Link::Direct,
        "dev 0 ctx 0 sweep-n 3000 1000 sweep-n 3 7340032 sweep-n 5 777777 ctx-destroy ready hold",
    );
    assert_eq!(held_by(&c, p.pid()), CONTEXT, "only the primary context");
    assert_eq!(c.usage().used[0], CONTEXT, "and only it is charged");
    p.kill();
}

#[test]
fn small_churn_at_the_limit_from_racing_processes_never_exceeds_it() {
    // Four processes churn 1 MiB pieces (small: two per page) against
    // 64 MiB: on a refusal each frees its oldest piece, leaving a hole its
    // next piece fills at the limit (a process without pages of its own
    // waits for a whole page to come free, as on a real GPU). Contexts
    // cost nothing on this node.
    let limit = 64 * MIB;
    let node = NodeSpec::small().context_overhead_mib(0).build();
    let c = Arc::new(Container::on(node, |u| GpuLimits {
        context_overhead: 0,
        ..memory_limit(u, limit / MIB)
    }));
    let judge = Judge::start(&c);
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let c = c.clone();
            let link = [Link::Direct, Link::Dlopen, Link::Dlsym, Link::Direct][i];
            std::thread::spawn(move || c.run(link, "dev 0 churn 1 3000"))
        })
        .collect();
    let outs: Vec<String> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let peak = judge.peak();
    let (mut ok, mut oom) = (0u64, 0u64);
    for out in &outs {
        let f = field(out, "churn");
        ok += f[0].parse::<u64>().unwrap();
        oom += f[1].parse::<u64>().unwrap();
    }
    // Once full, a process's refusal and the refill of its hole alternate:
    // at least 64 + (3000 - 64) / 2 successes even if one process holds
    // every page.
    assert!(
        ok > 1400 && oom > 1000,
        "contended at the limit: {ok} ok, {oom} refused"
    );
    assert!(
        peak <= limit,
        "peaked at {} MiB > {} MiB",
        peak / MIB,
        limit / MIB
    );
    assert!(
        peak + 2 * PAGE >= limit,
        "the limit was reached: peak {peak}"
    );
}
