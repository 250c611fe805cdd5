//! `tessera-scheduler`: command line over the webhook and extender logic.
#![forbid(unsafe_code)]

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};
use tessera_scheduler::manifest;
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
}

#[derive(Debug, Args)]
struct CheckPodArgs {
    /// Manifest file (YAML or JSON); `-` reads standard input.
    file: PathBuf,
    /// Scheduler name the webhook hands GPU pods to.
    #[arg(long, env = "TESSERA_SCHEDULER_NAME", default_value = webhook::DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
    /// Print one JSON object per pod instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::CheckPod(args) => check_pod(&args),
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
