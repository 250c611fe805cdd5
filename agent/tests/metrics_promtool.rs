//! `/metrics` of the agent running on the simulator with workloads: the
//! real output passes `promtool check metrics` (the Debian `prometheus`
//! package), its counters never go backwards when a container rewrites
//! its usage region, and a removed container's series disappear.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;
mod metrics_support;

use std::io::Write;
use std::time::Duration;

use daemon_support::{container_ok, wait_for};
use metrics_support::Scene;
use tessera_testkit::promtool::Promtool;

/// Every sample of `name` whose line contains each of `parts`.
fn samples(text: &str, name: &str, parts: &[&str]) -> Vec<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

fn metrics(scene: &Scene) -> String {
    let (code, body) = scene.agent.get("/metrics");
    assert_eq!(code, 200, "{body}");
    body
}

#[test]
fn promtool_accepts_the_agents_real_output() {
    let promtool = tessera_testkit::or_skip!(Promtool::find());
    let scene = Scene::start();
    // Wait until the busy container has launched and been throttled.
    let text = wait_for(Duration::from_secs(30), || {
        let t = metrics(&scene);
        let throttled = samples(
            &t,
            "tessera_container_throttled_seconds_total",
            &[r#"pod="trainer""#],
        );
        (throttled.iter().any(|&v| v > 0.0)).then_some(t)
    })
    .unwrap_or_else(|| panic!("no throttling seen: {}", metrics(&scene)));
    let checked = promtool.check_metrics(&text);
    // promtool exits 0 only without lint problems; its findings go to
    // stderr. Both must be clean.
    assert!(
        checked.success && checked.said.trim().is_empty(),
        "promtool: {}\n{text}",
        checked.said
    );
    // The output it checked holds the series the tests and the dashboard
    // rely on, for both pods.
    for pod in ["trainer", "notebook"] {
        let p = format!(r#"pod="{pod}""#);
        for name in [
            "tessera_container_memory_used_bytes",
            "tessera_container_memory_limit_bytes",
            "tessera_container_sm_target_ratio",
            "tessera_container_launches_total",
            "tessera_container_enforcement_actions_total",
        ] {
            assert!(
                !samples(&text, name, &[&p]).is_empty(),
                "{name} {pod}: {text}"
            );
        }
    }
    let gpu = format!(r#"gpu="{}""#, scene.gpu);
    assert_eq!(samples(&text, "tessera_gpu_up", &[&gpu]), [1.0], "{text}");
    assert_eq!(
        samples(&text, "tessera_agent_nvml_up", &[]),
        [1.0],
        "{text}"
    );
}

#[test]
fn counters_survive_a_rewritten_usage_region_and_removed_containers_disappear() {
    let scene = Scene::start();
    let busy = [r#"pod="trainer""#];
    let read = |name: &str| -> f64 {
        samples(&metrics(&scene), name, &busy)
            .first()
            .copied()
            .unwrap_or(0.0)
    };
    let launched = wait_for(Duration::from_secs(30), || {
        let v = read("tessera_container_launches_total");
        (v > 0.0).then_some(v)
    })
    .expect("the busy container launched");
    // The tenant zeroes its usage region (what a hostile process or a
    // recreated region does): the exported counters must not go back.
    let usage = scene.busy.dir.join("usage");
    assert!(usage.is_file(), "no usage region at {}", usage.display());
    let len = std::fs::metadata(&usage).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&usage)
        .unwrap()
        .write_all(&vec![0u8; len as usize])
        .unwrap();
    let mut last = launched;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        let v = read("tessera_container_launches_total");
        assert!(v >= last, "launches went back from {last} to {v}");
        last = v;
    }
    // Removing a container removes its series.
    container_ok(&scene.root, &["rm", "--id", scene.idle.id]);
    let gone = wait_for(Duration::from_secs(10), || {
        let t = metrics(&scene);
        (!t.contains(r#"pod="notebook""#)).then_some(t)
    });
    let t = gone.unwrap_or_else(|| panic!("notebook still exported: {}", metrics(&scene)));
    assert!(t.contains(r#"pod="trainer""#), "{t}");
}
