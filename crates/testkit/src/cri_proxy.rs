//! A CRI proxy for fault injection: it serves CRI v1 (runtime and image services) on its own
//! unix socket and forwards every call to a real runtime (the private containerd), unless a
//! fault scripted by the test applies: a delay, a failure (`Unavailable`, as a runtime that
//! went away) or a hang until the test releases it, for one method and optionally for one pod
//! only; and it can cut every open connection at once, as a runtime that crashed mid-call.
//! Point the agent at [`CriProxy::endpoint`] with `--container-runtime-endpoint`.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use gantry_cri::api::image_service_client::ImageServiceClient;
use gantry_cri::api::image_service_server::{ImageService, ImageServiceServer};
use gantry_cri::api::runtime_service_client::RuntimeServiceClient;
use gantry_cri::api::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use gantry_cri::api::*;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::cri;

/// The label with which the kubelet names a sandbox's or container's pod.
const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";

/// What a scripted fault does to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CriFault {
    /// Wait this long, then forward.
    Delay(Duration),
    /// Answer `Unavailable` without forwarding.
    Fail,
    /// Wait, unanswered, until [`CriProxy::release`] (the caller's deadline may end it first),
    /// then forward.
    Hang,
}

/// One call the proxy received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyCall {
    /// The CRI method (`CreateContainer`).
    pub method: &'static str,
    /// The pod the call is about, when the request names it or a fault needed to know it.
    pub pod: Option<String>,
    pub at: Instant,
}

struct Rule {
    method: String,
    pod: Option<String>,
    fault: CriFault,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    calls: Vec<ProxyCall>,
    /// Pod names of sandbox and container IDs, as the runtime labels them.
    pods: HashMap<String, String>,
    /// A duplicate of each connection accepted since the last cut: shutting one down ends the
    /// connection for both ends, whoever holds the other descriptor.
    connections: Vec<OwnedFd>,
}

struct Shared {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

/// The running proxy; stops serving when dropped.
pub struct CriProxy {
    socket: PathBuf,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl CriProxy {
    /// Serves on `socket`, forwarding to the CRI runtime on `upstream`.
    pub async fn start(socket: &Path, upstream: &Path) -> crate::Result<Self> {
        let channel = cri::connect(upstream).await?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: watch::Sender::new(0),
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        });
        let proxy = Proxy(shared.clone());
        let accepted = shared.clone();
        let incoming = cri::serve_socket(socket)?.inspect(move |conn| {
            if let Ok(stream) = conn
                && let Ok(fd) = stream.as_fd().try_clone_to_owned()
            {
                accepted.lock().connections.push(fd);
            }
        });
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(proxy.clone()))
                .add_service(ImageServiceServer::new(proxy))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "CRI proxy stopped");
            }
        });
        Ok(CriProxy { socket: socket.to_path_buf(), shared, server })
    }

    /// `unix://` endpoint for `--container-runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Every following `method` call about `pod` (any call if `None`) waits `delay` first.
    pub fn delay(&self, method: &str, pod: Option<&str>, delay: Duration) {
        self.add(method, pod, CriFault::Delay(delay));
    }

    /// Every following `method` call about `pod` (any call if `None`) fails with
    /// `Unavailable`, until [`release`](Self::release).
    pub fn fail(&self, method: &str, pod: Option<&str>) {
        self.add(method, pod, CriFault::Fail);
    }

    /// Every `method` call about `pod` (any call if `None`) hangs until
    /// [`release`](Self::release).
    pub fn hang(&self, method: &str, pod: Option<&str>) {
        self.add(method, pod, CriFault::Hang);
    }

    fn add(&self, method: &str, pod: Option<&str>, fault: CriFault) {
        let rule = Rule { method: method.to_string(), pod: pod.map(str::to_string), fault };
        self.shared.lock().rules.push(rule);
        self.shared.changed.send_modify(|v| *v += 1);
    }

    /// Drops every fault scripted for `method`; hung calls are forwarded now.
    pub fn release(&self, method: &str) {
        self.shared.lock().rules.retain(|r| r.method != method);
        self.shared.changed.send_modify(|v| *v += 1);
    }

    /// Cuts every connection open now (both directions shut down): calls in flight fail on
    /// the client's side, and a client that dials again is served as before.
    pub fn drop_connections(&self) {
        let connections = std::mem::take(&mut self.shared.lock().connections);
        for fd in connections {
            // Already closed by its peer: nothing to cut.
            let _ = std::os::unix::net::UnixStream::from(fd).shutdown(std::net::Shutdown::Both);
        }
    }

    /// Every call received so far, in arrival order.
    pub fn calls(&self) -> Vec<ProxyCall> {
        self.shared.lock().calls.clone()
    }

    /// The calls of `method` received so far.
    pub fn calls_of(&self, method: &str) -> Vec<ProxyCall> {
        self.calls().into_iter().filter(|c| c.method == method).collect()
    }
}

impl Drop for CriProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a request is about, for faults limited to one pod.
enum Subject<'a> {
    Nothing,
    Pod(&'a str),
    Sandbox(&'a str),
    Container(&'a str),
}

trait About {
    fn about(&self) -> Subject<'_>;
}

macro_rules! about {
    ($($req:ty => |$r:ident| $subject:expr;)*) => {
        $(impl About for $req {
            fn about(&self) -> Subject<'_> {
                let $r = self;
                $subject
            }
        })*
    };
}

fn pod_of(config: &Option<PodSandboxConfig>) -> Subject<'_> {
    config.as_ref().and_then(|c| c.metadata.as_ref()).map_or(Subject::Nothing, |m| Subject::Pod(&m.name))
}

about! {
    VersionRequest => |_r| Subject::Nothing;
    RunPodSandboxRequest => |r| pod_of(&r.config);
    StopPodSandboxRequest => |r| Subject::Sandbox(&r.pod_sandbox_id);
    RemovePodSandboxRequest => |r| Subject::Sandbox(&r.pod_sandbox_id);
    PodSandboxStatusRequest => |r| Subject::Sandbox(&r.pod_sandbox_id);
    ListPodSandboxRequest => |_r| Subject::Nothing;
    CreateContainerRequest => |r| pod_of(&r.sandbox_config);
    StartContainerRequest => |r| Subject::Container(&r.container_id);
    StopContainerRequest => |r| Subject::Container(&r.container_id);
    RemoveContainerRequest => |r| Subject::Container(&r.container_id);
    ListContainersRequest => |_r| Subject::Nothing;
    ContainerStatusRequest => |r| Subject::Container(&r.container_id);
    UpdateContainerResourcesRequest => |r| Subject::Container(&r.container_id);
    ReopenContainerLogRequest => |r| Subject::Container(&r.container_id);
    ExecSyncRequest => |r| Subject::Container(&r.container_id);
    ExecRequest => |r| Subject::Container(&r.container_id);
    AttachRequest => |r| Subject::Container(&r.container_id);
    PortForwardRequest => |r| Subject::Sandbox(&r.pod_sandbox_id);
    ContainerStatsRequest => |r| Subject::Container(&r.container_id);
    ListContainerStatsRequest => |_r| Subject::Nothing;
    PodSandboxStatsRequest => |r| Subject::Sandbox(&r.pod_sandbox_id);
    ListPodSandboxStatsRequest => |_r| Subject::Nothing;
    UpdateRuntimeConfigRequest => |_r| Subject::Nothing;
    StatusRequest => |_r| Subject::Nothing;
    CheckpointContainerRequest => |r| Subject::Container(&r.container_id);
    GetEventsRequest => |_r| Subject::Nothing;
    ListMetricDescriptorsRequest => |_r| Subject::Nothing;
    ListPodSandboxMetricsRequest => |_r| Subject::Nothing;
    RuntimeConfigRequest => |_r| Subject::Nothing;
    ListImagesRequest => |_r| Subject::Nothing;
    ImageStatusRequest => |_r| Subject::Nothing;
    PullImageRequest => |_r| Subject::Nothing;
    RemoveImageRequest => |_r| Subject::Nothing;
    ImageFsInfoRequest => |_r| Subject::Nothing;
}

#[derive(Clone)]
struct Proxy(Arc<Shared>);

impl Proxy {
    /// The pod a call is about: named by the request, or looked up by ID (only when a fault
    /// for this method is limited to a pod, so unfaulted calls cost nothing extra).
    async fn pod(&self, method: &str, subject: Subject<'_>) -> Option<String> {
        let id = match subject {
            Subject::Nothing => return None,
            Subject::Pod(name) => return Some(name.to_string()),
            Subject::Sandbox(id) | Subject::Container(id) => id,
        };
        {
            let state = self.0.lock();
            if let Some(pod) = state.pods.get(id) {
                return Some(pod.clone());
            }
            if !state.rules.iter().any(|r| r.method == method && r.pod.is_some()) {
                return None;
            }
        }
        let labels = match subject {
            Subject::Sandbox(_) => {
                let request = PodSandboxStatusRequest { pod_sandbox_id: id.to_string(), verbose: false };
                let status = self.0.runtime.clone().pod_sandbox_status(request).await.ok()?.into_inner().status;
                status?.labels
            }
            _ => {
                let request = ContainerStatusRequest { container_id: id.to_string(), verbose: false };
                let status = self.0.runtime.clone().container_status(request).await.ok()?.into_inner().status;
                status?.labels
            }
        };
        let pod = labels.get(POD_NAME_LABEL)?.clone();
        self.0.lock().pods.insert(id.to_string(), pod.clone());
        Some(pod)
    }

    /// The fault for a call now, if any.
    fn fault(&self, method: &str, pod: Option<&str>) -> Option<CriFault> {
        let state = self.0.lock();
        let applies = |r: &&Rule| r.method == method && r.pod.as_deref().is_none_or(|p| Some(p) == pod);
        state.rules.iter().find(applies).map(|r| r.fault)
    }

    /// Records the call and applies its fault; Ok to forward it.
    async fn enter(&self, method: &'static str, subject: Subject<'_>) -> Result<(), Status> {
        let pod = self.pod(method, subject).await;
        self.0.lock().calls.push(ProxyCall { method, pod: pod.clone(), at: Instant::now() });
        let mut changes = self.0.changed.subscribe();
        loop {
            match self.fault(method, pod.as_deref()) {
                None => return Ok(()),
                Some(CriFault::Delay(d)) => {
                    tokio::time::sleep(d).await;
                    return Ok(());
                }
                Some(CriFault::Fail) => {
                    return Err(Status::unavailable(format!("CRI proxy: {method} fails as scripted")));
                }
                Some(CriFault::Hang) => {
                    tracing::debug!(method, pod, "CRI proxy: holding the call");
                    if changes.changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// The trait implementation forwarding each listed method through `enter`, with `extra` items
/// (streaming methods) pasted in as they are.
macro_rules! forward {
    ($trait:ident, $client:ident, { $($extra:tt)* } $($method:ident $name:literal ($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl $trait for Proxy {
            $(async fn $method(&self, request: Request<$req>) -> Result<Response<$resp>, Status> {
                let request = request.into_inner();
                self.enter($name, request.about()).await?;
                self.0.$client.clone().$method(request).await
            })*

            $($extra)*
        }
    };
}

forward! { RuntimeService, runtime, {
        type GetContainerEventsStream = tonic::Streaming<ContainerEventResponse>;

        async fn get_container_events(
            &self,
            request: Request<GetEventsRequest>,
        ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
            let request = request.into_inner();
            self.enter("GetContainerEvents", request.about()).await?;
            self.0.runtime.clone().get_container_events(request).await
        }
    }
    version "Version" (VersionRequest) -> VersionResponse;
    run_pod_sandbox "RunPodSandbox" (RunPodSandboxRequest) -> RunPodSandboxResponse;
    stop_pod_sandbox "StopPodSandbox" (StopPodSandboxRequest) -> StopPodSandboxResponse;
    remove_pod_sandbox "RemovePodSandbox" (RemovePodSandboxRequest) -> RemovePodSandboxResponse;
    pod_sandbox_status "PodSandboxStatus" (PodSandboxStatusRequest) -> PodSandboxStatusResponse;
    list_pod_sandbox "ListPodSandbox" (ListPodSandboxRequest) -> ListPodSandboxResponse;
    create_container "CreateContainer" (CreateContainerRequest) -> CreateContainerResponse;
    start_container "StartContainer" (StartContainerRequest) -> StartContainerResponse;
    stop_container "StopContainer" (StopContainerRequest) -> StopContainerResponse;
    remove_container "RemoveContainer" (RemoveContainerRequest) -> RemoveContainerResponse;
    list_containers "ListContainers" (ListContainersRequest) -> ListContainersResponse;
    container_status "ContainerStatus" (ContainerStatusRequest) -> ContainerStatusResponse;
    update_container_resources "UpdateContainerResources" (UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse;
    reopen_container_log "ReopenContainerLog" (ReopenContainerLogRequest) -> ReopenContainerLogResponse;
    exec_sync "ExecSync" (ExecSyncRequest) -> ExecSyncResponse;
    exec "Exec" (ExecRequest) -> ExecResponse;
    attach "Attach" (AttachRequest) -> AttachResponse;
    port_forward "PortForward" (PortForwardRequest) -> PortForwardResponse;
    container_stats "ContainerStats" (ContainerStatsRequest) -> ContainerStatsResponse;
    list_container_stats "ListContainerStats" (ListContainerStatsRequest) -> ListContainerStatsResponse;
    pod_sandbox_stats "PodSandboxStats" (PodSandboxStatsRequest) -> PodSandboxStatsResponse;
    list_pod_sandbox_stats "ListPodSandboxStats" (ListPodSandboxStatsRequest) -> ListPodSandboxStatsResponse;
    update_runtime_config "UpdateRuntimeConfig" (UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse;
    status "Status" (StatusRequest) -> StatusResponse;
    checkpoint_container "CheckpointContainer" (CheckpointContainerRequest) -> CheckpointContainerResponse;
    list_metric_descriptors "ListMetricDescriptors" (ListMetricDescriptorsRequest) -> ListMetricDescriptorsResponse;
    list_pod_sandbox_metrics "ListPodSandboxMetrics" (ListPodSandboxMetricsRequest) -> ListPodSandboxMetricsResponse;
    runtime_config "RuntimeConfig" (RuntimeConfigRequest) -> RuntimeConfigResponse;
}

forward! { ImageService, images, {}
    list_images "ListImages" (ListImagesRequest) -> ListImagesResponse;
    image_status "ImageStatus" (ImageStatusRequest) -> ImageStatusResponse;
    pull_image "PullImage" (PullImageRequest) -> PullImageResponse;
    remove_image "RemoveImage" (RemoveImageRequest) -> RemoveImageResponse;
    image_fs_info "ImageFsInfo" (ImageFsInfoRequest) -> ImageFsInfoResponse;
}
