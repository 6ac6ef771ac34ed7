//! The metrics and health endpoint (`--metrics-bind-address`): `/metrics` (OpenMetrics text),
//! `/healthz` (the process serves) and `/readyz` (the caches are filled), as
//! controller-runtime's manager serves them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::metrics::Metrics;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the endpoint shows.
pub struct Endpoint {
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
}

impl Endpoint {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Endpoint> {
        Arc::new(Endpoint { metrics, ready: AtomicBool::new(false) })
    }
}

/// A `--metrics-bind-address` that is not `host:port`, `:port` or `0`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--metrics-bind-address {value:?}: {source}")]
pub struct BadBindAddress {
    pub value: String,
    pub source: std::net::AddrParseError,
}

/// Parses `--metrics-bind-address` as controller-runtime does: `0` disables, `:8080` binds
/// every address.
pub fn parse_bind_address(value: &str) -> Result<Option<SocketAddr>, BadBindAddress> {
    if value == "0" {
        return Ok(None);
    }
    let full = if value.starts_with(':') { format!("0.0.0.0{value}") } else { value.to_string() };
    full.parse().map(Some).map_err(|source| BadBindAddress { value: value.to_string(), source })
}

/// Binds at once (so a bad address fails start-up), then serves in the background.
pub async fn start(address: SocketAddr, endpoint: Arc<Endpoint>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving metrics and health checks");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| respond(endpoint.clone(), req));
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Ok(bound)
}

async fn respond(endpoint: Arc<Endpoint>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, content_type, body) = match req.uri().path() {
        "/metrics" => (StatusCode::OK, OPENMETRICS, endpoint.metrics.encode()),
        "/healthz" => (StatusCode::OK, "text/plain", "ok".to_string()),
        "/readyz" if endpoint.ready.load(Ordering::Relaxed) => (StatusCode::OK, "text/plain", "ok".to_string()),
        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "caches not synced".to_string()),
        _ => (StatusCode::NOT_FOUND, "text/plain", "404 page not found".to_string()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_address_follows_controller_runtime() {
        assert_eq!(parse_bind_address("0"), Ok(None));
        assert_eq!(parse_bind_address(":8080"), Ok(Some("0.0.0.0:8080".parse().unwrap())));
        assert_eq!(parse_bind_address("127.0.0.1:9090"), Ok(Some("127.0.0.1:9090".parse().unwrap())));
        let err = parse_bind_address("eighty").unwrap_err();
        assert!(err.to_string().contains("--metrics-bind-address \"eighty\""), "{err}");
    }
}
