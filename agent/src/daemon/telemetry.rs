//! The `GpuNode` status writer inside `tessera-agent run`: started with the
//! device plugin (it needs the node's name and the API server), once NVML
//! answers (the status carries the inventory: model, SM count, NUMA,
//! NVLink), then [`crate::telemetry`] runs until the daemon stops.

use std::sync::Arc;

use super::status::Status;
use crate::config::Config;
use crate::gpu::{Inventory, NvmlBackend};

/// Runs the writer until `stop` turns true (it is awaited twice: while
/// NVML is retried, then by the writer).
pub async fn run(
    config: Config,
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
    let inventory = loop {
        let lib = config.nvml_lib.clone();
        let collected = tokio::task::spawn_blocking(move || {
            NvmlBackend::load(lib.as_os_str()).and_then(|n| Inventory::collect(&n))
        })
        .await;
        match collected {
            Ok(Ok(i)) => break i,
            Ok(Err(e)) => tracing::warn!(
                error = %crate::error_chain::with_causes(&e),
                retry_ms = config.nvml_retry.as_millis() as u64,
                "telemetry: NVML unavailable"
            ),
            Err(e) => tracing::error!(error = %e, "telemetry: NVML loading panicked"),
        }
        tokio::select! {
            _ = stop_seen.wait_for(|s| *s) => return,
            () = tokio::time::sleep(config.nvml_retry) => {}
        }
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
