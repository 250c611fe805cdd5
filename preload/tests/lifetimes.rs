//! Objects that hold memory give it back when they go: a destroyed memory
//! pool its cached memory, and a destroyed context its own, without
//! taking a new context's charges with it when the driver reuses the
//! handle. The simulator's accounting is the judge.

mod common;

use common::{Container, Link, MIB, field, memory_limit};

#[test]
fn destroying_a_pool_returns_its_charge() {
    let c = Container::new(|u| memory_limit(u, 1000));
    for link in [Link::Direct, Link::Dlopen, Link::Dlsym] {
        // A pool that keeps what is freed holds the memory until destroyed.
        let p = c.spawn_probe(link, "dev 0 pool 600 ready hold");
        assert_eq!(
            c.held(p.pid()),
            300 * MIB,
            "{link:?}: the simulator freed the pool"
        );
        drop(p);
        // Then the whole limit can be allocated again, and the driver
        // holds exactly that.
        let p = c.spawn_probe(link, "dev 0 pool 600 fill 100 ready hold");
        let out = p.seen.join("\n");
        assert_eq!(
            field(&out, "pool"),
            ["CUDA_SUCCESS", "CUDA_SUCCESS"],
            "{link:?}"
        );
        assert_eq!(
            field(&out, "filled"),
            ["7", "CUDA_ERROR_OUT_OF_MEMORY"],
            "{link:?}"
        );
        assert_eq!(c.held(p.pid()), 1000 * MIB, "{link:?}");
    }
}

#[test]
fn a_context_reusing_a_destroyed_ones_handle_keeps_its_charge() {
    let c = Container::new(|u| memory_limit(u, 2000));
    // The simulator hands the destroyed context's handle to the next one,
    // and holds the destroy open 300 ms after the context is gone: the new
    // context and its allocation land between the driver's destroy and
    // the interposer's bookkeeping.
    let mut cmd = c.command(&common::graph_probe(Link::Direct));
    cmd.env("GPUSIM_REUSE_CONTEXT_HANDLES", "1")
        .env("GPUSIM_CONTEXT_DESTROY_DELAY_MS", "300")
        .args(["dev", "0", "ctx-race", "200", "ready", "hold"]);
    let p = common::sim::spawn_command_ready(cmd, "ctx-race");
    assert_eq!(
        p.seen[1], "ctx-race 1",
        "the new context got the old handle"
    );
    // Primary and new context, and the allocation: on the device and in
    // the container's account alike.
    let held = c.held(p.pid());
    assert_eq!(held, (300 + 300 + 200) * MIB);
    let charged: u64 = c
        .usage()
        .slots
        .iter()
        .filter(|s| s.pid == p.pid() as u32)
        .map(|s| s.used[0])
        .sum();
    assert_eq!(charged, held, "the account lost the new context's charges");
}
