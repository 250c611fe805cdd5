//! The controller against the plant model (deterministic), and the
//! allocator and sampling on their own.

use std::time::Instant;

use super::allocator::{Claim, allocate};
use super::plant::{Plant, Workload, saturating};
use super::sampling::fold_samples;
use super::*;

fn ctl(target: f64, mode: Mode) -> ContainerControl {
    ContainerControl {
        target_percent: target,
        mode,
        priority: 0,
    }
}

/// A plant with containers `(id, target, mode, workload)`.
fn plant(specs: Vec<(&str, f64, Mode, Workload)>) -> Plant {
    let mut p = Plant::new(GpuController::new(ControllerConfig::default()));
    for (id, target, mode, w) in specs {
        p.controller.upsert(id, ctl(target, mode)).unwrap();
        p.add(id, w);
    }
    p
}

/// Gives container `id` of `p` the control `c` at priority 10.
fn raise_priority(p: &mut Plant, id: &str, c: ContainerControl) {
    p.controller
        .upsert(id, ContainerControl { priority: 10, ..c })
        .unwrap();
}

/// Kernel shapes: GPU seconds per warp, from huge grids of cheap warps to
/// single-warp kernels that run long.
const COSTS: [f64; 5] = [2.7e-9, 1e-7, 2.9e-6, 2e-4, 5e-3];

#[track_caller]
fn assert_holds(p: &Plant, i: usize, want: f64, settle_s: f64, end_s: f64) {
    let mean = p.mean(i, settle_s, end_s);
    assert!(
        (mean - want).abs() <= 2.0,
        "container {i}: mean {mean:.2} after {settle_s} s, want {want} ± 2; history {:?}",
        p.history.iter().map(|(_, u)| u[i]).collect::<Vec<_>>()
    );
    let at = p.settled_at(i, want, 3.0);
    assert!(
        at.is_some_and(|t| t <= settle_s),
        "container {i}: settled (±3 pp per period) at {at:?}, want ≤ {settle_s} s; history {:?}",
        p.history.iter().map(|(_, u)| u[i]).collect::<Vec<_>>()
    );
}

#[test]
fn hard_alone_holds_its_target_for_every_kernel_shape() {
    for cost in COSTS {
        for target in [5.0, 30.0, 70.0] {
            let mut p = plant(vec![("a", target, Mode::Hard, saturating(cost))]);
            p.run(8.0);
            assert_holds(&p, 0, target, 3.0, 8.0);
            // Probing starts from below: no window far over the cap, also
            // while the estimate is being made.
            let max = p.history.iter().map(|(_, u)| u[0]).fold(0.0, f64::max);
            assert!(
                max <= target + 5.0,
                "cost {cost}, target {target}: a window at {max}: {:?}",
                p.history
            );
        }
    }
}

#[test]
fn three_hard_containers_share_one_gpu_at_their_targets() {
    let mut p = plant(vec![
        ("a", 30.0, Mode::Hard, saturating(2.9e-6)),
        ("b", 50.0, Mode::Hard, saturating(2e-4)),
        ("c", 20.0, Mode::Hard, saturating(2.7e-9)),
    ]);
    p.run(10.0);
    for (i, t) in [30.0, 50.0, 20.0].into_iter().enumerate() {
        assert_holds(&p, i, t, 3.0, 10.0);
    }
}

#[test]
fn elastic_uses_idle_sms_and_splits_contention_by_target() {
    let mut p = plant(vec![("a", 30.0, Mode::Elastic, saturating(2.9e-6))]);
    p.run(6.0);
    assert!(p.mean(0, 3.0, 6.0) >= 95.0, "{:?}", p.history);
    let mut p = plant(vec![
        ("a", 30.0, Mode::Elastic, saturating(2.9e-6)),
        ("b", 50.0, Mode::Elastic, saturating(2e-4)),
    ]);
    p.run(8.0);
    // 30 + 50 guaranteed, the 20 left split 30:50.
    assert_holds(&p, 0, 37.5, 3.0, 8.0);
    assert_holds(&p, 1, 62.5, 3.0, 8.0);
    let busy = p.mean(0, 3.0, 8.0) + p.mean(1, 3.0, 8.0);
    assert!(busy >= 95.0, "device {busy}");
}

#[test]
fn a_hard_neighbour_keeps_its_target_next_to_an_elastic_one() {
    let mut p = plant(vec![
        ("a", 30.0, Mode::Hard, saturating(2e-4)),
        ("b", 20.0, Mode::Elastic, saturating(2.9e-6)),
    ]);
    p.run(8.0);
    assert_holds(&p, 0, 30.0, 3.0, 8.0);
    assert_holds(&p, 1, 70.0, 3.0, 8.0);
}

#[test]
fn priority_comes_before_target_share() {
    let mut p = plant(vec![
        ("a", 30.0, Mode::Elastic, saturating(2.9e-6)),
        ("b", 50.0, Mode::Elastic, saturating(2.9e-6)),
    ]);
    raise_priority(&mut p, "a", ctl(30.0, Mode::Elastic));
    p.run(8.0);
    // b keeps its guarantee; everything else goes to the higher priority.
    assert_holds(&p, 0, 50.0, 3.0, 8.0);
    assert_holds(&p, 1, 50.0, 3.0, 8.0);
}

/// Hard targets that over-commit a GPU (possible outside Kubernetes,
/// where `container set` does not know the neighbours): the GPU cannot
/// give every container its target, so the split decides, as for
/// elastic containers — higher priority first, then in proportion to
/// targets — instead of whatever the GPU's time slicing hands out.
#[test]
fn over_committed_hard_targets_split_by_priority_then_target() {
    let mut p = plant(vec![
        ("a", 70.0, Mode::Hard, saturating(2.9e-6)),
        ("b", 60.0, Mode::Hard, saturating(2.9e-6)),
    ]);
    raise_priority(&mut p, "a", ctl(70.0, Mode::Hard));
    p.run(8.0);
    assert_holds(&p, 0, 70.0, 3.0, 8.0);
    assert_holds(&p, 1, 30.0, 3.0, 8.0);

    let mut p = plant(vec![
        ("a", 60.0, Mode::Hard, saturating(2.9e-6)),
        ("b", 50.0, Mode::Hard, saturating(2.9e-6)),
    ]);
    p.run(8.0);
    assert_holds(&p, 0, 100.0 * 60.0 / 110.0, 3.0, 8.0);
    assert_holds(&p, 1, 100.0 * 50.0 / 110.0, 3.0, 8.0);
}

#[test]
fn no_windup_while_memory_bound_or_idle() {
    // Launches a tenth of what the target needs for 20 s, then saturates.
    let cost = 2.9e-6;
    let needed = 40.0 / 100.0 / cost;
    let w: Workload = Box::new(move |t| {
        if t < 20.0 {
            (needed / 10.0, cost)
        } else {
            (f64::INFINITY, cost)
        }
    });
    let mut p = plant(vec![("a", 40.0, Mode::Hard, saturating(cost))]);
    p.get("a").workload = w;
    p.run(20.0);
    let rate = p.decisions.last().unwrap()[0].pacing.rate as f64;
    assert!(
        rate <= 1.5 * needed,
        "rate {rate} grew past 1.5 x the {needed} the target needs"
    );
    p.run(5.0);
    let after: Vec<f64> = p.history[200..].iter().map(|(_, u)| u[0]).collect();
    assert!(
        after.iter().all(|&u| u <= 40.0 + 5.0),
        "overshoot after the idle phase: {after:?}"
    );
    assert_holds(&p, 0, 40.0, 21.0, 25.0);

    // Fully idle for 10 s, then saturating: no burst above the cap.
    let w: Workload = Box::new(move |t| {
        if (2.0..12.0).contains(&t) {
            (0.0, cost)
        } else {
            (f64::INFINITY, cost)
        }
    });
    let mut p = plant(vec![("a", 40.0, Mode::Hard, w)]);
    p.run(16.0);
    let after: Vec<f64> = p.history[120..].iter().map(|(_, u)| u[0]).collect();
    assert!(after.iter().all(|&u| u <= 45.0), "{after:?}");
    assert_holds(&p, 0, 40.0, 13.0, 16.0);
}

/// Sign changes of (use − want) over the periods in `[from, to)`, ignoring
/// deviations within `dead` pp.
fn crossings(p: &Plant, i: usize, want: f64, from: f64, to: f64, dead: f64) -> usize {
    let mut last = 0.0f64;
    let mut n = 0;
    for (t, u) in &p.history {
        if *t <= from || *t > to {
            continue;
        }
        let e = u[i] - want;
        if e.abs() <= dead {
            continue;
        }
        if last != 0.0 && e.signum() != last.signum() {
            n += 1;
        }
        last = e;
    }
    n
}

#[test]
fn a_target_change_settles_without_oscillation() {
    let mut p = plant(vec![("a", 30.0, Mode::Hard, saturating(2e-4))]);
    p.run(5.0);
    p.controller.upsert("a", ctl(60.0, Mode::Hard)).unwrap();
    p.run(5.0);
    assert_holds(&p, 0, 60.0, 8.0, 10.0);
    let first = p.history[50..]
        .iter()
        .position(|(_, u)| (u[0] - 60.0).abs() <= 3.0)
        .unwrap();
    assert!(first <= 30, "took {first} periods to reach the new target");
    assert!(
        crossings(&p, 0, 60.0, 5.0, 10.0, 2.0) <= 1,
        "oscillates: {:?}",
        &p.history[50..]
    );
    // Down again, also without overshooting below.
    p.controller.upsert("a", ctl(20.0, Mode::Hard)).unwrap();
    p.run(5.0);
    assert_holds(&p, 0, 20.0, 13.0, 15.0);
    assert!(crossings(&p, 0, 20.0, 10.0, 15.0, 2.0) <= 1);
}

#[test]
fn a_departing_and_an_arriving_workload_settle() {
    let mut p = plant(vec![
        ("a", 50.0, Mode::Elastic, saturating(2.9e-6)),
        ("b", 50.0, Mode::Elastic, saturating(2e-4)),
    ]);
    p.run(5.0);
    assert_holds(&p, 0, 50.0, 3.0, 5.0);
    // b leaves: a takes the GPU within 3 s.
    p.get("b").present = false;
    p.controller.remove("b");
    p.run(5.0);
    assert!(p.mean(0, 8.0, 10.0) >= 95.0, "{:?}", &p.history[50..]);
    // A hard one arrives: gets its 30, a gives way to 70.
    p.controller.upsert("c", ctl(30.0, Mode::Hard)).unwrap();
    p.add("c", saturating(2.7e-9));
    p.run(6.0);
    let a: Vec<f64> = p.history[100..].iter().map(|(_, u)| u[0]).collect();
    let c: Vec<f64> = p.history[100..].iter().map(|(_, u)| u[1]).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    assert!((mean(&c[30..]) - 30.0).abs() <= 2.0, "c {c:?}");
    assert!((mean(&a[30..]) - 70.0).abs() <= 2.0, "a {a:?}");
    assert!(c.iter().all(|&u| u <= 35.0), "c overshoots: {c:?}");
}

#[test]
fn bursty_inference_is_capped_and_not_starved() {
    // A request every 250 ms of 100 ms of GPU work (40 % on average)
    // under a 30 % cap: requests pile up, the container runs at its cap,
    // and no window shows more.
    let cost = 2.9e-6;
    let mut p = plant(vec![("a", 30.0, Mode::Hard, saturating(cost))]);
    p.get("a").requests = Some((0.25, 0.1 / cost));
    p.run(10.0);
    let mean = p.mean(0, 3.0, 10.0);
    assert!((mean - 30.0).abs() <= 2.0, "mean {mean}: {:?}", p.history);
    assert!(
        p.history[30..].iter().all(|(_, u)| u[0] <= 33.0),
        "{:?}",
        p.history
    );
    // 50 ms of work every 250 ms (20 %) under a 30 % cap: all served.
    let mut p = plant(vec![("a", 30.0, Mode::Hard, saturating(cost))]);
    p.get("a").requests = Some((0.25, 0.05 / cost));
    p.run(10.0);
    let mean = p.mean(0, 3.0, 10.0);
    assert!((mean - 20.0).abs() <= 2.0, "mean {mean}: {:?}", p.history);
    let left = p.get("a").pending * cost;
    assert!(left <= 0.05, "{left} s of work left behind");
}

#[test]
fn a_changing_kernel_shape_is_followed() {
    let w: Workload = Box::new(|t| {
        let cost = if (t as u64 / 4).is_multiple_of(2) {
            2.9e-6
        } else {
            2e-4
        };
        (f64::INFINITY, cost)
    });
    let mut p = plant(vec![("a", 30.0, Mode::Hard, w)]);
    p.run(16.0);
    for k in 0..4 {
        let from = 4.0 * f64::from(k);
        assert_holds_window(&p, from + 3.0, from + 4.0, 30.0);
    }
}

#[track_caller]
fn assert_holds_window(p: &Plant, from: f64, to: f64, want: f64) {
    let m = p.mean(0, from, to);
    assert!(
        (m - want).abs() <= 2.0,
        "{from}..{to}: {m}: {:?}",
        p.history
    );
}

#[test]
fn hostile_counters_neither_crash_nor_raise_the_rate() {
    let mut c = GpuController::new(ControllerConfig::default());
    c.upsert("a", ctl(30.0, Mode::Hard)).unwrap();
    let t0 = Instant::now();
    let mut tick = |k: u64, u: Option<f64>, warps: u64, thr: u64| {
        c.tick(
            t0 + PERIOD * k as u32,
            &GpuSample {
                busy_percent: u,
                containers: vec![ContainerSample {
                    id: "a".into(),
                    sm_percent: u,
                    warps,
                    throttled_ns: thr,
                }],
            },
        )
        .remove(0)
    };
    tick(0, Some(30.0), 0, 0);
    let d = tick(1, Some(30.0), 100, 100_000_000);
    let sane = d.pacing.rate;
    let values = [
        (Some(f64::NAN), u64::MAX, u64::MAX),
        (Some(1e300), 0, 0),
        (Some(-5.0), u64::MAX / 2, 7),
        (Some(f64::INFINITY), 3, u64::MAX),
        (None, u64::MAX, 0),
        (Some(0.0), u64::MAX, u64::MAX),
    ];
    for (k, (u, w, thr)) in values.into_iter().enumerate() {
        let d = tick(2 + k as u64, u, w, thr);
        assert!(d.pacing.rate >= 1, "{d:?}");
        assert!(
            (d.pacing.rate as f64) <= sane as f64 * 4f64.powi(k as i32 + 1),
            "rate grew faster than the growth limit: {d:?}"
        );
        assert!(d.pacing.burst >= 1);
        assert!(d.cost.is_none_or(|c| c.is_finite() && c > 0.0), "{d:?}");
    }
    // Claimed warps beyond what the bucket admits are clipped: a container
    // at its cap that inflates its counter does not get a higher rate
    // than an honest one.
    let honest = {
        let mut p = plant(vec![("a", 30.0, Mode::Hard, saturating(2e-4))]);
        p.run(5.0);
        p.decisions.last().unwrap()[0].pacing.rate
    };
    let mut p = plant(vec![("a", 30.0, Mode::Hard, saturating(2e-4))]);
    p.run(3.0);
    for _ in 0..20 {
        p.get("a").warps *= 10.0;
        p.period();
    }
    let liar = p.decisions.last().unwrap()[0].pacing.rate;
    assert!(
        liar as f64 <= honest as f64 * 1.5,
        "inflated counters raised the rate {honest} -> {liar}"
    );
}

/// `tick_for` returns, for the containers it is asked about, exactly the
/// decisions `tick` makes, period after period (the others learn and are
/// decided all the same, only not returned).
#[test]
fn tick_for_decides_the_wanted_as_tick_does() {
    let ids = ["a", "b", "c", "d", "e"];
    let mut all = GpuController::new(ControllerConfig::default());
    for (k, id) in ids.iter().enumerate() {
        let mode = if k % 2 == 0 {
            Mode::Hard
        } else {
            Mode::Elastic
        };
        all.upsert(id, ctl(10.0 + 15.0 * k as f64, mode)).unwrap();
    }
    let mut some = all.clone();
    let t0 = Instant::now();
    let wanted_by_period: [&[&str]; 4] = [&["a", "c"], &[], &["b", "c", "e"], &["e"]];
    for k in 0..40u64 {
        // Samples for a shifting subset, in no particular order.
        let containers = ids
            .iter()
            .enumerate()
            .rev()
            .filter(|(i, _)| !(k as usize + i).is_multiple_of(3))
            .map(|(i, id)| ContainerSample {
                id: (*id).into(),
                sm_percent: Some(5.0 + (i as f64) * 3.0 + (k % 4) as f64),
                warps: k * 1000 * (i as u64 + 1),
                throttled_ns: k * 1_000_000 * (i as u64 % 2),
            })
            .collect();
        let sample = GpuSample {
            busy_percent: Some(60.0),
            containers,
        };
        let now = t0 + PERIOD * k as u32;
        let every = all.tick(now, &sample);
        let wanted = wanted_by_period[k as usize % wanted_by_period.len()];
        let got = some.tick_for(now, &sample, wanted);
        let expected: Vec<_> = every
            .into_iter()
            .filter(|d| wanted.contains(&d.id.as_str()))
            .collect();
        assert_eq!(got, expected, "period {k}");
    }
}

#[test]
fn live_mode_change_applies_at_the_next_tick() {
    let mut p = plant(vec![("a", 30.0, Mode::Hard, saturating(2.9e-6))]);
    p.run(4.0);
    p.controller.upsert("a", ctl(30.0, Mode::Elastic)).unwrap();
    p.period();
    let d = &p.decisions.last().unwrap()[0];
    assert!(d.cap_percent > 90.0, "{d:?}");
    p.run(3.0);
    assert!(p.mean(0, 6.0, 7.1) >= 95.0);
    p.controller.upsert("a", ctl(30.0, Mode::Hard)).unwrap();
    p.period();
    assert_eq!(p.decisions.last().unwrap()[0].cap_percent, 30.0);
    p.run(3.0);
    assert_holds_window(&p, 9.0, 10.2, 30.0);
}

#[test]
fn bad_controls_are_refused_with_the_range() {
    let mut c = GpuController::default();
    for t in [0.0, -1.0, 100.5, f64::NAN] {
        let e = c.upsert("a", ctl(t, Mode::Hard)).unwrap_err().to_string();
        assert!(e.contains("SM target") && e.contains("100"), "{e}");
    }
    let e = "soft".parse::<Mode>().unwrap_err().to_string();
    assert!(e.contains("soft") && e.contains("elastic"), "{e}");
    assert_eq!("elastic".parse::<Mode>().unwrap(), Mode::Elastic);
}

fn claim(mode: Mode, priority: i32, target: f64, claim: f64, hungry: bool) -> Claim {
    Claim {
        mode,
        priority,
        target,
        claim,
        hungry,
    }
}

#[test]
fn the_allocator_guarantees_then_lends() {
    use Mode::{Elastic, Hard};
    let shares = |cs: &[Claim]| -> Vec<(f64, f64)> {
        let a = allocate(cs);
        let total: f64 = a.iter().map(|x| x.share).sum();
        assert!(total <= 100.0 + 1e-9, "{a:?}");
        a.iter()
            .map(|x| {
                (
                    (x.share * 10.0).round() / 10.0,
                    (x.cap * 10.0).round() / 10.0,
                )
            })
            .collect()
    };
    // Hungry elastic containers: guarantees, then the rest by target.
    assert_eq!(
        shares(&[
            claim(Elastic, 0, 30.0, 100.0, true),
            claim(Elastic, 0, 50.0, 100.0, true)
        ]),
        vec![(37.5, 37.5), (62.5, 62.5)]
    );
    // An idle neighbour lends its share but keeps its target as a cap.
    assert_eq!(
        shares(&[
            claim(Elastic, 0, 30.0, 100.0, true),
            claim(Elastic, 0, 50.0, 1.0, false)
        ]),
        vec![(99.0, 99.0), (1.0, 50.0)]
    );
    // Hard: capped at the target whatever is free; its claim still counts.
    assert_eq!(
        shares(&[
            claim(Hard, 0, 30.0, 100.0, true),
            claim(Elastic, 0, 20.0, 100.0, true)
        ]),
        vec![(30.0, 30.0), (70.0, 70.0)]
    );
    assert_eq!(
        shares(&[claim(Hard, 0, 30.0, 11.0, false)]),
        vec![(11.0, 30.0)]
    );
    // Over-committed hard targets: the same order; a container cut by
    // it is capped at its guarantee, one that got its claim keeps its
    // target as a cap.
    assert_eq!(
        shares(&[
            claim(Hard, 1, 70.0, 100.0, true),
            claim(Hard, 0, 60.0, 100.0, true),
            claim(Hard, 0, 40.0, 5.0, false)
        ]),
        vec![(70.0, 70.0), (25.0, 25.0), (5.0, 40.0)]
    );
    // Over-committed targets: priority first, then by target.
    assert_eq!(
        shares(&[
            claim(Elastic, 1, 60.0, 100.0, true),
            claim(Elastic, 0, 60.0, 100.0, true),
            claim(Elastic, 0, 20.0, 100.0, true)
        ]),
        vec![(60.0, 60.0), (30.0, 30.0), (10.0, 10.0)]
    );
    // Garbage claims count as nothing.
    let a = allocate(&[
        claim(Elastic, 0, f64::NAN, f64::INFINITY, true),
        claim(Elastic, 0, 50.0, 100.0, true),
    ]);
    assert!(a.iter().all(|x| x.share.is_finite()));
    assert!(a.iter().map(|x| x.share).sum::<f64>() <= 100.0 + 1e-9);
}

#[test]
fn samples_fold_per_pid() {
    use nvml_wrapper::struct_wrappers::device::ProcessUtilizationSample as S;
    let s = |pid, timestamp, sm_util| S {
        pid,
        timestamp,
        sm_util,
        mem_util: 0,
        enc_util: 0,
        dec_util: 0,
    };
    let f = fold_samples(
        &[
            s(1, 100, 50),
            s(1, 200, 30),
            s(2, 150, 500),
            s(3, 10, 90),
            s(4, 300, 20),
        ],
        50,
    );
    assert_eq!(f.by_pid.get(&1), Some(&40.0));
    assert_eq!(f.by_pid.get(&2), Some(&100.0), "clamped");
    assert_eq!(f.by_pid.get(&3), None, "older than since");
    assert_eq!(f.newest_us, 300);
    assert_eq!(f.sum_over([1, 4, 1, 99]), 60.0, "each pid once");
    assert_eq!(f.total(), 100.0);
}

#[test]
fn a_floor_scales_the_start_and_bounds_the_burst_below() {
    let plain = ControllerConfig::default();
    let floored = plain.with_launch_floor(8448);
    // The same launches per second at the start, whatever the unit.
    assert_eq!(floored.start_rate(), plain.start_rate() * 8448.0);
    let start = floored.initial_limits();
    assert_eq!((start.rate, start.floor), (20 * 8448, 8448));
    // A burst never holds less than one launch of the smallest charge.
    assert_eq!(floored.burst_for(1000.0), 8448.0);
    assert_eq!(floored.burst_for(1e9), 1e9 * floored.burst_s);
    assert_eq!(plain.burst_for(10.0), 1.0);
    // Decisions carry the floor to the control region.
    let mut c = GpuController::new(floored);
    c.upsert("a", ctl(30.0, Mode::Hard)).unwrap();
    let d = c.tick(
        std::time::Instant::now(),
        &GpuSample {
            busy_percent: Some(0.0),
            containers: Vec::new(),
        },
    );
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].pacing.floor, 8448);
    assert!(d[0].pacing.burst >= 8448, "{d:?}");
}

#[test]
fn a_rate_written_under_another_floor_resumes_at_least_at_the_start() {
    let cfg = ControllerConfig::default().with_launch_floor(8448);
    let resumed = |current: Pacing| {
        let mut c = GpuController::new(cfg);
        c.resume("a", ctl(30.0, Mode::Hard), current).unwrap();
        let sample = GpuSample {
            busy_percent: Some(0.0),
            containers: Vec::new(),
        };
        c.tick(std::time::Instant::now(), &sample)[0].pacing.rate
    };
    let pacing = |rate, floor| Pacing {
        rate,
        burst: 1,
        floor,
    };
    // Same floor (an agent restarted): exactly the rate found (I4).
    assert_eq!(resumed(pacing(5_000, 8448)), 5_000);
    // `container add`'s start, written without the floor: the pace of a
    // new container under this floor, not 8448 times slower.
    let start = cfg.start_rate() as u64;
    assert_eq!(resumed(pacing(20, 0)), start);
    // A rate already above that is kept.
    assert_eq!(resumed(pacing(start * 10, 0)), start * 10);
}

#[test]
fn on_a_saturated_device_only_a_risen_cap_raises_the_rate() {
    use super::feedback::Loop;
    let cfg = ControllerConfig::default();
    // 1e6 warps/s giving 20 %: cost 2e-5 % per warp/s.
    let mut l = Loop::new(1e6);
    let mut warps = 0;
    let mut step = |l: &mut Loop, u: f64, cap: f64, saturated: bool| {
        warps += (l.rate() * 0.1) as u64;
        let obs = l.observe(0.1, Some(u), warps, 50_000_000, cfg.burst_s);
        l.decide(obs, cap, saturated, &cfg)
    };
    step(&mut l, 20.0, 20.0, false);
    let r = step(&mut l, 20.0, 20.0, false);
    assert!((r - 1e6).abs() < 1e3, "{r}");
    // Under its cap on a busy device: its warps may be queueing, so the
    // rate stays.
    assert_eq!(step(&mut l, 15.0, 20.0, true), r);
    // Its cap rose (a neighbour's fell in the same split): the rate goes
    // to the new cap at once, busy device or not.
    let up = step(&mut l, 20.0, 60.0, true);
    assert!((up - 3e6).abs() < 3e4, "{up}");
}

/// A hard container at 70 beside bursts it cannot outrun (each 10
/// windows, 4 in which it gets at most half the GPU and the device is
/// saturated): its queue holds what it launched and runs it in the
/// windows after, so it can take its 70 on average, and does while its
/// rate stays. Learning only the windows after a burst (the queued warps
/// running look dear) and never the burst (they look cheap) would raise
/// the cost each cycle and ratchet the rate and the share down.
#[test]
fn bursts_beside_a_hard_container_do_not_ratchet_its_rate_down() {
    use super::feedback::Loop;
    let cfg = ControllerConfig::default();
    // 1e6 warps/s give 70 %: cost 7e-5 % per warp/s.
    let cost = 7e-5;
    let mut l = Loop::new(1e6);
    let (mut warps, mut backlog) = (0u64, 0.0f64);
    let mut got_by_window = Vec::new();
    for k in 0..400 {
        let burst = k % 10 < 4 && k >= 50;
        let demand = cost * l.rate();
        let room = if burst { 50.0 } else { 100.0 };
        // What it launched and what queued before runs, as far as the
        // window has room (a queue of at most a second of its share).
        let got = (demand + backlog).min(room);
        backlog = (backlog + demand - got).clamp(0.0, 700.0);
        got_by_window.push(got);
        warps += (l.rate() * 0.1) as u64;
        let obs = l.observe(0.1, Some(got), warps, 50_000_000, cfg.burst_s);
        l.decide(obs, 70.0, burst || got >= 99.0, &cfg);
    }
    let last: Vec<f64> = got_by_window[300..].to_vec();
    let mean = last.iter().sum::<f64>() / last.len() as f64;
    assert!(
        (mean - 70.0).abs() <= 1.0,
        "mean {mean} over the last 100 windows (rate {}): {:?}",
        l.rate(),
        &got_by_window[380..]
    );
}
