//! The compute controller in closed loop on the simulated node with real
//! CUDA software in the container: a CuPy kernel loop (NVIDIA's libcudart
//! 12.9 from PyPI, the kernel compiled by NVRTC, `cupy_loop.py`) under
//! `libtessera.so` holds its hard SM target as the C workload does in
//! `control_sim.rs`, to the same accuracy (±2 pp over each window), alone
//! and beside a C workload. Judged by the simulator's own record of each
//! process's kernel time (`control_support`). Needs `cargo xtask build
//! --no-ebpf` first, and CuPy's environment (`target/pyenv-cuda`, made by
//! pip on first use; skipped where it cannot be made).
//!
//! A timing test: on a machine loaded by other work the loop may lag
//! (the run prints the load average and the late ticks).
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod control_support;

use std::sync::Mutex;

use control_support::{Change, Limiter, Run, Scenario, Spec, in_child, table, wide_kernels};
use tessera_agent::control::{ContainerControl, Mode};
use tessera_testkit::or_skip;
use tessera_testkit::python::{CUPY_CUDA12, python};
use tessera_testkit::sim::workspace;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A container running the CuPy loop: `spin` kernels (200 µs, one block
/// of 256 threads, as the C workload's `spin_kernels`) for `secs`.
fn cupy_spin(id: &str, target: f64, secs: f64, cache: &std::path::Path) -> Result<Spec, String> {
    let py = python(&CUPY_CUDA12)?;
    let mut s = Spec::new(id, target, Mode::Hard, String::new());
    s.command = vec![
        // `env` execs Python in its place: the container's pid is Python's.
        "env".into(),
        format!("CUPY_CACHE_DIR={}", cache.display()),
        py.display().to_string(),
        workspace()
            .join("xtask/gpusim/tests/py/cupy_loop.py")
            .display()
            .to_string(),
        "spin".into(),
        "1".into(),
        "256".into(),
        format!("{}", (secs * 1000.0) as u64),
    ];
    Ok(s)
}

fn run(name: &str, scenario: &Scenario) -> Run {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = in_child(scenario, &["--exact", name, "--nocapture"]);
    eprintln!(
        "{name}: load {:.1}, late ticks {}, oracle {:?}, device busy {:?}\n{}",
        run.load,
        run.late_ticks,
        run.oracle,
        run.oracle_busy,
        table(&run)
    );
    run
}

#[track_caller]
fn assert_near(run: &Run, window: usize, i: usize, want: f64, tol: f64) {
    let got = run.oracle[window][i];
    assert!(
        (got - want).abs() <= tol,
        "container {i}: {got} % in window {window}, want {want} ± {tol}\n{}",
        table(run)
    );
}

#[test]
fn a_cupy_loop_in_a_hard_container_is_capped_and_follows_a_new_target() {
    if control_support::child_main() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let s = Scenario {
        containers: vec![or_skip!(cupy_spin("cupy", 30.0, 12.0, cache.path()))],
        changes: vec![Change {
            at_s: 5.0,
            id: "cupy".into(),
            control: ContainerControl {
                target_percent: 60.0,
                mode: Mode::Hard,
                priority: 0,
            },
        }],
        seconds: 10.0,
        limiter: Limiter::Tessera,
        windows: vec![(3.0, 5.0), (8.0, 10.0)],
    };
    let r = run(
        "a_cupy_loop_in_a_hard_container_is_capped_and_follows_a_new_target",
        &s,
    );
    assert_near(&r, 0, 0, 30.0, 2.0);
    assert_near(&r, 1, 0, 60.0, 2.0);
}

#[test]
fn a_cupy_loop_and_the_c_workload_hold_their_hard_targets_side_by_side() {
    if control_support::child_main() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let s = Scenario {
        containers: vec![
            or_skip!(cupy_spin("cupy", 30.0, 12.0, cache.path())),
            Spec::new("c", 50.0, Mode::Hard, wide_kernels(12.0)),
        ],
        changes: vec![],
        seconds: 9.0,
        limiter: Limiter::Tessera,
        windows: vec![(4.0, 9.0)],
    };
    let r = run(
        "a_cupy_loop_and_the_c_workload_hold_their_hard_targets_side_by_side",
        &s,
    );
    assert_near(&r, 0, 0, 30.0, 2.0);
    assert_near(&r, 0, 1, 50.0, 2.0);
}
