//! Runs the actions probes and lifecycle hooks are made of, against one container: `exec`
//! (CRI `ExecSync`), `httpGet`, `tcpSocket` and `grpc` (grpc.health.v1 `Check`).

use std::sync::OnceLock;
use std::time::Duration;

use gantry_cri::RuntimeClient;
use k8s_openapi::api::core::v1::{Container, GRPCAction, HTTPGetAction, Probe, TCPSocketAction};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

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

/// Runs a command in the container; `Err` when it could not run or timed out.
pub async fn exec(t: Target<'_>, cmd: &[String], timeout: Duration) -> Result<ExecOutput, ExecError> {
    let started = std::time::Instant::now();
    match t.cri.exec_sync_for(t.container_id, cmd.to_vec(), timeout).await {
        Ok(r) => {
            let mut output = r.stdout;
            output.extend(r.stderr);
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

/// One probe run: a verdict, or an error (upstream: "… probe errored: …").
pub async fn probe(t: Target<'_>, p: &Probe, timeout: Duration) -> Result<Verdict, String> {
    if let Some(e) = &p.exec {
        let cmd = e.command.clone().unwrap_or_default();
        return match exec(t, &cmd, timeout).await {
            Ok(out) if out.exit_code == 0 => Ok(Verdict::Success(out.output)),
            Ok(out) => Ok(Verdict::Failure(out.output)),
            Err(ExecError::TimedOut) => Ok(Verdict::Failure(format!("command {:?} timed out", cmd.join(" ")))),
            Err(ExecError::Failed(e)) => Err(e),
        };
    }
    if let Some(h) = &p.http_get {
        return Ok(match http(h, t, timeout).await {
            Ok((status, body)) => http_get::classify(status, &body),
            Err(e) => Verdict::Failure(e),
        });
    }
    if let Some(s) = &p.tcp_socket {
        return Ok(tcp(s, t, timeout).await);
    }
    if let Some(g) = &p.grpc {
        return Ok(grpc(g, t, timeout).await);
    }
    Err("the probe has no handler (exec, httpGet, tcpSocket or grpc)".into())
}

/// Sends the request; returns the status and (the start of) the body.
pub async fn http(action: &HTTPGetAction, t: Target<'_>, timeout: Duration) -> Result<(u16, String), String> {
    let url = http_get::url(action, t.container, t.pod_ip)?;
    let mut request = client().get(&url);
    if !timeout.is_zero() {
        request = request.timeout(timeout);
    }
    for (name, value) in http_get::headers(action) {
        request = request.header(name, value);
    }
    let mut response = request.send().await.map_err(|e| format!("Get {url:?}: {}", error_chain(&e)))?;
    let status = response.status().as_u16();
    let mut body = Vec::new();
    while body.len() < MAX_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => return Err(format!("Get {url:?}: {}", error_chain(&e))),
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

async fn tcp(action: &TCPSocketAction, t: Target<'_>, timeout: Duration) -> Verdict {
    let port = match http_get::resolve_port(&action.port, t.container) {
        Ok(port) => port,
        Err(e) => return Verdict::Failure(e),
    };
    let Some(host) = action.host.as_deref().filter(|h| !h.is_empty()).or(t.pod_ip) else {
        return Verdict::Failure("the pod has no IP yet".into());
    };
    let addr = http_get::join_host_port(host, port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr.as_str())).await {
        Ok(Ok(_)) => Verdict::Success(String::new()),
        Ok(Err(e)) => Verdict::Failure(format!("dial tcp {addr}: {e}")),
        Err(_) => Verdict::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

async fn grpc(action: &GRPCAction, t: Target<'_>, timeout: Duration) -> Verdict {
    let Some(host) = t.pod_ip else { return Verdict::Failure("the pod has no IP yet".into()) };
    let Ok(port) = u16::try_from(action.port) else {
        return Verdict::Failure(format!("invalid port number: {}", action.port));
    };
    let addr = http_get::join_host_port(host, port);
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return Verdict::Failure(format!("error: failed to connect service at {addr:?}: {e}")),
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return Verdict::Failure(format!("error: failed to connect service at {addr:?}: {}", error_chain(&e)));
        }
        Err(_) => {
            return Verdict::Failure(format!(
                "timeout: failed to connect service {addr:?} within {}s",
                timeout.as_secs()
            ));
        }
    };
    let service = action.service.clone().unwrap_or_default();
    match HealthClient::new(channel).check(HealthCheckRequest { service }).await {
        Ok(r) if r.get_ref().status == ServingStatus::Serving as i32 => Verdict::Success("service healthy".into()),
        Ok(r) => {
            let status = ServingStatus::try_from(r.get_ref().status).unwrap_or(ServingStatus::Unknown);
            Verdict::Failure(format!("service unhealthy (responded with {:?})", status.as_str_name()))
        }
        Err(s) if s.code() == tonic::Code::Unimplemented => Verdict::Failure(format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
            s.message()
        )),
        Err(s) if s.code() == tonic::Code::DeadlineExceeded || s.code() == tonic::Code::Cancelled => {
            Verdict::Failure(format!("timeout: health rpc did not complete within {}s", timeout.as_secs()))
        }
        Err(s) => Verdict::Failure(format!("error: health rpc probe failed: {s}")),
    }
}
