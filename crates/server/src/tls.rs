//! The serving certificate and the TLS configuration of the secure port.
//!
//! With `tlsCertFile`/`tlsPrivateKeyFile` those files are served. Without them, as upstream,
//! a self-signed pair is written to `<cert-dir>/kubelet.crt` and `kubelet.key` for the
//! node's hostname and addresses, and reused on the next start. With `serverTLSBootstrap` the
//! caller gives a certificate resolver instead ([`ServingCert::Resolver`]). With
//! `authentication.x509.clientCAFile`, client certificates are asked for and, when presented,
//! verified against that bundle during the handshake (a certificate from another CA fails
//! the handshake); clients without one go on to token or anonymous authentication.
//! `tlsMinVersion` and `tlsCipherSuites` restrict versions and TLS 1.2 suites as in Go: the
//! list never turns TLS 1.3 suites off, and listed suites rustls does not implement (CBC, RC4,
//! 3DES, RSA key exchange) are skipped with a warning.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
pub use rustls::server::ResolvesServerCert;
use rustls::server::WebPkiClientVerifier;
use rustls::{SupportedCipherSuite, SupportedProtocolVersion};

use gantry_config::{SELF_SIGNED_CERT, SELF_SIGNED_KEY, ServerSettings, Settings, TlsVersion};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {}: {problem}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        problem: PemProblem,
    },
    #[error("cannot write the self-signed serving certificate to {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot generate a self-signed serving certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("invalid TLS configuration: {0}")]
    Protocols(#[source] rustls::Error),
    #[error("invalid TLS configuration: clientCAFile {}: {source}", path.display())]
    ClientCa { path: PathBuf, source: rustls::server::VerifierBuilderError },
    #[error("invalid TLS configuration: {} and {}: {source}", cert.display(), key.display())]
    CertAndKey { cert: PathBuf, key: PathBuf, source: rustls::Error },
}

/// What is wrong with a PEM file of certificates or a key.
#[derive(Debug, thiserror::Error)]
pub enum PemProblem {
    #[error("{0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("no PEM certificate in the file")]
    NoCertificate,
    #[error("{0}")]
    Certificate(#[from] rustls::Error),
}

fn read_err<'a>(what: &'static str, path: &'a Path) -> impl Fn(PemProblem) -> TlsError + 'a {
    move |problem| TlsError::Read { what, path: path.to_path_buf(), problem }
}

/// The certificate chain in a PEM file (at least one certificate).
pub fn load_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = read_err(what, path);
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.into()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.into()))?;
    if certs.is_empty() {
        return Err(err(PemProblem::NoCertificate));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| read_err("tlsPrivateKeyFile", path)(e.into()))
}

/// The names a self-signed certificate covers: the hostname (as DNS name or IP), the node
/// IPs, and localhost (so that processes on the node can verify it too).
pub fn self_signed_names(hostname: &str, node_ips: &[IpAddr]) -> Vec<String> {
    let mut names = vec![hostname.to_string()];
    names.extend(node_ips.iter().filter(|ip| !ip.is_unspecified()).map(IpAddr::to_string));
    for n in ["localhost", "127.0.0.1"] {
        if !names.iter().any(|x| x == n) {
            names.push(n.to_string());
        }
    }
    names
}

/// `(cert PEM, key PEM)` of a new self-signed certificate for `names`.
pub fn generate_self_signed(hostname: &str, names: Vec<String>) -> Result<(String, String), TlsError> {
    let mut params = rcgen::CertificateParams::new(names)?;
    // Upstream names the subject `<hostname>@<unix time>`.
    let cn = format!("{hostname}@{}", jiff::Timestamp::now().as_second());
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2120, 1, 1);
    let key = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The files to serve: the configured pair, or the self-signed pair (created if missing).
async fn serving_files(
    s: &ServerSettings,
    settings: &Settings,
    node_ips: &[IpAddr],
) -> Result<(PathBuf, PathBuf), TlsError> {
    if let (Some(cert), Some(key)) = (&s.tls_cert_file, &s.tls_private_key_file) {
        return Ok((cert.clone(), key.clone()));
    }
    let dir = s.cert_dir(&settings.root_dir);
    let (cert, key) = (dir.join(SELF_SIGNED_CERT), dir.join(SELF_SIGNED_KEY));
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    let names = self_signed_names(&settings.hostname, node_ips);
    let (cert_pem, key_pem) = generate_self_signed(&settings.hostname, names)?;
    tokio::fs::create_dir_all(&dir).await.map_err(write_err(&dir))?;
    tokio::fs::write(&cert, cert_pem).await.map_err(write_err(&cert))?;
    write_private(&key, key_pem.as_bytes()).map_err(write_err(&key))?;
    tracing::info!(cert = %cert.display(), "generated a self-signed serving certificate");
    Ok((cert, key))
}

/// Writes a file readable by its owner only.
fn write_err(path: &Path) -> impl Fn(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Write { path: path.to_path_buf(), source }
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(data)
}

/// Where the secure port's certificate comes from.
#[derive(Debug)]
pub enum ServingCert {
    /// `tlsCertFile`/`tlsPrivateKeyFile`, or the self-signed pair in `--cert-dir`; `node_ips`
    /// go into a generated certificate.
    Files { node_ips: Vec<IpAddr> },
    /// Chosen at each handshake (`serverTLSBootstrap`: the certificate the API server issued,
    /// rotated without a restart). When it has none the handshake fails: no fallback to a
    /// self-signed certificate, as upstream.
    Resolver(Arc<dyn ResolvesServerCert>),
}

/// The rustls configuration of the secure port (HTTP/1.1: upgrades need it).
pub async fn server_config(
    s: &ServerSettings,
    settings: &Settings,
    cert: ServingCert,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (provider, versions) = protocol(s);
    let provider = Arc::new(provider);
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(TlsError::Protocols)?;
    let builder = match &s.client_ca_file {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in load_certs(ca, "clientCAFile")? {
                roots.add(c).map_err(|e| read_err("clientCAFile", ca)(e.into()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|source| TlsError::ClientCa { path: ca.clone(), source })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = match cert {
        ServingCert::Files { node_ips } => {
            let (cert_path, key_path) = serving_files(s, settings, &node_ips).await?;
            let certs = load_certs(&cert_path, "tlsCertFile")?;
            let key = load_key(&key_path)?;
            builder.with_single_cert(certs, key).map_err(|source| TlsError::CertAndKey {
                cert: cert_path.clone(),
                key: key_path.clone(),
                source,
            })?
        }
        ServingCert::Resolver(resolver) => builder.with_cert_resolver(resolver),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The suites and versions `tlsCipherSuites` and `tlsMinVersion` allow, warning about what
/// rustls cannot serve.
fn protocol(s: &ServerSettings) -> (CryptoProvider, Vec<&'static SupportedProtocolVersion>) {
    let mut provider = rustls::crypto::ring::default_provider();
    let tls12_name = |suite: &SupportedCipherSuite| match suite {
        SupportedCipherSuite::Tls12(_) => Some(format!("{:?}", suite.suite())),
        SupportedCipherSuite::Tls13(_) => None,
    };
    if !s.tls_cipher_suites.is_empty() {
        provider.cipher_suites.retain(|suite| tls12_name(suite).is_none_or(|n| s.tls_cipher_suites.contains(&n)));
        let served: Vec<String> = provider.cipher_suites.iter().filter_map(tls12_name).collect();
        let skipped: Vec<&str> = s
            .tls_cipher_suites
            .iter()
            .filter(|n| !n.starts_with("TLS_AES_") && !n.starts_with("TLS_CHACHA20_") && !served.contains(n))
            .map(String::as_str)
            .collect();
        if !skipped.is_empty() {
            tracing::warn!(suites = %skipped.join(","), "tlsCipherSuites: not implemented by the TLS library; skipped");
        }
    }
    if s.tls_min_version < TlsVersion::Tls12 {
        tracing::warn!(min = ?s.tls_min_version, "tlsMinVersion: TLS 1.0 and 1.1 are not available; serving TLS 1.2 and later");
    }
    let tls12 =
        s.tls_min_version <= TlsVersion::Tls12 && provider.cipher_suites.iter().any(|c| tls12_name(c).is_some());
    if s.tls_min_version <= TlsVersion::Tls12 && !tls12 {
        tracing::warn!("tlsCipherSuites: no TLS 1.2 suite left; serving TLS 1.3 only");
    }
    let versions =
        if tls12 { vec![&rustls::version::TLS12, &rustls::version::TLS13] } else { vec![&rustls::version::TLS13] };
    (provider, versions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_names_cover_hostname_node_ips_and_localhost() {
        let names = self_signed_names("node-a", &["10.0.0.5".parse().unwrap(), "0.0.0.0".parse().unwrap()]);
        assert_eq!(names, vec!["node-a", "10.0.0.5", "localhost", "127.0.0.1"]);
        let names = self_signed_names("localhost", &[]);
        assert_eq!(names, vec!["localhost", "127.0.0.1"]);
    }

    #[test]
    fn generated_certificate_parses_and_names_the_host() {
        let (cert, _key) = generate_self_signed("node-a", self_signed_names("node-a", &[])).unwrap();
        let der = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        let cn = parsed.subject().iter_common_name().next().unwrap().as_str().unwrap().to_string();
        assert!(cn.starts_with("node-a@"), "{cn}");
    }

    fn suites_and_versions(s: &ServerSettings) -> (Vec<String>, Vec<rustls::ProtocolVersion>) {
        let (provider, versions) = protocol(s);
        let suites = provider.cipher_suites.iter().map(|c| format!("{:?}", c.suite())).collect();
        (suites, versions.iter().map(|v| v.version).collect())
    }

    #[test]
    fn cipher_suites_restrict_tls12_only_and_min_version_drops_tls12() {
        use rustls::ProtocolVersion::{TLSv1_2, TLSv1_3};
        let (all, versions) = suites_and_versions(&ServerSettings::default());
        assert_eq!(versions, [TLSv1_2, TLSv1_3]);
        assert!(all.len() > 3);

        let listed = ServerSettings {
            tls_cipher_suites: vec![
                "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384".into(),
                "TLS_RSA_WITH_AES_128_CBC_SHA".into(),
            ],
            ..Default::default()
        };
        let (suites, versions) = suites_and_versions(&listed);
        let tls12: Vec<&String> = suites.iter().filter(|n| n.contains("_WITH_")).collect();
        assert_eq!(tls12, ["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"], "the CBC suite is skipped");
        assert_eq!(suites.iter().filter(|n| n.starts_with("TLS13_")).count(), 3, "TLS 1.3 suites stay on");
        assert_eq!(versions, [TLSv1_2, TLSv1_3]);

        let only_cbc =
            ServerSettings { tls_cipher_suites: vec!["TLS_RSA_WITH_AES_128_CBC_SHA".into()], ..Default::default() };
        assert_eq!(suites_and_versions(&only_cbc).1, [TLSv1_3]);
        let tls13 = ServerSettings { tls_min_version: TlsVersion::Tls13, ..Default::default() };
        assert_eq!(suites_and_versions(&tls13).1, [TLSv1_3]);
        let tls10 = ServerSettings { tls_min_version: TlsVersion::Tls10, ..Default::default() };
        assert_eq!(suites_and_versions(&tls10).1, [TLSv1_2, TLSv1_3]);
    }
}
