//! The GpuNode writer against a scripted fake API server (tower-test):
//! the requests it sends (method, path, query, content type, body decoded
//! as a `GpuNode`), when it sends them (tokio's paused clock, so times are
//! exact), and what it does with errors.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use tessera_agent::containers::Metadata;
use tessera_agent::containers::meta::{GpuGrant, META_VERSION};
use tessera_agent::control::Mode;
use tessera_agent::gpu::{Health as GpuHealth, Inventory, InventoryGpu};
use tessera_agent::policy::{Action, Effective};
use tessera_agent::telemetry::{self, Settings, TelemetryFile};
use tessera_agent::view::status::Status;
use tessera_agent::view::{ContainerView, DeviceView, EnforcementView, GpuView, View};
use tessera_api::gpunode::{ComputeMode, GpuNode, Health};
use tessera_testkit::apiserver::{self, Call, Handle, Reply};
use tokio::sync::watch;
use tokio::time::Instant;

const NODE: &str = "gpu-node-1";
const PATH: &str = "/apis/tessera.dev/v1alpha1/gpunodes";
const MIB: u64 = 1 << 20;

fn gpu(i: u32) -> String {
    format!("GPU-00000000-0000-0000-0000-{i:012x}")
}

fn inventory() -> Inventory {
    Inventory {
        driver_version: "550.54.15".into(),
        cuda_driver_version: 12040,
        gpus: (0..2)
            .map(|i| InventoryGpu {
                index: i,
                uuid: gpu(i),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_mib: Some(81559),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i * 0x10),
                numa_node: Some(0),
                sm_count: Some(132),
                compute_capability: Some("9.0".into()),
                nvlink_peers: vec![1 - i],
                mig_enabled: Some(false),
                health: GpuHealth::Healthy,
            })
            .collect(),
    }
}

/// A pod's container with `mib` MiB and `sm` % on GPU 0.
fn pod(name: &str, mib: u64, sm: u32) -> ContainerView {
    let meta = Metadata {
        version: META_VERSION,
        namespace: Some("ml".into()),
        pod: Some(name.into()),
        container: Some("main".into()),
        claim: None,
        pod_uid: Some(format!("uid-{name}")),
        cgroup: None,
        sm_target: sm,
        mode: Some(Mode::Hard),
        priority: None,
        labels: BTreeMap::new(),
        fail_open: false,
        gpus: vec![GpuGrant {
            uuid: gpu(0),
            memory_limit_bytes: Some(mib * MIB),
            context_overhead_bytes: 0,
        }],
    };
    ContainerView {
        id: format!("id-{name}"),
        dir: format!("/var/lib/tessera/containers/id-{name}").into(),
        meta: Arc::new(meta),
        epoch: 1,
        since_period: Some(0),
        gpus: vec![GpuView {
            uuid: gpu(0),
            memory_limit_bytes: Some(mib * MIB),
            ..GpuView::default()
        }],
        processes: Vec::new(),
        problems: Vec::new(),
        policy: Effective {
            mode: Mode::Hard,
            priority: 0,
            bypass_action: Action::Alert,
            memory_overage_action: Action::Alert,
            compute_overage_action: Action::Throttle,
            rule: None,
        },
        ebpf: None,
        enforcement: EnforcementView::default(),
    }
}

/// A period: GPU 0 with `used_mib` in use at `sm` %, GPU 1 idle.
fn view(period: u64, pods: Vec<ContainerView>, used_mib: u64, sm: f64) -> Arc<View> {
    let dev = |i: u32, used: u64, sm| DeviceView {
        index: i,
        uuid: gpu(i),
        memory_used_bytes: Some(used * MIB),
        memory_total_bytes: Some(81559 * MIB),
        sm_percent: Some(sm),
        healthy: true,
    };
    Arc::new(View {
        period,
        nvml: "ready".into(),
        devices: vec![dev(0, used_mib, sm), dev(1, 0, 0.0)],
        containers: pods.into_iter().map(Arc::new).collect(),
        ..View::default()
    })
}

struct Fake {
    handle: Handle,
    status: Arc<Status>,
    t0: Instant,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn start(interval_ms: u64, heartbeat_ms: u64) -> Fake {
    let (client, handle) = apiserver::pair();
    let status = Arc::new(Status::new(Duration::from_secs(5)));
    status.tick_done(view(1, vec![pod("a", 20_000, 30)], 5000, 41.0));
    let settings = Settings::new(&TelemetryFile {
        enabled: Some(true),
        interval_ms: Some(interval_ms),
        heartbeat_ms: Some(heartbeat_ms),
    })
    .expect("settings");
    let (stop, mut rx) = watch::channel(false);
    let task = telemetry::spawn(
        settings,
        NODE.into(),
        client,
        &inventory(),
        status.clone(),
        async move {
            let _ = rx.wait_for(|s| *s).await;
        },
    )
    .expect("spawn");
    Fake {
        handle,
        status,
        t0: Instant::now(),
        stop,
        task,
    }
}

/// One request the writer sent.
struct Seen {
    at: Duration,
    method: Method,
    path: String,
    query: BTreeMap<String, String>,
    content_type: Option<String>,
    body: Vec<u8>,
    reply: Reply,
}

impl Seen {
    fn object(&self) -> GpuNode {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body of {} {} is no GpuNode: {e}: {}",
                self.method,
                self.path,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn respond(self, code: StatusCode, body: serde_json::Value) {
        self.reply.send_response(apiserver::json(code, &body));
    }

    /// The object as the API server would return it after this request.
    fn echo(self, code: StatusCode) {
        let mut v: serde_json::Value = serde_json::from_slice(&self.body).expect("json body");
        v["metadata"]["uid"] = "8d2f6c3e-1b7a-4d7e-9c1e-2b5f0a9e4c11".into();
        v["metadata"]["resourceVersion"] = "4711".into();
        v["metadata"]["creationTimestamp"] = "2026-12-01T15:00:00Z".into();
        self.respond(code, v);
    }

    fn fail(self, code: u16, reason: &str) {
        let code = StatusCode::from_u16(code).expect("status code");
        let mut status = apiserver::status_object(
            code,
            reason,
            &format!("gpunodes.tessera.dev \"{NODE}\": {reason}"),
        );
        status["details"] =
            serde_json::json!({"name": NODE, "group": "tessera.dev", "kind": "gpunodes"});
        self.respond(code, status);
    }
}

impl Fake {
    async fn next(&mut self) -> Seen {
        let (req, reply) = self.handle.next_request().await.expect("a request");
        let at = self.t0.elapsed();
        let call = Call::read(req).await;
        Seen {
            at,
            query: call.query_pairs(),
            method: call.method,
            path: call.path,
            content_type: call.content_type,
            body: call.body,
            reply,
        }
    }

    async fn expect(&mut self, method: Method, path: &str, at_s: u64) -> Seen {
        let seen = self.next().await;
        assert_eq!(
            (&seen.method, seen.path.as_str(), seen.at),
            (&method, path, Duration::from_secs(at_s)),
            "request (method, path, time since start)"
        );
        seen
    }

    /// The first write: read (404), create (201), status apply (200).
    async fn created(&mut self) -> GpuNode {
        self.expect(Method::GET, &format!("{PATH}/{NODE}"), 0)
            .await
            .fail(404, "NotFound");
        let create = self.expect(Method::POST, PATH, 0).await;
        let object = create.object();
        assert_eq!(object.metadata.name.as_deref(), Some(NODE));
        assert!(object.status.is_none(), "create carries no status");
        create.echo(StatusCode::CREATED);
        self.status_apply(0).await
    }

    /// A status apply at `at_s`, answered 200; its body.
    async fn status_apply(&mut self, at_s: u64) -> GpuNode {
        let patch = self
            .expect(Method::PATCH, &format!("{PATH}/{NODE}/status"), at_s)
            .await;
        assert_eq!(
            patch.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        assert_eq!(
            patch.query.get("fieldManager").map(String::as_str),
            Some("tessera-agent")
        );
        assert_eq!(patch.query.get("force").map(String::as_str), Some("true"));
        let object = patch.object();
        patch.echo(StatusCode::OK);
        object
    }

    /// Asserts no request comes before `at_s` (the clock runs on to it).
    async fn quiet_until(&mut self, at_s: u64) {
        let until = self.t0 + Duration::from_secs(at_s);
        tokio::select! {
            r = self.handle.next_request() => {
                let (req, _) = r.expect("a request");
                panic!(
                    "unexpected {} {} at {:?}",
                    req.method(),
                    req.uri(),
                    self.t0.elapsed()
                );
            }
            () = tokio::time::sleep_until(until) => {}
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.expect("writer task");
    }
}

#[tokio::test(start_paused = true)]
async fn creates_the_object_then_applies_its_status() {
    let mut fake = start(10_000, 60_000);
    let written = fake.created().await;
    assert_eq!(written.metadata.name.as_deref(), Some(NODE));
    let s = written.status.expect("status");
    let uuids: Vec<String> = s.devices.iter().map(|d| d.uuid.to_string()).collect();
    assert_eq!(uuids, [gpu(0), gpu(1)]);
    assert!(s.devices.iter().all(|d| d.model == "NVIDIA H100 80GB HBM3"
        && d.memory_mib == 81559
        && d.sm_count == 132
        && d.numa_node == Some(0)
        && d.health == Health::Healthy));
    assert_eq!(s.devices[0].nvlink_peers, [s.devices[1].uuid]);
    assert_eq!(s.allocations.len(), 1);
    let a = &s.allocations[0];
    assert_eq!(
        (
            a.device.to_string(),
            a.namespace.as_str(),
            a.pod.as_str(),
            a.container.as_str(),
            a.pod_uid.as_deref(),
            a.memory_mib,
            a.cores_percent,
            a.compute_mode
        ),
        (
            gpu(0),
            "ml",
            "a",
            "main",
            Some("uid-a"),
            20_000,
            30,
            Some(ComputeMode::Hard)
        )
    );
    // 5000 MiB -> 5120 (steps of 256), 41 % -> 40 (steps of 5).
    let u0 = &s.usage[0];
    assert_eq!((u0.memory_used_mib, u0.sm_util_percent), (5120, 40));
    assert_eq!(
        (
            s.summary.gpus,
            s.summary.healthy_gpus,
            s.summary.memory_mib,
            s.summary.allocated_memory_mib,
            s.summary.used_memory_mib,
            s.summary.sm_util_percent,
            s.summary.pods
        ),
        (2, 2, 2 * 81559, 20_000, 5120, 20, 1)
    );
    fake.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unchanged_view_is_written_only_by_the_heartbeat() {
    let mut fake = start(10_000, 60_000);
    let first = fake.created().await.status.expect("status");
    // New periods whose live use moves by less than one step.
    for (t, mib, sm) in [(5, 5100, 42.0), (25, 5200, 39.0), (45, 5050, 43.5)] {
        tokio::time::sleep_until(fake.t0 + Duration::from_secs(t)).await;
        fake.status
            .tick_done(view(t, vec![pod("a", 20_000, 30)], mib, sm));
    }
    fake.quiet_until(59).await;
    let beat = fake.status_apply(60).await.status.expect("status");
    assert!(
        beat.updated_at.0 >= first.updated_at.0,
        "the heartbeat carries a fresh timestamp"
    );
    assert_eq!(
        (&beat.allocations, &beat.usage, &beat.summary),
        (&first.allocations, &first.usage, &first.summary)
    );
    fake.quiet_until(119).await;
    fake.status_apply(120).await;
    fake.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_change_is_written_within_one_interval_and_at_most_once_per_interval() {
    let mut fake = start(10_000, 60_000);
    fake.created().await;
    tokio::time::sleep_until(fake.t0 + Duration::from_secs(15)).await;
    fake.status.tick_done(view(
        15,
        vec![pod("a", 20_000, 30), pod("b", 8_192, 25)],
        5000,
        41.0,
    ));
    fake.quiet_until(19).await;
    let s = fake.status_apply(20).await.status.expect("status");
    let pods: Vec<&str> = s.allocations.iter().map(|a| a.pod.as_str()).collect();
    assert_eq!(pods, ["a", "b"]);
    assert_eq!(s.summary.allocated_memory_mib, 28_192);
    // Two changes within one interval: one write, of the later view.
    tokio::time::sleep_until(fake.t0 + Duration::from_secs(21)).await;
    fake.status
        .tick_done(view(21, vec![pod("b", 8_192, 25)], 5000, 41.0));
    tokio::time::sleep_until(fake.t0 + Duration::from_secs(25)).await;
    fake.status.tick_done(view(25, vec![], 9000, 80.0));
    fake.quiet_until(29).await;
    let s = fake.status_apply(30).await.status.expect("status");
    assert!(s.allocations.is_empty(), "{:?}", s.allocations);
    assert_eq!(
        (s.usage[0].memory_used_mib, s.usage[0].sm_util_percent),
        (8960, 80)
    );
    // The heartbeat counts from the last write.
    fake.quiet_until(89).await;
    fake.status_apply(90).await;
    fake.stop().await;
}

#[tokio::test(start_paused = true)]
async fn api_errors_are_retried_with_backoff_and_a_deleted_object_is_recreated() {
    let mut fake = start(10_000, 60_000);
    let get = format!("{PATH}/{NODE}");
    fake.expect(Method::GET, &get, 0)
        .await
        .fail(500, "InternalError");
    // 1 s later: read again, create, apply -> 500.
    fake.expect(Method::GET, &get, 1)
        .await
        .fail(404, "NotFound");
    fake.expect(Method::POST, PATH, 1)
        .await
        .echo(StatusCode::CREATED);
    fake.expect(Method::PATCH, &format!("{get}/status"), 1)
        .await
        .fail(429, "TooManyRequests");
    // 2 s later the object is known to exist: the status apply alone.
    fake.quiet_until(3).await;
    fake.status_apply(3).await;
    // The next write is the heartbeat, 60 s after the last good one; the
    // object was deleted meanwhile.
    fake.quiet_until(63).await;
    fake.expect(Method::PATCH, &format!("{get}/status"), 63)
        .await
        .fail(404, "NotFound");
    // Failures start over at 1 s after a success; the object is made again.
    fake.expect(Method::GET, &get, 64)
        .await
        .fail(404, "NotFound");
    fake.expect(Method::POST, PATH, 64)
        .await
        .echo(StatusCode::CREATED);
    fake.status_apply(64).await;
    fake.stop().await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_written_before_the_first_period_or_when_disabled() {
    let (client, mut handle) = apiserver::pair();
    let status = Arc::new(Status::new(Duration::from_secs(5)));
    let (stop, mut rx) = watch::channel(false);
    let task = telemetry::spawn(
        Settings::default(),
        NODE.into(),
        client.clone(),
        &inventory(),
        status.clone(),
        async move {
            let _ = rx.wait_for(|s| *s).await;
        },
    )
    .expect("spawn");
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(35)).await;
    status.tick_done(view(1, vec![], 0, 0.0));
    let (req, _reply) = handle.next_request().await.expect("a request");
    assert_eq!(
        (req.method(), t0.elapsed()),
        (&Method::GET, Duration::from_secs(40)),
        "the first write waits for the first period, then for the next tick"
    );
    let _ = stop.send(true);
    task.await.expect("writer task");

    let disabled = Settings::new(&TelemetryFile {
        enabled: Some(false),
        ..TelemetryFile::default()
    })
    .expect("settings");
    let task = telemetry::spawn(
        disabled,
        NODE.into(),
        client,
        &inventory(),
        status,
        std::future::pending(),
    )
    .expect("spawn");
    task.await.expect("a disabled writer ends at once");
    drop(handle);
}

#[test]
fn a_bad_node_name_is_refused() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let (client, _handle) = apiserver::pair();
    let e = telemetry::spawn(
        Settings::default(),
        "Node_1".into(),
        client,
        &inventory(),
        Arc::new(Status::new(Duration::from_secs(5))),
        std::future::pending(),
    )
    .expect_err("bad name");
    assert!(e.to_string().contains("\"Node_1\""), "{e}");
}
