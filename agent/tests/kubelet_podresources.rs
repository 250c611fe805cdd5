//! The PodResources client and the region garbage collector against an
//! in-process fake kubelet: a tonic `PodResourcesLister` on a temp Unix
//! socket answering with pod lists shaped like a real kubelet's.
//!
//! The oracle of the client tests is the fake's own list; the oracle of
//! the collector tests is the file system (whether a directory exists),
//! never the collector's decisions alone. Each "kept" test ends by lifting
//! its guard's condition and showing the directory then goes, so the
//! guard, not some other rule, is what kept it.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tessera_agent::containers::live::Probe;
use tessera_agent::containers::meta::META_VERSION;
use tessera_agent::containers::{ContainerId, GpuGrant, Metadata, Store};
use tessera_agent::kubelet::gc::{Action, Collector, Decision, GcSettings, Observation};
use tessera_agent::kubelet::gc_task::{GcConfig, spawn_gc};
use tessera_agent::kubelet::podresources::{Client, ContainerKey, Device, PodResourcesError};
use tessera_agent::kubelet::vgpu::VgpuId;
use tessera_kubelet_api::podresources::v1 as pr;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const RESOURCE: &str = "nvidia.com/gpu";
const GPU_A: &str = "GPU-0a0a0a0a-1111-2222-3333-444444444444";
const GPU_B: &str = "GPU-0b0b0b0b-1111-2222-3333-444444444444";

type Pods = Arc<Mutex<Vec<pr::PodResources>>>;

struct FakeLister {
    pods: Pods,
    /// When set, `List` says it arrived and answers only once released.
    gate: Option<Gate>,
}

#[derive(Clone)]
struct Gate {
    arrived: tokio::sync::mpsc::UnboundedSender<()>,
    release: Arc<tokio::sync::Notify>,
}

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for FakeLister {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        if let Some(g) = &self.gate {
            let released = g.release.notified();
            let _ = g.arrived.send(());
            released.await;
        }
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: self.pods.lock().unwrap().clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(pr::AllocatableResourcesResponse {
            devices: vec![pr::ContainerDevices {
                resource_name: RESOURCE.into(),
                device_ids: (0..2)
                    .flat_map(|n| [format!("{GPU_A}::{n}"), format!("{GPU_B}::{n}")])
                    .collect(),
                topology: Some(numa(0)),
            }],
            cpu_ids: vec![0, 1, 2, 3],
            memory: vec![],
        }))
    }

    async fn get(
        &self,
        _: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }
}

/// A fake kubelet serving PodResources on `path`.
struct FakeKubelet {
    path: PathBuf,
    pods: Pods,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeKubelet {
    /// Starts like a new kubelet: a stale socket is replaced.
    fn start(path: &Path, pods: Vec<pr::PodResources>) -> Self {
        Self::start_gated(path, pods, None)
    }

    fn start_gated(path: &Path, pods: Vec<pr::PodResources>, gate: Option<Gate>) -> Self {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        let pods = Arc::new(Mutex::new(pods));
        let (stop, stopped) = oneshot::channel::<()>();
        let svc = pr::pod_resources_lister_server::PodResourcesListerServer::new(FakeLister {
            pods: pods.clone(),
            gate,
        });
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            path: path.to_owned(),
            pods,
            stop: Some(stop),
            task,
        }
    }

    fn set(&self, pods: Vec<pr::PodResources>) {
        *self.pods.lock().unwrap() = pods;
    }

    /// Stops like a kubelet process ending; the socket is removed.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn numa(id: i64) -> pr::TopologyInfo {
    pr::TopologyInfo {
        nodes: vec![pr::NumaNode { id }],
    }
}

/// A container as kubelet lists it: our devices, a foreign resource's,
/// CPUs and memory.
fn container(name: &str, ours: &[&str]) -> pr::ContainerResources {
    let mut devices = vec![pr::ContainerDevices {
        resource_name: "example.com/fpga".into(),
        device_ids: vec!["fpga-0".into()],
        topology: Some(numa(1)),
    }];
    if !ours.is_empty() {
        devices.push(pr::ContainerDevices {
            resource_name: RESOURCE.into(),
            device_ids: ours.iter().map(|s| (*s).to_owned()).collect(),
            topology: Some(numa(0)),
        });
    }
    pr::ContainerResources {
        name: name.into(),
        devices,
        cpu_ids: vec![2, 3],
        memory: vec![pr::ContainerMemory {
            memory_type: "memory".into(),
            size: 1 << 30,
            topology: Some(numa(0)),
        }],
        dynamic_resources: vec![],
    }
}

fn pod(namespace: &str, name: &str, containers: Vec<pr::ContainerResources>) -> pr::PodResources {
    pr::PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers,
        cpu_ids: vec![],
        memory: vec![],
    }
}

fn key(namespace: &str, pod: &str, container: &str) -> ContainerKey {
    ContainerKey {
        namespace: namespace.into(),
        pod: pod.into(),
        container: container.into(),
    }
}

fn vgpu(uuid: &str, replica: u32) -> Device {
    Device::Vgpu(VgpuId {
        uuid: uuid.into(),
        replica,
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn client(path: &Path) -> Client {
    Client::new(path, RESOURCE, Duration::from_secs(2))
}

#[test]
fn client_reads_pods_containers_and_our_devices() {
    runtime().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("kubelet.sock");
        let _k = FakeKubelet::start(
            &sock,
            vec![
                pod(
                    "ml",
                    "trainer-0",
                    vec![
                        container("main", &[&format!("{GPU_B}::1"), &format!("{GPU_A}::0")]),
                        container("sidecar", &[]),
                    ],
                ),
                pod("default", "web", vec![container("nginx", &["not-a-vgpu"])]),
                pod("", "nameless", vec![container("x", &[])]),
            ],
        );
        let mut c = client(&sock);
        let s = c.list().await.unwrap();
        let expected: BTreeMap<ContainerKey, Vec<Device>> = [
            (
                key("ml", "trainer-0", "main"),
                vec![vgpu(GPU_A, 0), vgpu(GPU_B, 1)],
            ),
            (key("ml", "trainer-0", "sidecar"), vec![]),
            (
                key("default", "web", "nginx"),
                vec![Device::Other("not-a-vgpu".into())],
            ),
        ]
        .into();
        assert_eq!(s.containers, expected);
        let holders: Vec<_> = s.holders().map(|(k, _)| k.clone()).collect();
        assert_eq!(
            holders,
            [
                key("default", "web", "nginx"),
                key("ml", "trainer-0", "main")
            ]
        );
        assert_eq!(
            s.holder_of(&VgpuId {
                uuid: GPU_B.into(),
                replica: 1
            }),
            Some(&key("ml", "trainer-0", "main"))
        );
        assert_eq!(
            s.holder_of(&VgpuId {
                uuid: GPU_B.into(),
                replica: 0
            }),
            None
        );
        assert_eq!(s.allocatable.as_ref().map(Vec::len), Some(4));
        // The nameless pod and the foreign ID are reported.
        assert_eq!(s.problems.len(), 2, "{:?}", s.problems);
        assert!(s.problems.iter().any(|p| p.contains("not-a-vgpu")));
        assert!(s.problems.iter().any(|p| p.contains("nameless")));
    });
}

#[test]
fn client_reconnects_after_kubelet_restart_and_survives_absence() {
    runtime().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("kubelet.sock");
        let mut c = client(&sock);
        // Kubelet absent at start: a clear error at once.
        let t = Instant::now();
        let e = c.list().await.unwrap_err();
        assert!(matches!(e, PodResourcesError::Absent { .. }), "{e}");
        assert!(e.to_string().contains(&sock.display().to_string()), "{e}");
        println!("absent kubelet answered in {:?}", t.elapsed());
        assert!(t.elapsed() < Duration::from_secs(1));

        let k = FakeKubelet::start(&sock, vec![pod("a", "one", vec![container("c", &[])])]);
        let first = c.list().await.unwrap();
        assert!(first.lists(&key("a", "one", "c")));

        // Kubelet restarts: the socket goes, then a new kubelet makes a new
        // one with other pods.
        k.stop().await;
        let e = c.list().await.unwrap_err();
        assert!(matches!(e, PodResourcesError::Absent { .. }), "{e}");
        let mut k = FakeKubelet::start(&sock, vec![pod("b", "two", vec![container("c", &[])])]);
        let mut prev = c.list().await.unwrap().kubelet;
        assert_ne!(prev, first.kubelet, "a new kubelet instance is told apart");
        // Restarts between two calls (no failed call in between to give
        // them away): each answer comes from the new kubelet and names it.
        let mut figures = Vec::new();
        for round in 0..5 {
            k.stop().await;
            let name = format!("three-{round}");
            k = FakeKubelet::start(&sock, vec![pod("b", &name, vec![container("c", &[])])]);
            let t = Instant::now();
            let s = c.list().await.unwrap();
            figures.push(t.elapsed());
            assert!(s.lists(&key("b", &name, "c")), "{s:?}");
            assert_eq!(s.containers.len(), 1, "{s:?}");
            assert_ne!(s.kubelet, prev, "restart {round} went unnoticed");
            prev = s.kubelet;
        }
        figures.sort();
        println!(
            "first List after a kubelet restart: median {:?}, max {:?} (5 restarts)",
            figures[2], figures[4]
        );
        k.stop().await;
    });
}

#[test]
fn an_answer_across_a_kubelet_restart_is_not_used() {
    runtime().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("kubelet.sock");
        let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
        let release = Arc::new(tokio::sync::Notify::new());
        let gate = Gate {
            arrived,
            release: release.clone(),
        };
        let old = FakeKubelet::start_gated(
            &sock,
            vec![pod("a", "old", vec![container("c", &[])])],
            Some(gate),
        );
        let mut c = client(&sock);
        // The old kubelet holds the call while a new one takes the socket.
        let (answer, new) = tokio::join!(c.list(), async {
            arrivals.recv().await.unwrap();
            let new = FakeKubelet::start(&sock, vec![]);
            release.notify_one();
            new
        });
        let e = answer.unwrap_err();
        assert!(matches!(e, PodResourcesError::Restarted { .. }), "{e}");
        // The next call is the new kubelet's.
        let s = c.list().await.unwrap();
        assert!(s.containers.is_empty(), "{s:?}");
        new.stop().await;
        drop(old);
    });
}

#[test]
fn hung_kubelet_costs_at_most_the_timeout() {
    runtime().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("kubelet.sock");
        // Accepts connections and never answers.
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let timeout = Duration::from_millis(500);
        let mut c = Client::new(&sock, RESOURCE, timeout);
        for _ in 0..2 {
            let t = Instant::now();
            let e = c.list().await.unwrap_err();
            let took = t.elapsed();
            println!("hung kubelet: {e} after {took:?}");
            assert!(matches!(e, PodResourcesError::Timeout { .. }), "{e}");
            // Connect and call are each bounded.
            assert!(took < timeout * 2 + Duration::from_millis(500), "{took:?}");
            assert!(!c.connected(), "a failed call drops the connection");
        }
        hold.abort();
    });
}

// ---------------------------------------------------------------------------
// The collector.

fn meta(namespace: &str, pod: &str, container: &str, uid: Option<&str>) -> Metadata {
    Metadata {
        version: META_VERSION,
        namespace: Some(namespace.into()),
        pod: Some(pod.into()),
        container: Some(container.into()),
        claim: None,
        pod_uid: uid.map(str::to_owned),
        cgroup: None,
        sm_target: 50,
        mode: None,
        priority: None,
        labels: BTreeMap::new(),
        fail_open: false,
        gpus: vec![GpuGrant {
            uuid: GPU_A.into(),
            memory_limit_bytes: Some(1 << 30),
            context_overhead_bytes: 0,
        }],
    }
}

const UID: &str = "6f1c2a4e-3b5d-4c7e-9a10-2b3c4d5e6f70";

fn add(store: &Store, id: &str, m: &Metadata) -> PathBuf {
    let id = ContainerId::new(id).unwrap();
    store.add(&id, m).unwrap();
    store.dir(&id)
}

fn probe() -> Probe {
    Probe {
        proc_root: PathBuf::from("/proc"),
        cgroup_root: None,
    }
}

fn settings(grace_ms: u64, settle_ms: u64, confirm_ms: u64) -> GcSettings {
    GcSettings {
        grace: Duration::from_millis(grace_ms),
        settle: Duration::from_millis(settle_ms),
        confirm: Duration::from_millis(confirm_ms),
    }
}

/// Runs rounds every 50 ms for `span`, listing anew each time.
async fn rounds(gc: &mut Collector, c: &mut Client, span: Duration) -> Vec<Decision> {
    let t = Instant::now();
    let mut all = Vec::new();
    while t.elapsed() < span {
        all.extend(round(gc, c).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    all
}

/// Runs rounds every 50 ms until every one of `paths` is gone, at most
/// [`GONE_WITHIN`] (a bound for a loaded machine; the rules need well
/// under a second here), then `extra` more.
async fn until_gone(
    gc: &mut Collector,
    c: &mut Client,
    paths: &[&Path],
    extra: Duration,
) -> Vec<Decision> {
    let t = Instant::now();
    let mut all = Vec::new();
    while paths.iter().any(|p| p.exists()) && t.elapsed() < GONE_WITHIN {
        all.extend(round(gc, c).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    all.extend(rounds(gc, c, extra).await);
    all
}

/// See [`until_gone`].
const GONE_WITHIN: Duration = Duration::from_secs(10);

async fn round(gc: &mut Collector, c: &mut Client) -> Vec<Decision> {
    match c.list().await {
        Ok(s) => gc.round(Observation::Listed(&s)),
        Err(e) => gc.round(Observation::Failed(&e.to_string())),
    }
}

/// No entry of the collector's own left under the root.
fn no_tombstones(root: &Path) {
    let left: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".gc."))
        .collect();
    assert!(left.is_empty(), "tombstones left: {left:?}");
}

/// A fake kubelet and a client, a temp root with its store.
struct Scene {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    store: Store,
    kubelet: FakeKubelet,
    client: Client,
}

fn scene(pods: Vec<pr::PodResources>) -> Scene {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("containers");
    let sock = tmp.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&sock, pods);
    Scene {
        store: Store::new(&root),
        root,
        client: client(&sock),
        kubelet,
        _tmp: tmp,
    }
}

#[test]
fn departed_pod_is_collected_listed_and_cli_ones_never() {
    runtime().block_on(async {
        let mut s = scene(vec![pod("ml", "running", vec![container("main", &[])])]);
        let gone = add(
            &s.store,
            "pod-gone-main",
            &meta("ml", "gone", "main", Some(UID)),
        );
        let listed = add(
            &s.store,
            "pod-running-main",
            &meta("ml", "running", "main", Some(UID)),
        );
        // Made by the CLI: no pod_uid, and kubelet does not list it.
        let cli = add(&s.store, "cli-made", &meta("ml", "cli", "main", None));
        let mut gc = Collector::new(s.store.clone(), settings(200, 0, 300), probe());
        tokio::time::sleep(Duration::from_millis(250)).await;
        let d = until_gone(&mut gc, &mut s.client, &[&gone], Duration::from_millis(300)).await;
        assert!(!gone.exists(), "the departed pod's directory stays: {d:#?}");
        assert!(
            listed.exists(),
            "a listed container's directory was removed"
        );
        assert!(cli.exists(), "a CLI-made directory was removed");
        let removed: Vec<_> = d.iter().filter(|d| d.action == Action::Removed).collect();
        assert_eq!(removed.len(), 1, "{removed:#?}");
        assert!(
            removed[0].reason.contains("ml/gone/main"),
            "{}",
            removed[0].reason
        );
        no_tombstones(&s.root);
        // Once kubelet stops listing it, the other pod's goes too; the CLI
        // one never.
        s.kubelet.set(vec![]);
        until_gone(
            &mut gc,
            &mut s.client,
            &[&listed],
            Duration::from_millis(300),
        )
        .await;
        assert!(!listed.exists(), "the pod that left stays");
        assert!(cli.exists(), "a CLI-made directory was removed");
        s.kubelet.stop().await;
    });
}

#[test]
fn a_directory_within_the_grace_period_is_kept() {
    runtime().block_on(async {
        let mut s = scene(vec![]);
        // Allocate just made it; kubelet does not list the container yet.
        let young = add(
            &s.store,
            "pod-new-main",
            &meta("ml", "new", "main", Some(UID)),
        );
        let mut gc = Collector::new(s.store.clone(), settings(3000, 0, 100), probe());
        let d = rounds(&mut gc, &mut s.client, Duration::from_millis(1000)).await;
        assert!(young.exists(), "removed within the grace period: {d:#?}");
        assert!(d.iter().any(|d| d.reason.contains("grace")));
        // Past the grace period it goes.
        tokio::time::sleep(Duration::from_millis(2100)).await;
        until_gone(&mut gc, &mut s.client, &[&young], Duration::ZERO).await;
        assert!(!young.exists(), "still there after the grace period");
        s.kubelet.stop().await;
    });
}

#[test]
fn a_directory_with_a_live_registered_process_is_kept() {
    runtime().block_on(async {
        let mut s = scene(vec![]);
        let dir = add(
            &s.store,
            "pod-zombie-main",
            &meta("ml", "zombie", "main", Some(UID)),
        );
        // A live process registered in the usage region (pid and start
        // time), which no longer maps the file.
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let info = tessera_agent::containers::pids::proc_info(Path::new("/proc"), pid).unwrap();
        {
            let usage = tessera_region::file::open_usage(&dir.join("usage")).unwrap();
            usage.claim(pid, info.start_time).unwrap();
        }
        let mut gc = Collector::new(s.store.clone(), settings(0, 0, 100), probe());
        let d = rounds(&mut gc, &mut s.client, Duration::from_millis(800)).await;
        assert!(
            dir.exists(),
            "removed while a registered process lives: {d:#?}"
        );
        assert!(
            d.iter()
                .any(|d| d.reason.contains(&format!("live process {pid}"))),
            "{d:#?}"
        );
        // The process ends (its slot stays, as after a kill): it goes.
        child.kill().unwrap();
        child.wait().unwrap();
        until_gone(&mut gc, &mut s.client, &[&dir], Duration::ZERO).await;
        assert!(!dir.exists(), "still there after its process ended");
        s.kubelet.stop().await;
    });
}

#[test]
fn a_directory_whose_usage_file_is_mapped_is_kept() {
    runtime().block_on(async {
        let mut s = scene(vec![]);
        let dir = add(
            &s.store,
            "pod-mapped-main",
            &meta("ml", "mapped", "main", Some(UID)),
        );
        // This process maps the usage file without a slot (as a process
        // in another pid namespace would look: its slot's pid is not ours).
        let usage = tessera_region::file::open_usage(&dir.join("usage")).unwrap();
        let mut gc = Collector::new(s.store.clone(), settings(0, 0, 100), probe());
        let d = rounds(&mut gc, &mut s.client, Duration::from_millis(800)).await;
        assert!(
            dir.exists(),
            "removed while its usage file is mapped: {d:#?}"
        );
        assert!(
            d.iter().any(|d| d.reason.contains("a process maps")),
            "{d:#?}"
        );
        drop(usage);
        until_gone(&mut gc, &mut s.client, &[&dir], Duration::ZERO).await;
        assert!(!dir.exists(), "still there after the mapping ended");
        s.kubelet.stop().await;
    });
}

#[test]
fn an_empty_list_right_after_a_kubelet_restart_removes_nothing() {
    runtime().block_on(async {
        let settle = Duration::from_millis(3000);
        let mut s = scene(vec![
            pod(
                "ml",
                "a",
                vec![container("main", &[&format!("{GPU_A}::0")])],
            ),
            pod(
                "ml",
                "b",
                vec![container("main", &[&format!("{GPU_B}::0")])],
            ),
        ]);
        let a = add(&s.store, "pod-a-main", &meta("ml", "a", "main", Some(UID)));
        let b = add(&s.store, "pod-b-main", &meta("ml", "b", "main", Some(UID)));
        let mut gc = Collector::new(
            s.store.clone(),
            GcSettings {
                settle,
                ..settings(0, 0, 100)
            },
            probe(),
        );
        round(&mut gc, &mut s.client).await;
        // Kubelet restarts and, not knowing its pods yet, lists nothing.
        let sock = s.client.path().to_owned();
        s.kubelet.stop().await;
        let k = FakeKubelet::start(&sock, vec![]);
        let restarted = SystemTime::now();
        let mut believed_early = Vec::new();
        while restarted.elapsed().unwrap() < settle / 2 {
            let Ok(snap) = s.client.list().await else {
                continue;
            };
            assert!(snap.containers.is_empty());
            let before = SystemTime::now();
            let d = gc.round(Observation::Listed(&snap));
            if before.duration_since(restarted).unwrap() < settle {
                believed_early.extend(d.into_iter().filter(|d| d.action == Action::Removed));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(believed_early.is_empty(), "{believed_early:#?}");
        assert!(
            a.exists() && b.exists(),
            "removed on a fresh kubelet's empty list"
        );
        // Still nothing listed long after the restart: the list is
        // believed and both go.
        tokio::time::sleep(settle).await;
        until_gone(&mut gc, &mut s.client, &[&a, &b], Duration::ZERO).await;
        assert!(
            !a.exists() && !b.exists(),
            "kept although a settled kubelet lists nothing"
        );
        k.stop().await;
    });
}

#[test]
fn a_failed_list_restarts_the_count() {
    runtime().block_on(async {
        let mut s = scene(vec![]);
        let dir = add(&s.store, "pod-x-main", &meta("ml", "x", "main", Some(UID)));
        let mut gc = Collector::new(s.store.clone(), settings(0, 0, 300), probe());
        let snap = s.client.list().await.unwrap();
        gc.round(Observation::Listed(&snap));
        tokio::time::sleep(Duration::from_millis(400)).await;
        gc.round(Observation::Failed("kubelet unreachable"));
        // Confirm time has passed since the first absence, but the failure
        // broke the run: two fresh answers are needed.
        let snap = s.client.list().await.unwrap();
        gc.round(Observation::Listed(&snap));
        assert!(dir.exists(), "removed across a failed List");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let snap = s.client.list().await.unwrap();
        gc.round(Observation::Listed(&snap));
        assert!(!dir.exists());
        s.kubelet.stop().await;
    });
}

#[test]
fn malformed_and_unmatchable_directories_are_reported_never_removed() {
    runtime().block_on(async {
        let mut s = scene(vec![]);
        let ok = add(
            &s.store,
            "pod-ok-main",
            &meta("ml", "ok", "main", Some(UID)),
        );
        let bad = s.root.join("pod-garbage");
        std::fs::create_dir(&bad).unwrap();
        std::fs::write(bad.join("meta.json"), b"{ not json").unwrap();
        let mut nameless = meta("ml", "x", "main", Some(UID));
        nameless.container = None;
        let unmatched = add(&s.store, "pod-nameless", &nameless);
        let mut gc = Collector::new(s.store.clone(), settings(0, 0, 100), probe());
        let d = until_gone(&mut gc, &mut s.client, &[&ok], Duration::from_millis(300)).await;
        assert!(!ok.exists(), "the well-formed departed one stays: {d:#?}");
        assert!(
            bad.join("meta.json").exists(),
            "a malformed directory was removed"
        );
        assert!(unmatched.exists(), "an unmatchable directory was removed");
        for name in ["pod-garbage", "pod-nameless"] {
            assert!(
                d.iter()
                    .any(|d| d.name == name && d.action == Action::Reported),
                "{name} not reported: {d:#?}"
            );
        }
        s.kubelet.stop().await;
    });
}

#[test]
fn a_busy_store_or_a_recreated_directory_defers_removal() {
    runtime().block_on(async {
        let mut s = scene(vec![]);
        let m = meta("ml", "y", "main", Some(UID));
        let dir = add(&s.store, "pod-y-main", &m);
        let mut gc = Collector::new(s.store.clone(), settings(0, 0, 300), probe());
        round(&mut gc, &mut s.client).await;
        // Allocate recreates the same id meanwhile: judged anew.
        let id = ContainerId::new("pod-y-main").unwrap();
        s.store.remove(&id).unwrap();
        s.store.add(&id, &m).unwrap();
        tokio::time::sleep(Duration::from_millis(350)).await;
        round(&mut gc, &mut s.client).await;
        assert!(
            dir.exists(),
            "a recreated directory was removed on the old one's evidence"
        );
        // Another writer holds the store (an Allocate in flight): no removal.
        tokio::time::sleep(Duration::from_millis(350)).await;
        {
            let _held = s.store.lock().unwrap();
            let d = round(&mut gc, &mut s.client).await;
            assert!(dir.exists(), "removed while the store was held: {d:#?}");
        }
        round(&mut gc, &mut s.client).await;
        assert!(!dir.exists());
        no_tombstones(&s.root);
        s.kubelet.stop().await;
    });
}

#[test]
fn the_task_collects_until_shutdown() {
    runtime().block_on(async {
        let s = scene(vec![pod("ml", "stay", vec![container("main", &[])])]);
        let gone = add(
            &s.store,
            "pod-gone-main",
            &meta("ml", "gone", "main", Some(UID)),
        );
        let stay = add(
            &s.store,
            "pod-stay-main",
            &meta("ml", "stay", "main", Some(UID)),
        );
        let config = GcConfig {
            pod_resources_socket: s.client.path().to_owned(),
            resource_name: RESOURCE.into(),
            interval: Duration::from_millis(100),
            timeout: Duration::from_secs(1),
            settings: settings(0, 0, 200),
        };
        assert!(
            GcConfig {
                interval: Duration::ZERO,
                ..config.clone()
            }
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("garbage collection setting gc_interval_s:")
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let task = spawn_gc(config, s.root.clone(), async {
            let _ = stopped.await;
        })
        .unwrap();
        let t = Instant::now();
        while gone.exists() && t.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!(
            "the task removed the departed pod's directory after {:?}",
            t.elapsed()
        );
        assert!(!gone.exists());
        assert!(stay.exists());
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        s.kubelet.stop().await;
    });
}

#[test]
fn a_directory_whose_cgroup_holds_a_process_is_kept() {
    if !rustix::process::geteuid().is_root() {
        println!("skipped: creating a cgroup needs root");
        return;
    }
    let Ok(cg_root) = tessera_agent::cgroup::v2::cgroup2_root() else {
        println!("skipped: no cgroup v2 hierarchy is mounted");
        return;
    };
    let name = format!("tessera-gc-test-{}", std::process::id());
    let cg = cg_root.join(&name);
    if let Err(e) = std::fs::create_dir(&cg) {
        println!("skipped: cannot create cgroup {}: {e}", cg.display());
        return;
    }
    runtime().block_on(async {
        let mut s = scene(vec![]);
        let mut m = meta("ml", "cg", "main", Some(UID));
        m.cgroup = Some(format!("/{name}"));
        let dir = add(&s.store, "pod-cg-main", &m);
        // A process in the container's cgroup that never registered a slot
        // nor maps the usage file (no GPU use yet).
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let mut held = InCgroup {
            child,
            cgroup: cg.clone(),
        };
        std::fs::write(cg.join("cgroup.procs"), held.child.id().to_string()).unwrap();
        let probe = Probe {
            proc_root: PathBuf::from("/proc"),
            cgroup_root: Some(cg_root.clone()),
        };
        let mut gc = Collector::new(s.store.clone(), settings(0, 0, 100), probe);
        let d = rounds(&mut gc, &mut s.client, Duration::from_millis(800)).await;
        assert!(
            dir.exists(),
            "removed while its cgroup holds a process: {d:#?}"
        );
        assert!(
            d.iter().any(|d| d.reason.contains("holds 1 process")),
            "{d:#?}"
        );
        held.end();
        until_gone(&mut gc, &mut s.client, &[&dir], Duration::ZERO).await;
        assert!(!dir.exists(), "still there after its cgroup emptied");
        s.kubelet.stop().await;
    });
}

/// A child process in a test cgroup; both are gone on drop (also when the
/// test fails).
struct InCgroup {
    child: std::process::Child,
    cgroup: PathBuf,
}

impl InCgroup {
    fn end(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for InCgroup {
    fn drop(&mut self) {
        self.end();
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

#[test]
fn a_directory_whose_pod_cgroup_exists_is_kept() {
    runtime().block_on(async {
        let mut s = scene(vec![]);
        let dir = add(
            &s.store,
            "pod-left-main",
            &meta("ml", "left", "main", Some(UID)),
        );
        // A cgroup v2 tree as kubelet's systemd driver lays it out, with
        // this pod's slice (its UID's '-' escaped to '_').
        let cg = tempfile::tempdir().unwrap();
        let slice = cg
            .path()
            .join("kubepods.slice/kubepods-besteffort.slice")
            .join(format!(
                "kubepods-besteffort-pod{}.slice",
                UID.replace('-', "_")
            ));
        std::fs::create_dir_all(&slice).unwrap();
        let probe = Probe {
            proc_root: PathBuf::from("/proc"),
            cgroup_root: Some(cg.path().to_owned()),
        };
        let mut gc = Collector::new(s.store.clone(), settings(0, 0, 100), probe);
        let d = rounds(&mut gc, &mut s.client, Duration::from_millis(800)).await;
        assert!(
            dir.exists(),
            "removed while its pod's cgroup exists: {d:#?}"
        );
        assert!(
            d.iter().any(|d| d.reason.contains("pod's cgroup")),
            "{d:#?}"
        );
        // Kubelet cleans the pod up: it goes.
        std::fs::remove_dir(&slice).unwrap();
        until_gone(&mut gc, &mut s.client, &[&dir], Duration::ZERO).await;
        assert!(!dir.exists(), "still there after its pod's cgroup went");
        s.kubelet.stop().await;
    });
}
