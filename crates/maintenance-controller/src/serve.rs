//! The metrics and health endpoint (`--metrics-bind-address`): `/metrics` (OpenMetrics text),
//! `/healthz` (the process serves) and `/readyz` (the caches are filled), as
//! controller-runtime's manager serves them.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::task::JoinSet;

use super::metrics::Metrics;

/// After a failed accept (e.g. out of file descriptors) wait before the next one instead of
/// spinning.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
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

/// Binds at once (so a bad address fails start-up) and returns the bound address and the
/// accept loop, for the caller's supervisor. Connections are the loop's own tasks and end
/// with it.
pub async fn bind(
    address: SocketAddr,
    endpoint: Arc<Endpoint>,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving metrics and health checks");
    Ok((bound, serve(listener, endpoint)))
}

async fn serve(listener: tokio::net::TcpListener, endpoint: Arc<Endpoint>) {
    let mut connections = JoinSet::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a metrics connection");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
            Some(_) = connections.join_next() => continue,
        };
        let endpoint = endpoint.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| respond(endpoint.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
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

    /// The metrics server is one of the controller's supervised loops: when another loop
    /// panics, the supervisor names it and the server stops, its open connections included.
    #[tokio::test]
    async fn the_metrics_server_stops_when_another_loop_panics() {
        use gantry_supervisor::{Supervisor, TaskFault};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let endpoint = Endpoint::new(Arc::new(Metrics::new()));
        let (address, serving) = bind("127.0.0.1:0".parse().unwrap(), endpoint).await.unwrap();
        let mut supervisor = Supervisor::default();
        supervisor.spawn("metrics-server", serving);
        let (lose_watch, watch_lost) = tokio::sync::oneshot::channel::<()>();
        supervisor.spawn("pod-watch", async move {
            let _ = watch_lost.await;
            panic!("the watch loop is lost");
        });
        let running = tokio::spawn(supervisor.run(std::future::pending()));

        let mut conn = tokio::net::TcpStream::connect(address).await.unwrap();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: controller\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 512];
        let n = conn.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));

        lose_watch.send(()).unwrap();
        let fault = running.await.unwrap().unwrap_err();
        assert_eq!(fault, TaskFault::Panicked { task: "pod-watch", message: "the watch loop is lost".into() });
        assert_eq!(conn.read(&mut buf).await.unwrap(), 0, "the open connection was closed");
        assert!(tokio::net::TcpStream::connect(address).await.is_err(), "nothing listens any more");
    }

    #[test]
    fn bind_address_follows_controller_runtime() {
        assert_eq!(parse_bind_address("0"), Ok(None));
        assert_eq!(parse_bind_address(":8080"), Ok(Some("0.0.0.0:8080".parse().unwrap())));
        assert_eq!(parse_bind_address("127.0.0.1:9090"), Ok(Some("127.0.0.1:9090".parse().unwrap())));
        let err = parse_bind_address("eighty").unwrap_err();
        assert!(err.to_string().contains("--metrics-bind-address \"eighty\""), "{err}");
    }
}
