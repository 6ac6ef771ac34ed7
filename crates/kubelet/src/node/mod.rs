//! Cluster mode, node side: register the Node, keep its status and its Lease
//! fresh (the "node controller" of virtual-kubelet's split).
//!
//! * [`status`] is the pure core: labels, taints, capacity/allocatable,
//!   nodeInfo (incl. KEP-4004 `kubeProxyVersion`), addresses, conditions,
//!   what changed, and the patches to send. No I/O; time is an input.
//! * [`machine`], [`addresses`], [`pressure`], [`runtime_state`] gather
//!   the inputs (machine facts, interfaces/DNS, free resources, CRI status).
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
pub mod events;
pub mod lease;
pub mod machine;
pub mod pressure;
pub mod quantity;
pub mod runtime_state;
pub mod status;

use gantry_cri::Cri;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use controller::{NodeController, NodeError, NodeRegistration};
pub use machine::MachineFacts;

use crate::api::{self, ApiClients};
use crate::config::Settings;

/// The version Gantry reports as `nodeInfo.kubeletVersion`: the Kubernetes
/// version whose kubelet it stands in for, plus Gantry's own version.
pub const KUBELET_VERSION: &str = concat!("v1.34.0-gantry.", env!("CARGO_PKG_VERSION"));

/// Annotation telling the attach/detach controller it manages this node's
/// volumes (upstream `enableControllerAttachDetach`, default true).
pub const CMAD_ANNOTATION: &str = "volumes.kubernetes.io/controller-managed-attach-detach";

/// The running node side.
pub struct NodeAgent {
    /// The API clients (`client` is rate-limited and meant for everything
    /// else the agent does in cluster mode: pods, mirror pods, events).
    pub clients: ApiClients,
    pub registration: NodeRegistration,
    /// The Node's UID as last seen (changes if the Node is re-created).
    pub node_uid: watch::Receiver<Option<String>>,
    /// The status, lease and runtime loops; they run until aborted.
    pub task: JoinHandle<()>,
}

/// Connects to the API server (failing with one clear [`api::ApiError`] for a
/// bad kubeconfig, unreachable server, rejected or forbidden credentials),
/// registers the Node (retrying until the API server accepts it), and spawns
/// the status and lease loops.
pub async fn start(settings: &Settings, cri: Cri) -> Result<NodeAgent, NodeError> {
    let clients = api::connect_clients(settings).await?;
    tracing::info!(
        server = %clients.server, user = %clients.user, kubeconfig = %clients.kubeconfig.display(),
        node = %settings.node_name, "connected to the API server"
    );
    let controller = NodeController::new(clients.heartbeat.clone(), settings, cri);
    let node_uid = controller.node_uid();
    let registration = controller.register().await?;
    let task = tokio::spawn(controller.run());
    Ok(NodeAgent { clients, registration, node_uid, task })
}
