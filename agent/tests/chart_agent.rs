//! The Helm chart's agent against the real `tessera-agent`: the rendered
//! config is one `tessera-agent config check` accepts (the exact loading
//! `run` does), the rendered policy one `policy check` accepts, the probes
//! ask paths the running daemon answers, and the rendered init step
//! installs the preload library where the device plugin mounts it from,
//! atomically and never over an installed version (invariant I4).
//!
//! These tests live here, not in `plugin/tests/chart.rs` (which checks the
//! chart against the Kubernetes schemas and rules), because the oracle is
//! this crate's binary (`CARGO_BIN_EXE_tessera-agent`) and its constants.
//! The chart is rendered through the same bridge to Helm,
//! `tessera_testkit::helm` (Helm Go SDK, `pip install helm-python-sdk`,
//! installed by `cargo xtask setup`); without it the chart tests print
//! "skipped: helm not installed".
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod daemon_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use daemon_support::{Agent, Node, agent_bin};
use serde_json::{Value, json};
use tessera_agent::kubelet::allocate::{CONTAINER_LIBRARY_DIR, LD_SO_PRELOAD_FILE};
use tessera_testkit::helm::{self, NO_HELM};

/// The chart rendered with `values` (the objects as JSON); `None` when the
/// Helm SDK is missing.
fn render(values: &Value) -> Option<Vec<Value>> {
    let report = helm::render(values)
        .ok()?
        .unwrap_or_else(|e| panic!("rendering the chart with {values} failed: {e}"));
    Some(report["objects"].as_array().unwrap().clone())
}

/// The agent's parts of one rendered chart.
struct AgentChart {
    /// The DaemonSet's pod spec.
    pod: Value,
    /// The agent's ConfigMap data.
    data: Value,
}

impl AgentChart {
    fn of(objects: &[Value]) -> Self {
        let one = |kind: &str| {
            let found: Vec<&Value> = objects
                .iter()
                .filter(|o| {
                    o["kind"] == kind
                        && o["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"
                })
                .collect();
            assert_eq!(found.len(), 1, "expected one agent {kind}");
            found[0].clone()
        };
        let daemonset = one("DaemonSet");
        let map = one("ConfigMap");
        Self {
            pod: daemonset["spec"]["template"]["spec"].clone(),
            data: map["data"].clone(),
        }
    }

    fn container(&self, list: &str, name: &str) -> &Value {
        self.pod[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {list} {name}: {}", self.pod))
    }

    fn agent(&self) -> &Value {
        self.container("containers", "agent")
    }

    fn init(&self) -> &Value {
        self.container("initContainers", "install-preload")
    }

    fn env<'a>(container: &'a Value, name: &str) -> &'a str {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("no env {name} in {container}"))
    }

    /// Where the agent container mounts volume `volume`.
    fn mount_path<'a>(container: &'a Value, volume: &str) -> &'a str {
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume)
            .and_then(|m| m["mountPath"].as_str())
            .unwrap_or_else(|| panic!("no mount of {volume} in {container}"))
    }

    /// The host path of hostPath volume `volume`.
    fn host_path(&self, volume: &str) -> &str {
        self.pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == volume)
            .and_then(|v| v["hostPath"]["path"].as_str())
            .unwrap_or_else(|| panic!("no hostPath volume {volume}: {}", self.pod))
    }

    /// The `--config` file's path in the container.
    fn config_path(&self) -> &str {
        let args: Vec<&str> = self.agent()["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(&args[..1], ["run"], "the agent runs the daemon: {args:?}");
        let at = args.iter().position(|a| *a == "--config").unwrap();
        args[at + 1]
    }

    /// `agent.toml` as the agent would parse it.
    fn config(&self) -> toml::Table {
        self.data["agent.toml"].as_str().unwrap().parse().unwrap()
    }
}

/// `tessera-agent config check --config FILE` with no TESSERA_* setting
/// from the test's environment and NODE_NAME set as the chart sets it.
fn config_check(file: &Path) -> Output {
    config_check_with(file, &[])
}

/// `config check` with only `env` (and NODE_NAME) of the TESSERA_ variables.
fn config_check_with(file: &Path, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(agent_bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TESSERA_") {
            c.env_remove(k);
        }
    }
    c.envs(env.iter().copied());
    c.env("NODE_NAME", "gpu-node-1")
        .args(["config", "check", "--config"])
        .arg(file)
        .output()
        .unwrap()
}

#[test]
fn config_check_prints_the_effective_settings_or_names_the_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "period_ms = 250\nlisten = \"127.0.0.1:9555\"\n[watchdog]\nebpf = \"off\"\n",
    )
    .unwrap();
    let out = config_check(&good);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("accepted"), "{stdout}");
    // Given values and defaults alike are printed.
    for wanted in [
        "250ms",
        "127.0.0.1:9555",
        "Off",
        "/var/lib/tessera/containers",
    ] {
        assert!(stdout.contains(wanted), "no {wanted} in {stdout}");
    }

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "period_ms = 100\n[watchdog]\nebfp = \"off\"\n").unwrap();
    let out = config_check(&bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr.contains(&bad.display().to_string())
            && stderr.contains("ebfp")
            && stderr.contains("line 3"),
        "{stderr}"
    );
    let range = dir.path().join("range.toml");
    std::fs::write(&range, "period_ms = 5\n").unwrap();
    let out = config_check(&range);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr.contains("period_ms") && stderr.contains("10 to 10000"),
        "{stderr}"
    );
    let missing = dir.path().join("missing.toml");
    let out = config_check(&missing);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

/// Value sets the chart is rendered with.
fn value_sets() -> Vec<Value> {
    vec![
        json!({}),
        json!({"image": {"tag": "v0.2.0-rc.1"}, "agent": {
            "metricsPort": 9500,
            "periodMs": 50,
            "logLevel": "tessera_agent=debug",
            "watchdog": {"ebpf": "off", "contextAllowanceMiB": 300,
                "devices": ["control=/dev/nvidiactl", "uvm=1:5", "gpu=/dev/nvidia0"]},
            "kubelet": {"resourceName": "tessera.dev/vgpu", "split": 4, "placement": "spread"},
            "hostPaths": {
                "state": "/data/tessera/",
                "devicePlugins": "/data/kubelet/device-plugins",
                "podResources": "/data/kubelet/pod-resources",
            },
            "policy": {
                "apiVersion": "tessera.dev/v1alpha1",
                "kind": "Policy",
                "defaults": {"computeMode": "elastic", "bypassAction": "freeze"},
                "rules": [{
                    "name": "prod-first",
                    "match": {"namespaces": ["prod"], "podLabels": {"tier": "inference"}},
                    "priority": 90,
                    "memoryOverageAction": "freeze",
                }],
            },
        }}),
        // DRA mode, with a kubelet root and a CDI folder of the operator's.
        json!({"dra": {"enabled": true}, "agent": {"hostPaths": {
            "pluginsRegistry": "/data/kubelet/plugins_registry/",
            "kubeletPlugins": "/data/kubelet/plugins",
            "cdi": "/etc/cdi",
        }}}),
        // DRA mode with the device plugin kept beside the driver.
        json!({"dra": {"enabled": true, "devicePlugin": true}}),
    ]
}

/// The whole rendered config, `[kubelet]` included, is accepted by the
/// binary, and it says what the rest of the chart assumes: the listen port
/// is the "metrics" container port, the policy is the ConfigMap's
/// `policy.yaml` where the ConfigMap is mounted, the root and the preload
/// directory are below the mounted state host path, the kubelet sockets
/// where their host paths are mounted.
#[test]
fn the_rendered_config_is_accepted_by_the_agent_and_matches_the_daemonset() {
    for values in value_sets() {
        let Some(objects) = render(&values) else {
            println!("skipped: {NO_HELM}");
            return;
        };
        let chart = AgentChart::of(&objects);
        let agent = chart.agent();
        let config = chart.config();

        // Stand-in devices reach the config as given (none: the key is
        // absent and the agent finds NVIDIA's in /proc).
        let rendered: Option<Vec<&str>> = config["watchdog"].get("devices").map(|d| {
            d.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap())
                .collect()
        });
        let given: Option<Vec<&str>> = values["agent"]["watchdog"].get("devices").map(|d| {
            d.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap())
                .collect()
        });
        assert_eq!(rendered, given, "{values}");
        let mount = AgentChart::mount_path(agent, "config");
        assert_eq!(
            chart.config_path(),
            format!("{mount}/agent.toml"),
            "{values}"
        );
        assert_eq!(
            config["policy"].as_str().unwrap(),
            format!("{mount}/policy.yaml"),
            "{values}"
        );
        assert!(chart.data["policy.yaml"].is_string());
        let port = agent["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "metrics")
            .unwrap()["containerPort"]
            .as_u64()
            .unwrap();
        assert_eq!(
            config["listen"].as_str().unwrap(),
            format!("0.0.0.0:{port}")
        );
        let state = AgentChart::mount_path(agent, "state");
        assert_eq!(
            config["root"].as_str().unwrap(),
            format!("{state}/containers")
        );
        // The device plugin serves unless DRA mode is on without it.
        let dra_on = values["dra"]["enabled"] == json!(true);
        let plugin_kept = values["dra"]["devicePlugin"] == json!(true);
        let kubelet = config["kubelet"].as_table().unwrap();
        assert_eq!(
            kubelet["enabled"].as_bool(),
            Some(!dra_on || plugin_kept),
            "{values}"
        );
        // The DeviceClass (DRA mode only) maps the device plugin's
        // extended resource to whole devices when the plugin is off, and
        // only then (the node would advertise it otherwise).
        let classes: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == "DeviceClass")
            .collect();
        assert_eq!(classes.len(), usize::from(dra_on), "{values}");
        if let Some(class) = classes.first() {
            let mapped = class["spec"].get("extendedResourceName");
            if plugin_kept {
                assert_eq!(mapped, None, "{values}");
            } else {
                assert_eq!(
                    mapped,
                    Some(&kubelet["resource_name"].as_str().map(Value::from).unwrap()),
                    "{values}"
                );
            }
        }
        assert_eq!(
            kubelet["preload_dir"].as_str().unwrap(),
            format!("{state}/lib")
        );
        assert_eq!(
            kubelet["plugin_dir"].as_str().unwrap(),
            AgentChart::mount_path(agent, "device-plugins")
        );
        assert_eq!(
            kubelet["pod_resources_socket"].as_str().unwrap(),
            format!(
                "{}/kubelet.sock",
                AgentChart::mount_path(agent, "pod-resources")
            )
        );
        // DRA mode: the driver's sockets and CDI specs go where their host
        // paths are mounted, each at its own host path (kubelet and the
        // runtime are given host paths).
        match config.get("dra") {
            None => assert!(!dra_on, "no [dra] with {values}"),
            Some(dra) => {
                assert!(dra_on, "[dra] rendered with {values}");
                assert_eq!(dra["enabled"].as_bool(), Some(true));
                let at = |volume: &str| {
                    let mount = AgentChart::mount_path(agent, volume);
                    assert_eq!(chart.host_path(volume), mount, "{volume}: {values}");
                    mount.to_owned()
                };
                assert_eq!(
                    dra["registry_dir"].as_str().unwrap(),
                    at("plugins-registry")
                );
                assert_eq!(
                    format!("{}/gpu.tessera.dev", dra["plugins_dir"].as_str().unwrap()),
                    at("dra-plugin")
                );
                assert_eq!(dra["cdi_dir"].as_str().unwrap(), at("cdi"));
            }
        }
        // The node name comes from the pod's node.
        let node = agent["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "NODE_NAME")
            .unwrap();
        assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
        // The agent mounts the version the init step installed: both read
        // TESSERA_PRELOAD_VERSION, with one value.
        let version_of = |c: &Value| {
            c["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "TESSERA_PRELOAD_VERSION")
                .unwrap_or_else(|| panic!("no TESSERA_PRELOAD_VERSION in {c}"))["value"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        let version = version_of(agent);
        assert_eq!(version, version_of(chart.init()), "{values}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, chart.data["agent.toml"].as_str().unwrap()).unwrap();
        let out = config_check_with(&file, &[("TESSERA_PRELOAD_VERSION", &version)]);
        assert!(
            out.status.success(),
            "tessera-agent refuses the chart's config (values {values}): {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            chart.data["agent.toml"].as_str().unwrap()
        );
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains(&format!("preload_version: {version:?}")),
            "the agent would mount another version than {version}: {shown}"
        );
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, chart.data["policy.yaml"].as_str().unwrap()).unwrap();
        let out = Command::new(agent_bin())
            .args(["policy", "check"])
            .arg(&policy)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tessera-agent refuses the chart's policy (values {values}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Values the agent would refuse are refused by the chart already, naming
/// the value.
#[test]
fn the_chart_refuses_settings_the_agent_would() {
    for (values, named) in [
        (
            json!({"agent": {"kubelet": {"placement": "random"}}}),
            "agent.kubelet.placement",
        ),
        (
            json!({"agent": {"watchdog": {"ebpf": "yes"}}}),
            "agent.watchdog.ebpf",
        ),
        (json!({"image": {"tag": "../x"}}), "image.tag"),
    ] {
        let Ok(rendered) = helm::render(&values) else {
            println!("skipped: {NO_HELM}");
            return;
        };
        let Err(stderr) = rendered else {
            panic!("{values} rendered");
        };
        assert!(stderr.contains(named), "{values}: {stderr}");
    }
}

/// The startup, liveness and readiness probes ask, on the "metrics" port,
/// paths that the running daemon answers with 200 once ready (judged by
/// the daemon itself on the simulator, not by a list in the test); an
/// unknown path is 404, so the check can fail.
#[test]
fn the_probes_ask_paths_the_running_agent_answers() {
    let Some(objects) = render(&json!({})) else {
        println!("skipped: {NO_HELM}");
        return;
    };
    let chart = AgentChart::of(&objects);
    let agent_spec = chart.agent();
    let probes: Vec<(&str, &str)> = ["startupProbe", "livenessProbe", "readinessProbe"]
        .into_iter()
        .map(|p| {
            let get = &agent_spec[p]["httpGet"];
            assert_eq!(get["port"], "metrics", "{p}");
            (
                p,
                get["path"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{p} has no path")),
            )
        })
        .collect();
    let node = Node::small();
    let root = node.dir.path().join("containers");
    let agent = Agent::start(&node, &root, &[]);
    agent.wait_ready();
    for (probe, path) in probes {
        let (code, body) = agent.get(path);
        assert_eq!(code, 200, "{probe} asks {path}: {body}");
    }
    assert_eq!(agent.get("/healthz-not").0, 404);
}

/// Runs the init container's rendered command with its rendered
/// environment, the library source and the host directory replaced by
/// test paths.
fn install(chart: &AgentChart, library: &Path, preload_dir: &Path, version: &str) -> Output {
    let init = chart.init();
    let command: Vec<&str> = init["command"]
        .as_array()
        .unwrap()
        .iter()
        .chain(init["args"].as_array().unwrap())
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&command[..2], ["/bin/sh", "-c"]);
    let mut c = Command::new("/bin/sh");
    c.args(&command[1..])
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    for e in init["env"].as_array().unwrap() {
        c.env(e["name"].as_str().unwrap(), e["value"].as_str().unwrap());
    }
    c.env("TESSERA_LIBRARY", library)
        .env("TESSERA_PRELOAD_DIR", preload_dir)
        .env("TESSERA_PRELOAD_VERSION", version)
        .output()
        .unwrap()
}

#[test]
fn the_init_step_installs_the_library_where_the_device_plugin_mounts_it_and_never_replaces_it() {
    let Some(objects) = render(&json!({})) else {
        println!("skipped: {NO_HELM}");
        return;
    };
    let chart = AgentChart::of(&objects);
    let init = chart.init();
    // Where the init step writes is the host's preload_dir, as the agent
    // is told, under the version the agent is told.
    let preload_dir = AgentChart::env(init, "TESSERA_PRELOAD_DIR");
    assert_eq!(AgentChart::mount_path(init, "preload"), preload_dir);
    assert_eq!(
        chart.config()["kubelet"]["preload_dir"].as_str().unwrap(),
        preload_dir
    );
    let version = AgentChart::env(init, "TESSERA_PRELOAD_VERSION");
    assert_eq!(
        version,
        env!("CARGO_PKG_VERSION"),
        "the default version is the release's"
    );
    assert_eq!(
        AgentChart::env(chart.agent(), "TESSERA_PRELOAD_VERSION"),
        version
    );
    let image = init["image"].as_str().unwrap();
    assert!(image.ends_with(&format!(":{version}")), "{image}");

    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("lib");
    let source = dir.path().join("libtessera.so");
    std::fs::write(&source, b"\x7fELF library one").unwrap();
    let out = install(&chart, &source, &host, version);
    assert!(out.status.success(), "{out:?}");
    let installed = host.join(version);
    let lib = installed.join("libtessera.so");
    let list = installed.join(LD_SO_PRELOAD_FILE);
    assert_eq!(std::fs::read(&lib).unwrap(), b"\x7fELF library one");
    // The one line of /etc/ld.so.preload is where the device plugin makes
    // the library appear in the container.
    assert_eq!(
        std::fs::read_to_string(&list).unwrap(),
        format!("{CONTAINER_LIBRARY_DIR}/libtessera.so\n")
    );
    for f in [&lib, &list] {
        assert_eq!(
            std::fs::metadata(f).unwrap().permissions().mode() & 0o777,
            0o644,
            "{} must be readable by non-root containers",
            f.display()
        );
    }
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&installed),
        ["ld.so.preload", "libtessera.so"],
        "no temporary left"
    );
    let inode = std::fs::metadata(&lib).unwrap().ino();

    // A restart with the same image keeps the installed files.
    let out = install(&chart, &source, &host, version);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::metadata(&lib).unwrap().ino(), inode);

    // A different library under the same version is refused, with the
    // reason, and the installed one stays as it was (pods map it).
    std::fs::write(&source, b"\x7fELF library two").unwrap();
    let out = install(&chart, &source, &host, version);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr.contains("differs") && stderr.contains("new version"),
        "{stderr}"
    );
    assert_eq!(std::fs::metadata(&lib).unwrap().ino(), inode);
    assert_eq!(std::fs::read(&lib).unwrap(), b"\x7fELF library one");
    assert_eq!(names(&installed), ["ld.so.preload", "libtessera.so"]);

    // A new version goes to its own directory, beside the old one.
    let out = install(&chart, &source, &host, "0.2.0");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(host.join("0.2.0/libtessera.so")).unwrap(),
        b"\x7fELF library two"
    );
    assert_eq!(std::fs::read(&lib).unwrap(), b"\x7fELF library one");

    // A temporary left by an interrupted step is replaced, never taken
    // for the library.
    std::fs::create_dir_all(host.join("0.3.0")).unwrap();
    std::fs::write(host.join("0.3.0/.libtessera.so.tmp"), b"half").unwrap();
    let out = install(&chart, &source, &host, "0.3.0");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(host.join("0.3.0/libtessera.so")).unwrap(),
        b"\x7fELF library two"
    );
    assert_eq!(
        names(&host.join("0.3.0")),
        ["ld.so.preload", "libtessera.so"]
    );
    // A missing source is an error naming it, and installs nothing.
    let out = install(&chart, &dir.path().join("absent.so"), &host, "0.4.0");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.so"));
    assert!(!host.join("0.4.0/libtessera.so").exists());
    for bad in ["..", "a/b", ".hidden"] {
        let out = install(&chart, &source, &host, bad);
        assert!(!out.status.success(), "version {bad:?} accepted");
    }
}
