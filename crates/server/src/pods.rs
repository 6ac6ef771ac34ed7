//! `/pods` and the pod/container lookups the streaming endpoints share.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;

use gantry_cri::api;
use gantry_vocab::{cri_labels, spec};

use super::ServerState;

/// `GET /pods`: the v1 PodList of the pods this node runs, with their latest status.
pub async fn list(State(state): State<ServerState>) -> Response {
    let items = state.pod_copies();
    Json(serde_json::json!({ "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items })).into_response()
}

/// A request the handlers refuse, with the status and message the client sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into() }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, self.message).into_response()
    }
}

/// The pod `namespace/name` (and, in the `/{podUID}/` forms, that UID) among `pods`.
pub fn find_pod<'a>(pods: &'a [Pod], namespace: &str, name: &str, uid: Option<&str>) -> Result<&'a Pod, ApiError> {
    pods.iter()
        .find(|p| {
            p.metadata.namespace.as_deref().unwrap_or("default") == namespace
                && p.metadata.name.as_deref() == Some(name)
                && uid.is_none_or(|u| p.metadata.uid.as_deref() == Some(u))
        })
        .ok_or_else(|| ApiError::not_found("pod does not exist"))
}

/// Whether the pod spec declares `container` (regular, init or ephemeral).
pub fn declares_container(pod: &Pod, container: &str) -> bool {
    let Some(spec) = &pod.spec else { return false };
    spec.containers.iter().any(|c| c.name == container)
        || spec.init_containers.iter().flatten().any(|c| c.name == container)
        || spec.ephemeral_containers.iter().flatten().any(|c| c.name == container)
}

fn container_not_found(container: &str) -> ApiError {
    ApiError::not_found(format!("container not found ({container:?})"))
}

/// The pod and the runtime ID of the running instance of `container` in it.
pub async fn running_container(
    state: &ServerState,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    container: &str,
) -> Result<(Pod, String), ApiError> {
    let pods = state.pod_copies();
    let pod = find_pod(&pods, namespace, name, uid)?.clone();
    if !declares_container(&pod, container) {
        return Err(container_not_found(container));
    }
    let mut labels = cri_labels::of_pod(state.node_name(), spec::uid(&pod));
    labels.insert(cri_labels::CONTAINER_NAME.to_string(), container.to_string());
    let running = api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 };
    let filter = api::ContainerFilter { state: Some(running), label_selector: labels, ..Default::default() };
    let listed = state.cri().runtime.list_containers(api::ListContainersRequest { filter: Some(filter) }).await;
    let containers = listed.map_err(|e| ApiError::internal(e.to_string()))?.containers;
    let attempt = |c: &api::Container| c.metadata.as_ref().map_or(0, |m| m.attempt);
    let id = containers.into_iter().max_by_key(attempt).map(|c| c.id).ok_or_else(|| container_not_found(container))?;
    Ok((pod, id))
}

/// The pod and the ID of its current sandbox, if ready (port-forward targets the pod's network
/// namespace).
pub async fn ready_sandbox(
    state: &ServerState,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<(Pod, String), ApiError> {
    let pods = state.pod_copies();
    let pod = find_pod(&pods, namespace, name, uid)?.clone();
    let labels = cri_labels::of_pod(state.node_name(), spec::uid(&pod));
    let filter = api::PodSandboxFilter { label_selector: labels, ..Default::default() };
    let listed = state.cri().runtime.list_pod_sandbox(api::ListPodSandboxRequest { filter: Some(filter) }).await;
    let sandboxes = listed.map_err(|e| ApiError::internal(e.to_string()))?.items;
    let sandbox = sandboxes
        .into_iter()
        .max_by_key(|s| s.created_at)
        .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        .map(|s| s.id)
        .ok_or_else(|| ApiError::not_found("pod does not exist"))?;
    Ok((pod, sandbox))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, uid: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": uid},
            "spec": {"containers": [{"name": "main"}], "initContainers": [{"name": "init"}]},
        }))
        .unwrap()
    }

    #[test]
    fn pods_are_found_by_namespace_name_and_optional_uid() {
        let pods = vec![pod("default", "a", "u1"), pod("kube-system", "a", "u2")];
        assert_eq!(find_pod(&pods, "kube-system", "a", None).unwrap().metadata.uid.as_deref(), Some("u2"));
        assert_eq!(find_pod(&pods, "default", "a", Some("u1")).unwrap().metadata.uid.as_deref(), Some("u1"));
        let err = find_pod(&pods, "default", "a", Some("u2")).unwrap_err();
        assert_eq!((err.status, err.message.as_str()), (StatusCode::NOT_FOUND, "pod does not exist"));
        assert!(find_pod(&pods, "other", "a", None).is_err());
    }

    #[test]
    fn containers_of_every_kind_are_declared() {
        let p = pod("default", "a", "u1");
        assert!(declares_container(&p, "main") && declares_container(&p, "init"));
        assert!(!declares_container(&p, "nope"));
        assert_eq!(container_not_found("nope").message, "container not found (\"nope\")");
    }
}
