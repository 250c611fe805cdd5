//! The DRA driver inside `tessera-agent run` (`[dra] enabled = true`):
//! once the daemon's NVML answers, the kubelet plugin
//! ([`crate::dra::plugin`]) serves until the daemon stops, and the node's
//! ResourceSlice ([`crate::dra::slice`]) is applied and kept current: the
//! inventory is read again every [`RESLICE`], and the device plugin's
//! health watch ([`crate::kubelet::HealthWatch`]: a GPU lost, or in
//! quarantine after a critical Xid) is followed as it changes; a change
//! is applied with the pool's generation raised, so the scheduler drops
//! the older slice and allocates nothing new on an unhealthy GPU. Claims'
//! cgroups are learnt beside them ([`crate::dra::bind`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;

use super::device_plugin::DEV_DIR;
use super::nvml::SharedNvml;
use crate::config::Config;
use crate::containers::Store;
use crate::dra::plugin::{ApiClaims, DraPlugin, Sockets, serve};
use crate::dra::prepare::Preparer;
use crate::dra::slice::{NodeRef, pcie_root, resource_slice, slice_name};
use crate::gpu::{Health, Inventory, NvmlBackend};
use crate::kubelet::allocate::HostPaths;
use crate::kubelet::{HealthWatch, KubeletConfig};

/// How often the inventory is read again for the slice.
pub const RESLICE: Duration = Duration::from_secs(10);
/// The field manager of the slice's server-side apply.
const MANAGER: &str = "tessera-agent";

/// Runs the driver until `stop` turns true.
pub async fn run(
    config: Config,
    nvml: Arc<SharedNvml>,
    client: kube::Client,
    stop: watch::Receiver<bool>,
) {
    let Some(node) = config.kubelet.node_name.clone() else {
        // Config::merge refuses `[dra] enabled` without a node name.
        tracing::error!("the DRA driver has no node name; not started");
        return;
    };
    let mut seen = stop.clone();
    let Some(backend) = nvml
        .wait_for("DRA driver", |n| Ok(n.clone()), async move {
            let _ = seen.wait_for(|s| *s).await;
        })
        .await
    else {
        return;
    };
    let inventory = match read_inventory(&backend).await {
        Ok(i) => i,
        Err(e) => {
            tracing::error!(error = %e, "the DRA driver cannot read the GPUs; not started");
            return;
        }
    };
    let minors = inventory
        .gpus
        .iter()
        .map(|g| backend.minor_number(g.index).ok())
        .collect();
    let k = &config.kubelet;
    let preparer = Preparer {
        node: node.clone(),
        store: Store::new(config.root.clone()),
        paths: HostPaths {
            library_dir: k.preload_dir.join(&k.preload_version),
            dev_dir: DEV_DIR.into(),
        },
        cdi_dir: config.dra.cdi_dir.clone(),
        gpus: inventory.gpus.clone(),
        minors,
    };
    let plugin = DraPlugin {
        preparer: Arc::new(preparer),
        claims: Arc::new(ApiClaims(client.clone())),
        serial: Arc::default(),
    };
    let sockets = Sockets {
        registry_dir: config.dra.registry_dir.clone(),
        plugins_dir: config.dra.plugins_dir.clone(),
    };
    // The claims' cgroups, once their containers run.
    let mut rx = stop.clone();
    let binder = tokio::spawn(crate::dra::bind::run(
        client.clone(),
        node.clone(),
        config.root.clone(),
        config
            .cgroup_root
            .clone()
            .or_else(|| crate::cgroup::v2::cgroup2_root().ok()),
        async move {
            let _ = rx.wait_for(|s| *s).await;
        },
    ));
    let slices = tokio::spawn(publish(client, node, backend, inventory, stop.clone()));
    let (registered, _) = watch::channel(false);
    let mut rx = stop;
    let stopped = async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    if let Err(e) = serve(&sockets, plugin, registered, stopped).await {
        tracing::error!(error = %crate::error_chain::with_causes(&e), "the DRA plugin stopped");
    }
    let _ = slices.await;
    let _ = binder.await;
}

async fn read_inventory(backend: &Arc<NvmlBackend>) -> Result<Inventory, String> {
    let b = Arc::clone(backend);
    tokio::task::spawn_blocking(move || Inventory::collect(&*b))
        .await
        .map_err(|e| format!("the inventory task failed: {e}"))?
        .map_err(|e| crate::error_chain::with_causes(&e))
}

/// Applies the slice, then again whenever the inventory or a GPU's
/// health changes.
async fn publish(
    client: kube::Client,
    node: String,
    backend: Arc<NvmlBackend>,
    mut inventory: Inventory,
    mut stop: watch::Receiver<bool>,
) {
    let initial = inventory
        .gpus
        .iter()
        .map(|g| g.health == Health::Healthy)
        .collect();
    let (health_tx, mut health) = watch::channel(initial);
    let _watch = match HealthWatch::start(
        Arc::clone(&backend),
        inventory.gpus.len(),
        KubeletConfig::default().xid_quarantine,
        health_tx,
    ) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(error = %e, "no GPU health watch for the ResourceSlice (lost GPUs still leave it at the next inventory)");
            None
        }
    };
    let roots: BTreeMap<String, String> = inventory
        .gpus
        .iter()
        .filter_map(|g| {
            Some((
                g.pci_bus_id.clone(),
                pcie_root(std::path::Path::new("/sys"), &g.pci_bus_id)?,
            ))
        })
        .collect();
    loop {
        // Read back every time: kubelet deletes the node's slices when it
        // starts (and a driver's when it stays unregistered), so what was
        // applied may be gone.
        let healthy = with_health(&inventory, &health.borrow_and_update());
        match apply(&client, &node, &healthy, &roots).await {
            Ok(Some(generation)) => {
                let devices = healthy
                    .gpus
                    .iter()
                    .filter(|g| g.health == Health::Healthy)
                    .count();
                tracing::info!(node = %node, generation, devices, "ResourceSlice applied");
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(node = %node, error = %e, "cannot apply the ResourceSlice; retrying")
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = health.changed() => continue,
            () = tokio::time::sleep(RESLICE) => {}
        }
        match read_inventory(&backend).await {
            Ok(i) => inventory = i,
            Err(e) => tracing::warn!(error = %e, "cannot read the GPUs for the ResourceSlice"),
        }
    }
}

/// `inventory` with each GPU the health watch calls unhealthy (by
/// inventory position) marked lost, so the slice leaves it out.
fn with_health(inventory: &Inventory, healthy: &[bool]) -> Inventory {
    let mut out = inventory.clone();
    for (g, ok) in out.gpus.iter_mut().zip(healthy) {
        if !ok {
            g.health = Health::Lost;
        }
    }
    out
}

/// Applies `node`'s slice for `inventory` unless the API server has it
/// as it should be (`None`): the generation is kept when the devices are
/// the ones published, raised otherwise (a deleted slice starts again
/// at 1). The node's UID (the slice's owner) is read only to apply: a
/// node made again gets a new one, and the old owner's garbage collector
/// deletes the slice, which the next pass applies again.
async fn apply(
    client: &kube::Client,
    node: &str,
    inventory: &Inventory,
    roots: &BTreeMap<String, String>,
) -> Result<Option<i64>, String> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let name = slice_name(node);
    let current = slices.get_opt(&name).await.map_err(|e| {
        format!(
            "cannot read ResourceSlice {name}: {}",
            crate::error_chain::with_causes(&e)
        )
    })?;
    let mut owner = NodeRef {
        name: node.to_owned(),
        uid: String::new(),
    };
    // (Devices compared: the API server may default other fields.)
    let devices = resource_slice(&owner, inventory, roots, 0).spec.devices;
    let generation = match current {
        Some(c) if c.spec.devices == devices => return Ok(None),
        Some(c) => c.spec.pool.generation + 1,
        None => 1,
    };
    let nodes: Api<Node> = Api::all(client.clone());
    owner.uid = nodes
        .get(node)
        .await
        .map_err(|e| {
            format!(
                "cannot read node {node}: {}",
                crate::error_chain::with_causes(&e)
            )
        })?
        .metadata
        .uid
        .ok_or_else(|| format!("node {node} has no UID"))?;
    let wanted = resource_slice(&owner, inventory, roots, generation);
    slices
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&wanted),
        )
        .await
        .map_err(|e| {
            format!(
                "cannot apply ResourceSlice {name}: {}",
                crate::error_chain::with_causes(&e)
            )
        })?;
    Ok(Some(generation))
}
