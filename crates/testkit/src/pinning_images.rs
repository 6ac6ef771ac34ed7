//! A CRI image service stand-in for image garbage collection tests: it forwards every call to
//! the private containerd's real image service, but reports one configured image as
//! `pinned: true` (containerd 1.6 never does) and records every `RemoveImage` call.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::*;
use tokio::net::UnixListener;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::cri;
use crate::error::IoContext;

/// The running stand-in; stops serving when dropped.
pub struct PinningImageService {
    socket: PathBuf,
    removed: Arc<Mutex<Vec<String>>>,
    server: tokio::task::JoinHandle<()>,
}

impl PinningImageService {
    /// Serves on `socket`, forwarding to the image service on `upstream`, reporting the image
    /// named `pinned` (any of its tags or digests) as pinned.
    pub async fn start(socket: &Path, upstream: &Path, pinned: &str) -> crate::Result<Self> {
        let client = cri::image_client(upstream).await?;
        let removed = Arc::new(Mutex::new(Vec::new()));
        let service = Forwarder { client, pinned: pinned.to_string(), removed: removed.clone() };
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).ctx(|| format!("bind {}", socket.display()))?;
        let incoming = futures::stream::unfold(listener, |l| async move {
            let conn = l.accept().await.map(|(stream, _)| stream);
            Some((conn, l))
        });
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(ImageServiceServer::new(service))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "pinning image service stopped");
            }
        });
        Ok(PinningImageService { socket: socket.to_path_buf(), removed, server })
    }

    /// `unix://` endpoint for `--image-service-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The image of every `RemoveImage` call so far, in order.
    pub fn removed(&self) -> Vec<String> {
        self.removed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for PinningImageService {
    fn drop(&mut self) {
        self.server.abort();
    }
}

struct Forwarder {
    client: ImageServiceClient<Channel>,
    pinned: String,
    removed: Arc<Mutex<Vec<String>>>,
}

impl Forwarder {
    fn mark(&self, mut image: Image) -> Image {
        let pinned = &self.pinned;
        image.pinned = image.repo_tags.iter().chain(&image.repo_digests).any(|n| n == pinned) || &image.id == pinned;
        image
    }
}

#[tonic::async_trait]
impl ImageService for Forwarder {
    async fn list_images(&self, request: Request<ListImagesRequest>) -> Result<Response<ListImagesResponse>, Status> {
        let mut response = self.client.clone().list_images(request.into_inner()).await?.into_inner();
        response.images = response.images.into_iter().map(|i| self.mark(i)).collect();
        Ok(Response::new(response))
    }

    async fn image_status(
        &self,
        request: Request<ImageStatusRequest>,
    ) -> Result<Response<ImageStatusResponse>, Status> {
        let mut response = self.client.clone().image_status(request.into_inner()).await?.into_inner();
        response.image = response.image.map(|i| self.mark(i));
        Ok(Response::new(response))
    }

    async fn pull_image(&self, request: Request<PullImageRequest>) -> Result<Response<PullImageResponse>, Status> {
        self.client.clone().pull_image(request.into_inner()).await
    }

    async fn remove_image(
        &self,
        request: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        let request = request.into_inner();
        let image = request.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        self.removed.lock().unwrap_or_else(|p| p.into_inner()).push(image);
        self.client.clone().remove_image(request).await
    }

    async fn image_fs_info(
        &self,
        request: Request<ImageFsInfoRequest>,
    ) -> Result<Response<ImageFsInfoResponse>, Status> {
        self.client.clone().image_fs_info(request.into_inner()).await
    }
}
