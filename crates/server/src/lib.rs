//! The node API server (issue 7): what `kubectl logs/exec/attach/port-forward`, metrics-server
//! and Prometheus reach through port 10250.
//!
//! * `routes.rs` lists every route and the authorization subresource of every path;
//!   new endpoints go there.
//! * `serve.rs` accepts connections (TLS with optional client certificates, or plain HTTP
//!   for the healthz and read-only ports) and hands them to axum with HTTP upgrades enabled.
//! * `authn.rs` / `authz.rs` / `cache.rs`: who is asking (client certificate, bearer token
//!   via TokenReview, anonymous) and whether they may (SubjectAccessReview or AlwaysAllow).
//! * `tls.rs`: the serving certificate (given files, or a self-signed pair in `--cert-dir`).
//! * `pods.rs`: `/pods` and pod/container lookup; `streaming.rs`: `/exec`, `/attach`,
//!   `/portForward`, `/run`; `proxy.rs`: the upgrade proxy to the runtime's streaming server.

pub mod authn;
pub mod authz;
mod cache;
pub mod logs;
mod metrics;
pub mod pods;
mod proxy;
pub mod routes;
mod serve;
pub mod stats;
pub mod streaming;
pub mod tls;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use gantry_config::{ServerSettings, Settings};
use gantry_cri::Cri;
use k8s_openapi::api::core::v1::{Pod, PodStatus};

pub use routes::{read_only_router, router};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind { addr: SocketAddr, what: &'static str, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// What the node API reads from the running agent: the pods it runs, each with its latest
/// status. The agent implements nothing of this crate; the binary wires the two together.
pub trait PodList: Send + Sync + 'static {
    fn pods(&self) -> Vec<RunningPod>;
}

/// A pod the node runs, shared with the agent rather than copied: readers that run every few
/// seconds (the volume measure, each `/stats/summary` and `/metrics/resource` scrape) copied
/// every pod, about 20 KB each, and at 250 pods the heap grew by 5 MiB and stayed so.
#[derive(Debug, Clone)]
pub struct RunningPod {
    /// As its worker runs it; its `status` is its source's, not the node's.
    pub pod: Arc<Pod>,
    /// The node's latest status of the pod.
    pub status: Arc<PodStatus>,
}

impl RunningPod {
    /// A pod copied out of `pod`, its status the node's.
    pub fn new(mut pod: Pod) -> Self {
        let status = Arc::new(pod.status.take().unwrap_or_default());
        RunningPod { pod: Arc::new(pod), status }
    }

    /// The pod with the node's status, as the API shows it: a copy.
    pub fn to_pod(&self) -> Pod {
        Pod { status: Some(PodStatus::clone(&self.status)), ..Pod::clone(&self.pod) }
    }
}

/// The usage of volumes only their plugin can measure (CSI's `NodeGetVolumeStats`): per pod
/// volume name of the pod `uid`, the figures the plugin reported (`time` left empty).
pub trait PluginVolumes: Send + Sync + 'static {
    fn usage(&self, uid: &str) -> futures::future::BoxFuture<'_, Vec<(String, stats::types::FsStats)>>;
}

/// What every handler can reach. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct ServerState {
    inner: Arc<Inner>,
}

struct Inner {
    node_name: String,
    cri: Cri,
    pods: Arc<dyn PodList>,
    plugin_volumes: Arc<dyn PluginVolumes>,
    root_dir: PathBuf,
    pod_logs_dir: PathBuf,
    /// How pod cgroups are named (None without `cgroupsPerQOS`), for the stats.
    cgroups: gantry_config::PodSettings,
    /// The runtime's unix socket, whose server is the `runtime` system container.
    runtime_socket: Option<PathBuf>,
    /// The `KubeletPSI` gate: pressure stall information in the summary.
    psi: bool,
    /// The InternalIP the node registered with (cluster mode), for the serving certificate.
    host_ip: Option<IpAddr>,
    settings: ServerSettings,
    authenticator: authn::Authenticator,
    authorizer: authz::Authorizer,
    stats: stats::summary::StatsCache,
    metrics: Arc<gantry_metrics::Metrics>,
}

impl ServerState {
    /// `client` is the API client in cluster mode (TokenReview, SubjectAccessReview).
    pub fn new(
        settings: &Settings,
        cri: Cri,
        pods: Arc<dyn PodList>,
        plugin_volumes: Arc<dyn PluginVolumes>,
        host_ip: Option<IpAddr>,
        client: Option<kube::Client>,
        metrics: Arc<gantry_metrics::Metrics>,
    ) -> Self {
        let server = settings.server.clone();
        let authenticator = authn::Authenticator::new(&server, client.clone());
        let authorizer = authz::Authorizer::new(&server, &settings.node_name, client);
        ServerState {
            inner: Arc::new(Inner {
                node_name: settings.node_name.clone(),
                cri,
                pods,
                plugin_volumes,
                root_dir: settings.root_dir.clone(),
                pod_logs_dir: settings.pod_logs_dir.clone(),
                cgroups: settings.pods.clone(),
                runtime_socket: settings.container_runtime_endpoint.strip_prefix("unix://").map(PathBuf::from),
                psi: settings.feature_gates.enabled(gantry_config::Gate::KubeletPSI),
                host_ip,
                settings: server,
                authenticator,
                authorizer,
                stats: Default::default(),
                metrics,
            }),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.inner.node_name
    }

    /// The CRI clients (runtime and images).
    pub fn cri(&self) -> &Cri {
        &self.inner.cri
    }

    /// The pods the node runs, with their latest status.
    pub fn pods(&self) -> Vec<RunningPod> {
        self.inner.pods.pods()
    }

    /// The pods the node runs, with their latest status, copied.
    pub fn pod_copies(&self) -> Vec<Pod> {
        self.pods().iter().map(RunningPod::to_pod).collect()
    }

    /// The volumes their plugins measure.
    pub fn plugin_volumes(&self) -> &dyn PluginVolumes {
        self.inner.plugin_volumes.as_ref()
    }

    pub fn root_dir(&self) -> &std::path::Path {
        &self.inner.root_dir
    }

    pub fn pod_logs_dir(&self) -> &std::path::Path {
        &self.inner.pod_logs_dir
    }

    /// How pod cgroups are named; None without `cgroupsPerQOS` (pods have none of their own).
    pub fn pod_cgroups(&self) -> Option<&gantry_config::PodSettings> {
        self.inner.cgroups.cgroups_per_qos.then_some(&self.inner.cgroups)
    }

    /// The cgroup settings, with the system containers' names (`kubeletCgroups`, …).
    pub fn cgroups(&self) -> &gantry_config::PodSettings {
        &self.inner.cgroups
    }

    pub fn runtime_socket(&self) -> Option<&std::path::Path> {
        self.inner.runtime_socket.as_deref()
    }

    /// Whether the summary reports pressure stall information (the `KubeletPSI` gate).
    pub fn psi(&self) -> bool {
        self.inner.psi
    }

    pub fn settings(&self) -> &ServerSettings {
        &self.inner.settings
    }

    /// The stats code's memory between scrapes (CPU samples, sandbox PIDs).
    pub fn stats_cache(&self) -> &stats::summary::StatsCache {
        &self.inner.stats
    }

    /// The node's metrics registry (`/metrics`, `/metrics/probes`).
    pub fn metrics(&self) -> &gantry_metrics::Metrics {
        &self.inner.metrics
    }

    pub fn authenticator(&self) -> &authn::Authenticator {
        &self.inner.authenticator
    }

    pub fn authorizer(&self) -> &authz::Authorizer {
        &self.inner.authorizer
    }
}

/// The addresses the server listens on (ports resolved, for logs and tests).
#[derive(Debug, Clone)]
pub struct Listening {
    pub secure: SocketAddr,
    pub healthz: Option<SocketAddr>,
    pub read_only: Option<SocketAddr>,
}

/// The bound ports and the loops that serve them, for the caller's supervisor.
pub struct Serving {
    pub listening: Listening,
    pub tasks: Vec<(&'static str, futures::future::BoxFuture<'static, ()>)>,
}

/// Binds every configured port (an error names the address, as upstream fails start-up when
/// it cannot listen) and returns the accept loops; nothing is served until they run.
/// `serving_cert`: the certificate resolver of `serverTLSBootstrap`; `None` serves
/// `tlsCertFile` or a self-signed certificate.
pub async fn bind_all(
    settings: &Settings,
    state: ServerState,
    serving_cert: Option<Arc<dyn tls::ResolvesServerCert>>,
) -> Result<Serving, ServerError> {
    let s = &settings.server;
    let cert = match serving_cert {
        Some(resolver) => tls::ServingCert::Resolver(resolver),
        None => {
            // The node's addresses: `--node-ip`, and in cluster mode the InternalIP it registered.
            let mut node_ips = settings.node_ips.clone();
            node_ips.extend(state.inner.host_ip);
            node_ips.dedup();
            tls::ServingCert::Files { node_ips }
        }
    };
    let tls = tls::server_config(s, settings, cert).await?;
    let (secure, secure_addr) = bind(SocketAddr::new(s.address, settings.port), "port").await?;
    let healthz = match s.healthz_port {
        0 => None,
        p => Some(bind(SocketAddr::new(s.healthz_bind_address, p), "healthzPort").await?),
    };
    let read_only = match s.read_only_port {
        0 => None,
        p => Some(bind(SocketAddr::new(s.address, p), "readOnlyPort").await?),
    };
    let listening = Listening {
        secure: secure_addr,
        healthz: healthz.as_ref().map(|(_, a)| *a),
        read_only: read_only.as_ref().map(|(_, a)| *a),
    };
    tracing::info!(node = %settings.node_name, address = %secure_addr, "serving the node API (HTTPS)");
    let mut tasks: Vec<(&'static str, futures::future::BoxFuture<'static, ()>)> =
        vec![("node-api", Box::pin(serve::https(secure, tls, router(state.clone()))))];
    if let Some((l, address)) = healthz {
        tracing::info!(%address, "serving /healthz (HTTP)");
        tasks.push(("healthz", Box::pin(serve::http(l, routes::healthz_router()))));
    }
    if let Some((l, address)) = read_only {
        tracing::info!(%address, "serving the read-only node API (HTTP, no authentication)");
        tasks.push(("read-only-api", Box::pin(serve::http(l, read_only_router(state)))));
    }
    Ok(Serving { listening, tasks })
}

/// The listener and the address it really got (port 0 resolved).
async fn bind(addr: SocketAddr, what: &'static str) -> Result<(tokio::net::TcpListener, SocketAddr), ServerError> {
    let error = |source| ServerError::Bind { addr, what, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    Ok((listener, bound))
}
