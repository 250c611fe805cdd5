//! `tessera-scheduler`: command line over the webhook and extender logic.
#![forbid(unsafe_code)]

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};
use tessera_api::GpuNode;
use tessera_scheduler::claim_templates::ClaimTemplates;
use tessera_scheduler::extender::{ClusterView, NodeView};
use tessera_scheduler::manifest;
use tessera_scheduler::placement::Policy;
use tessera_scheduler::server::{self, AppState, Telemetry};
use tessera_scheduler::simulate;
use tessera_scheduler::telemetry::{Cache, Staleness};
use tessera_scheduler::webhook::{self, WebhookConfig};

/// Tessera's kube-scheduler extender and admission webhook.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the admission webhook on a manifest and print verdict and patch.
    ///
    /// Reads Pods and the pod templates of Deployments, StatefulSets,
    /// DaemonSets, ReplicaSets, Jobs and CronJobs, from YAML or JSON with
    /// any number of documents. Exits 1 if any pod would be refused.
    CheckPod(CheckPodArgs),
    /// Serve the extender verbs over HTTP and the webhook over HTTPS.
    ///
    /// --listen (plain HTTP, for kube-scheduler on localhost in the same
    /// pod): POST /filter, /prioritize, /bind (with --bind; refused
    /// without), /webhook (AdmissionReview), GET /healthz, /metrics. --webhook-listen
    /// (HTTPS, for the API server): POST /webhook and GET /healthz only,
    /// with the certificate of --tls-cert/--tls-key, re-read when they
    /// change.
    Serve(ServeArgs),
    /// Replay an Alibaba openb trace by workload inflation and compare
    /// placement policies.
    ///
    /// Tasks are drawn from PODS with replacement (seeded) and submitted
    /// one by one to the cluster of NODES until the GPU they request
    /// reaches the cluster's GPU capacity (Weng et al., ATC '23). Prints,
    /// per policy, the share of requested GPU allocated and the GPUs left
    /// unallocated at that point (capacity minus allocated, in GPUs), then
    /// the extender's filter + prioritize latency per pod on the cluster
    /// half full.
    Simulate(SimulateArgs),
}

#[derive(Debug, Args)]
struct SimulateArgs {
    /// Node list CSV (`sn,cpu_milli,memory_mib,gpu,model`).
    #[arg(long)]
    nodes: PathBuf,
    /// Pod list CSV (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]`).
    #[arg(long)]
    pods: PathBuf,
    /// Policy: random, binpack, spread, fgd, tessera, or all.
    #[arg(long, default_value = "all", value_parser = parse_policies)]
    policy: PolicyList,
    /// Seed of the first run's task sequence.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs per policy, with seeds SEED, SEED+1, …; figures are means.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    runs: u64,
    /// Pods timed through filter + prioritize (0 skips the measurement).
    #[arg(long, default_value_t = 1000)]
    latency_pods: usize,
    /// Also compute, for each run's arrived tasks, a lower bound on the
    /// GPUs any policy leaves unallocated (an LP relaxation over classes
    /// of identical nodes and tasks).
    #[arg(long)]
    bound: bool,
    /// Print one JSON object per policy (and one for the bound, one for
    /// the latency).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone)]
struct PolicyList(Vec<Policy>);

fn parse_policies(name: &str) -> Result<PolicyList, String> {
    if name == "all" {
        return Ok(PolicyList(Policy::ALL.to_vec()));
    }
    Policy::from_name(name)
        .map(|p| PolicyList(vec![p]))
        .ok_or_else(|| {
            let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
            format!(
                "unknown policy {name:?}; accepted: {} or all",
                names.join(", ")
            )
        })
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "127.0.0.1:8888")]
    listen: SocketAddr,
    /// GPU telemetry: `GpuNode` objects as `kubectl get gpunodes -o json`
    /// prints them (a list with `items`, or a JSON array of objects), read
    /// once at start (offline use and tests). Without it the GpuNode
    /// objects are watched through the API server (in-cluster config or
    /// KUBECONFIG); with neither, no node has telemetry and every GPU pod
    /// fails filter.
    #[arg(long, env = "TESSERA_NODES")]
    nodes: Option<PathBuf>,
    /// Seconds a GpuNode status may be old before its node takes no new GPU
    /// pods (10 to 86400).
    #[arg(long, env = "TESSERA_TELEMETRY_MAX_AGE_S", value_name = "SECONDS", default_value_t = tessera_scheduler::telemetry::DEFAULT_MAX_AGE.as_secs(), value_parser = parse_max_age)]
    telemetry_max_age_s: u64,
    /// Scheduler name the webhook hands GPU pods to.
    #[arg(long, env = "TESSERA_SCHEDULER_NAME", default_value = webhook::DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
    /// Seconds a connection may take to send a request's headers (from
    /// its start or the previous answer; idle connections close then).
    #[arg(long, env = "TESSERA_HEADER_READ_TIMEOUT", value_name = "SECONDS", default_value = "10", value_parser = server::parse_timeout)]
    header_read_timeout: std::time::Duration,
    /// Seconds a request may take to send its body after its headers.
    #[arg(long, env = "TESSERA_BODY_READ_TIMEOUT", value_name = "SECONDS", default_value = "10", value_parser = server::parse_timeout)]
    body_read_timeout: std::time::Duration,
    /// Largest request body, in bytes (larger answer 413).
    #[arg(long, env = "TESSERA_MAX_BODY", value_name = "BYTES", default_value_t = server::MAX_BODY as u64, value_parser = clap::value_parser!(u64).range(1..))]
    max_body: u64,
    /// Connections served at once per listener; more wait to be accepted.
    #[arg(long, env = "TESSERA_MAX_CONNECTIONS", value_name = "N", default_value_t = server::MAX_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65_536))]
    max_connections: usize,
    /// Bind pods through the API server (in-cluster config or
    /// KUBECONFIG): /bind writes the assignment and creates the Binding.
    /// Pods already holding assignments are counted at start and every
    /// --refresh-interval.
    #[arg(long, env = "TESSERA_BIND")]
    bind: bool,
    /// Seconds between recounts of the pods holding assignments.
    #[arg(long, env = "TESSERA_REFRESH_INTERVAL", value_name = "SECONDS", default_value = "30", value_parser = server::parse_timeout)]
    refresh_interval: std::time::Duration,
    /// DRA mode: the webhook turns HAMi's GPU shares (gpumem, gpucores)
    /// into claims of ResourceClaimTemplates of DeviceClass gpu.tessera.dev,
    /// which it makes in the pod's namespace through the API server
    /// (in-cluster config or KUBECONFIG) before admitting the pod; whole-GPU
    /// pods are left to the DeviceClass's extended-resource mapping, and no
    /// pod is handed to --scheduler-name.
    #[arg(long, env = "TESSERA_DRA")]
    dra: bool,
    /// Shares one GPU may carry (HAMi's deviceSplitCount).
    #[arg(long, env = "TESSERA_MAX_SHARES_PER_GPU", default_value_t = tessera_scheduler::bind::reserve::DEFAULT_MAX_SHARES, value_parser = clap::value_parser!(u32).range(1..))]
    max_shares_per_gpu: u32,
    #[command(flatten)]
    tls: TlsArgs,
}

/// The webhook's HTTPS listener.
#[derive(Debug, Args)]
struct TlsArgs {
    /// Address of the HTTPS listener for the API server's webhook calls
    /// (routes /webhook and /healthz only); none without it.
    #[arg(long, env = "TESSERA_WEBHOOK_LISTEN", requires_all = ["tls_cert", "tls_key"])]
    webhook_listen: Option<SocketAddr>,
    /// PEM certificate chain, leaf first (`tls.crt` of the mounted secret).
    #[arg(
        long,
        env = "TESSERA_TLS_CERT",
        value_name = "FILE",
        requires = "webhook_listen"
    )]
    tls_cert: Option<PathBuf>,
    /// PEM private key (`tls.key` of the mounted secret).
    #[arg(
        long,
        env = "TESSERA_TLS_KEY",
        value_name = "FILE",
        requires = "webhook_listen"
    )]
    tls_key: Option<PathBuf>,
    /// Seconds between checks of the certificate files; a changed, valid
    /// pair serves new handshakes, a broken one is logged and ignored.
    #[arg(long, env = "TESSERA_TLS_RELOAD_INTERVAL", value_name = "SECONDS", default_value = "10", value_parser = server::parse_timeout)]
    tls_reload_interval: std::time::Duration,
}

#[derive(Debug, Args)]
struct CheckPodArgs {
    /// Manifest file (YAML or JSON); `-` reads standard input.
    file: PathBuf,
    /// Scheduler name the webhook hands GPU pods to.
    #[arg(long, env = "TESSERA_SCHEDULER_NAME", default_value = webhook::DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
    /// DRA mode, as `serve --dra`: also prints the ResourceClaimTemplates
    /// each pod would name (made by the webhook, not by this command).
    #[arg(long, env = "TESSERA_DRA")]
    dra: bool,
    /// Print one JSON object per pod instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::CheckPod(args) => check_pod(&args),
        Command::Serve(args) => {
            serve(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Simulate(args) => {
            simulate(&args)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn simulate(args: &SimulateArgs) -> anyhow::Result<()> {
    let options = simulate::Options {
        nodes: args.nodes.clone(),
        pods: args.pods.clone(),
        policies: args.policy.0.clone(),
        seeds: (0..args.runs).map(|i| args.seed.wrapping_add(i)).collect(),
        latency_pods: args.latency_pods,
        bound: args.bound,
    };
    let outcome = simulate::simulate(&options)?;
    if args.json {
        for report in &outcome.policies {
            println!("{}", report.to_json());
        }
        if let Some(bound) = &outcome.bound {
            println!("{}", bound.to_json());
        }
        if let Some(latency) = &outcome.latency {
            println!("{}", latency.to_json());
        }
        return Ok(());
    }
    println!(
        "{}: {} nodes, {} GPUs; {}: {} tasks; {} run(s) per policy from seed {}",
        args.nodes.display(),
        outcome.nodes,
        outcome.gpus,
        args.pods.display(),
        outcome.tasks,
        args.runs,
        args.seed
    );
    println!("{}", simulate::report::HEADER);
    for report in &outcome.policies {
        println!("{}", report.to_line());
    }
    if let Some(bound) = &outcome.bound {
        println!("{}", bound.to_line());
        for report in &outcome.policies {
            println!(
                "{:<8} {:>11.1} GPUs above the bound",
                report.policy.name(),
                report.unallocated_gpus() - bound.unallocated_gpus()
            );
        }
    }
    if let Some(l) = &outcome.latency {
        println!(
            "filter+prioritize per pod ({} pods, {} nodes, cluster half full): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            l.pods, l.nodes, l.p50_ms, l.p99_ms, l.max_ms
        );
    }
    Ok(())
}

fn parse_max_age(text: &str) -> Result<u64, String> {
    let s: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number of seconds"))?;
    Staleness::new(s).map_err(|e| e.to_string())?;
    Ok(s)
}

/// The telemetry `serve` judges against: the node file, else the GpuNode
/// watch when an API client can be configured, else nothing.
async fn telemetry(args: &ServeArgs) -> anyhow::Result<Telemetry> {
    let staleness = Staleness::new(args.telemetry_max_age_s)?;
    if let Some(path) = &args.nodes {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let nodes = read_gpu_nodes(&text).with_context(|| {
            format!(
                "{} is not a GpuNode list (`kubectl get gpunodes -o json`)",
                path.display()
            )
        })?;
        return Ok(ClusterView::new(nodes.iter().map(NodeView::from_gpu_node)).into());
    }
    match kube::Client::try_default().await {
        Ok(client) => {
            let (cache, _task) = Cache::spawn(client, std::future::pending());
            tracing::info!(
                max_age_s = args.telemetry_max_age_s,
                "watching GpuNode telemetry"
            );
            Ok(Telemetry::Live { cache, staleness })
        }
        Err(error) => {
            tracing::warn!(error = %tessera_scheduler::error_chain::with_causes(&error), "no --nodes and no API client (in-cluster config or KUBECONFIG): no node has GPU telemetry");
            Ok(Telemetry::default())
        }
    }
}

fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let view = telemetry(args).await?;
        let client = match (args.bind, args.dra) {
            (false, false) => None,
            (bind, _) => Some(
                kube::Client::try_default()
                    .await
                    .with_context(|| {
                        format!(
                            "connecting to the API server for {}",
                            if bind { "--bind" } else { "--dra" }
                        )
                    })?,
            ),
        };
        let binder = match (args.bind, &client) {
            (true, Some(client)) => {
                let binder = tessera_scheduler::bind::Binder::awaiting_count(
                    client.clone(),
                    tessera_scheduler::bind::reserve::Reservations::new(args.max_shares_per_gpu),
                );
                // The live cache is read in the background: counted once
                // it is ready, by the recount task below.
                if let Telemetry::Static(snap) = &view {
                    let counted = binder.refresh(&snap.view).await?;
                    tracing::info!(pods = counted, "pods holding GPU assignments counted");
                }
                Some(binder)
            }
            _ => None,
        };
        let claim_templates = match (args.dra, client) {
            (true, Some(client)) => Some(ClaimTemplates::new(client)),
            _ => None,
        };
        let state = Arc::new(AppState {
            view,
            webhook: WebhookConfig {
                scheduler_name: args.scheduler_name.clone(),
                dra: args.dra,
            },
            binder,
            claim_templates,
            ..AppState::default()
        });
        if let Some(binder) = state.binder.clone() {
            let (state, every) = (state.clone(), args.refresh_interval);
            tokio::spawn(async move {
                let live = matches!(state.view, Telemetry::Live { .. });
                state.view.ready().await;
                loop {
                    if !live {
                        tokio::time::sleep(every).await;
                    }
                    let now = state.view.now();
                    if let Err(e) = binder.refresh(&now.view).await {
                        tracing::warn!(error = %tessera_scheduler::error_chain::with_causes(&e), "recounting assignments failed; keeping the table");
                    }
                    if live {
                        tokio::time::sleep(every).await;
                    }
                }
            });
        }
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let local = listener.local_addr().context("reading the bound address")?;
        let webhook = webhook_listener(&args.tls).await?;
        match &webhook {
            Some((tls, _)) => {
                let addr = tls.local_addr().context("reading the bound webhook address")?;
                tracing::info!(listen = %local, webhook = %addr, nodes = state.view.now().view.len(), "serving");
            }
            None => tracing::info!(listen = %local, nodes = state.view.now().view.len(), "serving"),
        }
        let limits = server::Limits {
            header_read_timeout: args.header_read_timeout,
            body_read_timeout: args.body_read_timeout,
            max_body: usize::try_from(args.max_body)
                .context("--max-body is larger than this machine's address space")?,
            max_connections: args.max_connections,
        };
        tracing::debug!(?limits, "connection limits");
        let stop = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let plain = server::serve(listener, state.clone(), limits, stopped(stop.1.clone()));
        let secure = async {
            match webhook {
                Some((tls, config)) => {
                    server::serve_tls(tls, config, state.clone(), limits, stopped(stop.1.clone()))
                        .await
                }
                None => Ok(()),
            }
        };
        let signal = async {
            shutdown_signal().await;
            let _ = stop.0.send(true);
            Ok::<(), server::ServerError>(())
        };
        tokio::try_join!(plain, secure, signal)?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// The HTTPS listener, its certificate loaded and its reload task started.
async fn webhook_listener(
    args: &TlsArgs,
) -> anyhow::Result<Option<(tokio::net::TcpListener, Arc<rustls::ServerConfig>)>> {
    let (Some(addr), Some(cert), Some(key)) = (args.webhook_listen, &args.tls_cert, &args.tls_key)
    else {
        return Ok(None);
    };
    let files = server::tls::CertFiles {
        cert: cert.clone(),
        key: key.clone(),
    };
    let reloader =
        server::tls::CertReloader::new(files).context("loading the webhook certificate")?;
    let config = reloader.server_config()?;
    reloader.spawn(args.tls_reload_interval);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr} (webhook)"))?;
    Ok(Some((listener, config)))
}

/// Completes on SIGTERM (how Kubernetes stops a pod) or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(error) => {
            tracing::warn!(%error, "no SIGTERM handler; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn check_pod(args: &CheckPodArgs) -> anyhow::Result<ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        text
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let pods = manifest::pods_in(&text).with_context(|| format!("in {}", args.file.display()))?;
    let config = WebhookConfig {
        scheduler_name: args.scheduler_name.clone(),
        dra: args.dra,
    };
    let mut all_allowed = true;
    for found in pods {
        let verdict = webhook::admit_pod(&found.pod, &config);
        all_allowed &= verdict.is_ok();
        if args.json {
            println!("{}", verdict_json(&found.source, &verdict));
        } else {
            print_verdict(&found.source, &verdict);
        }
    }
    Ok(if all_allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn verdict_json(source: &str, verdict: &Result<webhook::Admitted, webhook::WebhookError>) -> Value {
    match verdict {
        Ok(admitted) => json!({
            "source": source, "allowed": true,
            "patch": admitted.patch, "warnings": admitted.warnings,
            "templates": admitted.templates,
        }),
        Err(error) => json!({
            "source": source, "allowed": false,
            "code": error.code(), "message": error.full_message(),
        }),
    }
}

fn print_verdict(source: &str, verdict: &Result<webhook::Admitted, webhook::WebhookError>) {
    match verdict {
        Ok(admitted) => {
            let change = if admitted.patch.is_empty() {
                " (unchanged)"
            } else {
                ""
            };
            println!("{source}: allowed{change}");
            for op in &admitted.patch {
                println!("  {} {} = {}", op.op, op.path, op.value);
            }
            for warning in &admitted.warnings {
                println!("  warning: {warning}");
            }
            for template in &admitted.templates {
                println!(
                    "  template {}: {}",
                    template.metadata.name.as_deref().unwrap_or_default(),
                    serde_json::to_string(&template.spec).unwrap_or_default()
                );
            }
        }
        Err(error) => {
            println!(
                "{source}: denied ({}): {}",
                error.code(),
                error.full_message()
            );
        }
    }
}

/// `GpuNode` objects from a `kind: List`-style object with `items`, or from
/// a JSON array.
fn read_gpu_nodes(text: &str) -> serde_json::Result<Vec<GpuNode>> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Nodes {
        List { items: Vec<GpuNode> },
        Array(Vec<GpuNode>),
    }
    Ok(match serde_json::from_str(text)? {
        Nodes::List { items } | Nodes::Array(items) => items,
    })
}
