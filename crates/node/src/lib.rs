//! One node agent's whole lifetime, as virtual-kubelet's `Node.Run`: [`Node::run`] connects to
//! the runtime, joins the cluster when a kubeconfig is given, binds the node API, runs every
//! loop under one [`Supervisor`] and returns when told to shut down or when a loop fails.
//!
//! Architecture invariant: the only place that knows every part of the agent; the binary
//! parses flags and calls [`Node::run`] (or [`run_once`]), and the parts do not know each
//! other beyond what their crates export. Nothing is spawned detached: every long-running
//! task is the supervisor's (see its rule).

mod eviction_stats;
pub mod release;

use std::future::Future;
use std::sync::Arc;

use gantry_agent::agent::{self, Agent, AgentError, NamedTask, Shared, Sources, runonce};
use gantry_agent::api::bootstrap;
use gantry_agent::api::rotation::{CertificateRotation, CurrentCert, KeyError, Purpose};
use gantry_agent::cluster::objects::ObjectSource;
use gantry_agent::cluster::{csi_node, maintenance, mirror, pod_source, status_sync};
use gantry_agent::events::Recorder;
use gantry_agent::eviction::{EvictionManager, Reclaim};
use gantry_agent::image::collector::{ImageCollector, ImageReclaimer};
use gantry_agent::node::{self as node_side, Startup};
use gantry_agent::shutdown::ShutdownManager;
use gantry_agent::source::SourceKind;
use gantry_agent::status_store::StatusStore;
use gantry_config::Settings;
use gantry_metrics::Metrics;
use gantry_plugins::csi::CsiDrivers;
use gantry_plugins::devices::DeviceManager;
use gantry_plugins::{podresources, watcher};
use gantry_server as server;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use gantry_supervisor::Supervisor;
pub use gantry_supervisor::TaskFault;

/// Why the node agent could not start or stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot create --root-dir {path}: {source}")]
    RootDir { path: String, source: std::io::Error },
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error(transparent)]
    Cluster(#[from] node_side::NodeError),
    #[error("cannot start the node API server: {0}")]
    Server(#[from] server::ServerError),
    #[error(
        "cannot use tlsCertFile/tlsPrivateKeyFile as the serving certificate until one is issued (serverTLSBootstrap): {}: {source}",
        path.display()
    )]
    ServingCertFile { path: std::path::PathBuf, source: std::io::Error },
    #[error(
        "cannot use tlsCertFile/tlsPrivateKeyFile as the serving certificate until one is issued (serverTLSBootstrap): {0}"
    )]
    ServingCert(#[source] KeyError),
    #[error(transparent)]
    Task(#[from] TaskFault),
    #[error("invalid eviction thresholds: {0}")]
    Eviction(#[from] gantry_pod::eviction::ThresholdError),
}

/// A node agent, before and while it runs.
pub struct Node {
    settings: Settings,
    ready: watch::Sender<bool>,
    /// This node's metrics: the agent, the CRI and API clients and the node API share it, and
    /// no other node in the process does.
    metrics: Arc<Metrics>,
    /// Hands freed memory back to the system (the allocator's call, the binary's to make).
    release_memory: Option<fn()>,
}

impl Node {
    pub fn new(settings: Settings) -> Self {
        Node { settings, ready: watch::Sender::new(false), metrics: Arc::default(), release_memory: None }
    }

    /// Calls `release` once the pods have settled after a burst of changes (see [`release`]).
    pub fn with_memory_release(mut self, release: fn()) -> Self {
        self.release_memory = Some(release);
        self
    }

    /// The registry the node records into (what its `/metrics` shows).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Becomes true once every part runs: the runtime answered, the node API listens and the
    /// pod workers start.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// Runs until `shutdown` completes (`Ok`; running pods keep running) or a supervised task
    /// fails (`Err` naming it).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), NodeError> {
        let settings = &self.settings;
        let mut shutdown = std::pin::pin!(shutdown);
        if let Some(paths) = node_side::bootstrap_paths(settings)
            && (settings.static_pod_path.is_some() || settings.static_pod_url.is_some())
            && !bootstrap::has_valid_client_cert(&paths.kubeconfig)
            && !static_pods_while_bootstrapping(settings, &paths, self.metrics.clone(), shutdown.as_mut()).await?
        {
            return Ok(());
        }
        let (devices, device_tasks) = DeviceManager::new(&settings.root_dir, self.metrics.clone());
        let csi = CsiDrivers::default();
        let shared = connect(settings, self.metrics.clone())
            .await?
            .with_devices(devices.clone())
            .with_csi(csi.clone(), settings.root_dir.clone());
        let mut sources = agent::sources(settings);
        let mut supervisor = Supervisor::default();
        spawn_all(&mut supervisor, std::mem::take(&mut sources.tasks));
        spawn_plugins(&mut supervisor, settings, &shared, devices, device_tasks, csi.clone());
        let serving_cert = serving_certificate(settings)?;
        let cluster = match settings.kubeconfig {
            Some(_) => {
                Some(join_cluster(settings, &shared, &mut sources, serving_cert.clone(), &mut supervisor).await?)
            }
            None => {
                if serving_cert.is_some() {
                    tracing::warn!(
                        node = %settings.node_name,
                        "serverTLSBootstrap needs --kubeconfig to request a serving certificate; the node API serves \
                         only a certificate already in --cert-dir (kubelet-server-current.pem)"
                    );
                }
                None
            }
        };
        let shared = match &cluster {
            Some(c) => {
                let strategy = settings.change_detection;
                let (objects, watches) = ObjectSource::new(c.client.clone(), strategy, c.object_ttl.clone());
                supervisor.spawn("object-watches", watches);
                let csi_node = csi_node::run(c.client.clone(), settings.node_name.clone(), csi.subscribe());
                supervisor.spawn("csi-node", csi_node);
                shared.with_api(c.client.clone(), objects, c.events.clone(), c.host_ip.clone())
            }
            None => shared,
        };
        if sources.kinds.is_empty() {
            tracing::warn!(
                "no pod source is configured (--kubeconfig, --pod-manifest-path or --manifest-url); running no pods"
            );
        }
        // The node API's state: its routes, and the stats the eviction manager reads.
        let client = cluster.as_ref().map(|c| c.client.clone());
        let state = server_state(settings, &shared, csi, client);
        if let Some(period) = settings.server.volume_stats_agg_period {
            supervisor.spawn("volume-stats", server::stats::volumes::run(state.clone(), period));
        }
        if settings.server.enabled {
            let serving = serve(settings, state.clone(), serving_cert).await?;
            spawn_all(&mut supervisor, serving.tasks);
        }
        let images = spawn_housekeeping(&mut supervisor, settings, &shared, cluster.as_ref());
        let agent = Agent::new(shared.clone(), sources.kinds.clone(), &settings.node_name);
        let stats = eviction_stats::SummaryStats { state };
        let reclaim = Reclaim { containers: agent.container_reclaimer(), images };
        let eviction = EvictionManager::new(settings, shared.clone(), stats, reclaim, agent.kills())?;
        supervisor.spawn("eviction-manager", eviction.run());
        if let Some(manager) = ShutdownManager::new(settings, shared.clone(), agent.kills()) {
            supervisor.spawn("node-shutdown", manager.run());
        }
        if let Some(c) = cluster {
            // Before the agent runs: pods a maintenance held when the last run ended stay stopped.
            let holds = agent.holds();
            holds.send_replace(maintenance::load(&maintenance::holds_file(&settings.root_dir)));
            let (node, root) = (settings.node_name.clone(), settings.root_dir.clone());
            supervisor
                .spawn("maintenance-holds", maintenance::run(c.client.clone(), node, root, holds, c.mirrors.clone()));
            c.spawn_pod_side(settings, &shared, agent.static_pods(), &mut supervisor);
        }
        if let Some(release_memory) = self.release_memory {
            supervisor.spawn("memory-release", release::when_settled(shared.statuses.clone(), release_memory));
        }
        drop(sources.tx);
        supervisor.spawn("pod-workers", agent.run(sources.rx));
        self.ready.send_replace(true);
        tracing::info!(node = %settings.node_name, "node agent ready");
        let outcome = supervise(supervisor, shutdown).await;
        // The status file's writer gathers changes for a moment: the last ones are written now.
        if let Err(e) = shared.statuses.write_file(&settings.root_dir).await {
            tracing::warn!(node = %settings.node_name, error = %e, "cannot write pod status file");
        }
        Ok(outcome?)
    }
}

/// TLS bootstrap on a node with static pods: they run (pod sources and workers only) while the
/// node waits for its client certificate, as upstream's static pods do, since the CSR may wait
/// for a human or the API server may be one of them. Once the certificate is there this
/// phase's loops stop (running pods keep running) and the full node, started next, adopts the
/// pods. `Ok(false)`: told to shut down meanwhile.
async fn static_pods_while_bootstrapping(
    settings: &Settings,
    paths: &bootstrap::BootstrapPaths,
    metrics: Arc<Metrics>,
    shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<bool, NodeError> {
    let shared = connect(settings, metrics).await?;
    let mut sources = agent::sources(settings);
    let mut supervisor = Supervisor::default();
    spawn_all(&mut supervisor, std::mem::take(&mut sources.tasks));
    let agent = Agent::new(shared, sources.kinds.clone(), &settings.node_name);
    // Pods a maintenance held when the last run ended stay stopped meanwhile too.
    agent.holds().send_replace(maintenance::load(&maintenance::holds_file(&settings.root_dir)));
    drop(sources.tx);
    supervisor.spawn("pod-workers", agent.run(sources.rx));
    tracing::info!(node = %settings.node_name, "static pods run while the node waits for its client certificate (TLS bootstrap)");
    let mut outcome = None;
    let until = async {
        tokio::select! {
            result = bootstrap::load_client_cert(paths, &settings.node_name) => outcome = Some(result),
            () = shutdown => {}
        }
    };
    supervise(supervisor, until).await?;
    match outcome {
        Some(Ok(())) => Ok(true),
        Some(Err(e)) => Err(node_side::NodeError::from(gantry_agent::api::ApiError::from(e)).into()),
        None => Ok(false),
    }
}

/// The deprecated RunOnce mode (KEP-4580): start the static pods once and report on each.
pub async fn run_once(settings: &Settings) -> Result<Vec<runonce::PodResult>, NodeError> {
    let shared = connect(settings, Arc::default()).await?;
    let sources = agent::sources(settings);
    if sources.kinds.is_empty() {
        return Err(AgentError::NoSources.into());
    }
    // The sources' loops belong to this run: dropping the set when it ends stops them.
    let mut loops = tokio::task::JoinSet::new();
    for (_, task) in sources.tasks {
        loops.spawn(task);
    }
    drop(sources.tx);
    Ok(runonce::run(shared, sources.rx).await?)
}

async fn connect(settings: &Settings, metrics: Arc<Metrics>) -> Result<Arc<Shared>, NodeError> {
    tokio::fs::create_dir_all(&settings.root_dir)
        .await
        .map_err(|source| NodeError::RootDir { path: settings.root_dir.display().to_string(), source })?;
    Ok(Shared::connect(settings, metrics).await?)
}

/// Runs the node's tasks until `shutdown`; a task that fails stops the node (the supervisor's rule).
async fn supervise(supervisor: Supervisor, shutdown: impl Future<Output = ()>) -> Result<(), TaskFault> {
    let outcome = supervisor.run(shutdown).await;
    if let Err(fault) = &outcome {
        tracing::error!(error = %fault, "stopping the node agent; running pods keep running");
    }
    outcome
}

fn spawn_all(supervisor: &mut Supervisor, tasks: Vec<NamedTask>) {
    for (name, task) in tasks {
        supervisor.spawn(name, task);
    }
}

fn server_state(
    settings: &Settings,
    shared: &Shared,
    csi: CsiDrivers,
    client: Option<kube::Client>,
) -> server::ServerState {
    let cri = shared.driver.cri().clone();
    let host_ip = shared.host_ip.as_deref().and_then(|ip| ip.parse().ok());
    let pods = Arc::new(AgentPods(shared.statuses.clone()));
    let volumes = Arc::new(CsiVolumeStats { drivers: csi, root_dir: settings.root_dir.clone() });
    server::ServerState::new(settings, cri, pods, volumes, host_ip, client, shared.metrics.clone())
}

async fn serve(
    settings: &Settings,
    state: server::ServerState,
    serving_cert: Option<Arc<CurrentCert>>,
) -> Result<server::Serving, NodeError> {
    let resolver = serving_cert.map(|c| c as Arc<dyn server::tls::ResolvesServerCert>);
    Ok(server::bind_all(settings, state, resolver).await?)
}

/// With `serverTLSBootstrap` (and the node API on), the serving certificate the API server
/// issues: `<cert-dir>/kubelet-server-current.pem`, else `tlsCertFile` as upstream's store.
fn serving_certificate(settings: &Settings) -> Result<Option<Arc<CurrentCert>>, NodeError> {
    let s = &settings.server;
    if !(s.enabled && s.server_tls_bootstrap) {
        return Ok(None);
    }
    let fallback = match (&s.tls_cert_file, &s.tls_private_key_file) {
        (Some(cert), Some(key)) => {
            let read = |path: &std::path::Path| {
                std::fs::read(path).map_err(|source| NodeError::ServingCertFile { path: path.to_path_buf(), source })
            };
            Some([read(cert)?, b"\n".to_vec(), read(key)?].concat())
        }
        _ => None,
    };
    let cert =
        CurrentCert::serving(&s.cert_dir(&settings.root_dir), fallback.as_deref()).map_err(NodeError::ServingCert)?;
    Ok(Some(Arc::new(cert)))
}

/// Node plugins: the device manager (its registration socket and the plugins' streams), the
/// plugin watcher (device plugins and CSI drivers), and the pod-resources API.
fn spawn_plugins(
    supervisor: &mut Supervisor,
    settings: &Settings,
    shared: &Shared,
    devices: DeviceManager,
    device_tasks: gantry_plugins::devices::Tasks,
    csi: CsiDrivers,
) {
    supervisor.spawn("device-manager", device_tasks.run());
    let handlers = watcher::Handlers { devices: devices.clone(), csi };
    supervisor.spawn("plugin-watcher", watcher::run(settings.root_dir.clone(), handlers));
    let pods = Arc::new(AgentPods(shared.statuses.clone()));
    supervisor.spawn("pod-resources", podresources::serve(settings.root_dir.clone(), pods, devices));
}

/// The status file, image garbage collection, log rotation and the system containers; the
/// image collector's reclaimer is for the eviction manager.
fn spawn_housekeeping(
    supervisor: &mut Supervisor,
    settings: &Settings,
    shared: &Shared,
    cluster: Option<&Cluster>,
) -> ImageReclaimer {
    let statuses = shared.statuses.clone();
    let root_dir = settings.root_dir.clone();
    supervisor.spawn("status-file", async move { statuses.write_file_forever(root_dir).await });
    let gc_events = cluster.map(|c| c.events.clone());
    let cri = shared.driver.cri().clone();
    let collector = ImageCollector::new(cri.clone(), settings.images.clone(), gc_events, &settings.node_name);
    let images = collector.reclaimer();
    supervisor.spawn("image-gc", collector.run());
    let rotation = gantry_logs::rotation::run(cri.runtime, settings.node_name.clone(), settings.logs.clone());
    supervisor.spawn("log-rotation", rotation);
    if gantry_agent::system_containers::configured(&settings.pods) {
        supervisor.spawn("system-containers", gantry_agent::system_containers::run(settings.pods.clone()));
    }
    images
}

/// Cluster mode: the node side (registration, status, lease) and the API pod source.
struct Cluster {
    client: kube::Client,
    /// The node's first InternalIP, the pods' hostIP.
    host_ip: Option<String>,
    node_uid: watch::Receiver<Option<String>>,
    /// The Node's object TTL annotation (the `Cache` strategy's TTL).
    object_ttl: watch::Receiver<Option<std::time::Duration>>,
    mirrors: watch::Receiver<Vec<Pod>>,
    /// Pod and node events (one recorder, one writer task).
    events: Recorder,
}

async fn join_cluster(
    settings: &Settings,
    shared: &Shared,
    sources: &mut Sources,
    serving_cert: Option<Arc<CurrentCert>>,
    supervisor: &mut Supervisor,
) -> Result<Cluster, NodeError> {
    // With static pods, an API server that is not up yet (perhaps one of them) must not stop them.
    let startup = if sources.kinds.is_empty() { Startup::RequireServer } else { Startup::TolerateUnreachable };
    let shutting_down = shared.shutting_down.subscribe();
    let pressure = shared.pressure.subscribe();
    let plugins = node_side::PluginStatus {
        devices: shared.driver.devices().cloned(),
        volumes_in_use: shared.driver.csi().map(|c| c.volumes_in_use()),
    };
    let node = node_side::start(
        settings,
        shared.driver.cri().clone(),
        startup,
        &shared.metrics,
        shutting_down,
        pressure,
        plugins,
    )
    .await?;
    supervisor.adopt("node-status", node.task);
    supervisor.adopt("event-writer", node.event_writer);
    if let Some(rotation) = node.clients.rotation.clone() {
        supervisor.spawn("certificate-rotation", rotation.run());
    }
    if let Some(cert) = serving_cert {
        let rotation = CertificateRotation {
            client: node.clients.heartbeat.clone(),
            cert,
            cert_dir: settings.server.cert_dir(&settings.root_dir),
            bootstrap: None,
            node: settings.node_name.clone(),
            purpose: Purpose::Serving { addresses: node.addresses.clone() },
        };
        supervisor.spawn("serving-certificate-rotation", Arc::new(rotation).run());
    }
    let client = node.clients.client.clone();
    let (mirrors_tx, mirrors) = watch::channel(Vec::new());
    sources.kinds.push(SourceKind::Api);
    let pods = pod_source::run(client.clone(), settings.node_name.clone(), sources.tx.clone(), mirrors_tx);
    supervisor.spawn("api-pod-source", pods);
    let host_ip = node.host_ips.first().cloned();
    Ok(Cluster { client, host_ip, node_uid: node.node_uid, object_ttl: node.object_ttl, mirrors, events: node.events })
}

impl Cluster {
    /// Mirror pods for static pods and pod status reporting.
    fn spawn_pod_side(
        self,
        settings: &Settings,
        shared: &Shared,
        statics: watch::Receiver<Vec<Pod>>,
        supervisor: &mut Supervisor,
    ) {
        let node = settings.node_name.clone();
        supervisor
            .spawn("mirror-pods", mirror::run(self.client.clone(), node, self.node_uid, statics, self.mirrors.clone()));
        supervisor.spawn("pod-status", status_sync::run(self.client, shared.statuses.clone(), self.mirrors));
    }
}

/// The node API's view of the agent: the pods it runs with their latest status.
struct AgentPods(Arc<StatusStore>);

impl server::PodList for AgentPods {
    fn pods(&self) -> Vec<server::RunningPod> {
        let records = self.0.all();
        records.iter().map(|r| server::RunningPod { pod: r.pod.clone(), status: r.status.clone() }).collect()
    }
}

/// The node API's view of the CSI volumes: `NodeGetVolumeStats` of those published for a pod.
struct CsiVolumeStats {
    drivers: CsiDrivers,
    root_dir: std::path::PathBuf,
}

impl server::PluginVolumes for CsiVolumeStats {
    fn usage(
        &self,
        uid: &str,
    ) -> std::pin::Pin<Box<dyn Future<Output = Vec<(String, server::stats::types::FsStats)>> + Send + '_>> {
        let uid = uid.to_string();
        Box::pin(async move {
            let measured = gantry_agent::runtime::csi::volume_stats(&self.drivers, &self.root_dir, &uid).await;
            measured.into_iter().map(|(name, usage)| (name, fs_stats(usage))).collect()
        })
    }
}

/// Upstream's `MetricsCSI` figures: bytes total/available/used, inodes total/free/used.
fn fs_stats(usage: gantry_plugins::csi::VolumeUsage) -> server::stats::types::FsStats {
    let (bytes, inodes) = (usage.bytes, usage.inodes);
    server::stats::types::FsStats {
        time: String::new(),
        capacity_bytes: bytes.map(|b| b.total),
        available_bytes: bytes.map(|b| b.available),
        used_bytes: bytes.map(|b| b.used),
        inodes: inodes.map(|i| i.total),
        inodes_free: inodes.map(|i| i.available),
        inodes_used: inodes.map(|i| i.used),
    }
}

impl podresources::ActivePods for AgentPods {
    fn pods(&self) -> Vec<Pod> {
        self.0.all().iter().map(|r| r.to_pod()).collect()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodStatus;

    use super::*;

    #[test]
    fn the_node_api_shares_each_pod_and_its_status() {
        let store = Arc::new(StatusStore::default());
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        let pod = Arc::new(pod);
        store.set(&pod, PodStatus { phase: Some("Running".into()), ..Default::default() });
        let record = store.all().pop().unwrap();
        let pods = server::PodList::pods(&AgentPods(store));
        assert!(Arc::ptr_eq(&pods[0].pod, &pod), "the worker's pod, not a copy");
        assert!(Arc::ptr_eq(&pods[0].status, &record.status), "the node's status, not a copy");
        assert_eq!(pods[0].to_pod().status.and_then(|s| s.phase), Some("Running".into()));
    }
}
