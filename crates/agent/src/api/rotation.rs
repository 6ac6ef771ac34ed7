//! Client certificate rotation (`rotateCertificates`), as upstream's client-go certificate
//! manager and kubelet `certificate` package:
//! - every new TLS connection to the API server presents the certificate that
//!   `<cert-dir>/kubelet-client-current.pem` holds at that moment ([`CurrentClientCert`], a
//!   rustls client certificate resolver), falling back to the kubeconfig's own certificate
//!   while that file does not exist; when the certificate changes, the connections made before
//!   are closed (as upstream's `CloseAll`), so that requests and watches reconnect with it;
//! - [`CertificateRotation::run`] requests a new certificate at a jittered 70–90% of the current
//!   one's lifetime ([`next_rotation_deadline`]), through a CertificateSigningRequest made with
//!   the current identity, or with the bootstrap kubeconfig once the certificate has expired;
//!   the new certificate is written next to the old one and the symlink moved (the old file is
//!   kept). Failures are retried with backoff and logged; they never end the loop.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use hyper_util::client::legacy::connect::{Connected, Connection};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rcgen::KeyPair;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

use super::bootstrap::{self, BootstrapError, CLIENT_USAGES, CURRENT_PEM_FILE, KUBELET_CLIENT_SIGNER};

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

/// The client certificate new connections present: `<cert-dir>/kubelet-client-current.pem`,
/// re-read when the symlink or the file changes, else the kubeconfig's own.
#[derive(Debug)]
pub struct CurrentClientCert {
    current: PathBuf,
    fallback: Option<Arc<CertifiedKey>>,
    state: Mutex<Loaded>,
    /// Bumped when the certificate changes; connections made before close.
    generation: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Loaded {
    /// The file's identity when it was read: its target and modification time.
    stamp: Option<(PathBuf, SystemTime)>,
    key: Option<Arc<CertifiedKey>>,
}

impl CurrentClientCert {
    /// `fallback_pem`: the kubeconfig's certificate and key (PEM), used while the cert dir has
    /// no current certificate.
    pub fn new(cert_dir: &Path, fallback_pem: Option<&[u8]>) -> Result<CurrentClientCert, KeyError> {
        let fallback = fallback_pem.map(certified_key).transpose()?.map(Arc::new);
        let this = CurrentClientCert {
            current: cert_dir.join(CURRENT_PEM_FILE),
            fallback,
            state: Default::default(),
            generation: watch::Sender::new(0),
        };
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
                        tracing::info!(cert = %self.current.display(), "the client certificate changed; new connections use it");
                    }
                    // Connections made with the previous certificate close (upstream closes
                    // them too), so that its expiry cannot strand the node.
                    self.generation.send_modify(|g| *g += 1);
                    state.key = Some(Arc::new(key));
                }
                Err(e) => {
                    tracing::warn!(cert = %self.current.display(), error = %e, "cannot use the current client certificate; keeping the previous one")
                }
            }
        }
        state.key.clone().or_else(|| self.fallback.clone())
    }

    /// The leaf certificate's validity (Unix seconds), for the rotation deadline.
    fn validity(&self) -> Option<(i64, i64)> {
        let key = self.key()?;
        let (_, cert) = x509_parser::parse_x509_certificate(key.cert.first()?.as_ref()).ok()?;
        Some((cert.validity().not_before.timestamp(), cert.validity().not_after.timestamp()))
    }
}

impl ResolvesClientCert for CurrentClientCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.key()
    }

    fn has_certs(&self) -> bool {
        true
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

/// A connector whose connections end (read end-of-file) when [`CurrentClientCert`]'s
/// certificate changes.
#[derive(Clone)]
pub struct TrackingConnector<C> {
    pub inner: C,
    pub cert: Arc<CurrentClientCert>,
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

/// The rotation loop of one node (run under the node supervisor).
pub struct CertificateRotation {
    /// A client that presents [`CurrentClientCert`] (not rate-limited: renewal must not queue
    /// behind pod traffic).
    pub client: Client,
    pub cert: Arc<CurrentClientCert>,
    pub cert_dir: PathBuf,
    /// `--bootstrap-kubeconfig`, used once the certificate has expired.
    pub bootstrap: Option<PathBuf>,
    pub node: String,
}

impl CertificateRotation {
    /// Rotates for the node's lifetime.
    pub async fn run(self: Arc<Self>) {
        loop {
            let now = jiff::Timestamp::now().as_second();
            let deadline = match self.cert.validity() {
                Some((not_before, not_after)) => next_rotation_deadline(not_before, not_after, fastrand::f64()),
                None => now,
            };
            let wait = Duration::from_secs(deadline.saturating_sub(now).max(0) as u64);
            tracing::info!(node = %self.node, rotate_in = ?wait, "next client certificate rotation scheduled");
            tokio::time::sleep(wait).await;
            self.rotate_with_retries().await;
        }
    }

    async fn rotate_with_retries(&self) {
        let mut failures = 0;
        loop {
            match self.rotate_once().await {
                Ok(path) => {
                    tracing::info!(node = %self.node, cert = %path.display(), "client certificate rotated");
                    return;
                }
                Err(e) => {
                    failures += 1;
                    let retry_in = retry_delay(failures);
                    // Each retry is logged; the backoff spaces them out.
                    tracing::error!(node = %self.node, error = %e, failures, ?retry_in, "client certificate rotation failed; retrying");
                    tokio::time::sleep(retry_in).await;
                }
            }
        }
    }

    /// Requests, waits for and writes one new certificate.
    async fn rotate_once(&self) -> Result<PathBuf, BootstrapError> {
        let now = jiff::Timestamp::now().as_second();
        let expired = self.cert.validity().is_none_or(|(_, not_after)| now >= not_after);
        let client = match (&self.bootstrap, expired) {
            (Some(path), true) => {
                tracing::warn!(node = %self.node, bootstrap = %path.display(), "the client certificate has expired; requesting a new one with the bootstrap kubeconfig");
                bootstrap::bootstrap_client(path).await?
            }
            _ => self.client.clone(),
        };
        let key = KeyPair::generate().map_err(|e| BootstrapError::Request {
            url: String::new(),
            reason: format!("cannot generate a key: {e}"),
        })?;
        let request = bootstrap::certificate_request(&key, &self.node).map_err(|e| BootstrapError::Request {
            url: String::new(),
            reason: format!("cannot make a request: {e}"),
        })?;
        // Upstream's rotation requests are named by the server (`csr-…`).
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta { generate_name: Some("csr-".into()), ..Default::default() },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.into_bytes()),
                signer_name: KUBELET_CLIENT_SIGNER.to_string(),
                usages: Some(CLIENT_USAGES.iter().map(|u| u.to_string()).collect()),
                ..Default::default()
            },
            status: None,
        };
        let api: Api<CertificateSigningRequest> = Api::all(client);
        let created = api.create(&PostParams::default(), &csr).await.map_err(|e| BootstrapError::Request {
            url: String::new(),
            reason: format!("cannot create a certificate signing request: {}", super::error_chain(&e)),
        })?;
        let name = created.metadata.name.unwrap_or_default();
        tracing::info!(node = %self.node, csr = %name, "requested a new client certificate");
        let cert_pem = bootstrap::wait_for_certificate(&api, &name, ROTATION_WAIT_TIMEOUT).await?;
        bootstrap::cert_valid_at(cert_pem.as_bytes(), jiff::Timestamp::now().as_second())
            .map_err(|e| BootstrapError::BadCertificate { name: name.clone(), reason: e.to_string() })?;
        let path = bootstrap::write_current(&self.cert_dir, &cert_pem, &key.serialize_pem())?;
        self.cert.key(); // switch now: new connections use it, old ones close
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn leaf_cn(key: &CertifiedKey) -> String {
        let (_, cert) = x509_parser::parse_x509_certificate(key.cert[0].as_ref()).unwrap();
        cert.subject().iter_common_name().next().unwrap().as_str().unwrap().to_string()
    }

    #[test]
    fn the_current_file_wins_over_the_kubeconfig_and_is_reread_when_the_link_moves() {
        let dir = tempfile::tempdir().unwrap();
        let current = CurrentClientCert::new(dir.path(), Some(issued_pem("from-kubeconfig").as_bytes())).unwrap();
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
