//! The API server clients of cluster mode (`--kubeconfig`).
//!
//! [`connect`] loads the kubeconfig (client certificates, bearer tokens and
//! token files, exec plugins: whatever the kube client supports), adds the
//! client-side rate limit (`kubeAPIQPS`/`kubeAPIBurst`), and checks the
//! connection with one request (`GET /api/v1/nodes/<node>`) so that a wrong
//! kubeconfig fails start-up with one [`ApiError`] saying what is wrong.
//!
//! [`connect_clients`] also returns a second client without the rate limit
//! for the node's heartbeats (status and lease), as upstream keeps those out
//! of the shared QPS budget so that a busy agent never looks dead.

pub mod bootstrap;
mod ratelimit;
mod request_metrics;
pub mod rotation;
mod transport;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use k8s_openapi::api::core::v1::Node;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Api, Client};

pub use ratelimit::{RateLimitLayer, RateLimited};

use gantry_config::Settings;

/// How long the start-up check waits for the API server.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// client-go's defaults when `kubeAPIQPS`/`kubeAPIBurst` are 0.
const CLIENT_DEFAULT_QPS: u32 = 5;
const CLIENT_DEFAULT_BURST: u32 = 10;

/// Why the API server cannot be used. Each message names the kubeconfig and,
/// once it is known, the server URL and the kubeconfig user.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// No `--kubeconfig` (standalone mode).
    #[error("no kubeconfig: cluster mode needs --kubeconfig")]
    NoKubeconfig,

    /// The kubeconfig file cannot be read.
    #[error("cannot read kubeconfig {} (given with --kubeconfig): {source}", path.display())]
    ReadKubeconfig { path: PathBuf, source: std::io::Error },

    /// The kubeconfig is malformed or refers to something unusable (missing
    /// context, certificate file, unparsable server URL, bad key, ...).
    #[error("kubeconfig {} (given with --kubeconfig) is not usable: {problem}", path.display())]
    InvalidKubeconfig {
        path: PathBuf,
        #[source]
        problem: KubeconfigProblem,
    },

    /// No connection to the server (refused, DNS, TLS, timeout).
    #[error("cannot reach the API server at {url} (server of kubeconfig {}): {problem}", kubeconfig.display())]
    Unreachable {
        url: String,
        kubeconfig: PathBuf,
        #[source]
        problem: ConnectProblem,
    },

    /// HTTP 401.
    #[error(
        "the API server rejected the node's credentials (expired or invalid): user {user:?} in kubeconfig {}, \
         server {url}: {message}",
        kubeconfig.display()
    )]
    Unauthorized { url: String, user: String, kubeconfig: PathBuf, message: String },

    /// HTTP 403.
    #[error(
        "the API server at {url} forbids the node's requests: user {user:?} in kubeconfig {} may not get Node {node:?} \
         ({message}); the node's credentials must be for system:node:{node} (group system:nodes), or be granted \
         access to it",
        kubeconfig.display()
    )]
    Forbidden { url: String, user: String, kubeconfig: PathBuf, node: String, message: String },

    /// Something answered, but not as a Kubernetes API server would.
    #[error(
        "the server at {url} (from kubeconfig {}) does not answer like a Kubernetes API server: {detail}; check the \
         server URL",
        kubeconfig.display()
    )]
    NotKubernetes { url: String, kubeconfig: PathBuf, detail: String },

    /// TLS bootstrap (`--bootstrap-kubeconfig`) could not get a client certificate.
    #[error(transparent)]
    Bootstrap(#[from] bootstrap::BootstrapError),

    /// Any other error status (5xx, 429, ...): the server is there but unwell. `reason` and
    /// `message` are the server's own (its `Status`).
    #[error("the API server at {url} failed the start-up check with HTTP {code} {reason}: {message}")]
    Server { url: String, code: u16, reason: String, message: String },
}

/// Why a kubeconfig (`--kubeconfig`, `--bootstrap-kubeconfig`) cannot be used. The kube
/// client's errors show their whole chain of causes, as they often say little on their own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeconfigProblem {
    /// Malformed, or a context, cluster, user or file it names is missing.
    #[error("{}", error_chain(.0))]
    Kubeconfig(#[source] KubeconfigError),
    /// A credential fails (bad token file, exec plugin, TLS material).
    #[error("{}", error_chain(.0))]
    Auth(#[source] kube::client::AuthError),
    /// The client cannot be built, or a request failed on a credential problem.
    #[error("{}", error_chain(.0))]
    Client(#[source] kube::Error),
    #[error(transparent)]
    V1Certificate(#[from] V1Certificate),
    #[error(transparent)]
    Key(#[from] rotation::KeyError),
    #[error("cannot read tokenFile {file}: {source}")]
    ReadTokenFile { file: String, source: std::io::Error },
    #[error("tokenFile {file} is empty")]
    EmptyTokenFile { file: String },
    #[error("no cluster in the current context")]
    NoCluster,
    #[error("certificate-authority-data is not base64-encoded PEM")]
    CertificateAuthorityData,
    #[error("cannot read certificate-authority {file}: {source}")]
    ReadCertificateAuthority { file: String, source: std::io::Error },
}

/// Why the API server could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectProblem {
    #[error("no answer within {}s", .0.as_secs())]
    NoAnswer(Duration),
    #[error("{}", error_chain(.0))]
    Transport(#[source] kube::Error),
}

impl ApiError {
    /// Whether retrying later may succeed without changing the configuration
    /// (server down or unwell), as opposed to a kubeconfig or credential
    /// problem.
    pub fn is_transient(&self) -> bool {
        matches!(self, ApiError::Unreachable { .. } | ApiError::Server { .. })
    }
}

/// The clients of one node agent.
#[derive(Clone)]
pub struct ApiClients {
    /// Rate-limited (`kubeAPIQPS`/`kubeAPIBurst`): pods, mirror pods, objects.
    pub client: Client,
    /// Rate-limited on its own (`eventRecordQPS`/`eventBurst`), as upstream's event client:
    /// the start-up burst's events do not hold up pod status writes.
    pub events: Client,
    /// Not rate-limited: node status and lease only.
    pub heartbeat: Client,
    /// The server URL, for messages.
    pub server: String,
    /// The kubeconfig user entry in use, for messages.
    pub user: String,
    /// The kubeconfig file.
    pub kubeconfig: PathBuf,
    /// The client certificate rotation loop, when `rotateCertificates` is on and the kubeconfig
    /// authenticates with a client certificate (the clients above then present the current one).
    pub rotation: Option<Arc<rotation::CertificateRotation>>,
}

/// Loads the kubeconfig, builds the rate-limited client and checks it
/// against the server.
/// Outside a node (tools, tests): the clients count their requests in a registry of their own.
pub async fn connect(settings: &Settings) -> Result<Client, ApiError> {
    Ok(connect_clients(settings).await?.client)
}

/// [`connect`], returning both clients.
pub async fn connect_clients(settings: &Settings) -> Result<ApiClients, ApiError> {
    let clients = build(settings, &Arc::default()).await?;
    check(&clients, &settings.node_name).await?;
    Ok(clients)
}

/// Builds the clients without contacting the server.
pub async fn build(settings: &Settings, metrics: &Arc<gantry_metrics::Metrics>) -> Result<ApiClients, ApiError> {
    let path = settings.kubeconfig.clone().ok_or(ApiError::NoKubeconfig)?;
    let kubeconfig = Kubeconfig::read_from(&path).map_err(|e| kubeconfig_error(&path, e))?;
    let user = current_user(&kubeconfig);
    if let Ok(pem) = bootstrap::kubeconfig_client_cert(&path) {
        reject_v1_certificate(&pem)
            .map_err(|e| ApiError::InvalidKubeconfig { path: path.clone(), problem: e.into() })?;
    }
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| kubeconfig_error(&path, e))?;
    trim_token_file(&mut config, &path)?;
    let server = config.cluster_url.to_string().trim_end_matches('/').to_string();
    let invalid =
        |e: kube::Error| ApiError::InvalidKubeconfig { path: path.clone(), problem: KubeconfigProblem::Client(e) };

    let (qps, burst) = effective_rate(settings.kube_api_qps, settings.kube_api_burst);
    let host = config.cluster_url.authority().map(|a| a.to_string()).unwrap_or_default();
    let counted = request_metrics::RequestMetricsLayer::new(host, metrics.clone());
    let rotating = match (settings.rotate_certificates, client_identity(&config)) {
        (true, Some(identity)) => {
            let cert_dir = settings.server.cert_dir(&settings.root_dir);
            let current = rotation::CurrentCert::client(&cert_dir, Some(&identity))
                .map_err(|e| ApiError::InvalidKubeconfig { path: path.clone(), problem: e.into() })?;
            Some(Arc::new(current))
        }
        (true, None) => {
            tracing::info!(
                kubeconfig = %path.display(), user = %user,
                "rotateCertificates is on, but the kubeconfig authenticates without a client certificate (token or exec \
                 plugin): no client certificate rotation"
            );
            None
        }
        (false, _) => None,
    };
    // One set of connections for the three clients (see `transport`).
    let (client, heartbeat, events) = match &rotating {
        Some(current) => {
            let inner = connector(&config, Some(current)).map_err(invalid)?;
            let connector = rotation::TrackingConnector { inner, cert: current.clone() };
            let lanes = transport::Lanes::new(connector);
            (stack(&config, lanes.clone()), stack(&config, lanes.clone()), stack(&config, lanes))
        }
        None => {
            let lanes = transport::Lanes::new(connector(&config, None).map_err(invalid)?);
            (stack(&config, lanes.clone()), stack(&config, lanes.clone()), stack(&config, lanes))
        }
    };
    let limited = |builder: kube::client::ClientBuilder<_>, (qps, burst): (Option<u32>, u32)| match qps {
        Some(qps) => builder.with_layer(&RateLimitLayer::new(qps, burst)).build(),
        None => builder.build(),
    };
    let client = limited(client.map_err(invalid)?.with_layer(&counted), (qps, burst));
    let event_rate = effective_rate(settings.event_record_qps, settings.event_burst);
    let events = limited(events.map_err(invalid)?.with_layer(&counted), event_rate);
    let heartbeat = heartbeat.map_err(invalid)?.with_layer(&counted).build();
    let rotation = rotating.map(|cert| rotation::CertificateRotation {
        client: heartbeat.clone(),
        cert,
        cert_dir: settings.server.cert_dir(&settings.root_dir),
        bootstrap: settings.bootstrap_kubeconfig.clone(),
        node: settings.node_name.clone(),
        purpose: rotation::Purpose::Client,
    });
    Ok(ApiClients { client, heartbeat, events, server, user, kubeconfig: path, rotation: rotation.map(Arc::new) })
}

/// The kubeconfig user's client certificate and key (PEM), if it authenticates with one.
fn client_identity(config: &kube::Config) -> Option<Vec<u8>> {
    use secrecy::ExposeSecret;
    let auth = &config.auth_info;
    let read = |data: Option<&str>, file: &Option<String>| -> Option<Vec<u8>> {
        match (data, file) {
            (Some(d), _) => base64::Engine::decode(&base64::engine::general_purpose::STANDARD, d.trim()).ok(),
            (None, Some(f)) => std::fs::read(f).ok(),
            (None, None) => None,
        }
    };
    let mut pem = read(auth.client_certificate_data.as_deref(), &auth.client_certificate)?;
    let key = read(auth.client_key_data.as_ref().map(|k| k.expose_secret()), &auth.client_key)?;
    pem.push(b'\n');
    pem.extend(key);
    Some(pem)
}

/// The TLS connector to the server: the kubeconfig's CA, server name and client certificate
/// (read at each new connection from `current` when it rotates, so that a rotated certificate
/// is used without a restart), ALPN offering `h2` then `http/1.1`, and its timeouts.
fn connector(
    config: &kube::Config,
    current: Option<&Arc<rotation::CurrentCert>>,
) -> Result<hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<HttpConnector>>, kube::Error> {
    use kube::client::ConfigExt;

    let mut tls = config.rustls_client_config()?;
    if let Some(current) = current {
        tls.client_auth_cert_resolver = current.clone();
        // A resumed session would keep the old certificate's identity.
        tls.resumption = rustls::client::Resumption::disabled();
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
    let https = match &config.tls_server_name {
        Some(name) => {
            let name = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|e| kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e)))?;
            https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => https,
    };
    let mut timeouts = hyper_timeout::TimeoutConnector::new(https.enable_all_versions().wrap_connector(http));
    timeouts.set_connect_timeout(config.connect_timeout);
    timeouts.set_read_timeout(config.read_timeout);
    timeouts.set_write_timeout(config.write_timeout);
    timeouts.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(timeouts)
}

/// kube's default client stack over `lanes` (as `ClientBuilder::try_from(Config)`: base URI,
/// retries of 429/503/504, auth with token refresh and exec plugins, extra headers).
fn stack<C>(config: &kube::Config, lanes: transport::Lanes<C>) -> Result<ClientBuilder<GenericService>, kube::Error>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    use http_body_util::BodyExt;
    use kube::client::ConfigExt;
    use tower::{BoxError, ServiceBuilder, ServiceExt};

    let retry =
        config.default_retry.then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(lanes)
        .map_response(|r| r.map(|body| Box::new(body.map_err(BoxError::from)) as Box<kube::client::DynBody>))
        .boxed_clone();
    Ok(ClientBuilder::new(service, config.default_namespace.clone()))
}

/// kube's boxed client service, as `ClientBuilder::try_from(Config)` builds it but cloneable:
/// the rate limit sends a request that waits for its token through a clone.
type GenericService = tower::util::BoxCloneService<
    http::Request<kube::client::Body>,
    http::Response<Box<kube::client::DynBody>>,
    tower::BoxError,
>;

/// A client certificate rustls cannot present (`version` is the X.509 version, 1 or 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the client certificate (subject {subject}) is an X.509 v{version} certificate, which Gantry's TLS library (rustls) \
     cannot use: reissue it as X.509 v3 (e.g. with openssl's -extfile giving extendedKeyUsage=clientAuth), or let \
     Gantry get one with --bootstrap-kubeconfig"
)]
pub struct V1Certificate {
    subject: String,
    version: u32,
}

/// rustls (through webpki) only takes X.509 v3 certificates; without this check a v1 client
/// certificate (as `openssl x509 -req` makes without an extensions file) fails with
/// "invalid peer certificate: UnsupportedCertVersion".
pub(crate) fn reject_v1_certificate(pem: &[u8]) -> Result<(), V1Certificate> {
    let Some(Ok(block)) = x509_parser::pem::Pem::iter_from_buffer(pem).next() else { return Ok(()) };
    let Ok(cert) = block.parse_x509() else { return Ok(()) };
    if cert.version() == x509_parser::x509::X509Version::V3 {
        return Ok(());
    }
    Err(V1Certificate { subject: cert.subject().to_string(), version: cert.version().0 + 1 })
}

/// client-go trims the whitespace around a `tokenFile`'s token (files
/// written with `echo` end with a newline); kube sends it as is, which is
/// not a valid header. Such a token is read here, trimmed, and used inline
/// (so it is not re-read when the file changes; token files without
/// surrounding whitespace, such as projected service account tokens, keep
/// kube's periodic re-reading).
fn trim_token_file(config: &mut kube::Config, kubeconfig: &Path) -> Result<(), ApiError> {
    let auth = &mut config.auth_info;
    let Some(file) = auth.token_file.clone().filter(|_| auth.token.is_none()) else {
        return Ok(());
    };
    let raw = std::fs::read_to_string(&file).map_err(|source| ApiError::InvalidKubeconfig {
        path: kubeconfig.to_path_buf(),
        problem: KubeconfigProblem::ReadTokenFile { file: file.clone(), source },
    })?;
    let token = raw.trim();
    if token.is_empty() {
        return Err(ApiError::InvalidKubeconfig {
            path: kubeconfig.to_path_buf(),
            problem: KubeconfigProblem::EmptyTokenFile { file },
        });
    }
    if token.len() != raw.len() {
        auth.token = Some(secrecy::SecretString::from(token.to_string()));
        auth.token_file = None;
    }
    Ok(())
}

/// The token bucket for `kubeAPIQPS`/`kubeAPIBurst` (and `eventRecordQPS`/`eventBurst`) as
/// client-go applies them: 0 means the client defaults (5/10); `None` = no limit.
pub fn effective_rate(qps: i32, burst: i32) -> (Option<u32>, u32) {
    let qps = if qps == 0 { CLIENT_DEFAULT_QPS as i32 } else { qps };
    let burst = if burst <= 0 { CLIENT_DEFAULT_BURST } else { burst as u32 };
    (u32::try_from(qps).ok().filter(|q| *q > 0), burst)
}

/// One request that needs working credentials: reading our own Node
/// (`404 NotFound` is fine: the node may not be registered yet).
pub async fn check(clients: &ApiClients, node: &str) -> Result<(), ApiError> {
    let nodes: Api<Node> = Api::all(clients.heartbeat.clone());
    let ctx = CheckContext {
        url: clients.server.clone(),
        user: clients.user.clone(),
        kubeconfig: clients.kubeconfig.clone(),
        node: node.to_string(),
    };
    match tokio::time::timeout(CHECK_TIMEOUT, nodes.get(node)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => classify(e, &ctx).map_or(Ok(()), Err),
        Err(_) => Err(ApiError::Unreachable {
            url: ctx.url,
            kubeconfig: ctx.kubeconfig,
            problem: ConnectProblem::NoAnswer(CHECK_TIMEOUT),
        }),
    }
}

/// What the start-up check needs to explain an error.
#[derive(Clone, Debug)]
pub struct CheckContext {
    pub url: String,
    pub user: String,
    pub kubeconfig: PathBuf,
    pub node: String,
}

/// Turns the start-up check's error into an [`ApiError`]; `None` when the
/// answer proves the server works (our Node is simply not there yet).
pub fn classify(err: kube::Error, ctx: &CheckContext) -> Option<ApiError> {
    let url = ctx.url.clone();
    let kubeconfig = ctx.kubeconfig.clone();
    match err {
        kube::Error::Api(status) => {
            let message = if status.message.is_empty() { status.reason.clone() } else { status.message.clone() };
            match status.code {
                404 if status.reason == "NotFound" => None,
                401 => Some(ApiError::Unauthorized { url, user: ctx.user.clone(), kubeconfig, message }),
                403 => Some(ApiError::Forbidden {
                    url,
                    user: ctx.user.clone(),
                    kubeconfig,
                    node: ctx.node.clone(),
                    message,
                }),
                code if code >= 500 || code == 429 => {
                    Some(ApiError::Server { url, code, reason: status.reason.clone(), message })
                }
                code => Some(ApiError::NotKubernetes {
                    url,
                    kubeconfig,
                    detail: format!(
                        "GET /api/v1/nodes/{} returned HTTP {code}: {}",
                        ctx.node,
                        truncate(&status.message, 200)
                    ),
                }),
            }
        }
        kube::Error::SerdeError(e) => Some(ApiError::NotKubernetes {
            url,
            kubeconfig,
            detail: format!("GET /api/v1/nodes/{} did not return a Node ({e})", ctx.node),
        }),
        kube::Error::Auth(e) => {
            Some(ApiError::InvalidKubeconfig { path: kubeconfig, problem: KubeconfigProblem::Auth(e) })
        }
        kube::Error::InferKubeconfig(e) => {
            Some(ApiError::InvalidKubeconfig { path: kubeconfig, problem: KubeconfigProblem::Kubeconfig(e) })
        }
        other if auth_error(&other).is_some() => {
            Some(ApiError::InvalidKubeconfig { path: kubeconfig, problem: KubeconfigProblem::Client(other) })
        }
        other => Some(ApiError::Unreachable { url, kubeconfig, problem: ConnectProblem::Transport(other) }),
    }
}

/// A credential problem found while sending (bad token file, exec plugin
/// failure, ...), wrapped in a service error.
fn auth_error(e: &kube::Error) -> Option<&kube::client::AuthError> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(auth) = s.downcast_ref::<kube::client::AuthError>() {
            return Some(auth);
        }
        source = s.source();
    }
    None
}

fn kubeconfig_error(path: &Path, e: KubeconfigError) -> ApiError {
    match e {
        KubeconfigError::ReadConfig(io, _) => ApiError::ReadKubeconfig { path: path.to_path_buf(), source: io },
        other => {
            ApiError::InvalidKubeconfig { path: path.to_path_buf(), problem: KubeconfigProblem::Kubeconfig(other) }
        }
    }
}

/// The user entry of the current context ("" if none).
fn current_user(kubeconfig: &Kubeconfig) -> String {
    let Some(current) = &kubeconfig.current_context else {
        return String::new();
    };
    kubeconfig
        .contexts
        .iter()
        .find(|c| &c.name == current)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone())
        .unwrap_or_default()
}

/// "outer: inner: root", without repeating a message its cause already says.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let msg = s.to_string();
        if !parts.last().is_some_and(|p| p.contains(&msg)) {
            parts.push(msg);
        }
        source = s.source();
    }
    parts.join(": ")
}

fn truncate(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests;
