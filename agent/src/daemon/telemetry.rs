//! The `GpuNode` status writer inside `tessera-agent run`: started with the
//! device plugin (it needs the node's name and the API server), once the
//! daemon's NVML ([`super::nvml`]) answers with the inventory (the status
//! carries it: model, SM count, NUMA, NVLink), then [`crate::telemetry`]
//! runs until the daemon stops.

use std::sync::Arc;

use super::nvml::SharedNvml;
use crate::config::Config;
use crate::gpu::Inventory;
use crate::view::status::Status;

/// Runs the writer until `stop` turns true (it is awaited twice: while
/// NVML is retried, then by the writer).
pub async fn run(
    config: Config,
    nvml: Arc<SharedNvml>,
    client: kube::Client,
    status: Arc<Status>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(node) = config.kubelet.node_name.clone() else {
        // Config::merge refuses `[kubelet] enabled` without a node name.
        tracing::error!("telemetry has no node name; not started");
        return;
    };
    let mut stop_seen = stop.clone();
    let inventory = nvml
        .wait_for("telemetry", |n| Inventory::collect(&**n), async move {
            let _ = stop_seen.wait_for(|s| *s).await;
        })
        .await;
    let Some(inventory) = inventory else {
        return;
    };
    let mut rx = stop;
    let stopped = async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    match crate::telemetry::spawn(config.telemetry, node, client, &inventory, status, stopped) {
        Ok(task) => {
            let _ = task.await;
        }
        Err(e) => tracing::error!(
            error = %crate::error_chain::with_causes(&e),
            "telemetry: the GpuNode writer cannot start"
        ),
    }
}
