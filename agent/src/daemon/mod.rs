//! `tessera-agent run`: the node agent as a long-running service.
//!
//! A tokio runtime (current thread) runs the HTTP endpoint ([`http`]) and
//! the control loop; each period ([`tick`]) runs on the blocking pool so a
//! slow NVML call or file system never stalls the endpoint, and a period
//! that never returns shows as a failing `/healthz`. SIGTERM or SIGINT
//! stops both: the period in flight completes (control writes are never
//! cut short by the agent itself), the listener closes, the process exits
//! 0. Nothing is undone on exit: the limits stay in the control regions
//! (invariant I4), and the next agent resumes them in its first period.
//!
//! With `[kubelet] enabled = true` the device plugin ([`device_plugin`]) runs
//! beside the loop, on the same runtime and stop signal: it removes its
//! socket on the way out, and `/readyz` fails while it is not registered
//! with kubelet. With `[dra] enabled = true` the DRA driver ([`dra`])
//! runs the same way (its plugin and the node's ResourceSlice). The loop,
//! the device plugin, the DRA driver and the telemetry writer share one
//! NVML ([`nvml`]): one handle, one retry policy.

pub mod device_plugin;
pub mod dra;
pub mod ebpf;
pub mod http;
pub mod nvml;
pub mod telemetry;
pub mod tick;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::view::Status;
use tick::Agent;

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The runtime could not start.
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    /// The root could not be created.
    #[error(transparent)]
    Root(#[from] crate::containers::StoreError),
    /// The endpoint could not listen.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The metric families could not be defined.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// No signal handler could be installed.
    #[error("cannot install the SIGTERM/SIGINT handlers")]
    Signal(#[source] std::io::Error),
    /// The Kubernetes API client could not be set up.
    #[error(
        "cannot reach the Kubernetes API for the device plugin or the DRA driver (in-cluster service account or kubeconfig)"
    )]
    Kube(#[source] kube::Error),
    /// The garbage collection's settings are out of range (checked at
    /// load; kept for a caller that builds them by hand).
    #[error("the garbage collection of region directories cannot start")]
    Gc(#[source] crate::kubelet::gc_task::GcConfigError),
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn run(config: Config) -> Result<(), DaemonError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(4)
        .build()
        .map_err(DaemonError::Runtime)?;
    let result = runtime.block_on(serve(config));
    // A period stuck in the kernel must not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

async fn serve(config: Config) -> Result<(), DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
    let agent = Agent::new(&config);
    agent.store().ensure_root()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| DaemonError::Listen {
            addr: config.listen,
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| DaemonError::Listen {
            addr: config.listen,
            source,
        })?;
    tracing::info!(
        listen = %local,
        root = %config.root.display(),
        period_ms = config.period.as_millis() as u64,
        "tessera-agent running"
    );
    let status = Arc::new(Status::new(config.stall_after));
    let metrics = Arc::new(Metrics::new()?);
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let server = tokio::spawn(http::serve(
        listener,
        status.clone(),
        metrics.clone(),
        stopped(stop_rx.clone()),
    ));
    let client = if config.kubelet.enabled || config.dra.enabled {
        Some(
            kube::Client::try_default()
                .await
                .map_err(DaemonError::Kube)?,
        )
    } else {
        None
    };
    let (device_plugin, telemetry) = match &client {
        Some(client) if config.kubelet.enabled => {
            status.require_device_plugin();
            let device_plugin = tokio::spawn(device_plugin::run(
                config.clone(),
                agent.nvml(),
                client.clone(),
                status.clone(),
                stopped(stop_rx.clone()),
            ));
            let telemetry = tokio::spawn(telemetry::run(
                config.clone(),
                agent.nvml(),
                client.clone(),
                status.clone(),
                stop_rx.clone(),
            ));
            // The containers' cgroups, once they run.
            tokio::spawn(crate::kubelet::bind::run(
                client.clone(),
                config.kubelet.node_name.clone().unwrap_or_default(),
                config.root.clone(),
                config
                    .cgroup_root
                    .clone()
                    .or_else(|| crate::cgroup::v2::cgroup2_root().ok()),
                stopped(stop_rx.clone()),
            ));
            (Some(device_plugin), Some(telemetry))
        }
        _ => (None, None),
    };
    let dra = match client {
        Some(client) if config.dra.enabled => Some(tokio::spawn(dra::run(
            config.clone(),
            agent.nvml(),
            client,
            stop_rx.clone(),
        ))),
        _ => None,
    };
    // Region directories of departed pods go once kubelet's PodResources
    // shows them gone (never a running container's: containers::gc).
    let gc = if config.kubelet.enabled {
        Some(
            crate::kubelet::gc_task::spawn_gc(
                config.kubelet.gc.clone(),
                config.root.clone(),
                stopped(stop_rx.clone()),
            )
            .map_err(DaemonError::Gc)?,
        )
    } else {
        None
    };
    let control = tokio::spawn(control_loop(
        Arc::new(Mutex::new(agent)),
        status,
        metrics,
        config.period,
        stopped(stop_rx),
    ));
    let signal = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal, "stopping");
    let _ = stop_tx.send(true);
    let _ = server.await;
    if let Some(p) = device_plugin
        && tokio::time::timeout(Duration::from_secs(5), p)
            .await
            .is_err()
    {
        tracing::error!("the device plugin did not stop within 5 s; exiting anyway");
    }
    if let Some(d) = dra
        && tokio::time::timeout(Duration::from_secs(5), d)
            .await
            .is_err()
    {
        tracing::error!("the DRA driver did not stop within 5 s; exiting anyway");
    }
    if let Some(t) = telemetry
        && tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .is_err()
    {
        tracing::error!("the telemetry write in flight did not end within 5 s; exiting anyway");
    }
    if let Some(g) = gc
        && tokio::time::timeout(Duration::from_secs(5), g)
            .await
            .is_err()
    {
        tracing::error!(
            "the garbage collection round in flight did not end within 5 s; exiting anyway"
        );
    }
    if tokio::time::timeout(Duration::from_secs(5), control)
        .await
        .is_err()
    {
        tracing::error!("the control period in flight did not end within 5 s; exiting anyway");
    }
    tracing::info!("stopped");
    Ok(())
}

async fn control_loop(
    agent: Arc<Mutex<Agent>>,
    status: Arc<Status>,
    metrics: Arc<Metrics>,
    period: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = interval.tick() => {}
        }
        let (a, s, m) = (agent.clone(), status.clone(), metrics.clone());
        let period = tokio::task::spawn_blocking(move || {
            // A period that panicked left nothing half-done that the next
            // one does not redo from the host state.
            let mut a = a.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let view = Arc::new(a.tick(&s));
            s.tick_done(view.clone());
            m.observe(view);
        });
        // Finish the period in flight before stopping (its writes are
        // never cut short); a period that never ends leaves /healthz
        // failing and the stop to the runtime's shutdown timeout.
        if let Err(e) = period.await {
            tracing::error!(error = %e, "a control period panicked");
        }
    }
}
