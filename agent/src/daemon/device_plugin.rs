//! The device plugin inside `tessera-agent run` (`[kubelet] enabled =
//! true`): once the daemon's NVML is loaded ([`super::nvml`], retried
//! every `nvml_retry_ms` until it works), [`crate::kubelet::serve`] runs
//! on that handle until the daemon stops, its registration state feeding
//! `/readyz`.

use std::sync::Arc;

use tokio::sync::watch;

use super::nvml::SharedNvml;
use crate::config::Config;
use crate::kubelet::{AllocateSetup, Wiring};
use crate::view::status::Status;

/// Where the device nodes are on the host.
pub const DEV_DIR: &str = "/dev";

/// Runs the device plugin until `stop` completes.
pub async fn run(
    config: Config,
    nvml: Arc<SharedNvml>,
    client: kube::Client,
    status: Arc<Status>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let k = &config.kubelet;
    let Some(node) = k.node_name.clone() else {
        // Config::merge refuses `enabled` without a node name.
        tracing::error!("the device plugin has no node name; not started");
        return;
    };
    let Some(nvml) = nvml
        .wait_for("device plugin", |n| Ok(n.clone()), &mut stop)
        .await
    else {
        return;
    };
    let (tx, mut rx) = watch::channel(false);
    let feed = {
        let status = status.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                status.set_device_plugin(*rx.borrow_and_update());
            }
        })
    };
    let wiring = Wiring {
        allocate: Some(AllocateSetup {
            client,
            node,
            root: config.root.clone(),
            preload_dir: k.preload_dir.clone(),
            version: k.preload_version.clone(),
            dev_dir: DEV_DIR.into(),
        }),
        registered: Some(tx),
    };
    if let Err(e) = crate::kubelet::serve(k.device_plugin.clone(), nvml, wiring, stop).await {
        tracing::error!(error = %crate::error_chain::with_causes(&e), "the device plugin stopped");
    }
    status.set_device_plugin(false);
    feed.abort();
}
