//! What `deploy/` ships: the GpuNode CRD, the examples, and the Helm chart.
//!
//! The chart tests render, lint and package with the Helm Go SDK through
//! its Python binding (`pip install helm-python-sdk==0.2.2`), and check
//! every rendered object against the Kubernetes 1.34 JSON schemas with
//! `kubernetes-validate==1.34.1` (both installed by `cargo xtask setup`,
//! both reached only through `tessera_testkit::helm`); without them they print
//! "skipped: helm not installed" or "skipped: kubernetes-validate not
//! installed" and pass (`cargo xtask test` fails on a skip under CI=true).
//! The others always run.
//! Every rendered chart's extender arguments are run through the built
//! `tessera-scheduler` to check that it takes them. What the agent binary
//! must accept of the chart (its config, policy, probe paths, the preload
//! init step) is tested against that binary in `agent/tests/chart_agent.rs`.
#![allow(clippy::unwrap_used)] // helpers of a test crate

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::{Value, json};
use tessera_scheduler::{manifest, resources, webhook};
use tessera_testkit::helm::{self, NO_HELM, NO_VALIDATE, render};

#[allow(dead_code)] // not every test crate uses every helper
mod support;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .collect()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn crd() -> Value {
    let docs = yaml_docs(&read("deploy/crds/gpunodes.tessera.dev.yaml"));
    assert_eq!(docs.len(), 1);
    docs.into_iter().next().unwrap()
}

/// Follows a printer column's `.a.b.c` path through the schema.
fn schema_at<'a>(schema: &'a Value, json_path: &str) -> Option<&'a Value> {
    json_path
        .trim_start_matches('.')
        .split('.')
        .try_fold(schema, |node, field| node.get("properties")?.get(field))
}

/// Every object or array node in a structural schema has a type.
fn assert_structural(node: &Value, at: &str) {
    if node.get("properties").is_some() || node.get("items").is_some() {
        assert!(node.get("type").is_some(), "{at} has no type");
    }
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            assert!(child.get("type").is_some(), "{at}.{name} has no type");
            assert_structural(child, &format!("{at}.{name}"));
        }
    }
    if let Some(items) = node.get("items") {
        assert_structural(items, &format!("{at}[]"));
    }
}

#[test]
fn gpunode_crd_is_cluster_scoped_with_a_status_subresource() {
    let crd = crd();
    assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(crd["kind"], "CustomResourceDefinition");
    let spec = &crd["spec"];
    assert_eq!(
        crd["metadata"]["name"],
        format!(
            "{}.{}",
            spec["names"]["plural"].as_str().unwrap(),
            spec["group"].as_str().unwrap()
        )
    );
    assert_eq!(spec["group"], "tessera.dev");
    assert_eq!(spec["scope"], "Cluster");
    assert_eq!(spec["names"]["kind"], "GpuNode");
    assert_eq!(spec["names"]["plural"], "gpunodes");
    let versions = spec["versions"].as_array().unwrap();
    let storage: Vec<_> = versions.iter().filter(|v| v["storage"] == true).collect();
    assert_eq!(storage.len(), 1, "exactly one storage version");
    assert_eq!(storage[0]["served"], true);
    assert_eq!(storage[0]["subresources"]["status"], json!({}));
}

#[test]
fn gpunode_status_schema_holds_devices_allocations_use_and_time() {
    let crd = crd();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    assert_structural(schema, "openAPIV3Schema");
    let status = schema_at(schema, ".status").unwrap();
    assert_eq!(status["properties"]["updatedAt"]["format"], "date-time");

    let device = &status["properties"]["devices"]["items"];
    let required: Vec<&str> = device["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for field in ["uuid", "model", "memoryMiB", "smCount", "health"] {
        assert!(
            required.contains(&field),
            "devices[].{field} must be required"
        );
    }
    for field in ["numaNode", "nvlinkPeers", "index"] {
        assert!(
            device["properties"].get(field).is_some(),
            "devices[].{field} missing"
        );
    }
    assert_eq!(
        device["properties"]["health"]["enum"],
        json!(["Healthy", "Unhealthy"])
    );
    assert_eq!(device["properties"]["nvlinkPeers"]["type"], "array");
    let uuid_pattern = device["properties"]["uuid"]["pattern"].as_str().unwrap();
    assert!(uuid_pattern.starts_with("^GPU-"));

    let allocation = &status["properties"]["allocations"]["items"]["properties"];
    for field in [
        "device",
        "namespace",
        "pod",
        "container",
        "memoryMiB",
        "coresPercent",
    ] {
        assert!(
            allocation.get(field).is_some(),
            "allocations[].{field} missing"
        );
    }
    assert_eq!(allocation["coresPercent"]["maximum"].as_f64(), Some(100.0));
    let usage = &status["properties"]["usage"]["items"]["properties"];
    for field in ["device", "memoryUsedMiB", "smUtilPercent"] {
        assert!(usage.get(field).is_some(), "usage[].{field} missing");
    }
}

#[test]
fn gpunode_printer_columns_point_into_the_schema() {
    let crd = crd();
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];
    let columns = version["additionalPrinterColumns"].as_array().unwrap();
    let names: Vec<&str> = columns
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for wanted in [
        "GPUs",
        "Healthy",
        "Model",
        "Allocated-MiB",
        "Used-MiB",
        "SM-Util",
        "Updated",
        "Age",
    ] {
        assert!(names.contains(&wanted), "no {wanted} column");
    }
    for column in columns {
        let path = column["jsonPath"].as_str().unwrap();
        if path == ".metadata.creationTimestamp" {
            continue;
        }
        let node = schema_at(schema, path).unwrap_or_else(|| panic!("{path} is not in the schema"));
        let kind = match node["type"].as_str().unwrap() {
            "string" if node["format"] == "date-time" => "date",
            other => other,
        };
        assert_eq!(column["type"], kind, "column {} type", column["name"]);
    }
}

/// The chart's files as `helm package` archives them (path below the
/// chart's folder → text); `Err(why)` when the Helm SDK is missing.
fn packaged_chart() -> Result<BTreeMap<String, String>, String> {
    Ok(helm::package()?
        .into_iter()
        .map(|(path, text)| {
            let (_chart, inside) = path.split_once('/').unwrap();
            (inside.to_owned(), text)
        })
        .collect())
}

/// What a user installs is the packaged chart, not the chart folder (whose
/// `crds/` links into `deploy/crds`): its `crds/` must hold exactly the
/// CRDs of `deploy/crds`, byte for byte.
#[test]
fn the_chart_ships_the_same_crd() {
    let Ok(packaged) = packaged_chart() else {
        println!("skipped: {NO_HELM}");
        return;
    };
    let shipped: BTreeMap<&str, &str> = packaged
        .iter()
        .filter_map(|(path, text)| Some((path.strip_prefix("crds/")?, text.as_str())))
        .collect();
    let mut ours = BTreeMap::new();
    for entry in std::fs::read_dir(repo().join("deploy/crds")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        ours.insert(name, std::fs::read_to_string(&path).unwrap());
    }
    let ours: BTreeMap<&str, &str> = ours.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert!(!ours.is_empty());
    assert_eq!(
        shipped.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>(),
        "the packaged chart's crds/ against deploy/crds"
    );
    for (name, text) in &ours {
        assert!(
            shipped[name] == *text,
            "the packaged chart's crds/{name} differs from deploy/crds/{name}"
        );
    }
}

#[test]
fn the_example_pod_is_admitted_as_the_design_describes() {
    let pods = manifest::pods_in(&read("deploy/examples/gpu-pod.yaml")).unwrap();
    assert_eq!(pods.len(), 1);
    let admitted = webhook::admit_pod(&pods[0].pod, &webhook::WebhookConfig::default()).unwrap();
    assert!(admitted.patch.is_empty(), "{:?}", admitted.patch);
    let pod = serde_json::from_value(pods[0].pod.clone()).unwrap();
    let shares = resources::pod_gpu_shares(&pod).unwrap();
    assert_eq!(shares.len(), 1);
    assert_eq!(shares[0].count, 1);
    assert_eq!(shares[0].memory, Some(resources::Memory::Mib(4000)));
    assert_eq!(shares[0].cores, Some(30));
}

#[test]
fn the_example_policy_has_defaults_and_rules() {
    let docs = yaml_docs(&read("deploy/examples/policy.yaml"));
    let policy = &docs[0];
    assert_eq!(policy["kind"], "Policy");
    let actions = ["alert", "throttle", "freeze", "kill"];
    let defaults = &policy["defaults"];
    assert!(["hard", "elastic"].contains(&defaults["computeMode"].as_str().unwrap()));
    assert!(actions.contains(&defaults["bypassAction"].as_str().unwrap()));
    assert!(actions.contains(&defaults["memoryOverageAction"].as_str().unwrap()));
    let rules = policy["rules"].as_array().unwrap();
    assert!(!rules.is_empty());
    for rule in rules {
        let matcher = &rule["match"];
        assert!(
            matcher.get("namespaces").is_some() || matcher.get("podLabels").is_some(),
            "rule {} matches nothing",
            rule["name"]
        );
    }
}

struct Rendered {
    objects: Vec<Value>,
}

impl Rendered {
    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let found = self.of_kind(kind);
        assert_eq!(found.len(), 1, "expected one {kind}");
        found[0]
    }
}

fn rendered(report: &Value) -> Rendered {
    let lint = &report["lint"];
    assert_eq!(lint["errors"], json!([]), "lint errors: {lint}");
    for message in lint["messages"].as_array().unwrap() {
        assert!(
            message["severity"].as_i64().unwrap() < 2,
            "lint warning or error: {message}"
        );
    }
    let mut objects = Vec::new();
    for (path, text) in report["manifests"].as_object().unwrap() {
        if path.ends_with(".txt") {
            continue;
        }
        for doc in yaml_docs(text.as_str().unwrap()) {
            assert!(
                doc["apiVersion"].is_string() && doc["kind"].is_string(),
                "{path}: {doc}"
            );
            assert!(
                doc["metadata"]["name"].is_string(),
                "{path}: unnamed object"
            );
            objects.push(doc);
        }
    }
    let chart = Rendered { objects };
    assert_extender_args_parse(&chart);
    chart
}

/// Runs `serve ARGS --help` with the built binary. Clap reads the
/// arguments in order, so an unknown flag or a bad value before `--help`
/// fails (exit 2) instead of printing help.
fn serve_help(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .args(args)
        .arg("--help")
        .env_remove("TESSERA_LISTEN")
        .env_remove("TESSERA_NODES")
        .env_remove("TESSERA_SCHEDULER_NAME")
        .env_remove("TESSERA_WEBHOOK_LISTEN")
        .env_remove("TESSERA_TLS_CERT")
        .env_remove("TESSERA_TLS_KEY")
        .env_remove("TESSERA_DRA")
        .output()
        .unwrap()
}

/// The extender container's rendered arguments are ones the binary takes:
/// a flag it rejects makes the container exit, and with a non-ignorable
/// extender no GPU pod schedules.
fn assert_extender_args_parse(chart: &Rendered) {
    for deployment in chart.of_kind("Deployment") {
        let containers = deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        for container in containers.iter().filter(|c| c["name"] == "extender") {
            assert!(
                container.get("command").is_none(),
                "the extender runs the image's entrypoint"
            );
            let args: Vec<&str> = container["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            let out = serve_help(&args);
            assert!(
                out.status.success(),
                "tessera-scheduler rejects the extender's rendered args {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn the_extender_args_check_catches_flags_serve_does_not_take() {
    assert!(
        serve_help(&["serve", "--listen=127.0.0.1:8888"])
            .status
            .success()
    );
    for args in [
        ["serve", "--webhook-port=9443"],
        ["serve", "--tls-cert-file=/etc/tessera/tls/tls.crt"],
        ["serve", "--listen=not-an-address"],
    ] {
        let out = serve_help(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}

#[test]
fn the_helm_chart_renders_and_lints() {
    let Ok(defaults) = render(&json!({})) else {
        println!("skipped: {NO_HELM}");
        return;
    };
    let report = defaults.unwrap();
    let chart = rendered(&report);
    let crds = report_crds(&report);
    assert_eq!(crds, ["crds/gpunodes.tessera.dev.yaml"]);

    // Agent: on by default, on the labelled GPU nodes, running the daemon
    // with its config (the rest of the agent: assert_agent_pod and
    // agent/tests/chart_agent.rs).
    let agent = chart.one("DaemonSet");
    let pod = &agent["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["nvidia.com/gpu.present"], "true");
    assert_agent_pod(pod);
    assert!(
        chart
            .of_kind("ConfigMap")
            .iter()
            .any(|m| m["data"]["agent.toml"].is_string()),
        "no agent config"
    );
    let off = rendered(
        &render(&json!({"agent": {"enabled": false}}))
            .unwrap()
            .unwrap(),
    );
    assert!(off.of_kind("DaemonSet").is_empty(), "agent.enabled=false");
    assert!(
        off.objects
            .iter()
            .all(|o| o["metadata"]["labels"]["app.kubernetes.io/component"] != "agent"),
        "agent objects rendered with agent.enabled=false"
    );

    // Scheduler: kube-scheduler plus the extender, configured for each other.
    let deployment = chart.one("Deployment");
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 2);
    let args: Vec<&str> = containers[1]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "serve");
    // Live telemetry: the GpuNode watch, not a node file, with the
    // staleness limit of the values.
    assert!(args.iter().all(|a| !a.starts_with("--nodes")), "{args:?}");
    assert!(args.contains(&"--telemetry-max-age-s=150"), "{args:?}");
    let config = scheduler_config(&chart);
    assert_eq!(config["kind"], "KubeSchedulerConfiguration");
    assert_eq!(
        config["profiles"][0]["schedulerName"],
        webhook::DEFAULT_SCHEDULER_NAME
    );
    let extender = &config["extenders"][0];
    let listen = args
        .iter()
        .find_map(|a| a.strip_prefix("--listen="))
        .unwrap();
    assert_eq!(extender["urlPrefix"], format!("http://{listen}"));
    assert_eq!(extender["filterVerb"], "filter");
    assert_eq!(extender["prioritizeVerb"], "prioritize");
    // The extender binds GPU pods by default: only its bind writes the
    // assignment the node agent's Allocate needs.
    assert_eq!(extender["bindVerb"], "bind", "bind is on by default");
    assert_eq!(extender["nodeCacheCapable"], true);
    let managed: Vec<&str> = extender["managedResources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["ignoredByScheduler"], true);
            r["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(managed, resources::ALL);
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
    ] {
        assert!(!chart.of_kind(kind).is_empty(), "no {kind}");
    }
    assert_eq!(chart.of_kind("MutatingWebhookConfiguration").len(), 1);
}

/// The rules of the agent's ClusterRole that name `resource`.
fn agent_rules<'a>(chart: &'a Rendered, resource: &str) -> Vec<&'a Value> {
    chart
        .of_kind("ClusterRole")
        .into_iter()
        .filter(|r| r["metadata"]["labels"]["app.kubernetes.io/component"] == "agent")
        .flat_map(|r| r["rules"].as_array().unwrap())
        .filter(|rule| {
            rule["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == resource)
        })
        .collect()
}

fn verbs(rules: &[&Value]) -> Vec<String> {
    let mut v: Vec<String> = rules
        .iter()
        .flat_map(|r| r["verbs"].as_array().unwrap())
        .map(|x| x.as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

/// DRA mode is off by default; on, it adds the driver's DeviceClass and
/// what the driver needs of the API (its slice, the claims, its node),
/// and nothing of it otherwise.
#[test]
fn the_helm_chart_dra_mode_ships_the_device_class_and_the_driver_rbac() {
    let Ok(defaults) = render(&json!({})) else {
        println!("skipped: {NO_HELM}");
        return;
    };
    let off = rendered(&defaults.unwrap());
    assert!(off.of_kind("DeviceClass").is_empty());
    assert!(agent_rules(&off, "resourceslices").is_empty());
    assert!(agent_rules(&off, "nodes").is_empty());

    let on = rendered(&render(&json!({"dra": {"enabled": true}})).unwrap().unwrap());
    let class = on.one("DeviceClass");
    assert_eq!(class["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(class["metadata"]["name"], "gpu.tessera.dev");
    assert!(
        class["metadata"].get("namespace").is_none(),
        "cluster-scoped"
    );
    assert_eq!(
        class["spec"]["selectors"],
        json!([{"cel": {"expression": "device.driver == \"gpu.tessera.dev\""}}])
    );
    let slices = agent_rules(&on, "resourceslices");
    assert!(
        slices
            .iter()
            .all(|r| r["apiGroups"] == json!(["resource.k8s.io"]))
    );
    assert_eq!(
        verbs(&slices),
        [
            "create", "delete", "get", "list", "patch", "update", "watch"
        ]
    );
    let claims = agent_rules(&on, "resourceclaims");
    assert!(
        claims
            .iter()
            .all(|r| r["apiGroups"] == json!(["resource.k8s.io"]))
    );
    assert_eq!(verbs(&claims), ["get", "list", "watch"]);
    assert_eq!(verbs(&agent_rules(&on, "nodes")), ["get"]);
    // The device plugin's objects stay (both modes serve the node).
    assert_eq!(on.of_kind("DaemonSet").len(), 1);
    assert_eq!(on.of_kind("Deployment").len(), 1);

    let no_class = rendered(
        &render(&json!({"dra": {"enabled": true, "deviceClass": false}}))
            .unwrap()
            .unwrap(),
    );
    assert!(no_class.of_kind("DeviceClass").is_empty());
    assert_eq!(
        verbs(&agent_rules(&no_class, "resourceclaims")),
        ["get", "list", "watch"]
    );
}

/// The rules of the scheduler's ClusterRole that name `resource`.
fn scheduler_rules<'a>(chart: &'a Rendered, resource: &str) -> Vec<&'a Value> {
    chart
        .of_kind("ClusterRole")
        .into_iter()
        .filter(|r| r["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler")
        .flat_map(|r| r["rules"].as_array().unwrap())
        .filter(|rule| {
            rule["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == resource)
        })
        .collect()
}

/// DRA mode turns the webhook's DRA mode on: `serve --dra` (which the
/// binary takes: `rendered` runs the arguments), `get` and `create` of
/// ResourceClaimTemplates for the scheduler's account, and
/// `sideEffects: NoneOnDryRun` (the webhook makes templates, never on a
/// dry run); none of it otherwise, nor without the webhook.
#[test]
fn the_helm_chart_dra_mode_lets_the_webhook_make_claim_templates() {
    let Ok(defaults) = render(&json!({})) else {
        println!("skipped: {NO_HELM}");
        return;
    };
    let side_effects = |chart: &Rendered| {
        chart.one("MutatingWebhookConfiguration")["webhooks"][0]["sideEffects"].clone()
    };
    let dra_flag = |chart: &Rendered| {
        extender_container(chart)["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--dra")
    };

    let off = rendered(&defaults.unwrap());
    assert!(!dra_flag(&off));
    assert!(scheduler_rules(&off, "resourceclaimtemplates").is_empty());
    assert_eq!(side_effects(&off), "None");

    let on = rendered(&render(&json!({"dra": {"enabled": true}})).unwrap().unwrap());
    assert!(dra_flag(&on), "{}", extender_container(&on)["args"]);
    let rules = scheduler_rules(&on, "resourceclaimtemplates");
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["apiGroups"], json!(["resource.k8s.io"]));
    assert_eq!(rules[0]["resources"], json!(["resourceclaimtemplates"]));
    assert_eq!(verbs(&rules), ["create", "get"]);
    assert_eq!(side_effects(&on), "NoneOnDryRun");
    // The agent's role gains nothing of it.
    assert!(agent_rules(&on, "resourceclaimtemplates").is_empty());

    let no_webhook = rendered(
        &render(&json!({"dra": {"enabled": true}, "webhook": {"enabled": false}}))
            .unwrap()
            .unwrap(),
    );
    assert!(!dra_flag(&no_webhook));
    assert!(scheduler_rules(&no_webhook, "resourceclaimtemplates").is_empty());
    assert!(
        no_webhook
            .of_kind("MutatingWebhookConfiguration")
            .is_empty()
    );
}

fn report_crds(report: &Value) -> Vec<String> {
    serde_json::from_value(report["crds"].clone()).unwrap()
}

fn scheduler_config(chart: &Rendered) -> Value {
    let maps: Vec<&Value> = chart
        .of_kind("ConfigMap")
        .into_iter()
        .filter(|m| m["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler")
        .collect();
    assert_eq!(maps.len(), 1, "one scheduler ConfigMap");
    let map = maps[0];
    let text = map["data"]["config.yaml"].as_str().unwrap();
    yaml_docs(text).into_iter().next().unwrap()
}

#[test]
fn the_helm_chart_leaves_binding_to_kube_scheduler_only_when_asked() {
    let values = json!({"scheduler": {"extender": {"bind": false}}});
    let Ok(report) = render(&values) else {
        println!("skipped: {NO_HELM}");
        return;
    };
    let chart = rendered(&report.unwrap());
    assert!(
        scheduler_config(&chart)["extenders"][0]
            .get("bindVerb")
            .is_none()
    );
}

fn skip_no_helm() {
    println!("skipped: {NO_HELM}");
}

/// The extender container of the rendered scheduler Deployment.
fn extender_container(chart: &Rendered) -> &Value {
    let containers = chart.one("Deployment")["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    containers.iter().find(|c| c["name"] == "extender").unwrap()
}

fn arg<'a>(container: &'a Value, flag: &str) -> Option<&'a str> {
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str().unwrap().strip_prefix(&format!("--{flag}=")))
}

fn b64(text: &Value) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.as_str().unwrap())
        .unwrap()
}

/// The wiring between the webhook configuration, the Service, the
/// extender's HTTPS listener and the mounted secret; returns the secret's
/// name and the file paths the extender reads.
fn assert_webhook_wired(chart: &Rendered) -> (String, String, String) {
    let hook = &chart.one("MutatingWebhookConfiguration")["webhooks"][0];
    assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(hook["sideEffects"], "None");
    let rules = &hook["rules"][0];
    assert_eq!(rules["operations"], json!(["CREATE"]));
    assert_eq!(rules["resources"], json!(["pods"]));
    let excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"].clone();
    assert!(
        excluded
            .as_array()
            .unwrap()
            .contains(&json!("tessera-system"))
    );
    let target = &hook["clientConfig"]["service"];
    assert_eq!(target["path"], "/webhook");
    assert_eq!(target["namespace"], "tessera-system");
    let service = chart.one("Service");
    assert_eq!(service["metadata"]["name"], target["name"]);
    let port = &service["spec"]["ports"][0];
    assert_eq!(port["port"], target["port"]);
    let container = extender_container(chart);
    let named = &container["ports"][0];
    assert_eq!(named["name"], port["targetPort"]);
    let listen = arg(container, "webhook-listen").unwrap();
    assert_eq!(
        listen,
        format!("0.0.0.0:{}", named["containerPort"]),
        "the webhook listens on the port the Service targets"
    );
    assert_eq!(container["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
    assert_eq!(
        container["readinessProbe"]["httpGet"]["port"],
        named["name"]
    );
    // The certificate files are in the mounted secret.
    let mount = &container["volumeMounts"][0];
    let dir = mount["mountPath"].as_str().unwrap();
    let (cert, key) = (
        arg(container, "tls-cert").unwrap(),
        arg(container, "tls-key").unwrap(),
    );
    assert_eq!(cert, format!("{dir}/tls.crt"));
    assert_eq!(key, format!("{dir}/tls.key"));
    let volumes = chart.one("Deployment")["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
    let secret = volume["secret"]["secretName"].as_str().unwrap().to_owned();
    (secret, cert.to_owned(), key.to_owned())
}

/// On by default with a certificate the chart generates: the real
/// `tessera-scheduler serve` loads the generated pair, and a client that
/// trusts only the rendered caBundle verifies it under the Service's DNS
/// name, the name the API server checks.
#[test]
fn the_webhook_is_on_by_default_with_a_generated_certificate_that_serves() {
    let Ok(report) = render(&json!({})) else {
        return skip_no_helm();
    };
    let chart = rendered(&report.unwrap());
    let (secret_name, _, _) = assert_webhook_wired(&chart);
    let secret = chart.one("Secret");
    assert_eq!(secret["metadata"]["name"], secret_name.as_str());
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let hook = &chart.one("MutatingWebhookConfiguration")["webhooks"][0];
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);

    let dir = std::env::temp_dir().join(format!("tessera-chart-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), b64(&secret["data"]["tls.crt"])).unwrap();
    std::fs::write(dir.join("tls.key"), b64(&secret["data"]["tls.key"])).unwrap();
    let server = support::Server::start(&dir.join("tls.crt"), &dir.join("tls.key"), &[]);
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let ca = CertificateDer::from_pem_slice(&b64(&hook["clientConfig"]["caBundle"])).unwrap();
    let service = &hook["clientConfig"]["service"];
    let host = format!(
        "{}.{}.svc",
        service["name"].as_str().unwrap(),
        service["namespace"].as_str().unwrap()
    );
    let mut tls = support::connect(support::client_config(ca), &server.webhook, &host);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"limits": {"nvidia.com/gpumem": "4k"}}}]}});
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "namespace": "ml", "object": pod}});
    let (status, body) =
        support::exchange(&mut tls, "POST", "/webhook", review.to_string().as_bytes());
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["uid"], "u-1");
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
}

#[test]
fn the_webhook_takes_an_operator_secret_or_cert_manager_or_can_be_off() {
    // The operator's own secret, signed by the CA they give.
    let values = json!({"webhook": {"tls": {"caBundle": "Q0E=", "secretName": "my-tls"}}});
    let Ok(report) = render(&values) else {
        return skip_no_helm();
    };
    let chart = rendered(&report.unwrap());
    let (secret, _, _) = assert_webhook_wired(&chart);
    assert_eq!(secret, "my-tls");
    assert!(
        chart.of_kind("Secret").is_empty(),
        "the operator's secret is not rendered"
    );
    let hook = &chart.one("MutatingWebhookConfiguration");
    assert_eq!(hook["webhooks"][0]["clientConfig"]["caBundle"], "Q0E=");
    assert!(hook["metadata"].get("annotations").is_none());

    // cert-manager issues the mounted secret for the Service's names and
    // injects the CA.
    let values = json!({"webhook": {"certManager": {"enabled": true}}});
    let chart = rendered(&render(&values).unwrap().unwrap());
    let (secret, _, _) = assert_webhook_wired(&chart);
    assert!(chart.of_kind("Secret").is_empty());
    let certificate = chart.one("Certificate");
    assert_eq!(certificate["spec"]["secretName"], secret.as_str());
    let hook = chart.one("MutatingWebhookConfiguration");
    let service = &hook["webhooks"][0]["clientConfig"]["service"];
    let host = format!(
        "{}.{}.svc",
        service["name"].as_str().unwrap(),
        service["namespace"].as_str().unwrap()
    );
    assert!(
        certificate["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&json!(host))
    );
    assert_eq!(
        hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!(
            "tessera-system/{}",
            certificate["metadata"]["name"].as_str().unwrap()
        )
    );
    assert!(
        hook["webhooks"][0]["clientConfig"]
            .get("caBundle")
            .is_none()
    );
    assert_eq!(chart.one("Issuer")["spec"]["selfSigned"], json!({}));

    // Both at once is refused, naming both.
    let values =
        json!({"webhook": {"certManager": {"enabled": true}, "tls": {"caBundle": "Q0E="}}});
    let error = render(&values).unwrap().unwrap_err();
    assert!(
        error.contains("webhook.tls.caBundle and webhook.certManager.enabled are both set"),
        "{error}"
    );

    // Off: no webhook objects, no HTTPS listener.
    for values in [
        json!({"webhook": {"enabled": false}}),
        json!({"scheduler": {"enabled": false}}),
    ] {
        let chart = rendered(&render(&values).unwrap().unwrap());
        for kind in [
            "MutatingWebhookConfiguration",
            "Service",
            "Secret",
            "Certificate",
        ] {
            assert!(chart.of_kind(kind).is_empty(), "{values}: {kind}");
        }
        if let Some(deployment) = chart.of_kind("Deployment").first() {
            let containers = &deployment["spec"]["template"]["spec"]["containers"];
            let extender = containers
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == "extender");
            assert!(arg(extender.unwrap(), "webhook-listen").is_none());
        }
    }
}

/// The agent pod: the privileges it needs and the Kubernetes rules around
/// them (which the JSON schemas do not encode), its host paths, probes and
/// metrics port.
fn assert_agent_pod(pod: &Value) {
    let flag = |v: &Value| v.as_bool().unwrap_or(false);
    // Host PID for /proc/<pid>/cgroup of NVML's pids; nothing else shared.
    assert_eq!(pod["hostPID"], true);
    assert!(
        !flag(&pod["hostNetwork"]),
        "the agent needs no host network"
    );
    assert!(!flag(&pod["hostIPC"]), "the agent needs no host IPC");
    // It reads and patches pods through the API, so it keeps its token.
    assert_ne!(pod["automountServiceAccountToken"], false);

    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let agent = &containers[0];
    let all: Vec<&Value> = containers
        .iter()
        .chain(pod["initContainers"].as_array().into_iter().flatten())
        .collect();
    for c in &all {
        let security = &c["securityContext"];
        let privileged = flag(&security["privileged"]);
        let mounts = c["volumeMounts"].as_array().unwrap();
        // Kubernetes: "Bidirectional mount propagation is available only
        // to privileged containers" (pod validation).
        for m in mounts {
            if m["mountPropagation"] == "Bidirectional" {
                assert!(
                    privileged,
                    "{}: Bidirectional without privileged",
                    c["name"]
                );
            }
        }
        // Kubernetes: allowPrivilegeEscalation false cannot go with
        // privileged true.
        if privileged {
            assert_ne!(security["allowPrivilegeEscalation"], false, "{}", c["name"]);
        }
        assert_eq!(security["readOnlyRootFilesystem"], true, "{}", c["name"]);
    }
    // The agent is privileged only because of the rule above: it has the
    // Bidirectional bpffs mount, and adds no capability on top (privileged
    // has them all).
    let bidirectional: Vec<&str> = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["mountPropagation"] == "Bidirectional")
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(bidirectional, ["/sys/fs/bpf"]);
    assert_eq!(agent["securityContext"]["privileged"], true);
    assert!(agent["securityContext"]["capabilities"].is_null());
    assert_eq!(
        agent["args"],
        json!(["run", "--config", "/etc/tessera/agent.toml"])
    );
    // The init step copies a file into one host directory: no privilege,
    // no capability.
    let init = &pod["initContainers"][0];
    assert_eq!(init["name"], "install-preload");
    assert_eq!(init["securityContext"]["privileged"], false);
    assert_eq!(init["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(
        init["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );

    // Host paths: exactly those of ARCHITECTURE.md, "Host paths", each where the agent
    // expects it (the same path as on the host, since the paths given to
    // kubelet are host paths; bpffs and cgroup where the kernel's are).
    let volumes: BTreeMap<&str, &Value> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    let host: BTreeMap<&str, &str> = volumes
        .iter()
        .filter_map(|(name, v)| Some((*name, v["hostPath"]["path"].as_str()?)))
        .collect();
    let expected: BTreeMap<&str, &str> = [
        ("state", "/var/lib/tessera"),
        ("preload", "/var/lib/tessera/lib"),
        ("device-plugins", "/var/lib/kubelet/device-plugins"),
        ("pod-resources", "/var/lib/kubelet/pod-resources"),
        ("bpffs", "/sys/fs/bpf"),
        ("cgroup", "/sys/fs/cgroup"),
    ]
    .into();
    assert_eq!(host, expected, "the agent's host paths");
    for c in &all {
        for m in c["volumeMounts"].as_array().unwrap() {
            let name = m["name"].as_str().unwrap();
            if let Some(path) = host.get(name) {
                assert_eq!(m["mountPath"], *path, "{}: mount of {name}", c["name"]);
            }
        }
    }
    let init_host: Vec<&str> = init["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        init_host,
        ["preload"],
        "the init step sees only the library directory"
    );
    let pod_resources = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "pod-resources")
        .unwrap();
    assert_eq!(pod_resources["readOnly"], true);
    assert!(volumes["config"]["configMap"]["name"].is_string());

    // Probes: the named metrics port; liveness and startup on /healthz,
    // readiness on /readyz (that the agent answers them:
    // agent/tests/chart_agent.rs); at least a minute for NVML to start.
    let ports = agent["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["name"], "metrics");
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ] {
        let get = &agent[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], "metrics", "{probe}");
    }
    let startup = &agent["startupProbe"];
    let allowance =
        startup["periodSeconds"].as_u64().unwrap() * startup["failureThreshold"].as_u64().unwrap();
    assert!(allowance >= 60, "startup allowance {allowance} s");
}

/// The agent's ClusterRole: pods get/list/watch/patch and its GpuNode,
/// nothing more (no wildcard, no secrets, no nodes, no events).
#[test]
fn the_agent_role_grants_what_the_agent_calls_and_no_more() {
    let Ok(report) = render(&json!({})) else {
        println!("skipped: {NO_HELM}");
        return;
    };
    let chart = rendered(&report.unwrap());
    let roles: Vec<&Value> = chart
        .of_kind("ClusterRole")
        .into_iter()
        .filter(|r| r["metadata"]["labels"]["app.kubernetes.io/component"] == "agent")
        .collect();
    assert_eq!(roles.len(), 1);
    let mut granted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for rule in roles[0]["rules"].as_array().unwrap() {
        for resource in rule["resources"].as_array().unwrap() {
            let verbs = granted
                .entry(resource.as_str().unwrap().to_owned())
                .or_default();
            for verb in rule["verbs"].as_array().unwrap() {
                verbs.push(verb.as_str().unwrap().to_owned());
            }
            verbs.sort();
        }
    }
    let expected: BTreeMap<String, Vec<String>> = [
        ("pods", vec!["get", "list", "patch", "watch"]),
        ("gpunodes", vec!["create", "get", "list", "patch", "watch"]),
        ("gpunodes/status", vec!["get", "patch", "update"]),
    ]
    .into_iter()
    .map(|(r, v)| (r.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(granted, expected);
    let binding = chart
        .of_kind("ClusterRoleBinding")
        .into_iter()
        .find(|b| b["roleRef"]["name"] == roles[0]["metadata"]["name"])
        .unwrap();
    let daemonset = chart.one("DaemonSet");
    assert_eq!(
        binding["subjects"][0]["name"],
        daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    );
}

/// The report's schema check, or `None` (skip) when kubernetes-validate
/// is not installed.
fn schema_errors(report: &Value) -> Option<Vec<String>> {
    let validation = &report["validation"];
    if validation.is_null() {
        return None;
    }
    assert_eq!(validation["version"], "1.34.0");
    // Every rendered object was checked, and the CRD.
    let checked = validation["objects"].as_array().unwrap().len();
    let rendered_objects: usize = report["objects"].as_array().unwrap().len();
    assert_eq!(checked, rendered_objects + report_crds(report).len());
    Some(serde_json::from_value(validation["errors"].clone()).unwrap())
}

/// Every object the chart renders, for the defaults and value sets that
/// turn each part on and off or change it, is valid against the
/// Kubernetes 1.34 schemas (strict: an unknown or misplaced field is an
/// error); a value set with a bad field shows the check fails.
#[test]
fn every_rendered_object_validates_against_the_kubernetes_schemas() {
    let value_sets = [
        json!({}),
        json!({"agent": {"enabled": false}}),
        json!({"scheduler": {"enabled": false}}),
        json!({"scheduler": {"extender": {"bind": true, "ignorable": true}, "replicas": 2}}),
        json!({"webhook": {"enabled": false}}),
        json!({"webhook": {"tls": {"caBundle": "Q0E=", "secretName": "my-tls"}, "port": 8443,
                           "failurePolicy": "Fail", "excludeNamespaces": []}}),
        json!({
            "image": {"registry": "registry.example.com/tessera/", "tag": "0.2.0-rc1", "pullPolicy": "Always"},
            "imagePullSecrets": [{"name": "regcred"}],
            "agent": {
                "runtimeClassName": "nvidia",
                "prometheusScrape": true,
                "podAnnotations": {"example.com/team": "gpu"},
                "metricsPort": 9500,
                "startupSeconds": 300,
                "nodeSelector": {"nvidia.com/gpu.present": null, "example.com/gpu": "shared"},
                "tolerations": [],
                "resources": {},
                "hostPaths": {"state": "/data/tessera", "devicePlugins": "/data/kubelet/device-plugins",
                              "podResources": "/data/kubelet/pod-resources"},
            },
        }),
        json!({"dra": {"enabled": true}}),
    ];
    for values in &value_sets {
        let Ok(report) = render(values) else {
            println!("skipped: {NO_HELM}");
            return;
        };
        let report = report.unwrap();
        rendered(&report);
        let Some(errors) = schema_errors(&report) else {
            println!("skipped: {NO_VALIDATE}");
            return;
        };
        assert!(errors.is_empty(), "values {values}: {errors:#?}");
    }

    let rich = rendered(&render(&value_sets[6]).unwrap().unwrap());
    let template = &rich.one("DaemonSet")["spec"]["template"];
    let annotations = &template["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "9500");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    assert_eq!(annotations["example.com/team"], "gpu");
    let pod = &template["spec"];
    assert_eq!(pod["runtimeClassName"], "nvidia");
    assert_eq!(pod["nodeSelector"], json!({"example.com/gpu": "shared"}));
    assert_eq!(
        pod["containers"][0]["image"],
        "registry.example.com/tessera/tessera-agent:0.2.0-rc1"
    );
    assert_eq!(pod["containers"][0]["ports"][0]["containerPort"], 9500);
    let mounts: Vec<&str> = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    for path in [
        "/data/tessera",
        "/data/kubelet/device-plugins",
        "/data/kubelet/pod-resources",
    ] {
        assert!(mounts.contains(&path), "{path} not mounted: {mounts:?}");
    }
    let startup = &pod["containers"][0]["startupProbe"];
    assert_eq!(
        startup["periodSeconds"].as_u64().unwrap() * startup["failureThreshold"].as_u64().unwrap(),
        300
    );
    let env = pod["initContainers"][0]["env"].as_array().unwrap();
    let version = env
        .iter()
        .find(|e| e["name"] == "TESSERA_PRELOAD_VERSION")
        .unwrap();
    assert_eq!(
        version["value"], "0.2.0-rc1",
        "the library version is the image tag"
    );
    // Without a scrape request, no scrape annotations.
    let plain = rendered(&render(&json!({})).unwrap().unwrap());
    assert!(
        plain.one("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
            .get("prometheus.io/scrape")
            .is_none()
    );

    // The check can fail: a field the schema does not know.
    let bad = json!({"agent": {"tolerations": [{"key": "x", "operator": "Exists", "efect": "NoSchedule"}]}});
    let report = render(&bad).unwrap().unwrap();
    let errors = schema_errors(&report).unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("DaemonSet/") && e.contains("efect")),
        "{errors:#?}"
    );
}
