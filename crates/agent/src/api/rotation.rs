//! Certificate rotation, as upstream's client-go certificate manager and kubelet `certificate`
//! package, for the two certificates the kubelet gets from the API server ([`Purpose`]):
//! - the client certificate (`rotateCertificates`): every new TLS connection to the API server
//!   presents the certificate that `<cert-dir>/kubelet-client-current.pem` holds at that moment
//!   ([`CurrentCert`] as a rustls client certificate resolver), falling back to the
//!   kubeconfig's own certificate while that file does not exist; when the certificate changes,
//!   the connections made before are closed (as upstream's `CloseAll`), so that requests and
//!   watches reconnect with it;
//! - the serving certificate of the node API (`serverTLSBootstrap`): every TLS handshake on the
//!   secure port is answered with `<cert-dir>/kubelet-server-current.pem` ([`CurrentCert`] as a
//!   rustls server certificate resolver); while there is none, or it has expired, the handshake
//!   fails, as upstream's `GetCertificate` returning no certificate. Its names are the node's
//!   addresses as last reported in the node status ([`serving_names`]).
//!
//! [`CertificateRotation::run`] requests a new certificate at a jittered 70–90% of the current
//! one's lifetime ([`next_rotation_deadline`]), at once when there is none or (serving) when it
//! no longer covers the node's addresses, through a CertificateSigningRequest made with the
//! node's identity, or with the bootstrap kubeconfig once the client certificate has expired.
//! The new certificate is written next to the old one and the symlink moved (the old file is
//! kept). Failures are retried with backoff and logged; they never end the loop.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use hyper_util::client::legacy::connect::{Connected, Connection};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::api::core::v1::NodeAddress;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rcgen::KeyPair;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

use super::bootstrap::{self, BootstrapError, CLIENT_FILE_PREFIX, CLIENT_USAGES, CertNames, KUBELET_CLIENT_SIGNER};

/// The signer of kubelet serving certificates.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The usages of a kubelet serving certificate with an ECDSA key (upstream adds key
/// encipherment for RSA keys only).
pub const SERVING_USAGES: &[&str] = &["digital signature", "server auth"];
/// The prefix of the serving certificate files in `--cert-dir`.
pub const SERVING_FILE_PREFIX: &str = "kubelet-server";

/// Which certificate a rotation keeps current.
#[derive(Debug)]
pub enum Purpose {
    /// The client certificate the node authenticates to the API server with.
    Client,
    /// The node API's serving certificate, for the node's addresses as last reported.
    Serving { addresses: watch::Receiver<Vec<NodeAddress>> },
}

impl Purpose {
    fn signer(&self) -> &'static str {
        match self {
            Purpose::Client => KUBELET_CLIENT_SIGNER,
            Purpose::Serving { .. } => KUBELET_SERVING_SIGNER,
        }
    }

    fn usages(&self) -> &'static [&'static str] {
        match self {
            Purpose::Client => CLIENT_USAGES,
            Purpose::Serving { .. } => SERVING_USAGES,
        }
    }

    fn file_prefix(&self) -> &'static str {
        match self {
            Purpose::Client => CLIENT_FILE_PREFIX,
            Purpose::Serving { .. } => SERVING_FILE_PREFIX,
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Purpose::Client => "client",
            Purpose::Serving { .. } => "serving",
        }
    }
}

/// Why one rotation attempt failed (it is retried).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RotationError {
    #[error("cannot make a key or certificate request for the new {what} certificate: cannot generate a key: {source}")]
    GenerateKey { what: &'static str, source: rcgen::Error },

    #[error("cannot make a key or certificate request for the new {what} certificate: cannot make a request: {source}")]
    CertificateRequest { what: &'static str, source: rcgen::Error },

    #[error(
        "cannot create a certificate signing request for the {what} certificate with the node's own credentials: \
         {}",
        super::error_chain(source)
    )]
    Create { what: &'static str, source: kube::Error },

    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
}

/// How long a rotation waits for its CSR to be issued (client-go's `certificateWaitTimeout`).
pub const ROTATION_WAIT_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The first retry after a failed rotation; doubled up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(2);
const MAX_RETRY: Duration = Duration::from_secs(5 * 60);

/// When to request the next certificate (pure): `not_before` plus 70% to 90% of the lifetime,
/// `jitter` (in `[0, 1)`) choosing where, as upstream's `nextRotationDeadline` and
/// `jitteryDuration`, so that nodes given certificates together do not all renew together.
pub fn next_rotation_deadline(not_before: i64, not_after: i64, jitter: f64) -> i64 {
    let total = (not_after - not_before).max(0) as f64;
    not_before + (total * (0.7 + 0.2 * jitter.clamp(0.0, 1.0))).round() as i64
}

/// The delay before retry number `failures` (1, 2, ...): 2s doubling, at most 5 minutes.
pub fn retry_delay(failures: u32) -> Duration {
    FIRST_RETRY.saturating_mul(2u32.saturating_pow(failures.saturating_sub(1))).min(MAX_RETRY)
}

/// Upstream's serving certificate names (`addressesToHostnamesAndIPs`, pure): Hostname,
/// InternalDNS and ExternalDNS addresses as DNS names (a Hostname that is an IP as an IP),
/// InternalIP and ExternalIP as IPs, without duplicates, sorted. `None` while the node has no
/// IP: upstream requests no serving certificate without one.
pub fn serving_names(addresses: &[NodeAddress]) -> Option<CertNames> {
    let mut names = CertNames::default();
    for a in addresses.iter().filter(|a| !a.address.is_empty()) {
        let ip = a.address.parse::<IpAddr>().ok();
        match (a.type_.as_str(), ip) {
            ("Hostname" | "InternalIP" | "ExternalIP", Some(ip)) => names.ips.push(ip),
            ("Hostname" | "InternalDNS" | "ExternalDNS", None) => names.dns.push(a.address.clone()),
            _ => {}
        }
    }
    names.dns.sort();
    names.dns.dedup();
    // Upstream sorts the IPs by their text.
    names.ips.sort_by_key(|ip| ip.to_string());
    names.ips.dedup();
    (!names.ips.is_empty()).then_some(names)
}

/// The certificate new connections present: `<cert-dir>/<prefix>-current.pem`, re-read when
/// the symlink or the file changes, else the fallback (the kubeconfig's client certificate, or
/// `tlsCertFile` for serving, as upstream's file store).
#[derive(Debug)]
pub struct CurrentCert {
    current: PathBuf,
    what: &'static str,
    fallback: Option<Arc<CertifiedKey>>,
    state: Mutex<Loaded>,
    /// Bumped when the certificate changes; client connections made before close.
    generation: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Loaded {
    /// The file's identity when it was read: its target and modification time.
    stamp: Option<(PathBuf, SystemTime)>,
    key: Option<Arc<CertifiedKey>>,
}

impl CurrentCert {
    /// The client certificate; `fallback_pem` is the kubeconfig's certificate and key (PEM).
    pub fn client(cert_dir: &Path, fallback_pem: Option<&[u8]>) -> Result<CurrentCert, KeyError> {
        CurrentCert::new(cert_dir.join(bootstrap::CURRENT_PEM_FILE), "client", fallback_pem)
    }

    /// The serving certificate; `fallback_pem` is `tlsCertFile` and `tlsPrivateKeyFile` (PEM).
    pub fn serving(cert_dir: &Path, fallback_pem: Option<&[u8]>) -> Result<CurrentCert, KeyError> {
        CurrentCert::new(cert_dir.join(format!("{SERVING_FILE_PREFIX}-current.pem")), "serving", fallback_pem)
    }

    fn new(current: PathBuf, what: &'static str, fallback_pem: Option<&[u8]>) -> Result<CurrentCert, KeyError> {
        let fallback = fallback_pem.map(certified_key).transpose()?.map(Arc::new);
        let this =
            CurrentCert { current, what, fallback, state: Default::default(), generation: watch::Sender::new(0) };
        this.key();
        Ok(this)
    }

    /// The certificate and key to present now, re-reading the current file if it changed.
    pub fn key(&self) -> Option<Arc<CertifiedKey>> {
        let mut state = self.state.lock().expect("never poisoned: no panics while held");
        let stamp = std::fs::canonicalize(&self.current)
            .ok()
            .and_then(|target| Some((target.clone(), std::fs::metadata(&target).ok()?.modified().ok()?)));
        if stamp.is_some() && stamp != state.stamp {
            // Recorded either way: a bad file is reported once, not at every connection.
            state.stamp.clone_from(&stamp);
            match std::fs::read(&self.current).map_err(KeyError::from).and_then(|pem| certified_key(&pem)) {
                Ok(key) => {
                    if state.key.is_some() {
                        tracing::info!(cert = %self.current.display(), "the {} certificate changed; new connections use it", self.what);
                    }
                    // Connections made with the previous certificate close (upstream closes
                    // them too), so that its expiry cannot strand the node.
                    self.generation.send_modify(|g| *g += 1);
                    state.key = Some(Arc::new(key));
                }
                Err(e) => tracing::warn!(
                    cert = %self.current.display(), error = %e,
                    "cannot use the current {} certificate; keeping the previous one", self.what
                ),
            }
        }
        state.key.clone().or_else(|| self.fallback.clone())
    }

    /// The leaf certificate's validity (Unix seconds) and names, for the rotation deadline.
    fn leaf(&self) -> Option<Leaf> {
        leaf(self.key()?.as_ref())
    }
}

/// What the rotation needs to know of a certificate.
#[derive(Debug, PartialEq, Eq)]
struct Leaf {
    not_before: i64,
    not_after: i64,
    names: CertNames,
}

fn leaf(key: &CertifiedKey) -> Option<Leaf> {
    let (_, cert) = x509_parser::parse_x509_certificate(key.cert.first()?.as_ref()).ok()?;
    let mut names = CertNames::default();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(d) => names.dns.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                        _ => None,
                    };
                    names.ips.extend(ip);
                }
                _ => {}
            }
        }
    }
    let v = cert.validity();
    Some(Leaf { not_before: v.not_before.timestamp(), not_after: v.not_after.timestamp(), names })
}

/// Upstream's `certSatisfiesTemplate` for the names (pure): the certificate covers every name
/// wanted (extra names are fine).
fn covers(have: &CertNames, want: &CertNames) -> bool {
    want.dns.iter().all(|d| have.dns.contains(d)) && want.ips.iter().all(|ip| have.ips.contains(ip))
}

impl ResolvesClientCert for CurrentCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.key()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The secure port's certificate: none (the handshake fails) while there is no certificate or
/// it has expired, as upstream's `GetCertificate` over the certificate manager's `Current`.
impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.unexpired_key(jiff::Timestamp::now().as_second())
    }
}

impl CurrentCert {
    /// The certificate to serve at `now` (Unix seconds): none once it has expired.
    fn unexpired_key(&self, now: i64) -> Option<Arc<CertifiedKey>> {
        let key = self.key()?;
        leaf(&key).is_some_and(|l| now < l.not_after).then_some(key)
    }
}

/// Why a certificate-and-key file cannot be presented.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error("bad certificate PEM: {0}")]
    CertificatePem(#[source] rustls::pki_types::pem::Error),
    #[error("no certificate")]
    NoCertificate,
    #[error("no usable private key: {0}")]
    PrivateKey(#[source] rustls::pki_types::pem::Error),
    #[error("unsupported key: {0}")]
    Unsupported(#[source] rustls::Error),
}

/// A certificate chain and its key from one PEM buffer (as the kubelet's `-current.pem`).
fn certified_key(pem: &[u8]) -> Result<CertifiedKey, KeyError> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pem).collect::<Result<_, _>>().map_err(KeyError::CertificatePem)?;
    if chain.is_empty() {
        return Err(KeyError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(KeyError::PrivateKey)?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(KeyError::Unsupported)?;
    Ok(CertifiedKey::new(chain, signing))
}

/// A connector whose connections end (read end-of-file) when [`CurrentCert`]'s
/// certificate changes.
#[derive(Clone)]
pub struct TrackingConnector<C> {
    pub inner: C,
    pub cert: Arc<CurrentCert>,
}

impl<C> tower::Service<http::Uri> for TrackingConnector<C>
where
    C: tower::Service<http::Uri> + Send,
    C::Future: Send + 'static,
{
    type Response = Tracked<C::Response>;
    type Error = C::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let mut changes = self.cert.generation.subscribe();
        changes.mark_unchanged();
        let connect = self.inner.call(uri);
        Box::pin(async move {
            let io = connect.await?;
            let changed = Box::pin(async move {
                if changes.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            });
            Ok(Tracked { io, changed, closed: false })
        })
    }
}

/// A connection made through [`TrackingConnector`].
pub struct Tracked<T> {
    io: T,
    /// Completes when the certificate changes.
    changed: futures::future::BoxFuture<'static, ()>,
    closed: bool,
}

impl<T: Connection> Connection for Tracked<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Tracked<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        // Polled here, the change also wakes an idle pooled connection, which then closes.
        this.closed = this.closed || this.changed.as_mut().poll(cx).is_ready();
        if this.closed {
            return Poll::Ready(Ok(())); // end of file: hyper drops the connection
        }
        std::pin::Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Tracked<T> {
    fn poll_write(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The rotation loop of one certificate (run under the node supervisor).
pub struct CertificateRotation {
    /// A client with the node's identity (not rate-limited: renewal must not queue behind pod
    /// traffic).
    pub client: Client,
    pub cert: Arc<CurrentCert>,
    pub cert_dir: PathBuf,
    /// `--bootstrap-kubeconfig`, used once the client certificate has expired.
    pub bootstrap: Option<PathBuf>,
    pub node: String,
    pub purpose: Purpose,
}

impl CertificateRotation {
    /// Rotates for the node's lifetime.
    pub async fn run(self: Arc<Self>) {
        let what = self.purpose.what();
        let mut addresses = match &self.purpose {
            Purpose::Serving { addresses } => Some(addresses.clone()),
            Purpose::Client => None,
        };
        loop {
            let names = match &mut addresses {
                Some(addresses) => wanted_names(addresses, &self.node).await,
                None => CertNames::default(),
            };
            let now = jiff::Timestamp::now().as_second();
            let deadline = match self.cert.leaf() {
                Some(leaf) if covers(&leaf.names, &names) => {
                    next_rotation_deadline(leaf.not_before, leaf.not_after, fastrand::f64())
                }
                Some(_) => {
                    tracing::info!(node = %self.node, dns = ?names.dns, ips = ?names.ips, "the {what} certificate does not cover the node's addresses; requesting a new one");
                    now
                }
                None => now,
            };
            let wait = Duration::from_secs(deadline.saturating_sub(now).max(0) as u64);
            tracing::info!(node = %self.node, rotate_in = ?wait, "next {what} certificate rotation scheduled");
            let addresses_changed = async {
                let changed = match &mut addresses {
                    Some(addresses) => addresses.changed().await.is_ok(),
                    None => false,
                };
                if !changed {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                // The names to request may have changed: decide again (upstream checks the
                // template every second).
                () = addresses_changed => continue,
            }
            self.rotate_with_retries(&names).await;
        }
    }

    async fn rotate_with_retries(&self, names: &CertNames) {
        let what = self.purpose.what();
        let mut failures = 0;
        loop {
            match self.rotate_once(names).await {
                Ok(path) => {
                    tracing::info!(node = %self.node, cert = %path.display(), "{what} certificate rotated");
                    return;
                }
                Err(e) => {
                    failures += 1;
                    let retry_in = retry_delay(failures);
                    // Each retry is logged; the backoff spaces them out.
                    tracing::error!(node = %self.node, error = %e, failures, ?retry_in, "{what} certificate rotation failed; retrying");
                    tokio::time::sleep(retry_in).await;
                }
            }
        }
    }

    /// Requests, waits for and writes one new certificate.
    async fn rotate_once(&self, names: &CertNames) -> Result<PathBuf, RotationError> {
        let what = self.purpose.what();
        let now = jiff::Timestamp::now().as_second();
        let expired = self.cert.leaf().is_none_or(|leaf| now >= leaf.not_after);
        let client = match (&self.bootstrap, expired) {
            (Some(path), true) => {
                tracing::warn!(node = %self.node, bootstrap = %path.display(), "the {what} certificate has expired; requesting a new one with the bootstrap kubeconfig");
                bootstrap::bootstrap_client(path).await?
            }
            _ => self.client.clone(),
        };
        let key = KeyPair::generate().map_err(|source| RotationError::GenerateKey { what, source })?;
        let request = bootstrap::certificate_request(&key, &self.node, names)
            .map_err(|source| RotationError::CertificateRequest { what, source })?;
        // Upstream's rotation requests are named by the server (`csr-…`).
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta { generate_name: Some("csr-".into()), ..Default::default() },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.into_bytes()),
                signer_name: self.purpose.signer().to_string(),
                usages: Some(self.purpose.usages().iter().map(|u| u.to_string()).collect()),
                ..Default::default()
            },
            status: None,
        };
        let api: Api<CertificateSigningRequest> = Api::all(client);
        let created =
            api.create(&PostParams::default(), &csr).await.map_err(|source| RotationError::Create { what, source })?;
        let name = created.metadata.name.unwrap_or_default();
        match self.purpose {
            Purpose::Client => tracing::info!(node = %self.node, csr = %name, "requested a new client certificate"),
            // As upstream, no controller approves serving requests: an operator (or a
            // controller they install) does.
            Purpose::Serving { .. } => tracing::info!(
                node = %self.node, csr = %name, dns = ?names.dns, ips = ?names.ips,
                "requested a serving certificate; it is issued once approved (kubectl certificate approve {name})"
            ),
        }
        let cert_pem = bootstrap::wait_for_certificate(&api, &name, ROTATION_WAIT_TIMEOUT).await?;
        bootstrap::cert_valid_at(cert_pem.as_bytes(), jiff::Timestamp::now().as_second())
            .map_err(|problem| BootstrapError::BadCertificate { name: name.clone(), problem })?;
        let path =
            bootstrap::write_current(&self.cert_dir, self.purpose.file_prefix(), &cert_pem, &key.serialize_pem())?;
        self.cert.key(); // switch now: new connections use it, old client connections close
        Ok(path)
    }
}

/// The names the serving certificate must cover, waiting until the node has an IP.
async fn wanted_names(addresses: &mut watch::Receiver<Vec<NodeAddress>>, node: &str) -> CertNames {
    let mut logged = false;
    loop {
        if let Some(names) = serving_names(&addresses.borrow_and_update()) {
            return names;
        }
        if !logged {
            tracing::info!(node = %node, "waiting for the node's addresses before requesting a serving certificate");
            logged = true;
        }
        if addresses.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::bootstrap::CURRENT_PEM_FILE;

    #[test]
    fn the_deadline_is_70_to_90_percent_of_the_lifetime() {
        assert_eq!(next_rotation_deadline(1000, 2000, 0.0), 1700);
        assert_eq!(next_rotation_deadline(1000, 2000, 0.5), 1800);
        assert_eq!(next_rotation_deadline(1000, 2000, 0.999_999), 1900);
        // An inverted validity rotates at once rather than never.
        assert_eq!(next_rotation_deadline(2000, 1000, 0.5), 2000);
    }

    #[test]
    fn retries_back_off_to_five_minutes() {
        assert_eq!(retry_delay(1), Duration::from_secs(2));
        assert_eq!(retry_delay(2), Duration::from_secs(4));
        assert_eq!(retry_delay(9), Duration::from_secs(300));
        assert_eq!(retry_delay(u32::MAX), Duration::from_secs(300));
    }

    fn issued_pem(cn: &str) -> String {
        let key = KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = params.self_signed(&key).unwrap();
        format!("{}{}", cert.pem(), key.serialize_pem())
    }

    fn address(type_: &str, address: &str) -> NodeAddress {
        NodeAddress { type_: type_.into(), address: address.into() }
    }

    #[test]
    fn serving_names_are_the_node_addresses_as_upstream() {
        let addresses = [
            address("InternalIP", "10.0.0.5"),
            address("ExternalIP", "203.0.113.7"),
            address("InternalIP", "10.0.0.5"),
            address("Hostname", "node-b"),
            address("InternalDNS", "node-b.internal"),
            address("ExternalDNS", ""),
            address("Hostname", "fd00::1"),
        ];
        let names = serving_names(&addresses).unwrap();
        assert_eq!(names.dns, ["node-b", "node-b.internal"]);
        let ips: Vec<String> = names.ips.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.0.0.5", "203.0.113.7", "fd00::1"], "sorted by text, without duplicates");
        // Upstream requests no serving certificate while the node has no IP.
        assert_eq!(serving_names(&[address("Hostname", "node-b")]), None);
        assert_eq!(serving_names(&[]), None);
    }

    #[test]
    fn a_certificate_covers_names_it_lists_and_may_list_more() {
        let have = CertNames { dns: vec!["a".into(), "b".into()], ips: vec!["10.0.0.1".parse().unwrap()] };
        assert!(covers(&have, &CertNames { dns: vec!["b".into()], ips: vec!["10.0.0.1".parse().unwrap()] }));
        assert!(covers(&have, &CertNames::default()));
        assert!(!covers(&have, &CertNames { dns: vec!["c".into()], ips: vec![] }));
        assert!(!covers(&have, &CertNames { dns: vec![], ips: vec!["10.0.0.2".parse().unwrap()] }));
    }

    /// A serving certificate for `names`, valid between two Unix times (PEM with its key).
    fn serving_pem(names: &CertNames, not_before: i64, not_after: i64) -> String {
        let key = KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(names.dns.clone()).unwrap();
        params.subject_alt_names.extend(names.ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
        params.not_before = time::OffsetDateTime::from_unix_timestamp(not_before).unwrap();
        params.not_after = time::OffsetDateTime::from_unix_timestamp(not_after).unwrap();
        format!("{}{}", params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    #[test]
    fn the_serving_certificate_is_none_until_issued_and_after_it_expires() {
        let dir = tempfile::tempdir().unwrap();
        let current = CurrentCert::serving(dir.path(), None).unwrap();
        assert!(current.unexpired_key(1_000).is_none(), "no certificate yet: the handshake fails");

        let names = CertNames { dns: vec!["node-b".into()], ips: vec!["10.0.0.5".parse().unwrap()] };
        let file = dir.path().join("kubelet-server-2026-01-01-00-00-00.pem");
        std::fs::write(&file, serving_pem(&names, 1_000, 2_000)).unwrap();
        std::os::unix::fs::symlink(&file, dir.path().join("kubelet-server-current.pem")).unwrap();
        assert!(current.unexpired_key(1_500).is_some());
        assert!(current.unexpired_key(2_000).is_none(), "expired: served no more");
        let leaf = current.leaf().unwrap();
        assert_eq!((leaf.not_before, leaf.not_after, leaf.names), (1_000, 2_000, names));
    }

    fn leaf_cn(key: &CertifiedKey) -> String {
        let (_, cert) = x509_parser::parse_x509_certificate(key.cert[0].as_ref()).unwrap();
        cert.subject().iter_common_name().next().unwrap().as_str().unwrap().to_string()
    }

    #[test]
    fn the_current_file_wins_over_the_kubeconfig_and_is_reread_when_the_link_moves() {
        let dir = tempfile::tempdir().unwrap();
        let current = CurrentCert::client(dir.path(), Some(issued_pem("from-kubeconfig").as_bytes())).unwrap();
        assert_eq!(leaf_cn(&current.key().unwrap()), "from-kubeconfig");

        std::fs::write(dir.path().join("one.pem"), issued_pem("one")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("one.pem"), dir.path().join(CURRENT_PEM_FILE)).unwrap();
        assert_eq!(leaf_cn(&current.key().unwrap()), "one");

        std::fs::write(dir.path().join("two.pem"), issued_pem("two")).unwrap();
        let tmp = dir.path().join("link.tmp");
        std::os::unix::fs::symlink(dir.path().join("two.pem"), &tmp).unwrap();
        std::fs::rename(&tmp, dir.path().join(CURRENT_PEM_FILE)).unwrap();
        assert_eq!(leaf_cn(&current.key().unwrap()), "two");

        // A broken replacement keeps the last good certificate.
        std::fs::write(dir.path().join("two.pem"), "garbage").unwrap();
        assert_eq!(leaf_cn(&current.key().unwrap()), "two");
    }
}
