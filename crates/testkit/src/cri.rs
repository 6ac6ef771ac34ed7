//! Raw CRI v1 clients over a unix socket, from the generated code in `gantry-cri`.
//!
//! The harness deliberately does not use Gantry's own CRI layer: it must keep
//! working (and measure a floor) even while that layer is being changed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gantry_cri::api::image_service_client::ImageServiceClient;
use gantry_cri::api::runtime_service_client::RuntimeServiceClient;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{IoContext, Result, TestkitError};

/// Open a gRPC channel to the CRI server listening on `socket`.
pub async fn connect(socket: &Path) -> Result<Channel> {
    let path: PathBuf = socket.to_path_buf();
    // The URI is required by tonic but unused: the connector ignores it.
    Endpoint::from_static("http://[::]:50051")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| TestkitError::Connect { path: socket.to_path_buf(), source })
}

/// CRI runtime service client on `socket`.
pub async fn runtime_client(socket: &Path) -> Result<RuntimeServiceClient<Channel>> {
    Ok(RuntimeServiceClient::new(connect(socket).await?))
}

/// CRI image service client on `socket`.
pub async fn image_client(socket: &Path) -> Result<ImageServiceClient<Channel>> {
    Ok(ImageServiceClient::new(connect(socket).await?))
}

/// Stop and remove every sandbox matching `labels` (all sandboxes if empty),
/// concurrently; returns how many were removed. Stopping kills the
/// containers, tears down the pod network and unmounts; removing deletes the
/// containers and the sandbox record.
pub async fn remove_sandboxes(client: &RuntimeServiceClient<Channel>, labels: &[(&str, &str)]) -> Result<usize> {
    use gantry_cri::api::{ListPodSandboxRequest, PodSandboxFilter};
    let filter = PodSandboxFilter {
        label_selector: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };
    let sandboxes = client
        .clone()
        .list_pod_sandbox(ListPodSandboxRequest { filter: Some(filter) })
        .await
        .map_err(TestkitError::cri("ListPodSandbox"))?
        .into_inner()
        .items;
    let mut removals = tokio::task::JoinSet::new();
    for sandbox in &sandboxes {
        removals.spawn(remove_sandbox(client.clone(), sandbox.id.clone()));
    }
    while let Some(joined) = removals.join_next().await {
        joined.expect("sandbox removal task panicked")?;
    }
    Ok(sandboxes.len())
}

async fn remove_sandbox(mut client: RuntimeServiceClient<Channel>, id: String) -> Result<()> {
    use gantry_cri::api::{RemovePodSandboxRequest, StopPodSandboxRequest};
    client
        .stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: id.clone() })
        .await
        .map_err(TestkitError::cri("StopPodSandbox"))?;
    client
        .remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id.clone() })
        .await
        .map_err(TestkitError::cri("RemovePodSandbox"))?;
    tracing::debug!(sandbox = %id, "removed sandbox");
    Ok(())
}

/// Binds a gRPC server's unix socket (replacing a stale socket file) and returns its incoming
/// connections, for tonic's `serve_with_incoming`.
pub(crate) fn serve_socket(
    socket: &Path,
) -> Result<impl futures::Stream<Item = std::io::Result<UnixStream>> + Send + 'static> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).ctx(|| format!("bind {}", socket.display()))?;
    Ok(futures::stream::unfold(listener, |l| async move {
        let conn = l.accept().await.map(|(stream, _)| stream);
        Some((conn, l))
    }))
}
