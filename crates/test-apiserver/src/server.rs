//! The listener: TLS on 127.0.0.1, HTTP/1.1 or HTTP/2 per connection (ALPN; at most
//! [`HTTP2_MAX_STREAMS`] streams at once, as kube-apiserver), each connection accounted, and a clean stop
//! that closes the listener (so connections are refused) and every open connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::handlers;
use crate::pki;
use crate::state::State;

const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The HTTP/2 streams one connection may have open at once (kube-apiserver's default).
pub const HTTP2_MAX_STREAMS: u32 = 100;

/// Binds 127.0.0.1:`port` (0 for any), reusing the address so a restart can take the same
/// port back at once.
pub fn bind(port: u16) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    socket.listen(1024)
}

/// A serving period: the accept loop and its connections.
pub struct Serving {
    cancel: CancellationToken,
    tracker: TaskTracker,
    accept: JoinHandle<()>,
}

impl Serving {
    pub fn start(state: Arc<State>, listener: TcpListener, cancel: CancellationToken) -> Serving {
        let tracker = TaskTracker::new();
        let acceptor = TlsAcceptor::from(state.pki.server_config());
        let accept = tokio::spawn(accept_loop(state, listener, acceptor, cancel.clone(), tracker.clone()));
        Serving { cancel, tracker, accept }
    }

    /// Closes the listener and every connection, and waits until they are gone.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.accept.await;
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Stops without waiting (for Drop).
    pub fn abort(&self) {
        self.cancel.cancel();
    }
}

async fn accept_loop(
    state: Arc<State>,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    tracker.spawn(connection(state.clone(), tcp, acceptor.clone(), cancel.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
        }
    }
}

async fn connection(state: Arc<State>, tcp: TcpStream, acceptor: TlsAcceptor, cancel: CancellationToken) {
    let _ = tcp.set_nodelay(true);
    let handshake = tokio::select! {
        r = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)) => r,
        _ = cancel.cancelled() => return,
    };
    let tls = match handshake {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|c| pki::identity_from_cert(c))
        .map(Arc::new);
    let http2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let accounted = state.clone();
    let guard = accounted.accounting.connected(http2);
    let id = guard.id;
    let service = service_fn(move |req| handlers::serve(state.clone(), cert.clone(), id, req));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // kube-apiserver's default `--http2-max-streams-per-connection`.
    builder.http2().max_concurrent_streams(HTTP2_MAX_STREAMS);
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    let dropped = accounted.faults.connection_token();
    tokio::select! {
        result = conn => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        _ = cancel.cancelled() => {}
        _ = dropped.cancelled() => tracing::debug!("connection dropped by an injected fault"),
    }
}
