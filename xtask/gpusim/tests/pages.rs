//! Linear device memory on the simulated node is held the way the real
//! driver holds it (see `gpusim_cuda::heap` for the facts): small
//! allocations packed 512 bytes apart into shared 2 MiB pages, larger ones
//! in whole pages of their own, the tail of a large allocation's last page
//! open to small ones, and a page given back with its last allocation.
//! Judged by what the simulator charges the process (what NVML reports).
#![allow(clippy::unwrap_used)]

use tessera_testkit::sim as support;

use support::{Gpu, Link, Node, NodeSpec};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 2 * MIB;
/// The small test node's context overhead.
const CONTEXT: u64 = 300 * MIB;

/// Device memory the simulator charges to `ops`' process once it is ready
/// (its context included); also returns what it printed.
fn held(node: &Node, ops: &str) -> (u64, Vec<String>) {
    let p = node.spawn_ready(Link::Direct, &format!("dev 0 {ops} ready hold"));
    let bytes = node
        .sim()
        .processes(0)
        .unwrap()
        .iter()
        .filter(|x| x.pid == p.pid())
        .map(|x| x.bytes)
        .sum();
    let seen = p.seen.clone();
    p.kill();
    (bytes, seen)
}

fn pages(node: &Node, ops: &str) -> u64 {
    let (bytes, seen) = held(node, ops);
    let bytes = bytes - CONTEXT;
    assert_eq!(bytes % PAGE, 0, "{ops}: {bytes} is whole pages ({seen:?})");
    bytes / PAGE
}

#[test]
fn small_allocations_share_pages_and_large_ones_hold_whole_pages() {
    let node = Node::small();
    for (ops, want) in [
        // 4096 × 512 B fill one page exactly; one more opens a second.
        ("sweep-n 4096 512", 1),
        ("sweep-n 4097 512", 2),
        // Sizes round up to 512 B: 1000 B takes 1024.
        ("sweep-n 2048 1000", 1),
        ("sweep-n 2049 1000", 2),
        ("sweep-n 2 1048576", 1),
        ("sweep-n 3 1048576", 2),
        // Over 1 MiB is large: pages of its own.
        ("sweep-n 1 1048577", 1),
        ("sweep-n 2 1048577", 2),
        ("sweep-n 3 1572864", 3),
        ("sweep-n 2 2097152", 2),
        ("sweep-n 1 7340032", 4),
        ("sweep-n 1 67108864", 32),
        // A 7 MiB allocation's last page has 1 MiB left for small ones.
        ("sweep-n 1 7340032 sweep-n 2 524288", 4),
        ("sweep-n 1 7340032 sweep-n 3 524288", 5),
    ] {
        assert_eq!(pages(&node, ops), want, "{ops}");
    }
}

#[test]
fn consecutive_small_allocations_are_512_bytes_apart() {
    let node = Node::small();
    for (size, step) in [(1, 512), (512, 512), (513, 1024), (4096, 4096)] {
        let (_, seen) = held(&node, &format!("sweep-n 2 {size} sweep-step"));
        let step_line = seen.iter().find(|l| l.starts_with("step")).unwrap();
        assert_eq!(step_line, &format!("step {step}"), "{size} B");
    }
}

#[test]
fn a_page_is_held_while_any_allocation_lives_in_it() {
    let node = Node::small();
    // Two pages of 512 B; keeping one allocation in each keeps both.
    assert_eq!(pages(&node, "sweep-n 8192 512 sweep-thin 4096"), 2);
    assert_eq!(pages(&node, "sweep-n 8192 512 sweep-thin 8192"), 1);
    assert_eq!(pages(&node, "sweep-n 8192 512 sweep-free"), 0);
    // Holes are reused before a new page is taken.
    assert_eq!(
        pages(&node, "sweep-n 8192 512 sweep-thin 2 sweep-n 4096 512"),
        2
    );
    // A 7 MiB allocation freed while small ones live in its last page:
    // that page stays (with them), the other three go. [s s s s L t t],
    // keeping every 5th leaves s and the second t.
    let ops = "sweep-n 4 524288 sweep-n 1 7340032 sweep-n 2 524288 sweep-thin 5";
    assert_eq!(pages(&node, ops), 2);
    assert_eq!(pages(&node, &format!("{ops} sweep-free")), 0);
    // And the reverse: the small ones go first, the large one keeps all.
    assert_eq!(
        pages(&node, "sweep-n 1 7340032 sweep-n 2 524288 sweep-thin 3"),
        4
    );
}

#[test]
fn a_full_device_takes_small_allocations_to_the_last_page() {
    // 64 MiB left after the context: 32 pages of 1 MiB pairs, or of 4096
    // 512-byte allocations; 7 MiB ones hold 8 MiB each.
    let node = NodeSpec::small_with(Gpu::sim(364)).build();
    for (size, n) in [(512, 32 * 4096), (1048576, 64), (7340032, 8), (1572864, 32)] {
        let (bytes, seen) = held(&node, &format!("sweep {size}"));
        let swept = seen.iter().find(|l| l.starts_with("swept")).unwrap();
        assert_eq!(
            swept,
            &format!("swept {n} CUDA_ERROR_OUT_OF_MEMORY"),
            "{size} B"
        );
        assert_eq!(bytes, 364 * MIB, "{size} B: the device is full");
    }
}
