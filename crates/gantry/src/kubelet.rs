//! `gantry kubelet`: resolve the configuration, connect to the runtime, run.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use gantry_agent::agent::{self, Agent, AgentError, Shared, runonce};
use gantry_agent::cluster::{maintenance, mirror, pod_source, status_sync};
use gantry_agent::image::collector::ImageCollector;
use gantry_agent::node::{self, Startup};
use gantry_agent::source::SourceKind;
use gantry_config::{self as config, ConfigError, RUNONCE_DEPRECATION, Settings};
use gantry_server as server;

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
    limit_malloc_arenas();
    // One worker: the agent waits on the runtime and the API server, and every extra worker
    // thread costs a stack and a malloc arena (measured: ~2 MiB RSS each, no latency gain).
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
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

/// glibc gives each thread that allocates its own arena, which stays resident; the agent's
/// threads allocate little and rarely at once, so one shared arena is enough.
fn limit_malloc_arenas() {
    // SAFETY: called before any other thread exists; mallopt only adjusts allocator tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

async fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    tracing::info!(node = %settings.node_name, "starting gantry kubelet: {}", settings.redacted_summary());
    tokio::fs::create_dir_all(&settings.root_dir)
        .await
        .with_context(|| format!("cannot create --root-dir {}", settings.root_dir.display()))?;
    let shared = Shared::connect(&settings).await?;
    let mut sources = agent::start_sources(&settings);
    if settings.run_once {
        return run_once(shared, sources.kinds.is_empty(), sources.rx).await;
    }
    let cluster = match settings.kubeconfig {
        Some(_) => Some(join_cluster(&settings, &shared, &mut sources).await?),
        None => None,
    };
    let shared = match &cluster {
        Some(c) => shared.with_api(c.client.clone(), &settings.node_name, c.host_ip.clone()),
        None => shared,
    };
    if sources.kinds.is_empty() {
        tracing::warn!(
            "no pod source is configured (--kubeconfig, --pod-manifest-path or --manifest-url); running no pods"
        );
    }
    if settings.server.enabled {
        let client = cluster.as_ref().map(|c| c.client.clone());
        let cri = shared.driver.cri().clone();
        let host_ip = shared.host_ip.as_deref().and_then(|ip| ip.parse().ok());
        let pods = Arc::new(AgentPods(shared.statuses.clone()));
        let state = server::ServerState::new(&settings, cri, pods, host_ip, client);
        server::start(&settings, state).await.context("cannot start the node API server")?;
    }
    let statuses = shared.statuses.clone();
    let root_dir = settings.root_dir.clone();
    tokio::spawn(async move { statuses.write_file_forever(root_dir).await });
    let gc_events =
        cluster.as_ref().map(|c| gantry_agent::events::NodeEventRecorder::new(c.client.clone(), &settings.node_name));
    let collector =
        ImageCollector::new(shared.driver.cri().clone(), settings.images.clone(), gc_events, &settings.node_name);
    tokio::spawn(collector.run());
    tokio::spawn(gantry_logs::rotation::run(
        shared.driver.cri().runtime.clone(),
        settings.node_name.clone(),
        settings.logs.clone(),
    ));
    let agent = Agent::new(shared.clone(), sources.kinds.clone(), &settings.node_name);
    if let Some(c) = cluster {
        // Before the agent runs: pods a maintenance held when the last run ended stay stopped.
        let holds = agent.holds();
        holds.send_replace(maintenance::load(&maintenance::holds_file(&settings.root_dir)));
        let (node, root) = (settings.node_name.clone(), settings.root_dir.clone());
        let watch = maintenance::run(c.client.clone(), node, root, holds, c.mirrors.clone());
        tokio::spawn(watch);
        c.spawn_pod_side(&settings, &shared, agent.static_pods());
    }
    drop(sources.tx);
    tokio::select! {
        () = agent.run(sources.rx) => {}
        signal = shutdown_signal() => {
            tracing::info!(signal, "shutting down; running pods keep running");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Cluster mode: the node side (registration, status, lease) and the API pod source.
struct Cluster {
    client: kube::Client,
    /// The node's first InternalIP, the pods' hostIP.
    host_ip: Option<String>,
    node_uid: tokio::sync::watch::Receiver<Option<String>>,
    mirrors: tokio::sync::watch::Receiver<Vec<k8s_openapi::api::core::v1::Pod>>,
}

async fn join_cluster(settings: &Settings, shared: &Shared, sources: &mut agent::Sources) -> anyhow::Result<Cluster> {
    // With static pods, an API server that is not up yet (perhaps one of them) must not stop them.
    let startup = if sources.kinds.is_empty() { Startup::RequireServer } else { Startup::TolerateUnreachable };
    let node = node::start(settings, shared.driver.cri().clone(), startup).await?;
    let client = node.clients.client.clone();
    let (mirrors_tx, mirrors) = tokio::sync::watch::channel(Vec::new());
    sources.kinds.push(SourceKind::Api);
    tokio::spawn(pod_source::run(client.clone(), settings.node_name.clone(), sources.tx.clone(), mirrors_tx));
    let host_ip = node.host_ips.first().cloned();
    Ok(Cluster { client, host_ip, node_uid: node.node_uid, mirrors })
}

impl Cluster {
    /// Mirror pods for static pods and pod status reporting.
    fn spawn_pod_side(
        self,
        settings: &Settings,
        shared: &Shared,
        statics: tokio::sync::watch::Receiver<Vec<k8s_openapi::api::core::v1::Pod>>,
    ) {
        let node = settings.node_name.clone();
        tokio::spawn(mirror::run(self.client.clone(), node, self.node_uid, statics, self.mirrors.clone()));
        tokio::spawn(status_sync::run(self.client, shared.statuses.clone(), self.mirrors));
    }
}

async fn run_once(
    shared: std::sync::Arc<Shared>,
    no_sources: bool,
    updates: tokio::sync::mpsc::Receiver<gantry_agent::source::SourceUpdate>,
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

/// The node API's view of the agent: the pods it runs with their latest status.
struct AgentPods(Arc<gantry_agent::status_store::StatusStore>);

impl server::PodList for AgentPods {
    fn pods(&self) -> Vec<k8s_openapi::api::core::v1::Pod> {
        self.0.all()
    }
}
