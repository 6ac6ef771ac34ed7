//! An in-process stand-in for kube-apiserver, for Gantry's tests.
//!
//! It serves the Kubernetes REST API over HTTPS on 127.0.0.1 with the semantics clients rely
//! on — resourceVersions and optimistic concurrency, watches with history and 410 Gone,
//! selectors, status subresources, graceful pod deletion, finalizers, the three patch
//! flavours, evictions with PodDisruptionBudgets, CRDs, the Node authorizer and
//! NodeRestriction — so the same end-to-end tests can run against it or a real cluster.
//!
//! ```no_run
//! # async fn demo() {
//! use gantry_test_apiserver::{TestApiServer, User};
//! let server = TestApiServer::start().await;
//! let client = server.client(&User::Admin).await;
//! let node_kubeconfig = server.kubeconfig(std::path::Path::new("/tmp/k"), &User::Node("n1".into()));
//! # }
//! ```
//!
//! Known differences from a real server are listed in the crate README-like section of
//! `TestApiServer`'s documentation.

mod accounting;
mod auth;
mod bootstrap_tokens;
mod csr;
mod discovery;
mod eviction;
mod faults;
mod handlers;
mod kinds;
mod kubeconfig;
mod meta;
mod ops;
mod patch;
mod pdb;
mod pki;
mod pods;
mod resize;
mod resources;
mod reviews;
mod routes;
pub mod selectors;
mod server;
mod state;
mod status;
mod storage_workloads;
mod store;
mod tokens;
mod watch;

pub use accounting::{ClientConnection, OpenWatch, RequestCounts, RequestKey};
pub use eviction::EvictionRecord;
pub use faults::{Failure, Fault, Faults};
pub use server::HTTP2_MAX_STREAMS;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::kubeconfig::Credentials;
use crate::server::Serving;
use crate::state::State;
use crate::store::{Store, StoreInner};

/// A user to connect as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum User {
    /// `kubernetes-admin` in `system:masters` (bearer token).
    Admin,
    /// `system:node:<name>` in `system:nodes` (bearer token).
    Node(String),
    /// Any bearer token; authenticated if the server knows it (see
    /// [`TestApiServer::add_token`], [`TestApiServer::set_token_review`]), else 401.
    Token(String),
    /// A client certificate signed by the server's CA: CN = user, one O = per group (at
    /// most two groups).
    ClientCert { cn: String, groups: Vec<String> },
    /// A service account token that expired an hour ago (always 401).
    ExpiredToken,
}

/// An authenticated identity, as in `authentication.k8s.io/v1` UserInfo.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The attributes of a request (or a SubjectAccessReview) being authorized.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRequest {
    pub user: UserInfo,
    /// get, list, watch, create, update, patch, delete, deletecollection (or the lowercased
    /// HTTP method for non-resource paths).
    pub verb: String,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    /// The object name; for list/watch with `fieldSelector=metadata.name=X`, X.
    pub name: String,
    /// Set for non-resource requests (`/healthz`, `/api`, ...).
    pub path: Option<String>,
}

/// An authorizer's answer. Reasons end up in Forbidden messages and SAR statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny(String),
    NoOpinion(String),
}

/// The server. Dropping it stops serving.
///
/// # Differences from kube-apiserver
/// * No controllers besides PDB status, namespace cleanup, default service accounts,
///   kube-root-ca.crt and kube-controller-manager's CSR approver and signer (node client
///   certificates from bootstrappers and nodes are auto-approved; approved kubelet client,
///   kubelet serving and kube-apiserver-client requests are signed with the cluster CA for
///   [`set_signing_duration`](Self::set_signing_duration)): no garbage collector (ownerReferences and `propagationPolicy` have no
///   effect), no scheduler, no workload controllers, no endpoints controller.
/// * Server-side apply merges the applied configuration (strategic merge for built-ins,
///   JSON merge for custom resources); field ownership, conflicts and removal of fields a
///   manager stopped applying are not implemented; `managedFields` is never populated.
/// * No schema validation or pruning (including CRD OpenAPI schemas), no defaulting beyond
///   the common pod/service/workload defaults, no admission webhooks, no RBAC objects:
///   authorization is system:masters, the Node authorizer, kubeadm's CSR bindings (group
///   `system:bootstrappers:kubeadm:default-node-token` may create and read CSRs and have node
///   client CSRs approved; `system:nodes` may have its own renewals approved), then
///   [`set_authorizer`](Self::set_authorizer).
/// * Bootstrap tokens (`bootstrap-token-<id>` Secrets in kube-system) authenticate as
///   kube-apiserver's `--enable-bootstrap-token-auth`; nothing deletes expired ones.
/// * core/v1 and events.k8s.io/v1 Events are stored separately (no conversion).
/// * Custom resource versions are served with `conversion: None` semantics.
/// * Service account tokens are HS256 JWTs (upstream: RS256/ES256); TokenRequest does not
///   cap the expiration of pod-bound tokens.
/// * JSON (and YAML request bodies) only: no protobuf, no Table output.
pub struct TestApiServer {
    state: Arc<State>,
    port: u16,
    serving: Option<Serving>,
    life: CancellationToken,
}

impl TestApiServer {
    /// Starts serving HTTPS on 127.0.0.1 at a random port, with fresh certificates, the
    /// namespaces default, kube-system, kube-public and kube-node-lease, and the
    /// `kubernetes` service.
    pub async fn start() -> TestApiServer {
        let pki = pki::Pki::generate();
        let mut inner = StoreInner::new(resources::Registry::with_builtins(), store::DEFAULT_HISTORY);
        inner.ca_pem = pki.ca_pem.clone();
        let listener = server::bind(0).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        for ns in kinds::INITIAL_NAMESPACES {
            kinds::bootstrap_namespace(&mut inner, ns);
        }
        kinds::bootstrap_kubernetes_service(&mut inner, port);
        let state = Arc::new(State::new(Store::new(inner), pki, tokens::Tokens::generate()));
        let life = CancellationToken::new();
        tokio::spawn(pdb_expiry_loop(state.clone(), life.clone()));
        tokio::spawn(csr_controller_loop(state.clone(), life.clone()));
        let serving = Serving::start(state.clone(), listener, state.epoch());
        tracing::info!(port, "test apiserver listening");
        TestApiServer { state, port, serving: Some(serving), life }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA certificate (PEM) that signed the serving and client certificates.
    pub fn ca_pem(&self) -> &str {
        &self.state.pki.ca_pem
    }

    /// The admin bearer token.
    pub fn admin_token(&self) -> &str {
        &self.state.tokens.admin_token
    }

    /// The bearer token of `system:node:<node>`.
    pub fn node_token(&self, node: &str) -> String {
        self.state.tokens.node_token(node)
    }

    /// Writes a kubeconfig for `user` (CA data and credentials embedded) into `dir` and
    /// returns its path.
    pub fn kubeconfig(&self, dir: &Path, user: &User) -> PathBuf {
        let (label, creds) = self.credentials(user);
        let contents = kubeconfig::render(&self.url(), self.ca_pem(), &label, &creds);
        kubeconfig::write(dir, &format!("{}.kubeconfig", kubeconfig::file_stem(&label)), &contents)
    }

    /// Like [`kubeconfig`](Self::kubeconfig), but a token user's token is written to a file
    /// next to it and referenced with `tokenFile` (certificate users are written as usual).
    pub fn kubeconfig_with_token_file(&self, dir: &Path, user: &User) -> PathBuf {
        let (label, creds) = self.credentials(user);
        let stem = kubeconfig::file_stem(&label);
        let creds = match creds {
            Credentials::Token(t) => Credentials::TokenFile(kubeconfig::write(dir, &format!("{stem}.token"), &t)),
            other => other,
        };
        let contents = kubeconfig::render(&self.url(), self.ca_pem(), &label, &creds);
        kubeconfig::write(dir, &format!("{stem}-tokenfile.kubeconfig"), &contents)
    }

    /// A kube-rs client for `user`, with kube's defaults (note: kube 5 clients retry 429,
    /// 503 and 504 with backoff for minutes; use [`config`](Self::config) with
    /// `default_retry = false` to see a 429 from an eviction at once).
    pub async fn client(&self, user: &User) -> kube::Client {
        kube::Client::try_from(self.config(user).await).expect("client builds")
    }

    /// The kube-rs configuration for `user`, to adjust before building a client.
    pub async fn config(&self, user: &User) -> kube::Config {
        let (label, creds) = self.credentials(user);
        let yaml = kubeconfig::render(&self.url(), self.ca_pem(), &label, &creds);
        let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("valid kubeconfig");
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kubeconfig loads")
    }

    fn credentials(&self, user: &User) -> (String, Credentials) {
        match user {
            User::Admin => ("admin".into(), Credentials::Token(self.state.tokens.admin_token.clone())),
            User::Node(n) => (format!("node-{n}"), Credentials::Token(self.state.tokens.node_token(n))),
            User::Token(t) => {
                let tag: String = t.chars().filter(char::is_ascii_alphanumeric).take(12).collect();
                (format!("token-{tag}"), Credentials::Token(t.clone()))
            }
            User::ClientCert { cn, groups } => {
                let (cert_pem, key_pem) = self.state.pki.client_cert(cn, groups);
                (format!("cert-{cn}"), Credentials::Certificate { cert_pem, key_pem })
            }
            User::ExpiredToken => ("expired".into(), Credentials::Token(self.expired_token())),
        }
    }

    fn expired_token(&self) -> String {
        let past = jiff::Timestamp::now().as_second() - 3600;
        self.state.tokens.sign_jwt(&json!({
            "aud": [tokens::API_AUDIENCE], "exp": past, "iat": past - 3600, "nbf": past - 3600,
            "iss": tokens::API_AUDIENCE, "sub": "system:serviceaccount:default:default",
            "kubernetes.io": {"namespace": "default", "serviceaccount": {"name": "default", "uid": ""}},
        }))
    }

    /// Registers a static bearer token for `user` (like a token file on a real server).
    pub fn add_token(&self, token: &str, user: UserInfo) {
        self.state.tokens.register(token, user);
    }

    /// Stops serving: the listener closes (connections are refused) and open connections,
    /// watches included, are closed. The data is kept.
    pub async fn stop(&mut self) {
        if let Some(serving) = self.serving.take() {
            self.state.cancel_epoch();
            serving.shutdown().await;
            tracing::info!(port = self.port, "test apiserver stopped");
        }
    }

    /// Serves again on the same port with the same data (stopping first if serving).
    pub async fn restart(&mut self) {
        self.stop().await;
        let listener = bind_with_retry(self.port).await;
        let epoch = self.state.next_epoch();
        self.serving = Some(Serving::start(self.state.clone(), listener, epoch));
        tracing::info!(port = self.port, "test apiserver restarted");
    }

    /// Drops the watch history: watches and `resourceVersionMatch=Exact` lists from any
    /// older resourceVersion now get 410 Gone/Expired.
    pub fn compact(&self) {
        self.state.store.lock().compact();
    }

    /// Every pods/eviction request so far, in arrival order, with its answer.
    pub fn evictions(&self) -> Vec<EvictionRecord> {
        self.state.store.lock().evictions.clone()
    }

    /// Every resource request so far (authorized or not), by verb, resource (with
    /// subresource) and object, as the server counted them.
    pub fn requests(&self) -> RequestCounts {
        self.state.accounting.requests()
    }

    /// The fault switch: failures, hangs, delays and dropped watches on command.
    pub fn faults(&self) -> &Faults {
        &self.state.faults
    }

    /// The watches being served now.
    pub fn open_watches(&self) -> Vec<OpenWatch> {
        self.state.accounting.open_watches()
    }

    /// Every client connection accepted so far, with the users whose requests it carried.
    pub fn connections(&self) -> Vec<ClientConnection> {
        self.state.accounting.connections()
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.store.lock().current_rv()
    }

    /// Sets how bearer tokens unknown to the server are authenticated, for API requests and
    /// TokenReviews: `hook(token, audiences)` returns the user, or None for 401 /
    /// `authenticated: false`. Built-in tokens (admin, nodes, service accounts, added
    /// tokens) are recognised first.
    pub fn set_token_review(&self, hook: impl Fn(&str, &[String]) -> Option<UserInfo> + Send + Sync + 'static) {
        self.state.hooks.write().unwrap_or_else(|p| p.into_inner()).token_review = Some(Arc::new(hook));
    }

    /// Sets the lifetime of the certificates the in-process signer issues (kube-controller-
    /// manager's `--cluster-signing-duration`, default one year); short lifetimes make
    /// rotation testable in seconds.
    pub fn set_signing_duration(&self, ttl: Duration) {
        self.state.set_signing_duration(ttl);
    }

    /// Sets the authorizer consulted after system:masters and the Node authorizer, for API
    /// requests and SubjectAccessReviews alike. Without one, everything else is denied.
    pub fn set_authorizer(&self, hook: impl Fn(&AccessRequest) -> Decision + Send + Sync + 'static) {
        self.state.hooks.write().unwrap_or_else(|p| p.into_inner()).authorizer = Some(Arc::new(hook));
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.life.cancel();
        self.state.cancel_epoch();
        if let Some(serving) = &self.serving {
            serving.abort();
        }
    }
}

async fn bind_with_retry(port: u16) -> tokio::net::TcpListener {
    let mut last = None;
    for _ in 0..50 {
        match server::bind(port) {
            Ok(l) => return l,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("rebinding 127.0.0.1:{port}: {last:?}");
}

/// kube-controller-manager's csrapproving and csrsigning controllers: a pass over the
/// requests after every change.
async fn csr_controller_loop(state: Arc<State>, life: CancellationToken) {
    let mut changes = state.store.subscribe();
    loop {
        csr::reconcile(&state);
        tokio::select! {
            _ = life.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

/// The disruption controller's recheck: PDB statuses whose disruptedPods entries time out.
async fn pdb_expiry_loop(state: Arc<State>, life: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = life.cancelled() => return,
            _ = tick.tick() => {
                let mut inner = state.store.lock();
                for ns in pdb::namespaces_with_expired_disruptions(&inner) {
                    pdb::sync_namespace(&mut inner, &ns);
                }
            }
        }
    }
}
