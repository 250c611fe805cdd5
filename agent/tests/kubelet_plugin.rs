//! The device plugin against an in-process fake kubelet, on the simulated
//! node.
//!
//! Each test runs this binary again as a child (`TESSERA_KUBELET_CHILD`
//! names the simulator's NVML) with the node's GPUSIM_* environment, so
//! that NVML reads it at `nvmlInit`; the child runs the scenario: the
//! plugin ([`kubelet::serve`]), a fake kubelet (a tonic `Registration`
//! server on `kubelet.sock` in a temp directory, and a `DevicePlugin`
//! client to our socket, as kubelet has), and Xids or GPU loss injected
//! into the simulator. The simulator and the node description are the
//! oracle; the figures printed are measured here. The fake kubelet and
//! the node are shared with the Allocate tests (`kubelet_support`).
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod kubelet_support;

use std::time::{Duration, Instant};

use gpusim::Sim;
use kubelet_support::{
    FakeKubelet, NUMA, SPLIT, UUIDS, config, nvml, on_node, plugin_client, runtime,
};
use tessera_agent::kubelet::{self, socket};
use tessera_kubelet_api::deviceplugin::v1beta1 as dp;
use tessera_kubelet_api::deviceplugin::{HEALTHY, UNHEALTHY};
use tokio::sync::oneshot;

/// Health of every vGPU of GPU `gpu` in `list`.
fn health_of(list: &dp::ListAndWatchResponse, gpu: usize) -> Vec<&str> {
    list.devices
        .iter()
        .filter(|d| d.id.starts_with(UUIDS[gpu]))
        .map(|d| d.health.as_str())
        .collect()
}

fn all_healthy(list: &dp::ListAndWatchResponse, gpu: usize) -> bool {
    let h = health_of(list, gpu);
    h.len() == SPLIT as usize && h.iter().all(|h| *h == HEALTHY)
}

fn all_unhealthy(list: &dp::ListAndWatchResponse, gpu: usize) -> bool {
    let h = health_of(list, gpu);
    h.len() == SPLIT as usize && h.iter().all(|h| *h == UNHEALTHY)
}

type Stream = tonic::Streaming<dp::ListAndWatchResponse>;

/// The next list within `within`, with the time it took.
async fn next_list(
    s: &mut Stream,
    within: Duration,
) -> Option<(dp::ListAndWatchResponse, Duration)> {
    let t = Instant::now();
    match tokio::time::timeout(within, s.message()).await {
        Ok(m) => Some((m.unwrap().expect("the stream ended"), t.elapsed())),
        Err(_) => None,
    }
}

/// Lists until one satisfies `f` (at most `within` after `since`).
async fn wait_list(
    s: &mut Stream,
    since: Instant,
    within: Duration,
    what: &str,
    f: impl Fn(&dp::ListAndWatchResponse) -> bool,
) -> Duration {
    loop {
        let left = within.saturating_sub(since.elapsed());
        let Some((l, _)) = next_list(s, left).await else {
            panic!("no list with {what} within {within:?}");
        };
        if f(&l) {
            return since.elapsed();
        }
    }
}

#[test]
fn registers_then_lists_vgpus_with_numa_and_prefers_nvlinked_gpus() {
    on_node(
        "registers_then_lists_vgpus_with_numa_and_prefers_nvlinked_gpus",
        || {
            runtime().block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let mut kubelet = FakeKubelet::start(dir.path());
                let (stop, stopped) = oneshot::channel::<()>();
                let plugin = tokio::spawn(kubelet::serve(
                    config(dir.path()),
                    nvml(),
                    Default::default(),
                    async {
                        let _ = stopped.await;
                    },
                ));
                let r = kubelet.registration(Duration::from_secs(5)).await;
                assert_eq!(r.request.version, "v1beta1");
                assert_eq!(r.request.endpoint, "tessera-test.sock");
                assert_eq!(r.request.resource_name, "nvidia.com/gpu");
                let o = r.request.options.unwrap();
                assert!(o.get_preferred_allocation_available && !o.pre_start_required);
                // Served before registering: the socket answers now.
                let mut client = plugin_client(dir.path(), &r).await;
                let opts = client
                    .get_device_plugin_options(dp::Empty {})
                    .await
                    .unwrap();
                assert_eq!(opts.into_inner(), o);

                let mut s = client
                    .list_and_watch(dp::Empty {})
                    .await
                    .unwrap()
                    .into_inner();
                let (list, _) = next_list(&mut s, Duration::from_secs(5)).await.unwrap();
                assert_eq!(list.devices.len(), 3 * SPLIT as usize);
                for (g, uuid) in UUIDS.iter().enumerate() {
                    for n in 0..SPLIT {
                        let id = format!("{uuid}::{n}");
                        let d = list
                            .devices
                            .iter()
                            .find(|d| d.id == id)
                            .unwrap_or_else(|| panic!("{id} missing from {:?}", list.devices));
                        assert_eq!(d.health, HEALTHY);
                        let nodes = &d.topology.as_ref().unwrap().nodes;
                        assert_eq!(nodes.len(), 1);
                        assert_eq!(nodes[0].id, NUMA[g], "{id}");
                    }
                }

                // Two vGPUs out of everything: the NVLinked pair on NUMA 0.
                let all: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
                let resp = client
                    .get_preferred_allocation(dp::PreferredAllocationRequest {
                        container_requests: vec![dp::ContainerPreferredAllocationRequest {
                            available_device_i_ds: all.clone(),
                            must_include_device_i_ds: vec![],
                            allocation_size: 2,
                        }],
                    })
                    .await
                    .unwrap()
                    .into_inner();
                let mut got = resp.container_responses[0].device_i_ds.clone();
                got.sort();
                assert_eq!(
                    got,
                    vec![format!("{}::0", UUIDS[0]), format!("{}::0", UUIDS[1])]
                );
                let bad = client
                    .get_preferred_allocation(dp::PreferredAllocationRequest {
                        container_requests: vec![dp::ContainerPreferredAllocationRequest {
                            available_device_i_ds: all,
                            must_include_device_i_ds: vec![],
                            allocation_size: -1,
                        }],
                    })
                    .await
                    .unwrap_err();
                assert_eq!(bad.code(), tonic::Code::InvalidArgument);
                assert!(bad.message().contains("allocation_size -1"), "{bad:?}");

                stop.send(()).unwrap();
                tokio::time::timeout(Duration::from_secs(5), plugin)
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                // Stopped cleanly: our socket is gone, the stream ended,
                // kubelet's socket is left alone.
                assert!(!dir.path().join("tessera-test.sock").exists());
                assert!(dir.path().join("kubelet.sock").exists());
                let end = tokio::time::timeout(Duration::from_secs(5), s.message()).await;
                assert!(!matches!(end, Ok(Ok(Some(_)))), "{end:?}");
                kubelet.stop().await;
            });
        },
    );
}

#[test]
fn xid_and_gpu_loss_reach_list_and_watch_within_a_second_and_recover() {
    on_node(
        "xid_and_gpu_loss_reach_list_and_watch_within_a_second_and_recover",
        || {
            runtime().block_on(async {
                let sim = Sim::from_env().unwrap();
                let dir = tempfile::tempdir().unwrap();
                let mut kubelet = FakeKubelet::start(dir.path());
                let (_stop, stopped) = oneshot::channel::<()>();
                tokio::spawn(kubelet::serve(
                    config(dir.path()),
                    nvml(),
                    Default::default(),
                    async {
                        let _ = stopped.await;
                    },
                ));
                let r = kubelet.registration(Duration::from_secs(5)).await;
                let mut client = plugin_client(dir.path(), &r).await;
                let mut s = client
                    .list_and_watch(dp::Empty {})
                    .await
                    .unwrap()
                    .into_inner();
                let (first, _) = next_list(&mut s, Duration::from_secs(5)).await.unwrap();
                assert!((0..3).all(|g| all_healthy(&first, g)));

                // An application Xid (MMU fault, 31) changes nothing.
                sim.inject_xid(2, 31).unwrap();
                let quiet = next_list(&mut s, Duration::from_millis(500)).await;
                assert!(
                    quiet.is_none(),
                    "update after an application Xid: {quiet:?}"
                );

                // A critical Xid (48, double-bit ECC) on GPU 2.
                let t = Instant::now();
                sim.inject_xid(2, 48).unwrap();
                let took = wait_list(&mut s, t, Duration::from_secs(1), "GPU 2 unhealthy", |l| {
                    all_unhealthy(l, 2) && all_healthy(l, 0) && all_healthy(l, 1)
                })
                .await;
                println!("figure: Xid 48 -> Unhealthy in ListAndWatch after {took:?}");
                // Quarantine (700 ms) over: healthy again.
                let t = Instant::now();
                let back = wait_list(&mut s, t, Duration::from_secs(2), "GPU 2 healthy", |l| {
                    all_healthy(l, 2)
                })
                .await;
                println!("figure: GPU 2 healthy again {back:?} after the unhealthy list");

                // GPU 1 falls off the bus.
                let t = Instant::now();
                sim.set_lost(1, true).unwrap();
                let took = wait_list(&mut s, t, Duration::from_secs(1), "GPU 1 unhealthy", |l| {
                    all_unhealthy(l, 1) && all_healthy(l, 0) && all_healthy(l, 2)
                })
                .await;
                println!("figure: GPU lost -> Unhealthy in ListAndWatch after {took:?}");
                // It stays unhealthy while lost, well past the quarantine.
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(1500) {
                    if let Some((l, _)) = next_list(&mut s, Duration::from_millis(100)).await {
                        assert!(all_unhealthy(&l, 1), "healthy while lost: {l:?}");
                    }
                }
                let t = Instant::now();
                sim.set_lost(1, false).unwrap();
                let back = wait_list(&mut s, t, Duration::from_secs(2), "GPU 1 healthy", |l| {
                    all_healthy(l, 1)
                })
                .await;
                println!("figure: GPU 1 healthy {back:?} after it answered again");
                kubelet.stop().await;
            });
        },
    );
}

#[test]
fn kubelet_restart_leads_to_reregistration_within_a_second() {
    on_node(
        "kubelet_restart_leads_to_reregistration_within_a_second",
        || {
            runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let mut kubelet = FakeKubelet::start(dir.path());
            let (_stop, stopped) = oneshot::channel::<()>();
            tokio::spawn(kubelet::serve(config(dir.path()), nvml(), Default::default(), async {
                let _ = stopped.await;
            }));
            let first = kubelet.registration(Duration::from_secs(5)).await;
            let mut worst = Duration::ZERO;
            for round in 0..3 {
                kubelet.stop().await;
                // A new kubelet: every socket removed, kubelet.sock anew.
                kubelet = FakeKubelet::start(dir.path());
                assert!(!dir.path().join(&first.request.endpoint).exists());
                let r = kubelet.registration(Duration::from_secs(1)).await;
                let took = r.at - kubelet.created;
                worst = worst.max(took);
                println!("figure: restart {round}: re-registered {took:?} after kubelet.sock was created");
                assert_eq!(r.request.endpoint, first.request.endpoint);
                assert_eq!(r.request.resource_name, "nvidia.com/gpu");
                // The endpoint it names answers.
                let mut client = plugin_client(dir.path(), &r).await;
                let mut s = client.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
                let (l, _) = next_list(&mut s, Duration::from_secs(5)).await.unwrap();
                assert_eq!(l.devices.len(), 3 * SPLIT as usize);
            }
            assert!(worst < Duration::from_secs(1), "{worst:?}");
            // One registration per kubelet: none repeated.
            let extra = kubelet.registrations.try_recv();
            assert!(extra.is_err(), "registered twice with one kubelet");
            kubelet.stop().await;
        });
        },
    );
}

#[test]
fn kubelet_absent_at_start_is_waited_for() {
    on_node("kubelet_absent_at_start_is_waited_for", || {
        runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let (_stop, stopped) = oneshot::channel::<()>();
            tokio::spawn(kubelet::serve(
                config(dir.path()),
                nvml(),
                Default::default(),
                async {
                    let _ = stopped.await;
                },
            ));
            // No kubelet: the plugin serves anyway.
            tokio::time::sleep(Duration::from_millis(600)).await;
            let ours = dir.path().join("tessera-test.sock");
            let ch = socket::channel(&ours, Duration::from_secs(5))
                .await
                .unwrap();
            let mut client = dp::device_plugin_client::DevicePluginClient::new(ch);
            client
                .get_device_plugin_options(dp::Empty {})
                .await
                .unwrap();
            // A socket file nobody listens on: registration fails, retried.
            let dead =
                std::os::unix::net::UnixListener::bind(dir.path().join("kubelet.sock")).unwrap();
            drop(dead);
            tokio::time::sleep(Duration::from_millis(400)).await;
            std::fs::remove_file(dir.path().join("kubelet.sock")).unwrap();

            let mut kubelet = FakeKubelet::start(dir.path());
            let r = kubelet.registration(Duration::from_secs(1)).await;
            println!(
                "figure: kubelet appearing -> registered after {:?}",
                r.at - kubelet.created
            );
            assert_eq!(r.request.endpoint, "tessera-test.sock");
            // The new kubelet removed our socket: the endpoint registered
            // is a fresh one that answers.
            let mut client = plugin_client(dir.path(), &r).await;
            let mut s = client
                .list_and_watch(dp::Empty {})
                .await
                .unwrap()
                .into_inner();
            let (l, _) = next_list(&mut s, Duration::from_secs(5)).await.unwrap();
            assert_eq!(l.devices.len(), 3 * SPLIT as usize);
            kubelet.stop().await;
        });
    });
}
