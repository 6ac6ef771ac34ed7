//! Accept loops: TLS (recording the verified client certificate for authentication) or plain
//! HTTP, each connection served by hyper with HTTP upgrades (exec, attach, port-forward).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use futures::future::BoxFuture;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// A client that does not finish the TLS handshake in this time is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed accept (e.g. out of file descriptors) wait before the next one instead of
/// spinning.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The client certificate the TLS layer verified for this connection, if any.
#[derive(Clone, Debug, Default)]
pub struct PeerCertificate(pub Option<CertificateDer<'static>>);

/// Serves until dropped; the connections are the loop's own tasks and end with it.
pub async fn https(listener: TcpListener, tls: Arc<rustls::ServerConfig>, router: Router) {
    let acceptor = TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    loop {
        let Some((tcp, remote)) = accept(&listener, &mut connections).await else { continue };
        let (acceptor, router) = (acceptor.clone(), router.clone());
        connections.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(%remote, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let peer = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| c.clone().into_owned());
            serve_connection(TokioIo::new(stream), router, PeerCertificate(peer)).await;
        });
    }
}

/// Serves until dropped; the connections are the loop's own tasks and end with it.
pub async fn http(listener: TcpListener, router: Router) {
    let mut connections = JoinSet::new();
    loop {
        let Some((tcp, _)) = accept(&listener, &mut connections).await else { continue };
        connections.spawn(serve_connection(TokioIo::new(tcp), router.clone(), PeerCertificate(None)));
    }
}

/// The next connection, reaping finished connection tasks meanwhile.
async fn accept(
    listener: &TcpListener,
    connections: &mut JoinSet<()>,
) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
    loop {
        tokio::select! {
            accepted = listener.accept() => return match accepted {
                Ok(conn) => Some(conn),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    None
                }
            },
            Some(_) = connections.join_next() => {}
        }
    }
}

/// Work a request leaves to its connection to finish after the response: the byte relay of
/// an upgraded stream (exec, attach, port-forward) and the runtime connection it talks to.
/// They run as the connection's own tasks, so they end when the connection's task ends, and
/// that task belongs to its accept loop: nothing outlives the loop that the node supervises.
#[derive(Clone, Debug)]
pub struct ConnectionTasks(mpsc::UnboundedSender<BoxFuture<'static, ()>>);

impl ConnectionTasks {
    /// Runs `task` as one of the connection's tasks (dropped unrun if the connection is gone).
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let _ = self.0.send(Box::pin(task));
    }
}

async fn serve_connection<I>(io: I, router: Router, peer: PeerCertificate)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (tx, mut requests) = mpsc::unbounded_channel();
    let tasks = ConnectionTasks(tx);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(peer.clone());
        req.extensions_mut().insert(tasks.clone());
        let router = router.clone();
        async move { Ok::<_, Infallible>(router.oneshot(req).await.unwrap_or_else(|e| match e {})) }
    });
    let builder = Builder::new(TokioExecutor::new());
    let builder = builder.http1_only();
    let connection = builder.serve_connection_with_upgrades(io, service);
    let mut connection = std::pin::pin!(connection);
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            result = &mut connection => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                break;
            }
            Some(task) = requests.recv() => {
                running.spawn(task);
            }
            Some(_) = running.join_next() => {}
        }
    }
    // An upgraded connection ends here while its relay goes on: wait for the relays (they end
    // with either side of the stream), and abort them if this task is dropped first.
    requests.close();
    while let Ok(task) = requests.try_recv() {
        running.spawn(task);
    }
    while running.join_next().await.is_some() {}
}
