//! `gantry kubelet`: resolve the configuration, connect to the runtime, run.

use std::process::ExitCode;

use anyhow::{Context, bail};
use gantry_kubelet::agent::{self, Agent, AgentError, Shared, runonce};
use gantry_kubelet::config::{self, ConfigError, RUNONCE_DEPRECATION, Settings};

use crate::logging;

pub fn main(args: &[String]) -> ExitCode {
    let logging = logging::init();
    let settings = match config::load(args) {
        Ok(settings) => settings,
        Err(ConfigError::HelpRequested(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("gantry kubelet: {e}");
            return ExitCode::from(2);
        }
    };
    logging.set_verbosity(settings.verbosity);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gantry kubelet: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gantry kubelet: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    tracing::info!(node = %settings.node_name, "starting gantry kubelet: {}", settings.redacted_summary());
    if settings.kubeconfig.is_some() {
        bail!("--kubeconfig was given, but cluster mode is not implemented yet; run without it for standalone mode");
    }
    tokio::fs::create_dir_all(&settings.root_dir)
        .await
        .with_context(|| format!("cannot create --root-dir {}", settings.root_dir.display()))?;
    let shared = Shared::connect(&settings).await?;
    let (kinds, updates) = agent::start_sources(&settings);
    if settings.run_once {
        return run_once(shared, kinds.is_empty(), updates).await;
    }
    if kinds.is_empty() {
        tracing::warn!("no static pod source is configured (--pod-manifest-path or --manifest-url); running no pods");
    }
    let statuses = shared.statuses.clone();
    let root_dir = settings.root_dir.clone();
    tokio::spawn(async move { statuses.write_file_forever(root_dir).await });
    tokio::select! {
        () = Agent::new(shared, kinds).run(updates) => {}
        signal = shutdown_signal() => {
            tracing::info!(signal, "shutting down; running pods keep running");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_once(
    shared: std::sync::Arc<Shared>,
    no_sources: bool,
    updates: tokio::sync::mpsc::Receiver<gantry_kubelet::source::SourceUpdate>,
) -> anyhow::Result<ExitCode> {
    tracing::warn!("{RUNONCE_DEPRECATION}");
    if no_sources {
        return Err(AgentError::NoSources.into());
    }
    let results = runonce::run(shared, updates).await?;
    for r in &results {
        println!("{r}");
    }
    let failed: Vec<&str> = results.iter().filter(|r| r.error.is_some()).map(|r| r.pod.as_str()).collect();
    if failed.is_empty() {
        tracing::info!(pods = results.len(), "pods started");
        Ok(ExitCode::SUCCESS)
    } else {
        bail!("error running pods: {}", failed.join(", "))
    }
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}
