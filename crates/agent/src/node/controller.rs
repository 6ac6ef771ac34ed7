//! The I/O edge of the node side: registration, the status loop, the lease
//! loop and the runtime health poll, around the pure core in
//! [`super::status`].
//!
//! None of the loops ends on an API error: they log, retry with backoff
//! (100 ms doubling to 7 s) and catch up when the server is back. After a
//! failed status report the next one is sent even if nothing changed.

use std::sync::Mutex;
use std::time::Duration;

use gantry_cri::Cri;
use gantry_cri::api::{ListImagesRequest, StatusRequest, VersionRequest};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::{Notify, watch};

use super::addresses::{AddressDetector, AddressError};
use super::lease::{LEASE_NAMESPACE, renewed_lease};
use super::machine::MachineFacts;
use super::runtime_state::RuntimeState;
use super::status::{self, EventType, NodeEvent, NodeInputs, Pressure};
use crate::api::ApiError;
use crate::events::Recorder as EventRecorder;
use crate::image::node_images::{MAX_IMAGES, node_images};
use gantry_config::Settings;
use gantry_plugins::devices::DeviceManager;

/// Backoff of registration, lease and failed status reports.
pub const BACKOFF_START: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(7);
/// How often the runtime's health is polled (upstream `updateRuntimeUp`).
pub const RUNTIME_POLL: Duration = Duration::from_secs(5);
/// Lease renew interval = duration × this (upstream).
pub const LEASE_RENEW_FRACTION: f64 = 0.25;
/// Jitter added to the status and lease periods (upstream `JitterUntil`).
pub const JITTER: f64 = 0.04;
const MAX_LEASE_UPDATE_RETRIES: usize = 5;

/// The registered node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRegistration {
    pub name: String,
    /// The Node's UID (owner of mirror pods and of the lease); `None` with
    /// `--register-node=false` while nobody has created the Node.
    pub uid: Option<String>,
    /// Whether this agent created the Node (rather than finding it).
    pub created: bool,
    /// The node's InternalIP addresses as reported at registration (the
    /// pods' `hostIP`/`hostIPs`); empty when they could not be determined.
    pub host_ips: Vec<String>,
}

fn internal_ips(addresses: &Result<Vec<NodeAddress>, AddressError>) -> Vec<String> {
    addresses
        .as_ref()
        .map(|a| a.iter().filter(|a| a.type_ == "InternalIP").map(|a| a.address.clone()).collect())
        .unwrap_or_default()
}

/// Why the lease was not renewed.
#[derive(Debug, thiserror::Error)]
enum LeaseError {
    /// A conflict, and the lease could not be read back to retry on.
    #[error("{0}")]
    Conflict(#[source] kube::Error),
    #[error("failed {MAX_LEASE_UPDATE_RETRIES} attempts to update lease: {0}")]
    Retries(#[source] kube::Error),
}

/// Why the node side cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The API server refuses the Node object itself (it will not accept it
    /// on a retry either).
    #[error("the API server rejected Node {node:?}: {message}")]
    Rejected { node: String, message: String },
}

/// Registers the Node and keeps its status and lease fresh.
pub struct NodeController {
    nodes: Api<Node>,
    leases: Api<Lease>,
    events: EventRecorder,
    settings: Settings,
    cri: Cri,
    facts: MachineFacts,
    uid: watch::Sender<Option<String>>,
    /// The Node's `node.alpha.kubernetes.io/ttl` annotation (the object cache TTL).
    object_ttl: watch::Sender<Option<Duration>>,
    /// The node's addresses as last observed for its status (the serving certificate's names).
    addresses: watch::Sender<Vec<NodeAddress>>,
    runtime: Mutex<RuntimeState>,
    runtime_changed: Notify,
    /// The pressure conditions from the eviction manager.
    pressure: watch::Receiver<Pressure>,
    detector: tokio::sync::Mutex<AddressDetector>,
    request_timeout: Duration,
    /// True while the node shuts down (graceful node shutdown).
    shutting_down: watch::Receiver<bool>,
    /// The device plugins' resources, when device plugins are served.
    devices: Option<DeviceManager>,
    /// The CSI volumes the node mounts or is about to mount, when it serves CSI volumes.
    volumes_in_use: Option<watch::Receiver<Vec<String>>>,
}

/// What one status pass observed (the owned half of [`NodeInputs`]).
struct Observed {
    runtime_version: Option<String>,
    runtime_errors: Vec<String>,
    pressure: Pressure,
    addresses: Result<Vec<NodeAddress>, AddressError>,
    images: Option<Vec<k8s_openapi::api::core::v1::ContainerImage>>,
    devices: gantry_plugins::devices::Capacity,
    volumes_in_use: Option<Vec<String>>,
    runtime_handlers: Vec<k8s_openapi::api::core::v1::NodeRuntimeHandler>,
    now: Timestamp,
}

/// State of the status loop between passes.
#[derive(Default)]
struct ReportState {
    /// When the status was last written; `None` forces the next write.
    last_report: Option<Timestamp>,
    last_address_error: Option<AddressError>,
}

fn timeout_error(op: &str, after: Duration) -> kube::Error {
    kube::Error::Service(Box::new(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{op}: no answer from the API server within {after:?}"),
    )))
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Completes when `rx` sees a change; never without one (or once its sender is gone).
async fn changed<T>(rx: &mut Option<watch::Receiver<T>>) {
    let Some(rx) = rx else { return std::future::pending().await };
    if rx.changed().await.is_err() {
        std::future::pending().await
    }
}

fn jittered(d: Duration) -> Duration {
    d.mul_f64(1.0 + JITTER * fastrand::f64())
}

fn next_backoff(d: Duration) -> Duration {
    (d * 2).min(BACKOFF_MAX)
}

impl NodeController {
    /// `client` is used for the Node, its Lease and its events; give it the
    /// heartbeat client of [`crate::api::ApiClients`] (no QPS limit).
    /// `shutting_down`: true while the node shuts down, which makes it not ready at once.
    pub fn new(
        client: Client,
        settings: &Settings,
        cri: Cri,
        events: EventRecorder,
        shutting_down: watch::Receiver<bool>,
        pressure: watch::Receiver<Pressure>,
    ) -> Self {
        let facts = MachineFacts::read(&settings.root_dir);
        let lease_duration = Duration::from_secs(u64::from(settings.node_lease_duration_seconds));
        let request_timeout = settings.node_status_update_frequency.min(lease_duration).max(Duration::from_secs(1));
        NodeController {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client.clone(), LEASE_NAMESPACE),
            events,
            settings: settings.clone(),
            cri,
            facts,
            uid: watch::channel(None).0,
            object_ttl: watch::channel(None).0,
            addresses: watch::channel(Vec::new()).0,
            runtime: Mutex::new(RuntimeState::default()),
            runtime_changed: Notify::new(),
            pressure,
            detector: tokio::sync::Mutex::new(AddressDetector::default()),
            request_timeout,
            shutting_down,
            devices: None,
            volumes_in_use: None,
        }
    }

    /// The Node reports the device plugins' resources of `devices`, and its status is synced
    /// as soon as they change.
    pub fn with_devices(self, devices: DeviceManager) -> Self {
        NodeController { devices: Some(devices), ..self }
    }

    /// The Node reports `volumes` as `status.volumesInUse`, synced as soon as they change (the
    /// attach/detach controller does not detach a volume the node reports in use).
    pub fn with_volumes_in_use(self, volumes: watch::Receiver<Vec<String>>) -> Self {
        NodeController { volumes_in_use: Some(volumes), ..self }
    }

    /// The Node's UID as last seen (`None` until known).
    pub fn node_uid(&self) -> watch::Receiver<Option<String>> {
        self.uid.subscribe()
    }

    /// The machine facts reported in the node status.
    pub fn machine_facts(&self) -> &MachineFacts {
        &self.facts
    }

    fn node_name(&self) -> &str {
        &self.settings.node_name
    }

    /// The Node's object TTL annotation as last seen (`None` without one).
    pub fn object_ttl(&self) -> watch::Receiver<Option<Duration>> {
        self.object_ttl.subscribe()
    }

    /// The node's addresses as last observed (upstream's `getLastObservedNodeAddresses`);
    /// changes only when they do.
    pub fn addresses(&self) -> watch::Receiver<Vec<NodeAddress>> {
        self.addresses.subscribe()
    }

    fn note_uid(&self, node: &Node) {
        let ttl = status::object_ttl(node);
        self.object_ttl.send_if_modified(|current| std::mem::replace(current, ttl) != ttl);
        let uid = node.metadata.uid.clone();
        self.uid.send_if_modified(|current| {
            if uid.is_some() && *current != uid {
                *current = uid;
                true
            } else {
                false
            }
        });
    }

    async fn with_timeout<T>(
        &self,
        op: &str,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        match tokio::time::timeout(self.request_timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(timeout_error(op, self.request_timeout)),
        }
    }

    async fn get_node(&self) -> Result<Node, kube::Error> {
        self.with_timeout("get node", self.nodes.get(self.node_name())).await
    }

    /// One CRI `Status` poll (upstream `updateRuntimeUp`); wakes the status
    /// loop when readiness changed.
    async fn update_runtime_up(&self) {
        let result = self.cri.runtime.status(StatusRequest { verbose: false }).await;
        let now = Timestamp::now();
        let changed = {
            let mut state = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
            let before = state.errors(now);
            match &result {
                Ok(status) => state.observe(status, now),
                Err(e) => tracing::error!(error = %e, "container runtime sanity check failed"),
            }
            let after = state.errors(now);
            if !after.is_empty() && after != before {
                tracing::warn!(errors = ?after, "container runtime not ready");
            }
            before != after
        };
        if changed {
            self.runtime_changed.notify_one();
        }
    }

    /// The node's InternalIP addresses, from `--node-ip` or detection.
    pub async fn host_ips(&self) -> Vec<String> {
        let s = &self.settings;
        let addresses = self.detector.lock().await.detect(&s.node_ips, &s.node_name, &s.hostname).await;
        internal_ips(&addresses)
    }

    async fn observe(&self) -> Observed {
        let runtime_version = match self.cri.runtime.version(VersionRequest::default()).await {
            Ok(v) => Some(v.runtime_version),
            Err(e) => {
                tracing::debug!(error = %e, "cannot get the container runtime version");
                None
            }
        };
        let now = Timestamp::now();
        let runtime_errors = self.runtime.lock().unwrap_or_else(|e| e.into_inner()).errors(now);
        let pressure = *self.pressure.borrow();
        let s = &self.settings;
        let addresses = self.detector.lock().await.detect(&s.node_ips, &s.node_name, &s.hostname).await;
        if let Ok(found) = &addresses {
            self.addresses.send_if_modified(|last| {
                let changed = last != found;
                if changed {
                    last.clone_from(found);
                }
                changed
            });
        }
        let images = match self.cri.images.list_images(ListImagesRequest::default()).await {
            Ok(list) => Some(node_images(&list.images, MAX_IMAGES)),
            Err(e) => {
                tracing::debug!(error = %e, "cannot list images for the node status");
                None
            }
        };
        let devices = self.devices.as_ref().map(DeviceManager::capacity).unwrap_or_default();
        let volumes_in_use = self.volumes_in_use.as_ref().map(|v| v.borrow().clone());
        let runtime_handlers = self.runtime.lock().unwrap_or_else(|e| e.into_inner()).handlers().to_vec();
        Observed {
            runtime_version,
            runtime_errors,
            pressure,
            addresses,
            images,
            devices,
            volumes_in_use,
            runtime_handlers,
            now,
        }
    }

    fn inputs<'a>(&'a self, o: &'a Observed) -> NodeInputs<'a> {
        NodeInputs {
            settings: &self.settings,
            facts: &self.facts,
            runtime_name: &self.cri.version.runtime_name,
            runtime_version: o.runtime_version.as_deref(),
            runtime_errors: o.runtime_errors.clone(),
            shutting_down: *self.shutting_down.borrow(),
            pressure: o.pressure,
            addresses: o.addresses.clone(),
            images: o.images.clone(),
            devices: o.devices.clone(),
            volumes_in_use: o.volumes_in_use.clone(),
            runtime_handlers: o.runtime_handlers.clone(),
            now: o.now,
        }
    }

    /// Registers the Node (upstream `registerWithAPIServer`): creates it, or
    /// reconciles the labels and annotation the agent owns on an existing
    /// one. Retries until it succeeds (100 ms doubling to 7 s), except when
    /// the API server rejects the Node object itself. With
    /// `--register-node=false` it only looks the Node up.
    pub async fn register(&self) -> Result<NodeRegistration, NodeError> {
        let name = self.node_name().to_string();
        self.events.record_node(&NodeEvent {
            type_: EventType::Normal,
            reason: "Starting".into(),
            message: "Starting kubelet.".into(),
        });
        self.update_runtime_up().await;
        if !self.settings.register_node {
            let host_ips = internal_ips(&self.observe().await.addresses);
            let uid = match self.get_node().await {
                Ok(node) => {
                    self.note_uid(&node);
                    node.metadata.uid
                }
                Err(e) => {
                    tracing::info!(node = %name, error = %e, "not registering the node (--register-node=false); it is not there yet");
                    None
                }
            };
            return Ok(NodeRegistration { name, uid, created: false, host_ips });
        }
        let mut delay = BACKOFF_START;
        loop {
            match self.try_register().await {
                Ok(registration) => return Ok(registration),
                Err(Some(fatal)) => return Err(fatal),
                Err(None) => {}
            }
            tokio::time::sleep(delay).await;
            delay = next_backoff(delay);
        }
    }

    /// One registration attempt; `Err(None)` = retry.
    async fn try_register(&self) -> Result<NodeRegistration, Option<NodeError>> {
        let name = self.node_name().to_string();
        let observed = self.observe().await;
        let host_ips = internal_ips(&observed.addresses);
        let (node, events) = status::initial_node(&self.inputs(&observed));
        tracing::info!(node = %name, "attempting to register node");
        let created = self.with_timeout("create node", self.nodes.create(&PostParams::default(), &node)).await;
        let existing = match created {
            Ok(created) => {
                self.note_uid(&created);
                tracing::info!(node = %name, uid = ?created.metadata.uid, "successfully registered node");
                events.iter().for_each(|ev| self.events.record_node(ev));
                return Ok(NodeRegistration { name, uid: created.metadata.uid, created: true, host_ips });
            }
            // Upstream also looks at the existing Node on 403: NodeRestriction
            // may refuse the create of a Node that exists.
            Err(e) if matches!(code(&e), Some(409) | Some(403)) => match self.get_node().await {
                Ok(existing) => existing,
                Err(get) => {
                    tracing::error!(node = %name, error = %e, get_error = %get, "unable to register node with API server, error getting existing node");
                    return Err(None);
                }
            },
            Err(e) if matches!(code(&e), Some(400) | Some(422)) => {
                return Err(Some(NodeError::Rejected { node: name, message: e.to_string() }));
            }
            Err(e) => {
                tracing::error!(node = %name, error = %e, "unable to register node with API server");
                return Err(None);
            }
        };
        tracing::info!(node = %name, "node was previously registered");
        if let Some(patch) = status::registration_patch(&existing, &node) {
            let patched = self
                .with_timeout("patch node", self.nodes.patch(&name, &PatchParams::default(), &Patch::Strategic(&patch)))
                .await;
            if let Err(e) = patched {
                tracing::error!(node = %name, error = %e, "unable to reconcile node with API server, error updating node");
                return Err(None);
            }
        }
        self.note_uid(&existing);
        Ok(NodeRegistration { name, uid: existing.metadata.uid, created: false, host_ips })
    }

    /// Runs the status, lease and runtime loops; never returns.
    pub async fn run(self) {
        tokio::join!(self.runtime_loop(), self.status_loop(), self.lease_loop());
    }

    async fn runtime_loop(&self) {
        loop {
            tokio::time::sleep(RUNTIME_POLL).await;
            self.update_runtime_up().await;
        }
    }

    async fn status_loop(&self) {
        let mut state = ReportState::default();
        let mut backoff = BACKOFF_START;
        let period = self.settings.node_status_update_frequency;
        let mut shutting_down = self.shutting_down.clone();
        let mut devices = self.devices.as_ref().map(DeviceManager::changes);
        let mut pressure = self.pressure.clone();
        let mut volumes_in_use = self.volumes_in_use.clone();
        loop {
            let wait = match self.sync_status(&mut state).await {
                Ok(()) => {
                    backoff = BACKOFF_START;
                    jittered(period)
                }
                Err(e) => {
                    tracing::warn!(node = %self.node_name(), error = %e, "error updating node status, will retry");
                    // Report on the next successful pass, changed or not.
                    state.last_report = None;
                    let wait = backoff.min(period);
                    backoff = next_backoff(backoff);
                    wait
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.runtime_changed.notified() => {}
                // Upstream syncs the node status as soon as a shutdown starts.
                Ok(()) = shutting_down.changed() => {}
                () = changed(&mut devices) => {}
                // A pressure condition shows as soon as the eviction manager sees it.
                Ok(()) = pressure.changed() => {}
                () = changed(&mut volumes_in_use) => {}
            }
        }
    }

    /// One status pass (upstream `tryUpdateNodeStatus`).
    async fn sync_status(&self, state: &mut ReportState) -> Result<(), kube::Error> {
        let node = self.get_node().await?;
        self.note_uid(&node);
        let observed = self.observe().await;
        match &observed.addresses {
            Err(e) if state.last_address_error.as_ref() != Some(e) => {
                tracing::warn!(node = %self.node_name(), error = %e, "failed to set some node status fields");
                state.last_address_error = Some(e.clone());
            }
            Err(_) => {}
            Ok(_) => state.last_address_error = None,
        }
        let old = node.status.clone().unwrap_or_default();
        let (new, events) = status::compute_status(&old, &self.inputs(&observed));
        let changed = status::status_changed(&old, &new);
        if !status::should_report(changed, state.last_report, observed.now, self.settings.node_status_report_frequency)
        {
            return Ok(());
        }
        self.patch_status(&old, &new).await?;
        state.last_report = Some(observed.now);
        tracing::debug!(node = %self.node_name(), changed, "node status reported");
        events.iter().for_each(|ev| self.events.record_node(ev));
        Ok(())
    }

    async fn patch_status(&self, old: &NodeStatus, new: &NodeStatus) -> Result<(), kube::Error> {
        let patch: Value = status::status_patch(old, new);
        let name = self.node_name();
        self.with_timeout(
            "patch node status",
            self.nodes.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)),
        )
        .await
        .map(|_| ())
    }

    // ---- lease -----------------------------------------------------------

    async fn lease_loop(&self) {
        let duration = Duration::from_secs(u64::from(self.settings.node_lease_duration_seconds));
        let renew = duration.mul_f64(LEASE_RENEW_FRACTION);
        let mut latest: Option<Lease> = None;
        loop {
            self.sync_lease(&mut latest).await;
            tokio::time::sleep(jittered(renew)).await;
        }
    }

    /// One renewal (upstream `controller.sync`): an optimistic update from
    /// the last lease, else get-or-create with backoff, then an update.
    async fn sync_lease(&self, latest: &mut Option<Lease>) {
        if let Some(base) = latest.clone() {
            match self.retry_update_lease(base, latest).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::info!(error = %e, "failed to update lease using latest lease, fallback to ensure lease")
                }
            }
        }
        let (lease, created) = self.backoff_ensure_lease().await;
        *latest = lease.clone();
        if let (Some(lease), false) = (lease, created)
            && let Err(e) = self.retry_update_lease(lease, latest).await
        {
            tracing::error!(error = %e, "will retry updating lease");
        }
    }

    async fn retry_update_lease(&self, mut base: Lease, latest: &mut Option<Lease>) -> Result<(), LeaseError> {
        let name = self.node_name().to_string();
        let mut last_error = None;
        for _ in 0..MAX_LEASE_UPDATE_RETRIES {
            let uid = self.uid.borrow().clone();
            let lease = renewed_lease(
                Some(&base),
                &name,
                self.settings.node_lease_duration_seconds as i32,
                uid.as_deref(),
                Timestamp::now(),
            );
            match self.with_timeout("update lease", self.leases.replace(&name, &PostParams::default(), &lease)).await {
                Ok(updated) => {
                    *latest = Some(updated);
                    return Ok(());
                }
                Err(e) => {
                    tracing::debug!(error = %e, "failed to update lease");
                    if code(&e) == Some(409) {
                        match self.backoff_ensure_lease().await {
                            (Some(fresh), _) => base = fresh,
                            (None, _) => return Err(LeaseError::Conflict(e)),
                        }
                    }
                    last_error = Some(e);
                }
            }
        }
        Err(LeaseError::Retries(last_error.expect("MAX_LEASE_UPDATE_RETRIES > 0")))
    }

    /// Gets the lease, creating it when missing; retries with backoff until
    /// it succeeds. `(None, false)` when it cannot be created yet (the Node
    /// is not there to own it).
    async fn backoff_ensure_lease(&self) -> (Option<Lease>, bool) {
        let mut sleep = BACKOFF_START;
        loop {
            match self.ensure_lease().await {
                Ok(result) => return result,
                Err(e) => {
                    sleep = next_backoff(sleep);
                    tracing::error!(error = %e, interval = ?sleep, "failed to ensure lease exists, will retry");
                    tokio::time::sleep(sleep).await;
                }
            }
        }
    }

    async fn ensure_lease(&self) -> Result<(Option<Lease>, bool), kube::Error> {
        let name = self.node_name().to_string();
        match self.with_timeout("get lease", self.leases.get(&name)).await {
            Ok(lease) => Ok((Some(lease), false)),
            Err(e) if code(&e) == Some(404) => {
                // The lease is owned by the Node: learn its UID first.
                let known = self.uid.borrow().clone();
                let uid = match known {
                    Some(uid) => uid,
                    None => match self.get_node().await {
                        Ok(node) => {
                            self.note_uid(&node);
                            match node.metadata.uid {
                                Some(uid) => uid,
                                None => return Ok((None, false)),
                            }
                        }
                        Err(e) => {
                            tracing::error!(node = %name, error = %e, "failed to get node when trying to set owner ref to the node lease");
                            return Ok((None, false));
                        }
                    },
                };
                let lease = renewed_lease(
                    None,
                    &name,
                    self.settings.node_lease_duration_seconds as i32,
                    Some(&uid),
                    Timestamp::now(),
                );
                let created =
                    self.with_timeout("create lease", self.leases.create(&PostParams::default(), &lease)).await?;
                Ok((Some(created), true))
            }
            Err(e) => Err(e),
        }
    }
}
