//! The edge to the API server for pods: the pods bound to this node as a source, mirror pods
//! for static pods, pod status reporting and final deletion, and events.

pub mod csi_node;
pub mod maintenance;
pub mod mirror;
pub mod objects;
pub mod pod_source;
pub mod retry;
pub mod status_sync;
pub mod watched;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client};

use gantry_vocab::spec;

/// What the pod workers need from the API server.
#[derive(Clone)]
pub struct ApiLink {
    pub client: Client,
}

impl ApiLink {
    /// The final delete after the pod's containers are gone: grace 0 and a UID precondition,
    /// so a new pod with the same name is never deleted by mistake.
    pub async fn delete_pod(&self, pod: &Pod) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), spec::namespace(pod));
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: pod.metadata.uid.clone(), resource_version: None }),
            ..Default::default()
        };
        match api.delete(spec::name(pod), &params).await {
            Ok(_) => {
                tracing::info!(pod = %spec::full_name(pod), pod_uid = spec::uid(pod), "pod deleted from the API server")
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => tracing::warn!(pod = %spec::full_name(pod), error = %e, "cannot delete pod from the API server"),
        }
    }
}
