//! Runs the actions probes and lifecycle hooks are made of, against one container: `exec`
//! (CRI `ExecSync`), `httpGet`, `tcpSocket` and `grpc` (grpc.health.v1 `Check`).

use std::sync::OnceLock;
use std::time::Duration;

use gantry_cri::RuntimeClient;
use k8s_openapi::api::core::v1::{Container, GRPCAction, HTTPGetAction, Pod, Probe, TCPSocketAction};

use super::http_get::{self, MAX_BODY, Verdict};

/// The container an action runs against.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub cri: &'a RuntimeClient,
    pub container_id: &'a str,
    pub container: &'a Container,
    pub pod_ip: Option<&'a str>,
}

/// What `ExecSync` returned: the exit code and stdout followed by stderr.
pub struct ExecOutput {
    pub exit_code: i32,
    pub output: String,
}

impl<'a> Target<'a> {
    /// `pod_ip` is the sandbox's IP; host-network pods have none, and their actions default to
    /// the loopback address, which reaches what they listen on in the node's namespace.
    pub fn new(
        cri: &'a RuntimeClient,
        container_id: &'a str,
        container: &'a Container,
        pod: &Pod,
        pod_ip: Option<&'a str>,
    ) -> Self {
        let pod_ip = pod_ip.or(gantry_vocab::spec::host_network(pod).then_some("127.0.0.1"));
        Target { cri, container_id, container, pod_ip }
    }
}

/// Runs a command in the container; `Err` when it could not run or timed out.
pub async fn exec(t: Target<'_>, cmd: &[String], timeout: Duration) -> Result<ExecOutput, ExecError> {
    let started = std::time::Instant::now();
    match t.cri.exec_sync_for(t.container_id, cmd.to_vec(), timeout).await {
        Ok(r) => {
            let mut output = r.stdout;
            output.extend(r.stderr);
            output.truncate(MAX_BODY);
            Ok(ExecOutput { exit_code: r.exit_code, output: String::from_utf8_lossy(&output).into_owned() })
        }
        Err(_) if !timeout.is_zero() && started.elapsed() >= timeout => Err(ExecError::TimedOut),
        Err(e) => Err(ExecError::Failed(e.to_string())),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("timed out")]
    TimedOut,
    #[error("{0}")]
    Failed(String),
}

/// Why a probe could not run at all (upstream: "… probe errored: …").
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The CRI could not run the exec action.
    #[error("{0}")]
    Exec(String),
    #[error("the probe has no handler (exec, httpGet, tcpSocket or grpc)")]
    NoHandler,
}

/// Why an `httpGet` action got no response.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(transparent)]
    Target(#[from] http_get::TargetError),
    /// `chain` is the error and its sources, as Go prints a wrapped error.
    #[error("Get {url:?}: {chain}")]
    Request { url: String, chain: String },
}

/// One probe run: a verdict, or an error (upstream: "… probe errored: …").
pub async fn probe(t: Target<'_>, p: &Probe, timeout: Duration) -> Result<Verdict, ProbeError> {
    if let Some(e) = &p.exec {
        let cmd = e.command.clone().unwrap_or_default();
        return match exec(t, &cmd, timeout).await {
            Ok(out) if out.exit_code == 0 => Ok(Verdict::Success(out.output)),
            Ok(out) => Ok(Verdict::Failure(out.output)),
            Err(ExecError::TimedOut) => Ok(Verdict::Failure(format!("command {:?} timed out", cmd.join(" ")))),
            Err(ExecError::Failed(e)) => Err(ProbeError::Exec(e)),
        };
    }
    if let Some(h) = &p.http_get {
        return Ok(match http(h, t.container, t.pod_ip, timeout).await {
            Ok((status, body)) => http_get::classify(status, &body),
            Err(e) => Verdict::Failure(e.to_string()),
        });
    }
    if let Some(s) = &p.tcp_socket {
        return Ok(tcp(s, t.container, t.pod_ip, timeout).await);
    }
    if let Some(g) = &p.grpc {
        return Ok(grpc(g, t.pod_ip, timeout).await);
    }
    Err(ProbeError::NoHandler)
}

/// Sends the request; returns the status and (the start of) the body.
pub async fn http(
    action: &HTTPGetAction,
    c: &Container,
    pod_ip: Option<&str>,
    timeout: Duration,
) -> Result<(u16, String), HttpError> {
    let url = http_get::url(action, c, pod_ip)?;
    let mut request = client().get(&url);
    if !timeout.is_zero() {
        request = request.timeout(timeout);
    }
    for (name, value) in http_get::headers(action) {
        request = request.header(name, value);
    }
    let failed = |e: reqwest::Error| HttpError::Request { url: url.clone(), chain: error_chain(&e) };
    let mut response = request.send().await.map_err(failed)?;
    let status = response.status().as_u16();
    let mut body = Vec::new();
    while body.len() < MAX_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => return Err(failed(e)),
        }
    }
    body.truncate(MAX_BODY);
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// One client for all probes and hooks: no proxy, no connection reuse, certificates not
/// verified, redirects followed only on the same host and at most 10 times (as upstream).
fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let redirects = reqwest::redirect::Policy::custom(|attempt| {
            let first_host = attempt.previous().first().and_then(|u| u.host_str().map(str::to_string));
            if first_host.as_deref() != attempt.url().host_str() {
                attempt.stop()
            } else if attempt.previous().len() >= 10 {
                attempt.error("stopped after 10 redirects")
            } else {
                attempt.follow()
            }
        });
        reqwest::Client::builder()
            .no_proxy()
            .danger_accept_invalid_certs(true)
            .pool_max_idle_per_host(0)
            .redirect(redirects)
            .build()
            .expect("a client with static settings builds")
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

async fn tcp(action: &TCPSocketAction, c: &Container, pod_ip: Option<&str>, timeout: Duration) -> Verdict {
    let port = match http_get::resolve_port(&action.port, c) {
        Ok(port) => port,
        Err(e) => return Verdict::Failure(e.to_string()),
    };
    let Some(host) = action.host.as_deref().filter(|h| !h.is_empty()).or(pod_ip) else {
        return Verdict::Failure("the pod has no IP yet".into());
    };
    let addr = http_get::join_host_port(host, port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr.as_str())).await {
        Ok(Ok(_)) => Verdict::Success(String::new()),
        Ok(Err(e)) => Verdict::Failure(format!("dial tcp {addr}: {e}")),
        Err(_) => Verdict::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

async fn grpc(action: &GRPCAction, pod_ip: Option<&str>, timeout: Duration) -> Verdict {
    let Some(host) = pod_ip else { return Verdict::Failure("the pod has no IP yet".into()) };
    let Ok(port) = u16::try_from(action.port) else {
        return Verdict::Failure(format!("invalid port number: {}", action.port));
    };
    let addr = http_get::join_host_port(host, port);
    match gantry_cri::health::check(&addr, action.service.clone().unwrap_or_default(), timeout).await {
        Ok(()) => Verdict::Success("service healthy".into()),
        Err(e) => Verdict::Failure(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// A one-route HTTP server on loopback: answers every request with `status` and a
    /// `Location` header (for redirects) and sends the request head it got to the channel.
    async fn server(status: u16, location: Option<String>) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = vec![0; 4096];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let location = location.as_ref().map(|l| format!("Location: {l}\r\n")).unwrap_or_default();
                let response =
                    format!("HTTP/1.1 {status} X\r\n{location}Content-Length: 2\r\nConnection: close\r\n\r\nok");
                let _ = conn.write_all(response.as_bytes()).await;
            }
        });
        (port, rx)
    }

    fn get(port: u16, path: &str) -> HTTPGetAction {
        HTTPGetAction { path: Some(path.into()), port: IntOrString::Int(port.into()), ..Default::default() }
    }

    async fn verdict(action: &HTTPGetAction) -> Verdict {
        match http(action, &Container::default(), Some("127.0.0.1"), SECOND).await {
            Ok((status, body)) => http_get::classify(status, &body),
            Err(e) => Verdict::Failure(e.to_string()),
        }
    }

    #[tokio::test]
    async fn http_probe_sends_upstream_headers_and_classifies() {
        let (port, mut requests) = server(200, None).await;
        assert_eq!(verdict(&get(port, "/healthz")).await, Verdict::Success("ok".into()));
        let head = requests.recv().await.unwrap();
        assert!(head.starts_with("GET /healthz HTTP/1.1"), "{head}");
        assert!(head.to_ascii_lowercase().contains("user-agent: kube-probe/1.34"), "{head}");
        let (port, _) = server(500, None).await;
        assert_eq!(verdict(&get(port, "/")).await, Verdict::Failure("HTTP probe failed with statuscode: 500".into()));
    }

    #[tokio::test]
    async fn redirects_are_followed_on_the_same_host_only() {
        let (target, _) = server(200, None).await;
        let (same, _) = server(302, Some(format!("http://127.0.0.1:{target}/ok"))).await;
        assert_eq!(verdict(&get(same, "/")).await, Verdict::Success("ok".into()));
        let (other, _) = server(302, Some(format!("http://localhost:{target}/ok"))).await;
        assert_eq!(
            verdict(&get(other, "/")).await,
            Verdict::Warning("Probe terminated redirects, Response body: ok".into())
        );
    }

    #[tokio::test]
    async fn https_probe_does_not_verify_the_certificate() {
        let cert = rcgen::generate_simple_self_signed(vec!["nowhere.invalid".into()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (conn, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(conn).await.unwrap();
            let mut buf = vec![0; 4096];
            let _ = tls.read(&mut buf).await;
            let _ = tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecure").await;
            let _ = tls.shutdown().await;
        });
        let action = HTTPGetAction { scheme: Some("HTTPS".into()), ..get(port, "/") };
        assert_eq!(verdict(&action).await, Verdict::Success("secure".into()));
    }

    #[tokio::test]
    async fn tcp_probe_connects_or_fails() {
        let (port, _) = server(200, None).await;
        let action = |port: u16| TCPSocketAction { port: IntOrString::Int(port.into()), host: None };
        let c = Container::default();
        assert_eq!(tcp(&action(port), &c, Some("127.0.0.1"), SECOND).await, Verdict::Success(String::new()));
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let Verdict::Failure(message) = tcp(&action(closed), &c, Some("127.0.0.1"), SECOND).await else {
            panic!("a closed port fails")
        };
        assert!(message.starts_with(&format!("dial tcp 127.0.0.1:{closed}: ")), "{message}");
    }
}
