//! The upgrade proxy to the runtime's streaming server (upstream's UpgradeAwareHandler in
//! "upgrade required" mode).
//!
//! The client's request (method, path query appended, upgrade headers: `Upgrade`,
//! `Connection`, `X-Stream-Protocol-Version`, `Sec-WebSocket-*`) goes to the URL the runtime
//! returned; its answer comes back as is. On `101 Switching Protocols` both connections are
//! upgraded and bytes are copied both ways until either side closes; then both are dropped,
//! which closes the runtime's stream (and so its exec session or port-forward). The relay and
//! the runtime connection run as tasks of the client's connection ([`ConnectionTasks`]), so
//! they stop with the node API's accept loop.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use super::pods::ApiError;
use super::serve::ConnectionTasks;

/// Headers that belong to one hop or carry the client's credentials for us, never the runtime.
const DROPPED: &[&str] = &["authorization", "host", "proxy-authorization", "content-length", "transfer-encoding"];

/// Whether the request asks for a connection upgrade (SPDY or WebSocket).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

/// Upstream answers a plain request to a streaming endpoint with 400.
pub fn require_upgrade(req: &Request) -> Result<(), ApiError> {
    if is_upgrade(req.headers()) { Ok(()) } else { Err(ApiError::bad_request("Upgrade request required")) }
}

/// The runtime URL with the client's query appended (the runtime's own query first).
pub fn target_path(url: &Uri, client_query: Option<&str>) -> String {
    let path = url.path();
    match (url.query(), client_query.filter(|q| !q.is_empty())) {
        (Some(a), Some(b)) => format!("{path}?{a}&{b}"),
        (Some(a), None) | (None, Some(a)) => format!("{path}?{a}"),
        (None, None) => path.to_string(),
    }
}

/// Proxies `req` to the runtime's streaming `url`.
pub async fn upgrade(mut req: Request, url: &str) -> Response {
    match try_upgrade(&mut req, url).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn try_upgrade(req: &mut Request, url: &str) -> Result<Response, ApiError> {
    let tasks = req
        .extensions()
        .get::<ConnectionTasks>()
        .cloned()
        .ok_or_else(|| ApiError::internal("a streaming request needs a connection to upgrade"))?;
    let target: Uri =
        url.parse().map_err(|e| ApiError::internal(format!("bad streaming URL {url:?} from the runtime: {e}")))?;
    if target.scheme_str() != Some("http") {
        return Err(ApiError::internal(format!(
            "streaming URL {url:?} from the runtime: only http:// streaming servers are supported (set the runtime's stream server to plain HTTP on a local address)"
        )));
    }
    let authority =
        target.authority().ok_or_else(|| ApiError::internal(format!("streaming URL {url:?} has no host")))?.clone();
    let port = authority.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((authority.host().trim_matches(|c| c == '[' || c == ']'), port))
        .await
        .map_err(|e| ApiError::internal(format!("cannot reach the runtime's streaming server at {authority}: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tcp))
        .await
        .map_err(|e| ApiError::internal(format!("streaming server {authority}: {e}")))?;
    tasks.spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "runtime streaming connection ended");
        }
    });

    let mut upstream =
        http::Request::builder().method(req.method().clone()).uri(target_path(&target, req.uri().query()));
    for (name, value) in req.headers().iter().filter(|(n, _)| !DROPPED.contains(&n.as_str())) {
        upstream = upstream.header(name, value);
    }
    let upstream = upstream
        .header(header::HOST, authority.as_str())
        .body(Body::empty())
        .map_err(|e| ApiError::internal(format!("cannot build the streaming request: {e}")))?;
    let client_upgrade = hyper::upgrade::on(&mut *req);
    let mut resp = sender
        .send_request(upstream)
        .await
        .map_err(|e| ApiError::internal(format!("streaming server {authority}: {e}")))?;

    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The runtime refused (e.g. an unsupported protocol): pass its answer on.
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        return Ok(Response::from_parts(parts, Body::from(bytes)));
    }
    let runtime_upgrade = hyper::upgrade::on(&mut resp);
    tasks.spawn(async move {
        let (client, runtime) = match tokio::try_join!(client_upgrade, runtime_upgrade) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "stream upgrade failed");
                return;
            }
        };
        relay(TokioIo::new(client), TokioIo::new(runtime)).await;
    });
    let mut out = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (name, value) in resp.headers() {
        out = out.header(name, value);
    }
    out.body(Body::empty()).map_err(|e| ApiError::internal(e.to_string()))
}

/// Copies bytes both ways until either direction ends (EOF or error), then drops both
/// connections, as upstream does: a client that goes away must not leave the runtime's
/// stream open (a half-closed copy would wait for the runtime forever).
async fn relay<A, B>(client: A, runtime: B)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut client_rx, mut client_tx) = tokio::io::split(client);
    let (mut runtime_rx, mut runtime_tx) = tokio::io::split(runtime);
    tokio::select! {
        r = tokio::io::copy(&mut client_rx, &mut runtime_tx) => tracing::debug!(result = ?r, "client side of the stream ended"),
        r = tokio::io::copy(&mut runtime_rx, &mut client_tx) => tracing::debug!(result = ?r, "runtime side of the stream ended"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_requests_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!is_upgrade(&h));
        h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert!(!is_upgrade(&h), "Upgrade header missing");
        h.insert(header::UPGRADE, "SPDY/3.1".parse().unwrap());
        assert!(is_upgrade(&h));
    }

    #[tokio::test]
    async fn relay_closes_the_runtime_side_when_the_client_leaves() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, mut client_peer) = tokio::io::duplex(64);
        let (runtime, mut runtime_peer) = tokio::io::duplex(64);
        let relay = tokio::spawn(relay(client, runtime));
        client_peer.write_all(b"in").await.unwrap();
        let mut buf = [0u8; 2];
        runtime_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"in");
        drop(client_peer);
        relay.await.unwrap();
        // The runtime's end reads EOF: its connection is gone, not half-open.
        assert_eq!(runtime_peer.read(&mut buf).await.unwrap(), 0);
    }

    /// Reads one HTTP message head (up to the blank line), byte by byte so nothing after it
    /// is consumed.
    async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(stream.read_u8().await.expect("a complete message head"));
        }
        String::from_utf8(head).unwrap()
    }

    /// The relay of an upgraded stream belongs to its connection, which belongs to the accept
    /// loop: when the loop is stopped (by the node's supervisor) the runtime's stream closes,
    /// even though the client is still connected.
    #[tokio::test]
    async fn a_relay_stops_with_its_accept_loop() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let runtime = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/exec/token", runtime.local_addr().unwrap());
        let exec = move |req: Request| {
            let url = url.clone();
            async move { upgrade(req, &url).await }
        };
        let router = axum::Router::new().route("/exec", axum::routing::any(exec));
        let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(api.local_addr().unwrap()).await.unwrap();
        let accept_loop = tokio::spawn(crate::serve::http(api, router));

        client
            .write_all(b"GET /exec HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
            .await
            .unwrap();
        let (mut stream, _) = runtime.accept().await.unwrap();
        let request = read_head(&mut stream).await;
        assert!(request.starts_with("GET /exec/token HTTP/1.1"), "{request}");
        stream
            .write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
            .await
            .unwrap();
        let response = read_head(&mut client).await;
        assert!(response.starts_with("HTTP/1.1 101"), "{response}");
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        stream.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping", "the relay runs");

        accept_loop.abort();
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut buf)).await;
        assert_eq!(read.expect("the relay stopped with its accept loop").unwrap(), 0, "the runtime's stream is closed");
        drop(client);
    }

    #[test]
    fn client_query_follows_the_runtime_query() {
        let u: Uri = "http://127.0.0.1:1234/exec/tok".parse().unwrap();
        assert_eq!(target_path(&u, Some("command=ls")), "/exec/tok?command=ls");
        assert_eq!(target_path(&u, None), "/exec/tok");
        let u: Uri = "http://127.0.0.1:1234/portforward/tok?a=1".parse().unwrap();
        assert_eq!(target_path(&u, Some("port=80")), "/portforward/tok?a=1&port=80");
    }
}
