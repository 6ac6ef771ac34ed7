//! Cluster mode, node side: register the Node, keep its status and its Lease
//! fresh (the "node controller" of virtual-kubelet's split).
//!
//! * [`status`] is the pure core: labels, taints, capacity/allocatable,
//!   nodeInfo (incl. KEP-4004 `kubeProxyVersion`), addresses, conditions,
//!   what changed, and the patches to send. No I/O; time is an input.
//! * [`machine`], [`addresses`], [`runtime_state`] gather the inputs
//!   (machine facts, interfaces/DNS, CRI status); the pressure conditions
//!   come from the eviction manager.
//! * [`controller::NodeController`] does the API calls: registration, the
//!   status loop (every `nodeStatusUpdateFrequency`, PATCH only when changed
//!   or every `nodeStatusReportFrequency`), the lease loop (every
//!   `nodeLeaseDurationSeconds` × 0.25), and events.
//! * [`start`] is the entry point the binary calls with `--kubeconfig`.
//!
//! Every write is one the Node authorizer and NodeRestriction admission
//! allow for `system:node:<name>`: only its own Node (create, patch of the
//! labels it owns and of `nodes/status`), its own Lease in
//! `kube-node-lease`, and Events.

pub mod addresses;
pub mod controller;
pub mod lease;
pub mod machine;
pub mod runtime_state;
pub mod status;

use gantry_cri::Cri;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use controller::{NodeController, NodeError, NodeRegistration};
pub use machine::MachineFacts;

use crate::api::{self, ApiClients};
use gantry_config::Settings;

pub use gantry_vocab::keys::KUBELET_VERSION;

/// Annotation telling the attach/detach controller it manages this node's
/// volumes (upstream `enableControllerAttachDetach`, default true).
pub const CMAD_ANNOTATION: &str = "volumes.kubernetes.io/controller-managed-attach-detach";

/// The running node side.
pub struct NodeAgent {
    /// The API clients (`client` is rate-limited and meant for everything
    /// else the agent does in cluster mode: pods, mirror pods, events).
    pub clients: ApiClients,
    /// The node's InternalIP addresses (the pods' `hostIP`/`hostIPs`), detected
    /// locally so that pods have them before the Node is registered; empty when
    /// they could not be determined.
    pub host_ips: Vec<String>,
    /// `Some` once the Node is registered (with `--register-node=false`: once
    /// it has been looked up).
    pub registration: watch::Receiver<Option<NodeRegistration>>,
    /// The Node's UID as last seen (changes if the Node is re-created).
    pub node_uid: watch::Receiver<Option<String>>,
    /// The Node's `node.alpha.kubernetes.io/ttl` annotation as last seen.
    pub object_ttl: watch::Receiver<Option<std::time::Duration>>,
    /// The event recorder for the node's and its pods' events.
    pub events: crate::events::Recorder,
    /// The recorder's writer task, for the caller's supervisor to adopt; it runs until the
    /// last recorder is dropped.
    pub event_writer: JoinHandle<()>,
    /// The node's addresses as last observed for its status.
    pub addresses: watch::Receiver<Vec<k8s_openapi::api::core::v1::NodeAddress>>,
    /// Registration, then the status, lease and runtime loops; they run until
    /// aborted.
    pub task: JoinHandle<()>,
}

impl NodeAgent {
    /// Waits until the Node is registered.
    pub async fn registered(&mut self) -> NodeRegistration {
        match self.registration.wait_for(Option::is_some).await {
            Ok(r) => r.clone().expect("waited for Some"),
            Err(_) => std::future::pending().await, // registration failed for good; logged by the task
        }
    }
}

/// What an API server that cannot be reached at start-up means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Startup {
    /// A start-up error: without the API server the agent has nothing to run.
    RequireServer,
    /// Keep going and register once it answers: static pods run meanwhile. This
    /// is how a kubeadm control plane boots, its API server being one of them.
    TolerateUnreachable,
}

/// What the node plugins add to the Node's status.
#[derive(Default)]
pub struct PluginStatus {
    /// The device plugins' extended resources.
    pub devices: Option<gantry_plugins::devices::DeviceManager>,
    /// The CSI volumes the node mounts or is about to (`status.volumesInUse`).
    pub volumes_in_use: Option<watch::Receiver<Vec<String>>>,
}

/// Connects to the API server (failing with one clear [`api::ApiError`] for a
/// bad kubeconfig, rejected or forbidden credentials, and an unreachable
/// server unless `startup` tolerates it), then spawns the task that registers
/// the Node (retrying until the API server accepts it) and runs the status
/// and lease loops.
pub async fn start(
    settings: &Settings,
    cri: Cri,
    startup: Startup,
    metrics: &std::sync::Arc<gantry_metrics::Metrics>,
    shutting_down: watch::Receiver<bool>,
    pressure: watch::Receiver<status::Pressure>,
    plugins: PluginStatus,
) -> Result<NodeAgent, NodeError> {
    if let Some(paths) = bootstrap_paths(settings) {
        api::bootstrap::load_client_cert(&paths, &settings.node_name).await.map_err(api::ApiError::from)?;
    }
    let clients = api::build(settings, metrics).await?;
    let node = &settings.node_name;
    match api::check(&clients, node).await {
        Ok(()) => tracing::info!(
            server = %clients.server, user = %clients.user, kubeconfig = %clients.kubeconfig.display(), node = %node,
            "connected to the API server"
        ),
        Err(e) if startup == Startup::TolerateUnreachable && e.is_transient() => tracing::warn!(
            node = %node, error = %e,
            "cannot reach the API server yet; static pods run meanwhile and the node registers once it answers"
        ),
        Err(e) => return Err(e.into()),
    }
    // Pod and node events share one recorder: one writer task, one correlator.
    let (events, event_writer) = crate::events::Recorder::to_api(clients.events.clone(), node);
    let mut controller =
        NodeController::new(clients.heartbeat.clone(), settings, cri, events.clone(), shutting_down, pressure);
    if let Some(devices) = plugins.devices {
        controller = controller.with_devices(devices);
    }
    if let Some(volumes) = plugins.volumes_in_use {
        controller = controller.with_volumes_in_use(volumes);
    }
    let node_uid = controller.node_uid();
    let object_ttl = controller.object_ttl();
    let addresses = controller.addresses();
    let host_ips = controller.host_ips().await;
    let (registered, registration) = watch::channel(None);
    let node = node.clone();
    let task = tokio::spawn(async move {
        match controller.register().await {
            Ok(r) => {
                registered.send_replace(Some(r));
                controller.run().await;
            }
            Err(e) => {
                tracing::error!(node = %node, error = %e, "cannot register the node; pods keep running");
                // The task runs for the node's lifetime either way: its supervisor treats an
                // ending as a fault, and a node that cannot register still runs its pods.
                std::future::pending::<()>().await
            }
        }
    });
    Ok(NodeAgent {
        clients,
        host_ips,
        registration,
        node_uid,
        object_ttl,
        addresses,
        task,
        events,
        event_writer: tokio::spawn(event_writer),
    })
}

/// Where TLS bootstrap reads and writes, with `--bootstrap-kubeconfig` and `--kubeconfig`.
pub fn bootstrap_paths(settings: &Settings) -> Option<api::bootstrap::BootstrapPaths> {
    Some(api::bootstrap::BootstrapPaths {
        kubeconfig: settings.kubeconfig.clone()?,
        bootstrap: settings.bootstrap_kubeconfig.clone()?,
        cert_dir: settings.server.cert_dir(&settings.root_dir),
    })
}
