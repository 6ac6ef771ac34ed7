//! Connected CRI clients with per-call timeouts.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::api;
use crate::api::image_service_client::ImageServiceClient;
use crate::api::runtime_service_client::RuntimeServiceClient;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Uri};
use tower::service_fn;

use crate::{Code, CriError, Endpoint};

/// Both CRI services, validated, plus what the runtime said about itself.
#[derive(Clone)]
pub struct Cri {
    pub runtime: RuntimeClient,
    pub images: ImageClient,
    pub version: api::VersionResponse,
}

impl Cri {
    /// Both clients report every call to `observer` from now on (and so do their clones).
    pub fn observed_by(mut self, observer: crate::CallObserver) -> Cri {
        self.runtime.observer = Some(observer.clone());
        self.images.observer = Some(observer);
        self
    }
}

/// Connects to the runtime (and image) endpoint and validates both with `Version`, as the Go
/// kubelet does before it starts anything. `image_endpoint` defaults to the runtime endpoint.
pub async fn connect(runtime_endpoint: &str, image_endpoint: Option<&str>, timeout: Duration) -> Result<Cri, CriError> {
    let runtime_ep = Endpoint::parse(runtime_endpoint)?;
    let image_ep = match image_endpoint {
        Some(raw) if !raw.trim().is_empty() => Endpoint::parse(raw)?,
        _ => runtime_ep.clone(),
    };
    for ep in [&runtime_ep, &image_ep] {
        if ep.deprecated_form {
            tracing::warn!(endpoint = %ep, "using a bare path as endpoint is deprecated, please use the full URL format unix:///path");
        }
    }
    let runtime_channel = open_channel(&runtime_ep, timeout).await?;
    let runtime = RuntimeClient { inner: RuntimeServiceClient::new(runtime_channel.clone()), timeout, observer: None };
    let version = validate(&runtime_ep, runtime.version(api::VersionRequest::default()).await)?;
    let image_channel = if image_ep == runtime_ep { runtime_channel } else { open_channel(&image_ep, timeout).await? };
    let images = ImageClient { inner: ImageServiceClient::new(image_channel), timeout, observer: None };
    validate_images(&image_ep, images.list_images(api::ListImagesRequest::default()).await)?;
    Ok(Cri { runtime, images, version })
}

async fn open_channel(ep: &Endpoint, timeout: Duration) -> Result<Channel, CriError> {
    let path = ep.path().to_path_buf();
    match tokio::fs::symlink_metadata(&path).await {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(CriError::SocketMissing { endpoint: ep.to_string(), path });
        }
        _ => {}
    }
    // Dial once ourselves so "not listening" is reported as such rather than as an opaque
    // transport error from the channel.
    UnixStream::connect(&path).await.map_err(|source| CriError::Unreachable {
        endpoint: ep.to_string(),
        path: path.clone(),
        source,
    })?;
    let connector_path = path.clone();
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_timeout(timeout)
        .connect_with_connector(service_fn(move |_: Uri| dial(connector_path.clone())))
        .await
        // The transport error, kept as the cause (io::Error::other keeps its text and chain).
        .map_err(|e| CriError::Unreachable { endpoint: ep.to_string(), path, source: std::io::Error::other(e) })
}

async fn dial(path: PathBuf) -> io::Result<TokioIo<UnixStream>> {
    Ok(TokioIo::new(UnixStream::connect(path).await?))
}

/// A socket that accepted our connection but fails `Version` is not a CRI v1 runtime: either
/// the service is unknown (gRPC Unimplemented) or the peer does not speak gRPC at all (the
/// Docker Engine socket answers HTTP/1.1).
fn validate(ep: &Endpoint, result: Result<api::VersionResponse, CriError>) -> Result<api::VersionResponse, CriError> {
    match result {
        Ok(v) => Ok(v),
        Err(CriError::Call { code, message, .. }) if code != Code::DeadlineExceeded => {
            Err(CriError::NotCriV1 { endpoint: ep.to_string(), detail: describe(code, &message) })
        }
        Err(other) => Err(other),
    }
}

fn validate_images(ep: &Endpoint, result: Result<api::ListImagesResponse, CriError>) -> Result<(), CriError> {
    match result {
        Ok(_) => Ok(()),
        Err(CriError::Call { code: Code::Unimplemented, message, .. }) => {
            Err(CriError::NotCriV1 { endpoint: ep.to_string(), detail: describe(Code::Unimplemented, &message) })
        }
        Err(other) => Err(other),
    }
}

fn describe(code: Code, message: &str) -> String {
    match code {
        Code::Unimplemented => format!("the service is not implemented ({message})"),
        _ if message.contains("h2") || message.contains("protocol") || message.contains("transport") => {
            format!("the socket does not speak gRPC ({message})")
        }
        code => format!("{code:?}: {message}"),
    }
}

/// Generates a thin wrapper per RPC that applies the client timeout and names the operation
/// in errors.
macro_rules! rpcs {
    ($($method:ident => $op:literal : $req:ty => $resp:ty;)*) => {
        $(
            pub async fn $method(&self, req: $req) -> Result<$resp, CriError> {
                self.call_with_timeout($op, self.timeout, |mut client, request| async move {
                    client.$method(request).await
                }, req).await
            }
        )*
    };
}

/// Shared body of every wrapper: the deadline goes both into the gRPC header (so the runtime
/// can give up) and around the future (so a stuck socket cannot hang us).
macro_rules! client_type {
    ($name:ident, $inner:ty) => {
        #[derive(Clone)]
        pub struct $name {
            inner: $inner,
            timeout: Duration,
            observer: Option<crate::CallObserver>,
        }

        impl $name {
            async fn call_with_timeout<Req, Resp, F, Fut>(
                &self,
                op: &'static str,
                timeout: Duration,
                f: F,
                req: Req,
            ) -> Result<Resp, CriError>
            where
                F: FnOnce($inner, tonic::Request<Req>) -> Fut,
                Fut: std::future::Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
            {
                let mut request = tonic::Request::new(req);
                request.set_timeout(timeout);
                let started = std::time::Instant::now();
                let result = match tokio::time::timeout(timeout, f(self.inner.clone(), request)).await {
                    Ok(Ok(resp)) => Ok(resp.into_inner()),
                    Ok(Err(status)) => Err(CriError::call(op, status)),
                    Err(_) => Err(CriError::Timeout { op, timeout }),
                };
                self.observe(op, started.elapsed(), result.is_ok());
                result
            }

            fn observe(&self, op: &'static str, elapsed: Duration, ok: bool) {
                if let Some(f) = &self.observer {
                    f(op, elapsed, ok);
                }
            }

            /// The timeout applied to each call.
            pub fn timeout(&self) -> Duration {
                self.timeout
            }
        }
    };
}

client_type!(RuntimeClient, RuntimeServiceClient<Channel>);
client_type!(ImageClient, ImageServiceClient<Channel>);

impl RuntimeClient {
    rpcs! {
        version => "Version": api::VersionRequest => api::VersionResponse;
        status => "Status": api::StatusRequest => api::StatusResponse;
        run_pod_sandbox => "RunPodSandbox": api::RunPodSandboxRequest => api::RunPodSandboxResponse;
        stop_pod_sandbox => "StopPodSandbox": api::StopPodSandboxRequest => api::StopPodSandboxResponse;
        remove_pod_sandbox => "RemovePodSandbox": api::RemovePodSandboxRequest => api::RemovePodSandboxResponse;
        pod_sandbox_status => "PodSandboxStatus": api::PodSandboxStatusRequest => api::PodSandboxStatusResponse;
        list_pod_sandbox => "ListPodSandbox": api::ListPodSandboxRequest => api::ListPodSandboxResponse;
        create_container => "CreateContainer": api::CreateContainerRequest => api::CreateContainerResponse;
        start_container => "StartContainer": api::StartContainerRequest => api::StartContainerResponse;
        remove_container => "RemoveContainer": api::RemoveContainerRequest => api::RemoveContainerResponse;
        list_containers => "ListContainers": api::ListContainersRequest => api::ListContainersResponse;
        container_status => "ContainerStatus": api::ContainerStatusRequest => api::ContainerStatusResponse;
        update_container_resources => "UpdateContainerResources":
            api::UpdateContainerResourcesRequest => api::UpdateContainerResourcesResponse;
        exec_sync => "ExecSync": api::ExecSyncRequest => api::ExecSyncResponse;
        runtime_config => "RuntimeConfig": api::RuntimeConfigRequest => api::RuntimeConfigResponse;
    }

    /// Stops a container, giving it `grace` to exit after SIGTERM. The call itself may take
    /// that long, so its deadline is the normal timeout plus the grace period (as upstream).
    pub async fn stop_container(&self, container_id: &str, grace: Duration) -> Result<(), CriError> {
        let req = api::StopContainerRequest { container_id: container_id.to_string(), timeout: grace.as_secs() as i64 };
        self.call_with_timeout(
            "StopContainer",
            self.timeout + grace,
            |mut c, r| async move { c.stop_container(r).await },
            req,
        )
        .await
        .map(|_| ())
    }
}

impl RuntimeClient {
    /// Runs `cmd` in a container and waits at most `timeout` (zero: no limit of its own); the
    /// call's deadline leaves the usual timeout on top for the runtime to clean up, as upstream.
    pub async fn exec_sync_for(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<api::ExecSyncResponse, CriError> {
        let req =
            api::ExecSyncRequest { container_id: container_id.to_string(), cmd, timeout: timeout.as_secs() as i64 };
        self.call_with_timeout("ExecSync", self.timeout + timeout, |mut c, r| async move { c.exec_sync(r).await }, req)
            .await
    }
}

impl RuntimeClient {
    // Streaming (exec, attach, port-forward): the runtime answers with a URL of its streaming
    // server, which the node API proxies the client's connection to.
    rpcs! {
        exec => "Exec": api::ExecRequest => api::ExecResponse;
        attach => "Attach": api::AttachRequest => api::AttachResponse;
        port_forward => "PortForward": api::PortForwardRequest => api::PortForwardResponse;
    }
}

impl ImageClient {
    rpcs! {
        list_images => "ListImages": api::ListImagesRequest => api::ListImagesResponse;
        image_status => "ImageStatus": api::ImageStatusRequest => api::ImageStatusResponse;
        remove_image => "RemoveImage": api::RemoveImageRequest => api::RemoveImageResponse;
        image_fs_info => "ImageFsInfo": api::ImageFsInfoRequest => api::ImageFsInfoResponse;
    }
}

impl ImageClient {
    /// PullImage has no deadline of ours, as upstream: a large image on a slow link may need
    /// longer than any per-call timeout, and the runtime bounds a stalled pull itself.
    pub async fn pull_image(&self, req: api::PullImageRequest) -> Result<api::PullImageResponse, CriError> {
        let mut client = self.inner.clone();
        let started = std::time::Instant::now();
        let result = client.pull_image(tonic::Request::new(req)).await;
        self.observe("PullImage", started.elapsed(), result.is_ok());
        match result {
            Ok(resp) => Ok(resp.into_inner()),
            Err(status) => Err(CriError::call("PullImage", status)),
        }
    }
}

/// Logs and stats (the node agent's HTTPS API and the log manager).
impl RuntimeClient {
    rpcs! {
        reopen_container_log => "ReopenContainerLog": api::ReopenContainerLogRequest => api::ReopenContainerLogResponse;
        container_stats => "ContainerStats": api::ContainerStatsRequest => api::ContainerStatsResponse;
        list_container_stats => "ListContainerStats": api::ListContainerStatsRequest => api::ListContainerStatsResponse;
        list_pod_sandbox_stats => "ListPodSandboxStats": api::ListPodSandboxStatsRequest => api::ListPodSandboxStatsResponse;
    }
}
