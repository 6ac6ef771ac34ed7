//! The pod-resources API (`v1.PodResourcesLister`) on `<root-dir>/pod-resources/kubelet.sock`,
//! which monitoring agents (GPU exporters and the like) read: the devices of every active pod's
//! containers (`List`, `Get`) and of the node (`GetAllocatableResources`). Gantry has no CPU
//! or memory manager, so CPU IDs and memory are empty, as upstream reports them with the
//! `none` policies. `Get` is served as its gate (`KubeletPodResourcesGet`) is on by default in
//! v1.34.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;

use gantry_vocab::spec;
use k8s_openapi::api::core::v1::Pod;
use tonic::{Request, Response, Status};

use crate::api::podresources::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use crate::api::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices, ContainerResources,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, NumaNode,
    PodResources, TopologyInfo,
};
use crate::devices::{Allocation, DeviceManager};

/// `<root-dir>/pod-resources`.
pub const DIR: &str = "pod-resources";
pub const SOCKET: &str = "kubelet.sock";
/// The NUMA node of devices whose plugin reports no topology.
const NO_TOPOLOGY: i64 = -1;
/// Upstream's limit on the socket: 100 requests a second, bursts of 10.
const QPS: u32 = 100;
const BURST: u32 = 10;

/// The pods the node runs (with their latest status), as the agent knows them.
pub trait ActivePods: Send + Sync + 'static {
    fn pods(&self) -> Vec<Pod>;
}

/// The service.
struct Lister {
    pods: Arc<dyn ActivePods>,
    devices: DeviceManager,
    limiter: governor::DefaultDirectRateLimiter,
}

fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

impl Lister {
    fn new(pods: Arc<dyn ActivePods>, devices: DeviceManager) -> Self {
        let quota = governor::Quota::per_second(NonZeroU32::new(QPS).unwrap_or(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(BURST).unwrap_or(NonZeroU32::MIN));
        Lister { pods, devices, limiter: governor::RateLimiter::direct(quota) }
    }

    /// Upstream's rate limit: a request over it fails with `ResourceExhausted`.
    fn admit(&self) -> Result<(), Status> {
        self.limiter.check().map_err(|_| Status::resource_exhausted("rejected by rate limit"))
    }

    /// One pod's containers (regular ones and sidecars) with their devices.
    fn pod_resources(&self, pod: &Pod, allocations: &[Allocation]) -> PodResources {
        let uid = spec::uid(pod);
        let spec = pod.spec.as_ref();
        let sidecars =
            spec.into_iter().flat_map(|s| s.init_containers.iter().flatten()).filter(|c| spec::is_sidecar(c));
        let containers = sidecars.chain(spec.into_iter().flat_map(|s| &s.containers));
        PodResources {
            name: spec::name(pod).to_string(),
            namespace: spec::namespace(pod).to_string(),
            containers: containers
                .map(|c| ContainerResources {
                    name: c.name.clone(),
                    devices: allocations
                        .iter()
                        .filter(|a| a.pod_uid == uid && a.container == c.name)
                        .map(|a| ContainerDevices {
                            resource_name: a.resource.clone(),
                            device_ids: a.device_ids.clone(),
                            topology: Some(TopologyInfo { nodes: vec![NumaNode { id: NO_TOPOLOGY }] }),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(&self, _: Request<ListPodResourcesRequest>) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.admit()?;
        let allocations = self.devices.allocations();
        let pod_resources =
            self.pods.pods().iter().filter(|p| is_active(p)).map(|p| self.pod_resources(p, &allocations)).collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.admit()?;
        // One entry per device, as upstream lists devices without topology.
        let devices = self
            .devices
            .registered()
            .into_iter()
            .flat_map(|(resource, ids)| {
                ids.into_iter().map(move |id| ContainerDevices {
                    resource_name: resource.clone(),
                    device_ids: vec![id],
                    topology: None,
                })
            })
            .collect();
        Ok(Response::new(AllocatableResourcesResponse { devices, cpu_ids: Vec::new(), memory: Vec::new() }))
    }

    async fn get(&self, request: Request<GetPodResourcesRequest>) -> Result<Response<GetPodResourcesResponse>, Status> {
        self.admit()?;
        let r = request.into_inner();
        let pods = self.pods.pods();
        let pod = pods
            .iter()
            .find(|p| spec::name(p) == r.pod_name && spec::namespace(p) == r.pod_namespace && is_active(p))
            .ok_or_else(|| Status::unknown(format!("pod {} in namespace {} not found", r.pod_name, r.pod_namespace)))?;
        let pod_resources = Some(self.pod_resources(pod, &self.devices.allocations()));
        Ok(Response::new(GetPodResourcesResponse { pod_resources }))
    }
}

/// Serves the API on `<root_dir>/pod-resources/kubelet.sock` for the node's lifetime.
pub async fn serve(root_dir: PathBuf, pods: Arc<dyn ActivePods>, devices: DeviceManager) {
    let socket = root_dir.join(DIR).join(SOCKET);
    let incoming = match crate::dial::listen(&socket) {
        Ok(incoming) => incoming,
        Err(e) => {
            tracing::error!(socket = %socket.display(), error = %e, "cannot serve the pod resources API");
            return std::future::pending().await;
        }
    };
    tracing::info!(socket = %socket.display(), "serving the pod resources API");
    let service = PodResourcesListerServer::new(Lister::new(pods, devices));
    if let Err(e) = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await {
        tracing::error!(error = %e, "the pod resources API stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoPods;

    impl ActivePods for NoPods {
        fn pods(&self) -> Vec<Pod> {
            Vec::new()
        }
    }

    #[tokio::test]
    async fn requests_over_upstreams_rate_limit_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let (devices, _tasks) = DeviceManager::new(root.path(), Default::default());
        let lister = Lister::new(Arc::new(NoPods), devices);
        let mut refused = None;
        for _ in 0..=BURST {
            if let Err(status) = lister.list(Request::new(ListPodResourcesRequest {})).await {
                refused = Some(status);
                break;
            }
        }
        let status = refused.expect("the burst is limited");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(status.message(), "rejected by rate limit");
    }
}
