//! Helpers for tests of the node API (port 10250 upstream): a test PKI (serving certificate
//! for 127.0.0.1, client certificates, a foreign CA), free ports, the flags that turn the
//! server on, and HTTPS / WebSocket clients.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// A certificate authority that signs serving and client certificates.
pub struct TestCa {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa { cert_pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// (cert PEM, key PEM) for `cn` in groups `orgs` (client) or for 127.0.0.1 (server).
    fn sign(&self, cn: &str, orgs: &[&str], server: bool) -> (String, String) {
        let sans = if server { vec!["127.0.0.1".to_string(), "localhost".to_string()] } else { vec![] };
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        params.extended_key_usages =
            vec![if server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn client(&self, cn: &str, orgs: &[&str]) -> Identity {
        let (cert, key) = self.sign(cn, orgs, false);
        Identity { cert, key }
    }
}

/// A client certificate and its key (PEM).
#[derive(Clone)]
pub struct Identity {
    pub cert: String,
    pub key: String,
}

/// The files and ports of one node API.
pub struct NodeApi {
    pub ca: TestCa,
    pub port: u16,
    pub healthz_port: u16,
    pub dir: PathBuf,
}

/// A port nothing listens on right now (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl NodeApi {
    /// A CA, a serving certificate for 127.0.0.1 and free ports; files go into `dir`.
    pub fn new(dir: &Path) -> NodeApi {
        let ca = TestCa::new("node-api-test-ca");
        let (cert, key) = ca.sign("node", &[], true);
        std::fs::write(dir.join("server.crt"), cert).unwrap();
        std::fs::write(dir.join("server.key"), key).unwrap();
        std::fs::write(dir.join("client-ca.crt"), &ca.cert_pem).unwrap();
        NodeApi { ca, port: free_port(), healthz_port: free_port(), dir: dir.to_path_buf() }
    }

    /// Flags serving HTTPS on 127.0.0.1 with the test certificate, client certificates from
    /// the test CA, and the healthz port.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--enable-server=true".into(),
            "--address=127.0.0.1".into(),
            format!("--port={}", self.port),
            format!("--healthz-port={}", self.healthz_port),
            format!("--tls-cert-file={}", self.dir.join("server.crt").display()),
            format!("--tls-private-key-file={}", self.dir.join("server.key").display()),
            format!("--client-ca-file={}", self.dir.join("client-ca.crt").display()),
        ]
    }

    /// A node agent serving this node API, plus `extra` flags; returns once healthz answers.
    pub async fn start_agent(&self, env: &super::Env, extra: &[&str]) -> super::Gantry {
        let mut flags = self.flags();
        flags.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
        let gantry = env.kubelet(&refs);
        let healthz = format!("http://127.0.0.1:{}/healthz", self.healthz_port);
        let plain = reqwest::Client::builder().no_proxy().build().unwrap();
        super::eventually("the healthz port to answer", &gantry, || async {
            let resp = plain.get(&healthz).send().await.ok()?;
            (resp.status() == 200).then_some(())
        })
        .await;
        gantry
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// An HTTPS client trusting the test CA, presenting `identity` if given.
    pub fn client(&self, identity: Option<&Identity>) -> reqwest::Client {
        let mut b = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca.cert_pem.as_bytes()).unwrap())
            .tls_built_in_root_certs(false)
            .no_proxy();
        if let Some(id) = identity {
            b = b.identity(reqwest::Identity::from_pem(format!("{}{}", id.cert, id.key).as_bytes()).unwrap());
        }
        b.build().unwrap()
    }

    /// A TLS connection to the node API (for WebSocket and raw upgrade requests).
    pub async fn tls(&self, identity: Option<&Identity>) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        self.connect(self.rustls_config(identity, rustls::DEFAULT_VERSIONS)).await.unwrap()
    }

    /// `GET path` over a fresh TLS connection presenting `identity`: the raw response, or the
    /// TLS or I/O error that ended the exchange.
    pub async fn raw_get(&self, identity: &Identity, path: &str) -> std::io::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tls = self.connect(self.rustls_config(Some(identity), rustls::DEFAULT_VERSIONS)).await?;
        tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())
            .await?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }

    /// The TLS version and cipher suite of a handshake offering only `versions`, or why it
    /// failed.
    pub async fn handshake(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> std::io::Result<(rustls::ProtocolVersion, rustls::CipherSuite)> {
        let stream = self.connect(self.rustls_config(None, versions)).await?;
        let conn = stream.get_ref().1;
        Ok((conn.protocol_version().unwrap(), conn.negotiated_cipher_suite().unwrap().suite()))
    }

    fn rustls_config(
        &self,
        identity: Option<&Identity>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> rustls::ClientConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(self.ca.cert_pem.as_bytes()).unwrap()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots);
        match identity {
            Some(id) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(id.cert.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(id.key.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        }
    }

    async fn connect(
        &self,
        config: rustls::ClientConfig,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await
    }

    /// Opens a WebSocket on `path` with `subprotocol`; the HTTP error (status, body) if the
    /// server refuses the upgrade.
    pub async fn websocket(
        &self,
        identity: Option<&Identity>,
        path: &str,
        subprotocol: &str,
    ) -> Result<WebSocket, (u16, String)> {
        let mut req = format!("wss://127.0.0.1:{}{path}", self.port).into_client_request().unwrap();
        req.headers_mut().insert("Sec-WebSocket-Protocol", subprotocol.parse().unwrap());
        let tls = self.tls(identity).await;
        match tokio_tungstenite::client_async(req, tls).await {
            Ok((ws, resp)) => {
                let chosen = resp.headers().get("sec-websocket-protocol").and_then(|v| v.to_str().ok());
                assert_eq!(chosen, Some(subprotocol), "the runtime's chosen subprotocol comes back through the proxy");
                Ok(ws)
            }
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let body = resp.body().as_ref().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
                Err((resp.status().as_u16(), body))
            }
            Err(e) => panic!("websocket to {path}: {e}"),
        }
    }
}

pub type WebSocket = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
