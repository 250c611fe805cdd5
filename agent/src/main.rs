//! `tessera-agent`: the Tessera node agent.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tessera_agent::cgroup::{CgroupMap, cgroup2_root};
use tessera_agent::commands::container::ContainerArgs;
use tessera_agent::commands::policy::PolicyCommand;
use tessera_agent::commands::region::RegionCommand;
use tessera_agent::config::{Config, ConfigArgs};
use tessera_agent::ebpf::Observer;
use tessera_agent::ebpf::args::EbpfArgs;
use tessera_agent::error_chain::with_causes;
use tessera_agent::gpu::{GpuArgs, Inventory};
use tessera_ebpf_common::{
    dev::{kdev_major, kdev_minor},
    uvm::format_uuid,
};

/// The Tessera node agent: one per GPU node.
#[derive(Debug, Parser)]
#[command(name = "tessera-agent", version)]
struct Cli {
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the node's GPUs as NVML reports them.
    Inventory {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Load the eBPF observer, watch for a while, and print per-cgroup
    /// NVIDIA device use (JSON) with the pod and container of each cgroup.
    Observe {
        #[command(flatten)]
        ebpf: EbpfArgs,
        /// How long to watch.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Run the node agent: the control loop over the region directories
    /// under the root, /healthz and /readyz; stops on SIGTERM or SIGINT.
    Run {
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Check the daemon's configuration as `run` would load it (file,
    /// then flags and environment over it).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Manage containers outside Kubernetes (docker run, systemd, Slurm):
    /// their region directories under the root.
    Container(ContainerArgs),
    /// Create, update and inspect a container's region directory (the
    /// limits its processes' libtessera.so enforces).
    Region {
        #[command(subcommand)]
        command: RegionCommand,
    },
    /// Check a node policy file (YAML) as the agent would load it.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Load the settings exactly as `run` does and print the effective
    /// ones (every default written out); exit status 1 with the error
    /// naming file, field and what is accepted when `run` would refuse
    /// them.
    Check {
        #[command(flatten)]
        config: ConfigArgs,
    },
}

fn observe(ebpf: &EbpfArgs, seconds: u64) -> Result<()> {
    let config = ebpf.config().context("cannot pick the devices to watch")?;
    let observer = Observer::start(&config).context("cannot start the eBPF observer")?;
    eprintln!(
        "tessera-agent: observing {} device(s) in {:?} mode for {seconds} s",
        config.devices.len(),
        observer.mode()
    );
    std::thread::sleep(std::time::Duration::from_secs(seconds));
    let snap = observer
        .snapshot()
        .context("cannot read the observer's maps")?;
    let cgroups = cgroup2_root()
        .ok()
        .and_then(|root| CgroupMap::build(&root).ok())
        .unwrap_or_default();
    let mut ids: Vec<u64> = snap.ioctls.keys().map(|k| k.cgroup_id).collect();
    ids.extend(snap.opens.keys().map(|k| k.cgroup_id));
    ids.sort_unstable();
    ids.dedup();
    let dev = |d: u32| format!("{}:{}", kdev_major(d), kdev_minor(d));
    let uuid = |u: &[u8; 16]| {
        let mut text = [0u8; 40];
        let n = format_uuid(u, &mut text);
        String::from_utf8_lossy(&text[..n]).into_owned()
    };
    let rows: Vec<serde_json::Value> = ids
        .iter()
        .map(|&id| {
            let entry = cgroups.get(id);
            let mut devices = std::collections::BTreeMap::<String, u64>::new();
            for (k, n) in snap.ioctls_of(id) {
                *devices.entry(dev(k.dev)).or_default() += n;
            }
            let opens: u64 = snap
                .opens
                .iter()
                .filter(|(k, _)| k.cgroup_id == id)
                .map(|(_, n)| n)
                .sum();
            serde_json::json!({
                "cgroup_id": id,
                "cgroup": entry.map(|e| e.path.clone()),
                "pod_uid": cgroups.pod_of(id).map(|p| p.uid.clone()),
                "ioctls_by_device": devices,
                "opens": opens,
                "gpus": snap.gpus_of(id).iter().map(|(u, _)| uuid(u)).collect::<Vec<_>>(),
                "video_memory_estimate": snap.rm_bytes_of(id),
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "mode": format!("{:?}", observer.mode()),
            "cgroups": rows,
            "notes": cgroups.notes,
        }))?
    );
    Ok(())
}

fn inventory(cli: &Cli, json: bool) -> Result<()> {
    let backend = cli.gpu.backend()?;
    let inventory = Inventory::collect(&backend).context("cannot take the GPU inventory")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&inventory)?);
    } else {
        print!("{}", inventory.table());
    }
    Ok(())
}

/// The settings `run` uses: `args` (file, flags, environment) and the
/// NVML library when given on the command line or in the environment.
fn load_config(cli: &Cli, nvml_given: bool, args: &ConfigArgs) -> Result<Config> {
    let nvml = nvml_given.then(|| std::path::Path::new(&cli.gpu.nvml_lib));
    Ok(Config::load(args, nvml)?)
}

fn config_check(cli: &Cli, nvml_given: bool, args: &ConfigArgs) -> Result<()> {
    let config = load_config(cli, nvml_given, args)?;
    let source = args
        .config
        .as_ref()
        .map_or_else(|| "no config file".to_owned(), |p| p.display().to_string());
    println!("# {source}: accepted; effective settings:\n{config:#?}");
    Ok(())
}

fn run(cli: &Cli, nvml_given: bool, args: &ConfigArgs) -> Result<()> {
    let config = load_config(cli, nvml_given, args)?;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(&config.log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tessera_agent::daemon::run(config)?;
    Ok(())
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    // The NVML library from --nvml-lib/TESSERA_NVML_LIB wins over the
    // config file; its built-in default does not.
    let nvml_given = !matches!(
        matches.value_source("nvml_lib"),
        None | Some(ValueSource::DefaultValue)
    );
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let result = match &cli.command {
        Command::Run { config } => run(&cli, nvml_given, config),
        Command::Config {
            command: ConfigCommand::Check { config },
        } => config_check(&cli, nvml_given, config),
        Command::Container(args) => tessera_agent::commands::container::run(args)
            .map(|out| println!("{out}"))
            .map_err(anyhow::Error::from),
        Command::Inventory { json } => inventory(&cli, *json),
        Command::Observe { ebpf, seconds } => observe(ebpf, *seconds),
        Command::Region { command } => tessera_agent::commands::region::run(command)
            .map(|out| println!("{out}"))
            .map_err(anyhow::Error::from),
        Command::Policy { command } => tessera_agent::commands::policy::run(command)
            .map(|out| println!("{out}"))
            .map_err(anyhow::Error::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-agent: error: {}", with_causes(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
