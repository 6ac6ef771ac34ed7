//! The device manager (upstream `pkg/kubelet/cm/devicemanager`): device plugins register on
//! `<root-dir>/device-plugins/kubelet.sock` (deviceplugin v1beta1 `Register`) or through the
//! plugin watcher (type `DevicePlugin`); the node dials each plugin, asks its options and
//! follows its `ListAndWatch` stream. A pod is admitted only if every container gets its
//! devices (`GetPreferredAllocation` when offered, then `Allocate`); at container start the
//! answers become the container's envs, mounts, devices and annotations, after
//! `PreStartContainer` when the plugin asks for it. Allocations are checkpointed.
//!
//! The decisions are in [`state`] (pure), the container options in [`options`] (pure), the file
//! in [`checkpoint`]; this module does the I/O.

pub mod checkpoint;
pub mod options;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_metrics::{Metrics, ResourceLabels};
use gantry_vocab::spec;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::api::deviceplugin::device_plugin_client::DevicePluginClient;
use crate::api::deviceplugin::registration_server::{Registration, RegistrationServer};
use crate::api::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, DevicePluginOptions, Empty,
    PreStartContainerRequest, PreferredAllocationRequest, RegisterRequest,
};
pub use options::RunOptions;
pub use state::{AllocError, Amounts, Capacity};
use state::{Entry, Need, Registry};

/// The only device plugin API version (upstream `pluginapi.Version`).
pub const VERSION: &str = "v1beta1";
/// `<root-dir>/device-plugins`.
pub const DIR: &str = "device-plugins";
/// The kubelet's registration socket in [`DIR`].
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Upstream's `KubeletPreStartContainerRPCTimeoutInSecs`.
const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the grace period of plugins that went away is looked at.
const GRACE_CHECK: Duration = Duration::from_secs(30);

/// Why a plugin cannot register (upstream's texts; the plugin gets them back).
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("requested API version {version:?} is not supported by kubelet. Supported version is [{VERSION:?}]")]
    UnsupportedVersion { version: String },
    #[error("manager version, {VERSION}, is not among plugin supported versions [{}]", .versions.join(" "))]
    NoSupportedVersion { versions: Vec<String> },
    /// On `kubelet.sock`.
    #[error("the ResourceName {0:?} is invalid")]
    InvalidResourceName(String),
    /// Through `plugins_registry`, where the name is the socket's plugin name.
    #[error("invalid name of device plugin socket: the ResourceName {0:?} is invalid")]
    InvalidSocketName(String),
    #[error("failed to dial device plugin: {source}")]
    Dial {
        #[source]
        source: std::io::Error,
    },
    #[error("failed to get device plugin options: {0}")]
    Options(#[source] Status),
}

/// Why a pod is not admitted, or a container cannot get its devices.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error("device plugin for {resource} is not connected")]
    NotConnected { resource: String },
    #[error("{0}")]
    Rpc(GrpcError),
    #[error("{resource}: device plugin answered {got} allocations for 1 container")]
    BadAnswer { resource: String, got: usize },
}

/// A gRPC failure printed as Go's client prints it (`rpc error: code = ... desc = ...`).
#[derive(Debug)]
pub struct GrpcError(pub Status);

impl std::fmt::Display for GrpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rpc error: code = {:?} desc = {}", self.0.code(), self.0.message())
    }
}

/// Upstream's admission failure: the pod fails with reason `UnexpectedAdmissionError`.
#[derive(Debug, thiserror::Error)]
#[error("Allocate failed due to {0}, which is unexpected")]
pub struct AdmitError(#[source] pub DeviceError);

impl AdmitError {
    pub const REASON: &'static str = "UnexpectedAdmissionError";
}

/// A resource name a device plugin may serve (upstream `IsExtendedResourceName`): qualified
/// with a domain other than `kubernetes.io`, and not `requests.`-prefixed.
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else { return false };
    !domain.is_empty()
        && !rest.is_empty()
        && !rest.contains('/')
        && domain != "kubernetes.io"
        && !domain.ends_with(".kubernetes.io")
        && !name.starts_with("requests.")
}

/// The devices one container holds of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub pod_uid: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
}

/// What one container of a pod being admitted asks for.
struct Wanted {
    container: String,
    /// A regular init container: it finishes before the pod's next container starts.
    finishes: bool,
    /// Device plugin resources and how many of each.
    requests: Vec<(String, usize)>,
}

struct Plugin {
    client: DevicePluginClient<Channel>,
    options: DevicePluginOptions,
    /// Tells this connection from a later one of the same resource.
    id: u64,
}

struct Connected {
    resource: String,
    id: u64,
    client: DevicePluginClient<Channel>,
}

struct Inner {
    dir: PathBuf,
    /// The node's metrics (registrations, `Allocate` durations).
    metrics: Arc<Metrics>,
    state: Mutex<Registry>,
    plugins: Mutex<BTreeMap<String, Plugin>>,
    next_id: std::sync::atomic::AtomicU64,
    /// Bumped on every change of the Node's device resources.
    changed: watch::Sender<u64>,
    /// Pods are admitted one at a time, so two pods never get the same device.
    admission: tokio::sync::Mutex<()>,
    connected: mpsc::UnboundedSender<Connected>,
}

/// The node's device manager; clones share it.
#[derive(Clone)]
pub struct DeviceManager {
    inner: Arc<Inner>,
}

/// The manager's long-running work, for the node's supervisor.
pub struct Tasks {
    manager: DeviceManager,
    connected: mpsc::UnboundedReceiver<Connected>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DeviceManager {
    /// The manager of `<root_dir>/device-plugins`, with the checkpoint's allocations restored,
    /// recording into the node's `metrics`.
    pub fn new(root_dir: &Path, metrics: Arc<Metrics>) -> (Self, Tasks) {
        let dir = root_dir.join(DIR);
        let restored = match checkpoint::load(&dir) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "continuing without the device checkpoint; device allocations may not be up to date");
                checkpoint::Checkpoint::default()
            }
        };
        if !restored.entries.is_empty() {
            tracing::info!(entries = restored.entries.len(), "device allocations restored from the checkpoint");
        }
        let state = Registry::restored(restored.entries, restored.registered.into_keys(), Instant::now());
        let (tx, rx) = mpsc::unbounded_channel();
        let manager = DeviceManager {
            inner: Arc::new(Inner {
                dir,
                metrics,
                state: Mutex::new(state),
                plugins: Mutex::default(),
                next_id: Default::default(),
                changed: watch::Sender::new(0),
                admission: tokio::sync::Mutex::new(()),
                connected: tx,
            }),
        };
        (manager.clone(), Tasks { manager, connected: rx })
    }

    /// `<root-dir>/device-plugins`.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Changes whenever the Node's device resources do.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    fn notify(&self) {
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// The device plugin resources for the Node status now.
    pub fn capacity(&self) -> Capacity {
        lock(&self.inner.state).capacity(Instant::now())
    }

    /// Every allocation.
    pub fn allocations(&self) -> Vec<Allocation> {
        let state = lock(&self.inner.state);
        state
            .entries()
            .iter()
            .map(|e| Allocation {
                pod_uid: e.pod_uid.clone(),
                container: e.container.clone(),
                resource: e.resource.clone(),
                device_ids: e.device_ids.clone(),
            })
            .collect()
    }

    /// Every device per resource, healthy or not (the pod-resources API's allocatable ones).
    pub fn registered(&self) -> BTreeMap<String, Vec<String>> {
        lock(&self.inner.state).registered()
    }

    /// Checks a plugin's registration (upstream `ValidatePlugin` for the watcher path).
    pub fn validate(name: &str, versions: &[String]) -> Result<(), RegisterError> {
        if !versions.iter().any(|v| v == VERSION) {
            return Err(RegisterError::NoSupportedVersion { versions: versions.to_vec() });
        }
        if !is_extended_resource_name(name) {
            return Err(RegisterError::InvalidSocketName(name.to_string()));
        }
        Ok(())
    }

    /// Connects the plugin of `resource` serving on `socket`: dials it, asks its options, and
    /// hands it to the stream loop. A later registration of the same resource replaces it.
    pub async fn connect(&self, resource: &str, socket: &Path) -> Result<(), RegisterError> {
        let channel = crate::dial::channel(socket).await.map_err(|source| RegisterError::Dial { source })?;
        let mut client = DevicePluginClient::new(channel);
        let options = client.get_device_plugin_options(Empty {}).await.map_err(RegisterError::Options)?.into_inner();
        let id = self.inner.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(resource, socket = %socket.display(), pre_start_required = options.pre_start_required,
            preferred_allocation = options.get_preferred_allocation_available, "device plugin connected");
        lock(&self.inner.plugins).insert(resource.to_string(), Plugin { client: client.clone(), options, id });
        // The receiver lives as long as the node's supervisor runs the tasks.
        let _ = self.inner.connected.send(Connected { resource: resource.to_string(), id, client });
        Ok(())
    }

    /// Upstream counts every registration request, refused ones too.
    pub fn count_registration(&self, resource: &str) {
        let labels = ResourceLabels { resource_name: resource.to_string() };
        self.inner.metrics.device_plugin_registrations.get_or_create(&labels).inc();
    }

    /// The plugin of `resource` went away (its socket was removed): its devices are no longer
    /// allocatable.
    pub fn disconnect(&self, resource: &str) {
        if lock(&self.inner.plugins).remove(resource).is_some() {
            lock(&self.inner.state).disconnected(resource, Instant::now());
            tracing::info!(resource, "device plugin disconnected");
            self.notify();
        }
    }

    fn stream_ended(&self, resource: &str, id: u64, why: &str) {
        let mut plugins = lock(&self.inner.plugins);
        if plugins.get(resource).is_some_and(|p| p.id == id) {
            plugins.remove(resource);
            drop(plugins);
            tracing::warn!(resource, error = why, "listAndWatch ended unexpectedly for device plugin");
            lock(&self.inner.state).disconnected(resource, Instant::now());
            self.notify();
        }
    }

    /// Allocates the devices of every container of `pod` (init containers first), or says why
    /// the pod cannot be admitted. A pod asking for no device resource passes untouched.
    pub async fn admit(&self, pod: &Pod) -> Result<(), AdmitError> {
        let _one_at_a_time = self.inner.admission.lock().await;
        let uid = spec::uid(pod);
        // Upstream's `devicesToReuse`: a regular init container's devices are free for the
        // pod's later containers (it has finished by then); a sidecar's or an app container's
        // devices are theirs for the pod's life.
        let spec = pod.spec.as_ref();
        let inits =
            spec.into_iter().flat_map(|s| s.init_containers.iter().flatten()).map(|c| (c, !spec::is_sidecar(c)));
        let apps = spec.into_iter().flat_map(|s| &s.containers).map(|c| (c, false));
        let wanted: Vec<Wanted> = inits
            .chain(apps)
            .map(|(c, finishes)| Wanted { container: c.name.clone(), finishes, requests: self.requests(c) })
            .collect();
        let mut reusable: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for Wanted { container, finishes, requests } in wanted {
            for (resource, size) in requests {
                let reuse = reusable.entry(resource.clone()).or_default();
                let ids = self.allocate(uid, &container, &resource, size, reuse).await.map_err(AdmitError)?;
                if finishes {
                    reuse.extend(ids);
                } else {
                    ids.iter().for_each(|id| {
                        reuse.remove(id);
                    });
                }
            }
        }
        Ok(())
    }

    /// The device plugin resources `c` asks for, with how many.
    fn requests(&self, c: &Container) -> Vec<(String, usize)> {
        let state = lock(&self.inner.state);
        let resources = c.resources.as_ref();
        let limits = resources.and_then(|r| r.limits.as_ref());
        // Extended resources must have requests equal to limits; either names the amount.
        let amounts = limits.or(resources.and_then(|r| r.requests.as_ref()));
        amounts
            .into_iter()
            .flatten()
            .filter(|(name, _)| state.manages(name))
            .filter_map(|(name, q)| {
                let n = gantry_vocab::quantity::parse_units(&q.0).ok()?;
                (n > 0).then(|| (name.clone(), n as usize))
            })
            .collect()
    }

    /// Gives `container` `size` devices of `resource` (the ones it holds already, if any) and
    /// returns them.
    async fn allocate(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
        size: usize,
        reusable: &BTreeSet<String>,
    ) -> Result<Vec<String>, DeviceError> {
        let need = lock(&self.inner.state).need(uid, container, resource, size, reusable)?;
        let (reusable, available, size) = match need {
            Need::Allocated(ids) => return Ok(ids),
            Need::Pick { reusable, available, size } => (reusable, available, size),
        };
        let (mut client, options) = self.plugin(resource)?;
        let mut preferred = Vec::new();
        // Enough reusable devices: no choice to ask the plugin about (as upstream).
        if options.get_preferred_allocation_available && reusable.len() < size {
            let request = PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: available.clone(),
                    must_include_device_i_ds: reusable.clone(),
                    allocation_size: size as i32,
                }],
            };
            let answer = client.get_preferred_allocation(request).await.map_err(|s| DeviceError::Rpc(GrpcError(s)))?;
            preferred = answer.into_inner().container_responses.into_iter().flat_map(|r| r.device_i_ds).collect();
        }
        let ids = state::choose(&reusable, &available, size, &preferred);
        let request =
            AllocateRequest { container_requests: vec![ContainerAllocateRequest { devices_ids: ids.clone() }] };
        let started = Instant::now();
        let answer = client.allocate(request).await;
        let labels = ResourceLabels { resource_name: resource.to_string() };
        let histogram = self.inner.metrics.device_plugin_alloc_duration.get_or_create(&labels);
        histogram.observe(started.elapsed().as_secs_f64());
        let mut answer = answer.map_err(|s| DeviceError::Rpc(GrpcError(s)))?.into_inner().container_responses;
        if answer.len() != 1 {
            return Err(DeviceError::BadAnswer { resource: resource.to_string(), got: answer.len() });
        }
        tracing::info!(pod_uid = uid, container, resource, devices = ?ids, "devices allocated");
        let entry = Entry {
            pod_uid: uid.to_string(),
            container: container.to_string(),
            resource: resource.to_string(),
            device_ids: ids.clone(),
            response: answer.remove(0),
        };
        lock(&self.inner.state).record(entry);
        self.save();
        Ok(ids)
    }

    fn plugin(&self, resource: &str) -> Result<(DevicePluginClient<Channel>, DevicePluginOptions), DeviceError> {
        let plugins = lock(&self.inner.plugins);
        let p = plugins.get(resource).ok_or_else(|| DeviceError::NotConnected { resource: resource.to_string() })?;
        Ok((p.client.clone(), p.options))
    }

    /// What `container` of `pod` gets from the device plugins, after `PreStartContainer` for
    /// plugins that ask for it (upstream `GetDeviceRunContainerOptions`).
    pub async fn run_options(&self, pod: &Pod, container: &str) -> Result<RunOptions, DeviceError> {
        let entries: Vec<Entry> =
            lock(&self.inner.state).container_entries(spec::uid(pod), container).cloned().collect();
        for e in &entries {
            let pre_start = lock(&self.inner.plugins).get(&e.resource).is_some_and(|p| p.options.pre_start_required);
            if pre_start {
                let (mut client, _) = self.plugin(&e.resource)?;
                let request = PreStartContainerRequest { devices_ids: e.device_ids.clone() };
                let call = tokio::time::timeout(PRE_START_TIMEOUT, client.pre_start_container(request));
                match call.await {
                    Ok(Ok(_)) => {}
                    Ok(Err(s)) => return Err(DeviceError::Rpc(GrpcError(s))),
                    Err(_) => {
                        return Err(DeviceError::Rpc(GrpcError(Status::deadline_exceeded(
                            "context deadline exceeded",
                        ))));
                    }
                }
            }
        }
        Ok(options::merge(entries.iter().map(|e| &e.response)))
    }

    /// Frees the devices of pod `uid` (it terminated).
    pub fn release(&self, uid: &str) {
        if lock(&self.inner.state).release(uid) {
            tracing::info!(pod_uid = uid, "devices freed");
            self.save();
        }
    }

    /// Frees the devices of every pod not in `active` (pods gone while the node was down).
    pub fn retain(&self, active: &BTreeSet<String>) {
        if lock(&self.inner.state).retain_pods(active) {
            self.save();
        }
    }

    fn save(&self) {
        let checkpoint = {
            let state = lock(&self.inner.state);
            checkpoint::Checkpoint { entries: state.entries().to_vec(), registered: state.registered() }
        };
        if let Err(e) = checkpoint::save(&self.inner.dir, &checkpoint) {
            tracing::error!(error = %e, "cannot checkpoint device allocations");
        }
    }
}

impl Tasks {
    /// Serves `kubelet.sock` and follows every connected plugin's `ListAndWatch` stream; runs
    /// for the node's lifetime (the streams are children of this task).
    pub async fn run(mut self) {
        let dir = self.manager.inner.dir.clone();
        remove_stale_sockets(&dir);
        let socket = dir.join(KUBELET_SOCKET);
        let incoming = match crate::dial::listen(&socket) {
            Ok(incoming) => incoming,
            Err(e) => {
                tracing::error!(socket = %socket.display(), error = %e, "cannot serve the device plugin registration socket");
                return std::future::pending().await;
            }
        };
        tracing::info!(socket = %socket.display(), "serving device plugin registration");
        let service = RegistrationServer::new(Registrar { manager: self.manager.clone() });
        let server = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming);
        let mut server = std::pin::pin!(server);
        let mut streams = JoinSet::new();
        let mut grace = tokio::time::interval(GRACE_CHECK);
        let mut last = self.manager.capacity();
        loop {
            tokio::select! {
                result = &mut server => {
                    tracing::error!(result = ?result.err(), "device plugin registration server stopped");
                    return;
                }
                Some(c) = self.connected.recv() => {
                    streams.spawn(follow(self.manager.clone(), c));
                }
                Some(_) = streams.join_next(), if !streams.is_empty() => {}
                _ = grace.tick() => {
                    // A resource past its grace period leaves the Node's capacity.
                    let now = self.manager.capacity();
                    if now != last {
                        last = now;
                        self.manager.notify();
                    }
                }
            }
        }
    }
}

/// Upstream's `CleanupPluginDirectory` at start: every socket in `dir` but the checkpoint is
/// removed (plugins that registered on the last run's `kubelet.sock` register again when it is
/// back, as upstream's plugins do); directories and other files stay.
fn remove_stale_sockets(dir: &Path) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        // `file_type` does not follow symlinks (upstream's Lstat).
        let socket = entry.file_type().is_ok_and(|t| t.is_socket());
        if !socket || entry.file_name() == checkpoint::FILE_NAME {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!(socket = %path.display(), "removed a device plugin socket of an earlier run"),
            Err(e) => {
                tracing::warn!(socket = %path.display(), error = %e, "cannot remove a stale device plugin socket")
            }
        }
    }
}

/// One plugin's `ListAndWatch` stream, until it ends.
async fn follow(manager: DeviceManager, c: Connected) {
    let Connected { resource, id, mut client } = c;
    let mut stream = match client.list_and_watch(Empty {}).await {
        Ok(s) => s.into_inner(),
        Err(s) => return manager.stream_ended(&resource, id, &GrpcError(s).to_string()),
    };
    loop {
        match stream.message().await {
            Ok(Some(list)) => {
                let healthy = list.devices.iter().filter(|d| d.health == state::HEALTHY).count();
                tracing::info!(resource, devices = list.devices.len(), healthy, "device plugin listed its devices");
                if lock(&manager.inner.plugins).get(&resource).is_some_and(|p| p.id == id) {
                    lock(&manager.inner.state).update(&resource, &list.devices);
                    manager.save();
                    manager.notify();
                }
            }
            Ok(None) => return manager.stream_ended(&resource, id, "stream closed"),
            Err(s) => return manager.stream_ended(&resource, id, &GrpcError(s).to_string()),
        }
    }
}

/// The kubelet's `Registration` service (v1beta1).
struct Registrar {
    manager: DeviceManager,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(resource = %r.resource_name, "got registration request from device plugin");
        self.manager.count_registration(&r.resource_name);
        let check = if r.version != VERSION {
            Err(RegisterError::UnsupportedVersion { version: r.version.clone() })
        } else if !is_extended_resource_name(&r.resource_name) {
            Err(RegisterError::InvalidResourceName(r.resource_name.clone()))
        } else {
            Ok(())
        };
        let socket = self.manager.dir().join(&r.endpoint);
        let result = match check {
            Ok(()) => self.manager.connect(&r.resource_name, &socket).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => Ok(Response::new(Empty {})),
            Err(e) => {
                tracing::warn!(resource = %r.resource_name, error = %e, "bad registration request from device plugin");
                Err(Status::unknown(e.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resource_names_as_upstream() {
        assert!(is_extended_resource_name("example.com/gpu"));
        assert!(is_extended_resource_name("nvidia.com/gpu"));
        assert!(!is_extended_resource_name("gpu"));
        assert!(!is_extended_resource_name("kubernetes.io/gpu"));
        assert!(!is_extended_resource_name("node.kubernetes.io/gpu"));
        assert!(!is_extended_resource_name("requests.example.com/gpu"));
    }

    #[test]
    fn registration_errors_name_the_versions_and_resource() {
        let e = DeviceManager::validate("example.com/gpu", &["v1alpha".into(), "v2".into()]).unwrap_err();
        assert_eq!(e.to_string(), "manager version, v1beta1, is not among plugin supported versions [v1alpha v2]");
        let e = DeviceManager::validate("gpu", &[VERSION.into()]).unwrap_err();
        assert_eq!(e.to_string(), "invalid name of device plugin socket: the ResourceName \"gpu\" is invalid");
        let e = RegisterError::UnsupportedVersion { version: "v1alpha".into() };
        assert_eq!(
            e.to_string(),
            "requested API version \"v1alpha\" is not supported by kubelet. Supported version is [\"v1beta1\"]"
        );
        assert_eq!(RegisterError::InvalidResourceName("gpu".into()).to_string(), "the ResourceName \"gpu\" is invalid");
        assert!(DeviceManager::validate("example.com/gpu", &[VERSION.into()]).is_ok());
    }

    #[test]
    fn only_sockets_but_the_checkpoint_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        std::fs::write(dir.path().join(checkpoint::FILE_NAME), "{}").unwrap();
        std::fs::write(dir.path().join("notes"), "kept").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        remove_stale_sockets(dir.path());
        assert!(!stale.exists());
        for kept in [checkpoint::FILE_NAME, "notes", "sub"] {
            assert!(dir.path().join(kept).exists(), "{kept}");
        }
    }

    #[test]
    fn an_admission_failure_reads_as_upstreams() {
        let e = AdmitError(DeviceError::Alloc(AllocError::Unavailable {
            resource: "example.com/gpu".into(),
            requested: 2,
            available: 1,
        }));
        assert_eq!(
            e.to_string(),
            "Allocate failed due to requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1, which is unexpected"
        );
    }
}
