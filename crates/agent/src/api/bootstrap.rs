//! TLS bootstrap, as the kubelet's `--bootstrap-kubeconfig`: when the `--kubeconfig` file is
//! missing or holds no valid client certificate, get one from the API server with the
//! bootstrap credentials (a kubeadm bootstrap token) through a CertificateSigningRequest.
//!
//! The steps follow upstream (kubelet `certificate/bootstrap`, client-go `util/certificate/csr`):
//! 1. keep a private key in `<cert-dir>/kubelet-client.key.tmp` (made once, reused after a
//!    restart so that the same request is found again);
//! 2. create the CSR `node-csr-<digest of key, subject and usages>` for
//!    `CN=system:node:<node>, O=system:nodes`, signer
//!    `kubernetes.io/kube-apiserver-client-kubelet`, usages digital signature and client auth
//!    (an existing CSR of that name is the same request, made before a restart);
//! 3. wait for it to be approved and issued (an hour at most; denied or failed is an error
//!    naming the CSR);
//! 4. write `<cert-dir>/kubelet-client-<time>.pem` (certificate and key) and point the
//!    `kubelet-client-current.pem` symlink at it;
//! 5. write the `--kubeconfig` file: the bootstrap kubeconfig's server and CA, with that
//!    symlink as client certificate and key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PublicKeyData};

use super::KubeconfigProblem;

/// The signer of kubelet client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The key kept while a request is pending.
pub const PENDING_KEY_FILE: &str = "kubelet-client.key.tmp";
/// The prefix of the client certificate files in `--cert-dir` (`<prefix>-<time>.pem`).
pub const CLIENT_FILE_PREFIX: &str = "kubelet-client";
/// The symlink to the current client certificate and key.
pub const CURRENT_PEM_FILE: &str = "kubelet-client-current.pem";
/// How long the wait for an issued certificate lasts (upstream: one hour).
pub const APPROVAL_TIMEOUT: Duration = Duration::from_secs(3600);
/// The usages of a kubelet client certificate with an ECDSA key.
pub const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];

/// Why TLS bootstrap failed. Each message names the file or the CSR to look at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    #[error("cannot read the bootstrap kubeconfig {} (given with --bootstrap-kubeconfig): {source}", path.display())]
    ReadBootstrapKubeconfig { path: PathBuf, source: std::io::Error },

    #[error("the bootstrap kubeconfig {} (given with --bootstrap-kubeconfig) is not usable: {problem}", path.display())]
    InvalidBootstrapKubeconfig {
        path: PathBuf,
        #[source]
        problem: KubeconfigProblem,
    },

    #[error(
        "the API server at {url} answered 401 Unauthorized to the bootstrap credentials of {} (given with \
         --bootstrap-kubeconfig): the bootstrap token is wrong, expired or deleted; create a new one (kubeadm token \
         create) ({message})",
        path.display()
    )]
    Unauthorized { url: String, path: PathBuf, message: String },

    #[error(
        "the API server at {url} forbids the bootstrap credentials of {} (given with --bootstrap-kubeconfig) to create \
         certificate signing requests: {message}",
        path.display()
    )]
    Forbidden { url: String, path: PathBuf, message: String },

    #[error("cannot request a client certificate from the API server at {url}: {}", super::error_chain(source))]
    Request { url: String, source: kube::Error },

    #[error(
        "certificate signing request {name} exists but is not this node's pending request ({problem}); delete it \
         (kubectl delete csr {name}) or remove {}",
        key.display()
    )]
    Incompatible {
        name: String,
        key: PathBuf,
        #[source]
        problem: Incompatible,
    },

    /// `reason` and `message` are the CSR condition's, as the approver wrote them.
    #[error("certificate signing request {name} was denied: {reason}: {message}")]
    Denied { name: String, reason: String, message: String },

    #[error("certificate signing request {name} failed: {reason}: {message}")]
    Failed { name: String, reason: String, message: String },

    #[error(
        "certificate signing request {name} was not approved and issued within {}s; approve it with \
         `kubectl certificate approve {name}`",
        timeout.as_secs()
    )]
    NotIssued { name: String, timeout: Duration },

    #[error("certificate signing request {name} was issued a certificate that cannot be used: {problem}")]
    BadCertificate {
        name: String,
        #[source]
        problem: CertError,
    },

    #[error("cannot write {} (--cert-dir / --kubeconfig): {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },

    #[error("cannot write {} (--cert-dir / --kubeconfig): cannot generate a key: {source}", path.display())]
    GenerateKey { path: PathBuf, source: rcgen::Error },

    #[error(
        "cannot write {} (--cert-dir / --kubeconfig): cannot make a certificate request with this key: {source}",
        path.display()
    )]
    CertificateRequest { path: PathBuf, source: rcgen::Error },
}

/// Where TLS bootstrap reads and writes.
#[derive(Clone, Debug)]
pub struct BootstrapPaths {
    /// `--kubeconfig`: read if present, written after bootstrap.
    pub kubeconfig: PathBuf,
    /// `--bootstrap-kubeconfig`.
    pub bootstrap: PathBuf,
    /// `--cert-dir`.
    pub cert_dir: PathBuf,
}

/// Whether `kubeconfig` holds a client certificate valid now (upstream's
/// `isClientConfigStillValid`): if not, TLS bootstrap is needed.
pub fn has_valid_client_cert(kubeconfig: &Path) -> bool {
    kubeconfig_client_cert(kubeconfig).is_ok_and(|pem| cert_valid_at(&pem, jiff::Timestamp::now().as_second()).is_ok())
}

/// Makes sure `--kubeconfig` holds a valid client certificate, bootstrapping one if not.
pub async fn load_client_cert(paths: &BootstrapPaths, node: &str) -> Result<(), BootstrapError> {
    if has_valid_client_cert(&paths.kubeconfig) {
        tracing::info!(kubeconfig = %paths.kubeconfig.display(), node = %node, "the kubeconfig has a valid client certificate; no bootstrap needed");
        return Ok(());
    }
    let bootstrap = BootstrapClient::load(&paths.bootstrap).await?;
    let key = pending_key(&paths.cert_dir)?;
    let request = certificate_request(&key, node, &CertNames::default())
        .map_err(|source| BootstrapError::CertificateRequest { path: paths.cert_dir.join(PENDING_KEY_FILE), source })?;
    let name =
        csr_name(&key.subject_public_key_info(), &format!("system:node:{node}"), &["system:nodes"], CLIENT_USAGES);
    tracing::info!(csr = %name, node = %node, server = %bootstrap.url, "requesting a client certificate (TLS bootstrap)");
    let api: Api<CertificateSigningRequest> = Api::all(bootstrap.client.clone());
    bootstrap.create_or_adopt(&api, &name, &request, &paths.cert_dir.join(PENDING_KEY_FILE)).await?;
    let cert_pem = wait_for_certificate(&api, &name, APPROVAL_TIMEOUT).await?;
    cert_valid_at(cert_pem.as_bytes(), jiff::Timestamp::now().as_second())
        .map_err(|problem| BootstrapError::BadCertificate { name: name.clone(), problem })?;
    let pem_path = write_current(&paths.cert_dir, CLIENT_FILE_PREFIX, &cert_pem, &key.serialize_pem())?;
    write_private(&paths.kubeconfig, bootstrap.kubeconfig_for(&pem_path).as_bytes())?;
    let _ = std::fs::remove_file(paths.cert_dir.join(PENDING_KEY_FILE));
    tracing::info!(csr = %name, cert = %pem_path.display(), kubeconfig = %paths.kubeconfig.display(), "client certificate issued; kubeconfig written");
    Ok(())
}

/// A client with the bootstrap kubeconfig's credentials (rotation falls back to it once the
/// certificate has expired).
pub(crate) async fn bootstrap_client(path: &Path) -> Result<Client, BootstrapError> {
    Ok(BootstrapClient::load(path).await?.client)
}

/// The bootstrap kubeconfig, loaded.
struct BootstrapClient {
    path: PathBuf,
    client: Client,
    url: String,
    /// PEM of the cluster CA ("" when the kubeconfig has none: system roots).
    ca_pem: String,
    insecure: bool,
}

impl BootstrapClient {
    async fn load(path: &Path) -> Result<BootstrapClient, BootstrapError> {
        let invalid = |problem| BootstrapError::InvalidBootstrapKubeconfig { path: path.to_path_buf(), problem };
        let kubeconfig = Kubeconfig::read_from(path).map_err(|e| match e {
            kube::config::KubeconfigError::ReadConfig(source, _) => {
                BootstrapError::ReadBootstrapKubeconfig { path: path.to_path_buf(), source }
            }
            other => invalid(KubeconfigProblem::Kubeconfig(other)),
        })?;
        let cluster = current_cluster(&kubeconfig).ok_or_else(|| invalid(KubeconfigProblem::NoCluster))?;
        let ca_pem = match (&cluster.certificate_authority_data, &cluster.certificate_authority) {
            (Some(data), _) => STANDARD
                .decode(data.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| invalid(KubeconfigProblem::CertificateAuthorityData))?,
            (None, Some(file)) => std::fs::read_to_string(file).map_err(|source| {
                invalid(KubeconfigProblem::ReadCertificateAuthority { file: file.clone(), source })
            })?,
            (None, None) => String::new(),
        };
        let insecure = cluster.insecure_skip_tls_verify.unwrap_or(false);
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| invalid(KubeconfigProblem::Kubeconfig(e)))?;
        let url = config.cluster_url.to_string().trim_end_matches('/').to_string();
        let client = Client::try_from(config).map_err(|e| invalid(KubeconfigProblem::Client(e)))?;
        Ok(BootstrapClient { path: path.to_path_buf(), client, url, ca_pem, insecure })
    }

    /// Creates the CSR; one of that name already there is ours if it is the same request.
    async fn create_or_adopt(
        &self,
        api: &Api<CertificateSigningRequest>,
        name: &str,
        request_pem: &str,
        key_path: &Path,
    ) -> Result<(), BootstrapError> {
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request_pem.as_bytes().to_vec()),
                signer_name: KUBELET_CLIENT_SIGNER.to_string(),
                usages: Some(CLIENT_USAGES.iter().map(|u| u.to_string()).collect()),
                ..Default::default()
            },
            status: None,
        };
        let mut backoff = Duration::from_secs(1);
        loop {
            match api.create(&PostParams::default(), &csr).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let existing = api.get(name).await.map_err(|e| self.request_error(e))?;
                    return compatible(&existing, &csr.spec).map_err(|problem| BootstrapError::Incompatible {
                        name: name.to_string(),
                        key: key_path.to_path_buf(),
                        problem,
                    });
                }
                Err(e) => {
                    let transient = is_transient(&e);
                    let err = self.request_error(e);
                    if !matches!(err, BootstrapError::Request { .. }) || !transient {
                        return Err(err);
                    }
                    tracing::warn!(error = %err, retry_in = ?backoff, "cannot create the certificate signing request yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    fn request_error(&self, e: kube::Error) -> BootstrapError {
        let (url, path) = (self.url.clone(), self.path.clone());
        match e {
            kube::Error::Api(s) if s.code == 401 => {
                BootstrapError::Unauthorized { url, path, message: s.message.clone() }
            }
            kube::Error::Api(s) if s.code == 403 => BootstrapError::Forbidden { url, path, message: s.message.clone() },
            other => BootstrapError::Request { url, source: other },
        }
    }

    /// The `--kubeconfig` upstream writes after bootstrap: this server and CA, the certificate
    /// and key from `pem_path`.
    fn kubeconfig_for(&self, pem_path: &Path) -> String {
        render_kubeconfig(&self.url, &self.ca_pem, self.insecure, pem_path)
    }
}

fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        _ => true,
    }
}

fn current_cluster(kubeconfig: &Kubeconfig) -> Option<kube::config::Cluster> {
    let context_name = kubeconfig.current_context.as_ref()?;
    let context = kubeconfig.contexts.iter().find(|c| &c.name == context_name)?.context.clone()?;
    kubeconfig.clusters.iter().find(|c| c.name == context.cluster)?.cluster.clone()
}

/// Why an existing CSR of our name is not ours (upstream's `ensureCompatible`).
#[derive(Debug, thiserror::Error)]
pub enum Incompatible {
    #[error("its request is not PEM: {0}")]
    NotPem(#[source] x509_parser::nom::Err<x509_parser::error::PEMError>),
    #[error("its request does not parse: {0}")]
    Unparsable(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("its subject differs")]
    Subject,
    #[error("its public key differs")]
    PublicKey,
    #[error("its signer is {0}")]
    Signer(String),
    #[error("its usages are {0:?}")]
    Usages(Vec<String>),
}

/// Why a certificate is not (or not yet, or no longer) usable.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("not PEM: {0}")]
    NotPem(#[source] x509_parser::error::PEMError),
    #[error("not an X.509 certificate: {0}")]
    NotX509(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("not valid before {0}")]
    NotYetValid(x509_parser::time::ASN1Time),
    #[error("expired at {0}")]
    Expired(x509_parser::time::ASN1Time),
    #[error("no certificate")]
    NoCertificate,
}

/// Why a kubeconfig yields no client certificate.
#[derive(Debug, thiserror::Error)]
pub enum ClientCertError {
    #[error(transparent)]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("no user in the current context")]
    NoUser,
    #[error("no such user")]
    NoSuchUser,
    #[error("client-certificate-data: {0}")]
    Data(#[source] base64::DecodeError),
    #[error("cannot read client-certificate {file}: {source}")]
    File { file: String, source: std::io::Error },
    #[error("no client certificate")]
    None,
}

/// Upstream's `ensureCompatible`: an existing CSR of our name must carry our request.
fn compatible(existing: &CertificateSigningRequest, ours: &CertificateSigningRequestSpec) -> Result<(), Incompatible> {
    let spec = &existing.spec;
    // ECDSA signatures differ each time: compare what the request asks for, as upstream.
    let (theirs_req, ours_req) = (request_identity(&spec.request.0)?, request_identity(&ours.request.0)?);
    if theirs_req.0 != ours_req.0 {
        return Err(Incompatible::Subject);
    }
    if theirs_req.1 != ours_req.1 {
        return Err(Incompatible::PublicKey);
    }
    if spec.signer_name != ours.signer_name {
        return Err(Incompatible::Signer(spec.signer_name.clone()));
    }
    if spec.usages != ours.usages {
        return Err(Incompatible::Usages(spec.usages.clone().unwrap_or_default()));
    }
    Ok(())
}

/// The DER subject and public key of a PEM certificate request.
fn request_identity(pem: &[u8]) -> Result<(Vec<u8>, Vec<u8>), Incompatible> {
    use x509_parser::prelude::FromDer;
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(Incompatible::NotPem)?;
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
        .map_err(Incompatible::Unparsable)?;
    let info = &req.certification_request_info;
    Ok((info.subject.as_raw().to_vec(), info.subject_pki.raw.to_vec()))
}

/// What a CSR's status says about the wait (pure).
#[derive(Debug, PartialEq, Eq)]
pub enum CsrState {
    Pending,
    Issued(String),
    Denied { reason: String, message: String },
    Failed { reason: String, message: String },
}

pub fn csr_state(csr: &CertificateSigningRequest) -> CsrState {
    let status = csr.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let find = |kind: &str| conditions.iter().find(|c| c.type_ == kind && c.status == "True");
    let text = |c: &k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition| {
        (c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default())
    };
    if let Some(c) = find("Denied") {
        let (reason, message) = text(c);
        return CsrState::Denied { reason, message };
    }
    if let Some(c) = find("Failed") {
        let (reason, message) = text(c);
        return CsrState::Failed { reason, message };
    }
    match (find("Approved"), status.certificate) {
        (Some(_), Some(cert)) if !cert.0.is_empty() => CsrState::Issued(String::from_utf8_lossy(&cert.0).into_owned()),
        _ => CsrState::Pending,
    }
}

/// Watches the CSR until it is issued, denied or failed, or `timeout` passes. While it is
/// pending, says every minute what the operator can do.
pub(crate) async fn wait_for_certificate(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    timeout: Duration,
) -> Result<String, BootstrapError> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api.clone(), config).default_backoff().applied_objects().boxed();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut reminder =
        tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(60), Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                return Err(BootstrapError::NotIssued { name: name.to_string(), timeout });
            }
            _ = reminder.tick() => tracing::warn!(
                csr = %name,
                "waiting for certificate signing request {name} to be approved and issued; approve it with `kubectl certificate approve {name}`"
            ),
            next = events.try_next() => match next {
                Ok(Some(csr)) => match csr_state(&csr) {
                    CsrState::Pending => {}
                    CsrState::Issued(pem) => return Ok(pem),
                    CsrState::Denied { reason, message } => {
                        return Err(BootstrapError::Denied { name: name.to_string(), reason, message });
                    }
                    CsrState::Failed { reason, message } => {
                        return Err(BootstrapError::Failed { name: name.to_string(), reason, message });
                    }
                },
                Ok(None) => return Err(BootstrapError::NotIssued { name: name.to_string(), timeout }),
                Err(e) => tracing::warn!(csr = %name, error = %e, "watching the certificate signing request failed; retrying"),
            },
        }
    }
}

/// The pending request's key: reused if a previous run made one, else made and saved.
fn pending_key(cert_dir: &Path) -> Result<KeyPair, BootstrapError> {
    let path = cert_dir.join(PENDING_KEY_FILE);
    if let Ok(pem) = std::fs::read_to_string(&path) {
        match KeyPair::from_pem(&pem) {
            Ok(key) => return Ok(key),
            Err(e) => {
                tracing::warn!(key = %path.display(), error = %e, "ignoring an unreadable pending key; making a new one")
            }
        }
    }
    let key = KeyPair::generate().map_err(|source| BootstrapError::GenerateKey { path: path.clone(), source })?;
    std::fs::create_dir_all(cert_dir)
        .map_err(|source| BootstrapError::Write { path: cert_dir.to_path_buf(), source })?;
    write_private(&path, key.serialize_pem().as_bytes())?;
    Ok(key)
}

/// The names a serving certificate covers (upstream's request template: the node's DNS names
/// and IPs, each sorted). Empty for a client certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertNames {
    pub dns: Vec<String>,
    pub ips: Vec<std::net::IpAddr>,
}

/// The PEM certificate request for `node` (ECDSA P-256, as the kubelet's): subject
/// `CN=system:node:<node>, O=system:nodes`, and `names` as subject alternative names.
pub fn certificate_request(key: &KeyPair, node: &str, names: &CertNames) -> Result<String, rcgen::Error> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::OrganizationName, "system:nodes");
    params.distinguished_name.push(DnType::CommonName, format!("system:node:{node}"));
    for dns in &names.dns {
        params.subject_alt_names.push(rcgen::SanType::DnsName(dns.clone().try_into()?));
    }
    params.subject_alt_names.extend(names.ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
    params.serialize_request(key)?.pem()
}

/// Upstream's CSR name: `node-csr-` and the base64url SHA-512/256 of the public key, subject
/// and usages (each base64url-encoded and `|`-terminated), so that a restart with the same
/// key finds its request again.
pub fn csr_name(public_key_der: &[u8], cn: &str, orgs: &[&str], usages: &[&str]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA512_256);
    let mut write = |data: &[u8]| {
        ctx.update(URL_SAFE_NO_PAD.encode(data).as_bytes());
        ctx.update(b"|");
    };
    write(public_key_der);
    write(cn.as_bytes());
    for o in orgs {
        write(o.as_bytes());
    }
    for u in usages {
        write(u.as_bytes());
    }
    format!("node-csr-{}", URL_SAFE_NO_PAD.encode(ctx.finish().as_ref()))
}

/// The PEM client certificate of a kubeconfig's current user (file or data).
pub fn kubeconfig_client_cert(path: &Path) -> Result<Vec<u8>, ClientCertError> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let user = kubeconfig
        .current_context
        .as_ref()
        .and_then(|name| kubeconfig.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone())
        .ok_or(ClientCertError::NoUser)?;
    let auth = kubeconfig
        .auth_infos
        .iter()
        .find(|a| a.name == user)
        .and_then(|a| a.auth_info.clone())
        .ok_or(ClientCertError::NoSuchUser)?;
    match (auth.client_certificate_data, auth.client_certificate) {
        (Some(data), _) => STANDARD.decode(data.trim()).map_err(ClientCertError::Data),
        (None, Some(file)) => std::fs::read(&file).map_err(|source| ClientCertError::File { file, source }),
        (None, None) => Err(ClientCertError::None),
    }
}

/// Whether every certificate in `pem` is valid at `now` (Unix seconds), as upstream's
/// `isClientConfigStillValid`; the error says why not.
pub fn cert_valid_at(pem: &[u8], now: i64) -> Result<(), CertError> {
    let mut seen = 0;
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(CertError::NotPem)?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = block.parse_x509().map_err(CertError::NotX509)?;
        let v = cert.validity();
        if now < v.not_before.timestamp() {
            return Err(CertError::NotYetValid(v.not_before));
        }
        if now >= v.not_after.timestamp() {
            return Err(CertError::Expired(v.not_after));
        }
        seen += 1;
    }
    if seen == 0 { Err(CertError::NoCertificate) } else { Ok(()) }
}

/// Writes `<cert-dir>/<prefix>-<time>.pem` and swaps the `<prefix>-current.pem` symlink to it
/// (a rename, so readers never see a missing link), as upstream's certificate file store.
/// Returns the link's path.
pub(crate) fn write_current(
    cert_dir: &Path,
    prefix: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<PathBuf, BootstrapError> {
    let stamp = jiff::Zoned::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
    let file = cert_dir.join(format!("{prefix}-{stamp}.pem"));
    let mut contents = cert_pem.trim_end().to_string();
    contents.push('\n');
    contents.push_str(key_pem);
    write_private(&file, contents.as_bytes())?;
    let link = cert_dir.join(format!("{prefix}-current.pem"));
    let tmp = cert_dir.join(format!(".{prefix}-current.pem.tmp"));
    let werr = |path: &Path| {
        let path = path.to_path_buf();
        move |source: std::io::Error| BootstrapError::Write { path, source }
    };
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&file, &tmp).map_err(werr(&tmp))?;
    std::fs::rename(&tmp, &link).map_err(werr(&link))?;
    Ok(link)
}

/// The kubeconfig upstream writes after bootstrap (names as upstream's).
pub fn render_kubeconfig(server: &str, ca_pem: &str, insecure: bool, pem_path: &Path) -> String {
    let mut cluster = serde_json::json!({"server": server});
    if !ca_pem.is_empty() {
        cluster["certificate-authority-data"] = serde_json::json!(STANDARD.encode(ca_pem));
    }
    if insecure {
        cluster["insecure-skip-tls-verify"] = serde_json::json!(true);
    }
    let pem = pem_path.display().to_string();
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": cluster}],
        "users": [{"name": "default-auth", "user": {"client-certificate": pem, "client-key": pem}}],
        "contexts": [{"name": "default-context", "context": {"cluster": "default-cluster", "user": "default-auth", "namespace": "default"}}],
        "current-context": "default-context",
        "preferences": {},
    });
    serde_yaml_ng::to_string(&config).expect("a kubeconfig serialises")
}

/// Writes a file only its owner can read (keys, kubeconfigs), creating its directory.
fn write_private(path: &Path, data: &[u8]) -> Result<(), BootstrapError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source: std::io::Error| BootstrapError::Write { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension("gantry-tmp");
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(err)?;
    f.write_all(data).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests;
