//! A CRI image service stand-in for image tests: it forwards calls to the private containerd's
//! real image service, but reports one configured image as `pinned: true` (containerd 1.6
//! never does), records every `RemoveImage` and `PullImage` call (image, credentials, timing),
//! can hold pulls for a while (to observe concurrency), and answers pulls of images containerd
//! already has itself, so tests never reach a registry.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_cri::api::image_service_client::ImageServiceClient;
use gantry_cri::api::image_service_server::{ImageService, ImageServiceServer};
use gantry_cri::api::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::cri;

/// The running stand-in; stops serving when dropped.
pub struct PinningImageService {
    socket: PathBuf,
    state: Arc<Mutex<State>>,
    server: tokio::task::JoinHandle<()>,
}

/// One `PullImage` call as the stand-in saw it.
#[derive(Clone, Debug)]
pub struct PullRecord {
    pub image: String,
    pub auth: Option<AuthConfig>,
    pub started: Instant,
    pub finished: Instant,
}

#[derive(Default)]
struct State {
    removed: Vec<String>,
    pulls: Vec<PullRecord>,
    in_flight: usize,
    max_in_flight: usize,
    pull_delay: Duration,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl PinningImageService {
    /// Serves on `socket`, forwarding to the image service on `upstream`, reporting the image
    /// named `pinned` (any of its tags or digests) as pinned.
    pub async fn start(socket: &Path, upstream: &Path, pinned: &str) -> crate::Result<Self> {
        let client = cri::image_client(upstream).await?;
        let state = Arc::new(Mutex::new(State::default()));
        let service = Forwarder { client, pinned: pinned.to_string(), state: state.clone() };
        let incoming = cri::serve_socket(socket)?;
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(ImageServiceServer::new(service))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "pinning image service stopped");
            }
        });
        Ok(PinningImageService { socket: socket.to_path_buf(), state, server })
    }

    /// `unix://` endpoint for `--image-service-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The image of every `RemoveImage` call so far, in order.
    pub fn removed(&self) -> Vec<String> {
        lock(&self.state).removed.clone()
    }

    /// Every finished `PullImage` call so far, in the order they finished.
    pub fn pulls(&self) -> Vec<PullRecord> {
        lock(&self.state).pulls.clone()
    }

    /// The most `PullImage` calls that were in progress at the same time.
    pub fn max_concurrent_pulls(&self) -> usize {
        lock(&self.state).max_in_flight
    }

    /// Holds every following pull this long before answering it.
    pub fn set_pull_delay(&self, delay: Duration) {
        lock(&self.state).pull_delay = delay;
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
    state: Arc<Mutex<State>>,
}

impl Forwarder {
    fn mark(&self, mut image: Image) -> Image {
        let pinned = &self.pinned;
        image.pinned = image.repo_tags.iter().chain(&image.repo_digests).any(|n| n == pinned) || &image.id == pinned;
        image
    }
}

impl Forwarder {
    /// An image containerd already has is "pulled" without asking a registry.
    async fn pull(&self, request: PullImageRequest) -> Result<Response<PullImageResponse>, Status> {
        let status = ImageStatusRequest { image: request.image.clone(), verbose: false };
        if let Some(image) = self.client.clone().image_status(status).await?.into_inner().image {
            return Ok(Response::new(PullImageResponse { image_ref: image.id }));
        }
        self.client.clone().pull_image(request).await
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
        let request = request.into_inner();
        let started = Instant::now();
        let delay = {
            let mut state = lock(&self.state);
            state.in_flight += 1;
            state.max_in_flight = state.max_in_flight.max(state.in_flight);
            state.pull_delay
        };
        tokio::time::sleep(delay).await;
        let result = self.pull(request.clone()).await;
        let mut state = lock(&self.state);
        state.in_flight -= 1;
        let image = request.image.map(|i| i.image).unwrap_or_default();
        state.pulls.push(PullRecord { image, auth: request.auth, started, finished: Instant::now() });
        result
    }

    async fn remove_image(
        &self,
        request: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        let request = request.into_inner();
        let image = request.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        lock(&self.state).removed.push(image);
        self.client.clone().remove_image(request).await
    }

    async fn image_fs_info(
        &self,
        request: Request<ImageFsInfoRequest>,
    ) -> Result<Response<ImageFsInfoResponse>, Status> {
        self.client.clone().image_fs_info(request.into_inner()).await
    }
}
