//! The node agent in standalone mode: sources in, one worker per pod, a relist that notices
//! runtime changes (the PLEG), orphan clean-up and garbage collection.

pub mod allocation;
mod holds;
mod prober;
pub mod runonce;
mod seen;
mod worker;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use gantry_cri::CriError;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinError, JoinSet};
// tokio's: the same as std's in production, and stepped with the clock in paused-clock tests.
use tokio::time::Instant;

use crate::cluster::ApiLink;
use crate::cluster::maintenance::HoldInput;
use crate::cluster::objects::ObjectSource;
use crate::node::status::Resources;
use crate::runtime::observe::PodIdentity;
use crate::runtime::{Driver, Observer, Snapshot};
use crate::source::merge::Merger;
use crate::source::{SourceKind, SourceUpdate, file, http};
pub use crate::status_store::StatusStore;
use gantry_config::Settings;
use gantry_metrics::Metrics;
use gantry_pod::ObservedPod;
use gantry_pod::gc::{self, Removal};
use gantry_vocab::spec;

/// How often the runtime is relisted to notice exits and changes (upstream PLEG period).
const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// How often dead containers and sandboxes are collected (upstream container GC period).
const GC_PERIOD: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("no pod manifest update after {0:?}; check --pod-manifest-path / --manifest-url")]
    NoManifestUpdate(Duration),
    #[error(
        "no static pod source is configured: set --pod-manifest-path (staticPodPath) or --manifest-url (staticPodURL)"
    )]
    NoSources,
    #[error(
        "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is in maintenance mode (failCgroupV1 is true)"
    )]
    CgroupV1,
    #[error("invalid configuration: singleProcessOOMKill must not be explicitly set to false when using cgroup v1")]
    SingleProcessOomKillOnV1,
    #[error(transparent)]
    Systemd(#[from] crate::runtime::systemd::SystemdError),
    #[error(transparent)]
    CgroupDriver(#[from] crate::runtime::cgroups::DriverMismatch),
    #[error(transparent)]
    Reserved(#[from] crate::runtime::cgroups::ReservedError),
}

/// The `kubepods` limits for this machine (node allocatable enforcement).
fn kubepods_limits(settings: &Settings, capacity: Resources) -> Option<gantry_pod::resources::CgroupValues> {
    let limits = crate::node::status::pods_cgroup_limits(settings, capacity);
    if let Some(l) = &limits {
        tracing::info!(
            cpu_shares = l.cpu_shares,
            memory_limit = l.memory_limit,
            "node allocatable enforced on kubepods"
        );
    }
    limits
}

/// The node's allocatable CPU and memory as the Node status reports it: what pod resizes are
/// admitted against, the downward API's default for missing limits and the bound of
/// memory-backed volumes.
fn node_allocatable(settings: &Settings, capacity: Resources) -> gantry_pod::resize::Amounts {
    let a = crate::node::status::allocatable(settings, capacity);
    gantry_pod::resize::Amounts { cpu_milli: a.cpu_milli, memory: a.memory }
}

/// Upstream's start-up check: cgroup v1 is deprecated, and refused with `failCgroupV1`.
fn check_cgroup_version(fail_cgroup_v1: bool, single_process_oom_kill: Option<bool>) -> Result<(), AgentError> {
    use crate::runtime::cgroups::{self, Hierarchy};
    let hierarchy = cgroups::hierarchy(std::path::Path::new(cgroups::MOUNT));
    tracing::info!(?hierarchy, "cgroup hierarchy");
    if hierarchy == Some(Hierarchy::V1) {
        if fail_cgroup_v1 {
            return Err(AgentError::CgroupV1);
        }
        if single_process_oom_kill == Some(false) {
            return Err(AgentError::SingleProcessOomKillOnV1);
        }
        tracing::warn!(reason = "CgroupV1", "{}", cgroups::V1_DEPRECATED);
    }
    Ok(())
}

/// What every worker needs.
pub struct Shared {
    pub driver: Driver,
    pub observer: Observer,
    pub statuses: Arc<StatusStore>,
    pub host_ip: Option<String>,
    pub pod_logs_dir: PathBuf,
    /// `syncFrequency`: the longest a pod worker waits before it observes its pod again (and
    /// refreshes the contents of its ConfigMap, Secret and projected volumes).
    pub sync_frequency: Duration,
    /// Set in cluster mode: final pod deletion and events go to the API server.
    pub api: Option<ApiLink>,
    pub events: crate::events::Recorder,
    /// The node's metrics registry.
    pub metrics: Arc<Metrics>,
    /// The resources allocated to each pod (in-place resize admission), checkpointed.
    pub allocations: allocation::Allocations,
    /// True while the node shuts down (graceful node shutdown): new pods are not admitted,
    /// and the Node is not ready.
    pub shutting_down: tokio::sync::watch::Sender<bool>,
    /// The pressure conditions as the eviction manager last judged them (the Node's
    /// MemoryPressure, DiskPressure and PIDPressure; admission under pressure).
    pub pressure: tokio::sync::watch::Sender<gantry_pod::eviction::Pressure>,
    /// When this agent connected: a container created before then that never ran had its
    /// start cut off by the previous agent's death (`plan::compute`).
    pub started_at: gantry_pod::Nanos,
    /// What each worker last saw of its pod in the runtime: the relist wakes it only for
    /// changes it has not seen.
    seen: seen::Seen,
}

impl Shared {
    /// Connects to the runtime named in `settings` and validates it; every CRI call and pod
    /// start is recorded in `metrics` (the node's).
    pub async fn connect(settings: &Settings, metrics: Arc<Metrics>) -> Result<Arc<Self>, AgentError> {
        let started_at = worker::now();
        check_cgroup_version(settings.pods.fail_cgroup_v1, settings.pods.single_process_oom_kill)?;
        let cri = gantry_cri::connect(
            &settings.container_runtime_endpoint,
            settings.image_service_endpoint.as_deref(),
            settings.runtime_request_timeout,
        )
        .await?
        .observed_by(metrics.cri_observer());
        tracing::info!(
            runtime = %cri.version.runtime_name, version = %cri.version.runtime_version,
            api = %cri.version.runtime_api_version, node = %settings.node_name, "connected to container runtime"
        );
        let observer = Observer::new(cri.runtime.clone(), &settings.node_name);
        let capacity =
            crate::node::status::capacity(settings, &crate::node::machine::MachineFacts::read(&settings.root_dir));
        let allocatable = node_allocatable(settings, capacity);
        let driver = Driver::new(
            cri,
            &settings.node_name,
            settings.pod_logs_dir.clone(),
            settings.root_dir.clone(),
            settings.images.parallel_pull_limit(),
        )
        .with_node_resources(allocatable, capacity.memory)
        .with_pod_settings(settings.pods.clone(), kubepods_limits(settings, capacity))
        .await?;
        driver.check_runtime_cgroup_driver().await?;
        driver.refresh_runtime_features().await;
        driver.enforce_reserved(settings).await?;
        let events = crate::events::Recorder::default();
        let allocations = allocation::Allocations::load(&settings.root_dir, allocatable);
        Ok(Arc::new(Shared {
            driver: driver.with_events(events.clone()),
            observer,
            statuses: Arc::new(StatusStore::default()),
            host_ip: None,
            pod_logs_dir: settings.pod_logs_dir.clone(),
            sync_frequency: settings.sync_frequency,
            api: None,
            events,
            metrics,
            allocations,
            shutting_down: tokio::sync::watch::Sender::new(false),
            pressure: tokio::sync::watch::Sender::new(Default::default()),
            started_at,
            seen: seen::Seen::default(),
        }))
    }

    /// The same, with pods getting their devices from `devices` (device plugins).
    pub fn with_devices(self: Arc<Self>, devices: gantry_plugins::devices::DeviceManager) -> Arc<Self> {
        let mut shared = Arc::into_inner(self).expect("with_devices is called before workers start");
        shared.driver = shared.driver.with_devices(devices);
        Arc::new(shared)
    }

    /// The same, with claim volumes from the CSI drivers registered in `drivers`.
    pub fn with_csi(
        self: Arc<Self>,
        drivers: gantry_plugins::csi::CsiDrivers,
        root_dir: std::path::PathBuf,
    ) -> Arc<Self> {
        let mut shared = Arc::into_inner(self).expect("with_csi is called before workers start");
        let node = shared.driver.node().to_string();
        shared.driver = shared.driver.with_csi(crate::runtime::csi::CsiVolumes::new(drivers, root_dir, node));
        Arc::new(shared)
    }

    /// The same, reporting to the API server through `client` (cluster mode).
    /// `objects`: the ConfigMaps, Secrets, Services and tokens pods use.
    pub fn with_api(
        self: Arc<Self>,
        client: kube::Client,
        objects: ObjectSource,
        events: crate::events::Recorder,
        host_ip: Option<String>,
    ) -> Arc<Self> {
        let mut shared = Arc::into_inner(self).expect("with_api is called before workers start");
        shared.events = events;
        shared.driver = shared.driver.with_objects(objects).with_events(shared.events.clone());
        shared.api = Some(ApiLink { client });
        shared.host_ip = host_ip;
        Arc::new(shared)
    }
}

/// A long-running task for the caller's supervisor, with the name it is logged under.
pub type NamedTask = (&'static str, BoxFuture<'static, ()>);

/// The pod sources feeding one agent.
pub struct Sources {
    pub kinds: Vec<SourceKind>,
    pub tx: mpsc::Sender<SourceUpdate>,
    pub rx: mpsc::Receiver<SourceUpdate>,
    /// The source loops, to run under the caller's supervisor.
    pub tasks: Vec<NamedTask>,
}

/// The configured static pod sources; nothing runs until the caller runs `tasks`.
pub fn sources(settings: &Settings) -> Sources {
    let (tx, rx) = mpsc::channel(16);
    let mut kinds = Vec::new();
    let mut tasks: Vec<NamedTask> = Vec::new();
    if let Some(path) = &settings.static_pod_path {
        kinds.push(SourceKind::File);
        let run = file::run(path.clone(), settings.node_name.clone(), settings.file_check_frequency, tx.clone());
        tasks.push(("static-pod-files", Box::pin(run)));
    }
    if let Some(url) = &settings.static_pod_url {
        kinds.push(SourceKind::Http);
        let source = http::HttpSource::new(url.clone(), settings.static_pod_url_header.clone(), &settings.node_name);
        tasks.push(("static-pod-url", Box::pin(http::run(source, settings.http_check_frequency, tx.clone()))));
    }
    Sources { kinds, tx, rx, tasks }
}

/// The long-running agent.
pub struct Agent {
    shared: Arc<Shared>,
    merger: Merger,
    configured: Vec<SourceKind>,
    /// Everything the sources want, shared with the merger and the workers.
    merged: BTreeMap<String, Arc<Pod>>,
    /// What the node runs: `merged` minus the static pods a node maintenance holds.
    desired: BTreeMap<String, Arc<Pod>>,
    node: String,
    holds: tokio::sync::watch::Sender<HoldInput>,
    holds_rx: tokio::sync::watch::Receiver<HoldInput>,
    /// Static pods held by node maintenances.
    held: holds::Holds,
    /// The pod workers' tasks. Declared before `workers` so that, when the agent is dropped,
    /// they are aborted before their handles close.
    tasks: JoinSet<()>,
    workers: HashMap<String, worker::Handle>,
    done_tx: mpsc::UnboundedSender<String>,
    done_rx: mpsc::UnboundedReceiver<String>,
    last_gc: Instant,
    /// Pods being deleted through the API whose termination already ran.
    finished: std::collections::HashSet<String>,
    /// What the QoS cgroups were last given (None: to be set).
    qos: Option<crate::runtime::cgroups::QosWanted>,
    /// The static pods, for the mirror pod manager.
    statics: tokio::sync::watch::Sender<Vec<Pod>>,
    /// Pods to stop for the node's shutdown or an eviction.
    kills_tx: mpsc::UnboundedSender<Kill>,
    kills_rx: mpsc::UnboundedReceiver<Kill>,
    /// Requests for a garbage collection pass now (the eviction manager's reclaim).
    gc_tx: mpsc::UnboundedSender<tokio::sync::oneshot::Sender<()>>,
    gc_rx: mpsc::UnboundedReceiver<tokio::sync::oneshot::Sender<()>>,
    /// The runtime work the loop polls beside its messages rather than awaiting it, so that
    /// kills, source updates and finished workers are served while the runtime is slow.
    background: Background,
}

/// The relist in flight, and the cgroup and collection work started from the loop.
#[derive(Default)]
struct Background {
    /// The relist in flight, with the reclaims that wait for its collection pass.
    listing: Option<BoxFuture<'static, Relisted>>,
    /// Reclaims asked for while a relist was already in flight: the next one serves them.
    gc_asked: Vec<oneshot::Sender<()>>,
    /// The chore in flight: one at a time, so that QoS settings never overtake each other.
    chore: Option<BoxFuture<'static, ChoreDone>>,
    /// The QoS levels are to be set (to what the pods want once the chore starts).
    qos_due: bool,
    /// Collection passes waiting for their turn.
    gc_due: VecDeque<GcPass>,
}

struct Relisted {
    snapshot: Result<Snapshot, CriError>,
    /// When the list ended: a worker that began a look after it has seen all it shows.
    listed_at: Instant,
    gc_waiters: Vec<oneshot::Sender<()>>,
}

/// What a collection pass removes, decided from a relist; `waiters` are answered after it.
struct GcPass {
    removals: Vec<(String, Removal)>,
    waiters: Vec<oneshot::Sender<()>>,
}

enum ChoreDone {
    /// The QoS levels were set to `0` if `1`.
    Qos(crate::runtime::cgroups::QosWanted, bool),
    Gc,
}

/// The next output of `slot`'s future (never, when empty); the slot is emptied once it is ready.
async fn next_of<T>(slot: &mut Option<BoxFuture<'static, T>>) -> T {
    let Some(future) = slot.as_mut() else { return std::future::pending().await };
    let output = future.await;
    *slot = None;
    output
}

/// Asks the agent to remove the dead containers and sandboxes its garbage collection would
/// remove, now (upstream's `DeleteAllUnusedContainers`, before a disk eviction).
#[derive(Clone)]
pub struct ContainerReclaimer(mpsc::UnboundedSender<tokio::sync::oneshot::Sender<()>>);

impl ContainerReclaimer {
    /// Returns once the pass is over (at once when the agent does not run).
    pub async fn delete_dead(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.0.send(done).is_ok() {
            let _ = wait.await;
        }
    }
}

/// A pod to stop and leave `Failed` (the node's shutdown, an eviction), within `grace`; `done`
/// is dropped once it is stopped and its status says so (at once when the agent does not run it).
pub struct Kill {
    pub uid: String,
    pub grace: Duration,
    pub why: KillReason,
    pub done: tokio::sync::oneshot::Sender<()>,
}

/// Why a pod is stopped and left `Failed`, which decides its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillReason {
    /// Graceful node shutdown: reason `Terminated`, `DisruptionTarget`.
    Shutdown,
    /// The eviction manager: reason `Evicted` with its message, and `DisruptionTarget` for
    /// pressure evictions.
    Evicted { message: String, disruption_target: bool },
}

impl Agent {
    pub fn new(shared: Arc<Shared>, configured: Vec<SourceKind>, node: &str) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let holds = tokio::sync::watch::Sender::new(HoldInput::default());
        let (kills_tx, kills_rx) = mpsc::unbounded_channel();
        let (gc_tx, gc_rx) = mpsc::unbounded_channel();
        Agent {
            shared,
            merger: Merger::default(),
            configured,
            merged: BTreeMap::new(),
            desired: BTreeMap::new(),
            node: node.to_string(),
            holds_rx: holds.subscribe(),
            holds,
            held: holds::Holds::default(),
            tasks: JoinSet::new(),
            workers: HashMap::new(),
            done_tx,
            done_rx,
            last_gc: Instant::now(),
            finished: Default::default(),
            qos: None,
            statics: tokio::sync::watch::Sender::new(Vec::new()),
            kills_tx,
            kills_rx,
            gc_tx,
            gc_rx,
            background: Background::default(),
        }
    }

    /// Where the eviction manager asks for dead containers to go.
    pub fn container_reclaimer(&self) -> ContainerReclaimer {
        ContainerReclaimer(self.gc_tx.clone())
    }

    /// Where the node shutdown manager and the eviction manager send the pods to stop.
    pub fn kills(&self) -> mpsc::UnboundedSender<Kill> {
        self.kills_tx.clone()
    }

    /// The static pods that have (or should have) a mirror pod, as they change: held static
    /// pods lose their mirror once stopped, which is how the maintenance controller sees them go.
    pub fn static_pods(&self) -> tokio::sync::watch::Receiver<Vec<Pod>> {
        self.statics.subscribe()
    }

    /// Where the NodeMaintenance watch publishes the hold input. Set the saved input before
    /// `run`, so held static pods are never started.
    pub fn holds(&self) -> tokio::sync::watch::Sender<HoldInput> {
        self.holds.clone()
    }

    /// Runs until the process ends. Pods keep running when it does.
    pub async fn run(mut self, mut updates: mpsc::Receiver<SourceUpdate>) {
        let mut relist = tokio::time::interval(RELIST_PERIOD);
        relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                Some(update) = updates.recv() => {
                    self.apply(update);
                    self.update_qos_cgroups();
                }
                Some(uid) = self.done_rx.recv() => {
                    self.workers.remove(&uid);
                    if self.shared.allocations.remove(&uid) {
                        // Room freed: deferred resizes are tried again.
                        self.workers.values().for_each(|h| drop(h.tx.send(worker::Msg::Wake)));
                    }
                    if self.held.worker_done(&uid) {
                        self.publish_statics();
                    }
                    self.reconcile();
                    self.update_qos_cgroups();
                }
                Some(Err(e)) = self.tasks.join_next() => worker_failed(e),
                Ok(()) = self.holds_rx.changed() => self.refresh(),
                Some(kill) = self.kills_rx.recv() => self.stop_and_fail(kill),
                Some(done) = self.gc_rx.recv() => {
                    self.background.gc_asked.push(done);
                    self.start_relist();
                }
                relisted = next_of(&mut self.background.listing) => {
                    self.housekeeping(relisted).await;
                    if !self.background.gc_asked.is_empty() {
                        self.start_relist();
                    }
                }
                done = next_of(&mut self.background.chore) => {
                    if let ChoreDone::Qos(want, true) = done {
                        self.qos = Some(want);
                    }
                    self.next_chore();
                }
                // A relist still in flight is not doubled; the next tick looks again.
                _ = relist.tick() => self.start_relist(),
            }
        }
    }

    /// Lists the runtime in the background, unless a relist is already in flight; the
    /// reclaims asked for so far wait for its collection pass.
    fn start_relist(&mut self) {
        let background = &mut self.background;
        if background.listing.is_some() {
            return;
        }
        let gc_waiters = std::mem::take(&mut background.gc_asked);
        let shared = self.shared.clone();
        background.listing = Some(Box::pin(async move {
            let snapshot = shared.observer.all().await;
            Relisted { snapshot, listed_at: Instant::now(), gc_waiters }
        }));
    }

    /// Starts the next chore when none runs: the QoS levels first, then collection passes.
    fn next_chore(&mut self) {
        let background = &mut self.background;
        if background.chore.is_some() {
            return;
        }
        if std::mem::take(&mut background.qos_due) {
            let want = self.qos_wanted();
            if self.qos != Some(want) {
                let shared = self.shared.clone();
                self.background.chore =
                    Some(Box::pin(async move { ChoreDone::Qos(want, shared.driver.update_qos_cgroups(want).await) }));
                return;
            }
        }
        if let Some(pass) = self.background.gc_due.pop_front() {
            let shared = self.shared.clone();
            self.background.chore = Some(Box::pin(async move {
                collect_garbage(&shared.driver, pass.removals).await;
                drop(pass.waiters); // the reclaim is over
                ChoreDone::Gc
            }));
        }
    }

    fn apply(&mut self, update: SourceUpdate) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let desired = self.merger.apply(update, &now);
        for message in &desired.rejected {
            tracing::error!("{message}");
        }
        self.merged = desired.pods;
        self.refresh();
    }

    /// Applies the maintenance holds to the merged pods: a newly held static pod leaves the
    /// desired set (its worker stops it gracefully), a released one comes back (and starts).
    fn refresh(&mut self) {
        let statics: Vec<Pod> =
            self.merged.values().filter(|p| !gantry_vocab::keys::is_api_pod(p)).map(|p| Pod::clone(p)).collect();
        let decision = self.holds_rx.borrow_and_update().held(&self.node, &statics);
        let changes = self.held.update(decision, |uid| self.workers.contains_key(uid));
        let name = |uid: &str| self.merged.get(uid).map(|p| spec::full_name(p)).unwrap_or_default();
        for (uid, maintenance) in &changes.held {
            tracing::info!(pod = %name(uid), pod_uid = %uid, maintenance = %maintenance, "stopping static pod for node maintenance");
        }
        for (uid, maintenance) in &changes.released {
            tracing::info!(pod = %name(uid), pod_uid = %uid, maintenance = %maintenance, "node maintenance released static pod");
        }
        self.desired = self.held.desired(&self.merged);
        self.publish_statics();
        self.reconcile();
    }

    /// Mirror pods follow the static pods, except held ones once stopped.
    fn publish_statics(&self) {
        self.statics.send_replace(self.held.mirrored(&self.merged));
    }

    /// Starts workers for new pods, forwards spec changes, and terminates pods that are
    /// unwanted or being deleted through the API.
    fn reconcile(&mut self) {
        self.finished.retain(|uid| self.desired.contains_key(uid));
        for (uid, pod) in &self.desired {
            let deleting = pod.metadata.deletion_timestamp.is_some();
            match self.workers.get_mut(uid) {
                None if deleting => {
                    if self.finished.insert(uid.clone()) {
                        let handle = worker::spawn_terminator(
                            pod.clone(),
                            self.shared.clone(),
                            self.done_tx.clone(),
                            &mut self.tasks,
                        );
                        self.workers.insert(uid.clone(), handle);
                    }
                }
                None => {
                    tracing::info!(pod = %spec::full_name(pod), pod_uid = %uid, "adding pod");
                    let handle = worker::spawn(pod.clone(), self.shared.clone(), self.done_tx.clone(), &mut self.tasks);
                    self.workers.insert(uid.clone(), handle);
                }
                Some(h) if !h.terminating => {
                    // Every source update lists all pods; only a pod that changed wakes its worker
                    // (an unchanged pod is the same `Arc`, so most checks compare no fields).
                    if !Arc::ptr_eq(&h.pod, pod) && *h.pod != **pod {
                        h.pod = pod.clone();
                        let _ = h.tx.send(worker::Msg::Update(pod.clone()));
                    }
                    if deleting {
                        tracing::info!(pod = %spec::full_name(pod), pod_uid = %uid, "pod is being deleted");
                        h.terminating = true;
                        self.finished.insert(uid.clone());
                        let _ = h.tx.send(worker::Msg::Terminate);
                    }
                }
                Some(_) => {} // restarts once the old incarnation is gone
            }
        }
        for (uid, h) in self.workers.iter_mut().filter(|(uid, h)| !h.terminating && !self.desired.contains_key(*uid)) {
            tracing::info!(pod_uid = %uid, "removing pod");
            h.terminating = true;
            let _ = h.tx.send(worker::Msg::Terminate);
        }
    }

    /// Hands a pod to its worker to stop and leave failed. A pod without a running worker
    /// (unknown, or already being removed) needs nothing: dropping `done` says so.
    fn stop_and_fail(&mut self, kill: Kill) {
        if let Some(h) = self.workers.get(&kill.uid).filter(|h| !h.terminating) {
            let _ = h.tx.send(worker::Msg::Stop(Box::new(kill)));
        }
    }

    /// The relist: wakes workers whose pods changed in the runtime, stops pods that no source
    /// wants (after every source reported, so a restart does not kill pods it has not read
    /// yet), and collects garbage.
    async fn housekeeping(&mut self, relisted: Relisted) {
        let snapshot = match relisted.snapshot {
            Ok(snapshot) => snapshot,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list pods in the runtime");
                return;
            }
        };
        let sources_ready = self.merger.all_reported(&self.configured);
        for (uid, observed) in &snapshot.pods {
            if self.shared.seen.changed(uid, observed)
                && let Some(h) = self.workers.get(uid)
            {
                let _ = h.tx.send(worker::Msg::Relisted(relisted.listed_at));
            }
            if sources_ready && !self.workers.contains_key(uid) && !self.desired.contains_key(uid) {
                self.stop_orphan(uid, snapshot.identities.get(uid));
            }
        }
        self.shared.seen.retain(|uid| snapshot.pods.contains_key(uid));
        if sources_ready {
            // Pods removed while the agent was down leave no allocation behind.
            self.shared.allocations.retain(|uid| self.workers.contains_key(uid) || self.desired.contains_key(uid));
            let active = self.workers.keys().chain(self.desired.keys()).cloned().collect();
            self.shared.driver.retain_devices(&active);
        }
        let periodic = self.last_gc.elapsed() >= GC_PERIOD;
        if periodic || !relisted.gc_waiters.is_empty() {
            let removals = self.removals(&snapshot.pods);
            self.background.gc_due.push_back(GcPass { removals, waiters: relisted.gc_waiters });
        }
        if periodic {
            self.last_gc = Instant::now();
            // Upstream sets the QoS levels again every minute, whatever changed them.
            self.qos = None;
            self.background.qos_due = true;
            if sources_ready {
                // Awaited here: what it keeps must not change while it runs. It is a directory
                // scan unless a pod's cgroup was left behind.
                let known = snapshot.pods.keys().chain(self.workers.keys()).chain(self.desired.keys());
                let known: std::collections::HashSet<String> = known.cloned().collect();
                // Upstream's reconciler retries unmounting until it succeeds; here every GC pass.
                self.shared.driver.tear_down_orphaned_volumes(&known).await;
                self.shared.driver.remove_orphaned_cgroups(known).await;
            }
        }
        self.next_chore();
    }

    /// The Burstable QoS level's CPU shares follow the active Burstable pods' CPU requests
    /// (upstream's `UpdateQOSCgroups`), set when they change, as a chore: a new pod counts as
    /// soon as it arrives, a removed one stops counting.
    fn update_qos_cgroups(&mut self) {
        self.background.qos_due = true;
        self.next_chore();
    }

    /// What the QoS levels should be given for the active pods.
    fn qos_wanted(&self) -> crate::runtime::cgroups::QosWanted {
        let terminal = |p: &Pod| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            matches!(phase, Some("Succeeded" | "Failed"))
        };
        let active: Vec<&Pod> = self
            .desired
            .iter()
            .filter(|(uid, p)| !self.finished.contains(*uid) && !terminal(p))
            .map(|(_, p)| p.as_ref())
            .collect();
        crate::runtime::cgroups::QosWanted {
            burstable_shares: gantry_pod::resources::burstable_shares(active.iter().copied()),
            memory_min: gantry_pod::resources::qos_memory_min(active.iter().copied()),
        }
    }

    fn stop_orphan(&mut self, uid: &str, identity: Option<&PodIdentity>) {
        let pod = orphan_pod(uid, identity);
        tracing::info!(pod = %spec::full_name(&pod), pod_uid = uid, "stopping pod that no source defines any more");
        let handle =
            worker::spawn_terminator(Arc::new(pod), self.shared.clone(), self.done_tx.clone(), &mut self.tasks);
        self.workers.insert(uid.to_string(), handle);
    }

    /// The dead containers and sandboxes to remove, except those of pods being terminated
    /// (their workers remove them).
    fn removals(&self, pods: &HashMap<String, ObservedPod>) -> Vec<(String, Removal)> {
        let terminating = |uid: &str| self.workers.get(uid).is_some_and(|h| h.terminating);
        pods.iter()
            .filter(|(uid, _)| !terminating(uid))
            .flat_map(|(uid, observed)| {
                gc::collect(observed, self.desired.contains_key(uid)).into_iter().map(|r| (uid.clone(), r))
            })
            .collect()
    }
}

async fn collect_garbage(driver: &Driver, removals: Vec<(String, Removal)>) {
    for (uid, removal) in removals {
        let result = match &removal {
            Removal::Container(id) => driver.remove_container(id).await,
            Removal::Sandbox(id) => driver.remove_sandbox(id).await,
        };
        if let Err(e) = result {
            tracing::warn!(pod_uid = %uid, ?removal, error = %e, "garbage collection failed");
        }
    }
}

/// A pod object good enough to stop what the runtime still runs for a vanished pod.
/// A pod worker that panicked takes the agent down with it, by the supervisor's rule (logged
/// by name, the agent stops, systemd restarts it, pods keep running): its pod would otherwise
/// be left without a worker.
fn worker_failed(e: JoinError) {
    if e.is_panic() {
        std::panic::resume_unwind(e.into_panic());
    }
}

fn orphan_pod(uid: &str, identity: Option<&PodIdentity>) -> Pod {
    let identity =
        identity.cloned().unwrap_or(PodIdentity { name: String::new(), namespace: String::new(), grace_seconds: 30 });
    Pod {
        metadata: ObjectMeta {
            name: Some(identity.name),
            namespace: Some(identity.namespace),
            uid: Some(uid.to_string()),
            ..Default::default()
        },
        spec: Some(PodSpec { termination_grace_period_seconds: Some(identity.grace_seconds), ..Default::default() }),
        ..Default::default()
    }
}
