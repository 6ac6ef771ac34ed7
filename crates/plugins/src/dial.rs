//! gRPC over unix sockets, both ways: a channel to a plugin's socket, and the incoming
//! connections of a socket the node serves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Uri};
use tower::service_fn;

/// How long dialling a plugin may take (upstream's 10 s).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A channel to the gRPC server on `socket`, connected once now (so that a missing or dead
/// socket is an error here, not on the first call).
pub async fn channel(socket: &Path) -> Result<Channel, std::io::Error> {
    let path = socket.to_path_buf();
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_timeout(DIAL_TIMEOUT)
        .connect_with_connector(service_fn(move |_: Uri| dial(path.clone())))
        .await
        .map_err(std::io::Error::other)
}

async fn dial(path: PathBuf) -> std::io::Result<TokioIo<UnixStream>> {
    Ok(TokioIo::new(UnixStream::connect(path).await?))
}

/// Binds `socket` (replacing a stale socket file, creating its directory) and returns its
/// incoming connections, for tonic's `serve_with_incoming`.
pub fn listen(
    socket: &Path,
) -> Result<impl futures::Stream<Item = std::io::Result<UnixStream>> + Send + 'static, std::io::Error> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(socket)?;
    Ok(futures::stream::unfold(listener, |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) }))
}
