//! Pod events (Pulled, Created, Started, Killing, BackOff, Failed, …) with the Go kubelet's
//! reasons and messages: always a structured log line, and in cluster mode also an Event in
//! the API server (kube-runtime's recorder, which aggregates repeats into series).

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::{Event, EventType as ApiEventType, Recorder as ApiRecorder, Reporter};

use gantry_vocab::spec;

use super::EventType;

#[derive(Clone, Default)]
pub struct Recorder {
    api: Option<ApiRecorder>,
}

impl Recorder {
    /// A recorder that also publishes to the API server, reporting as the kubelet on `node`.
    pub fn to_api(client: kube::Client, node: &str) -> Self {
        let reporter = Reporter { controller: "kubelet".into(), instance: Some(node.to_string()) };
        Recorder { api: Some(ApiRecorder::new(client, reporter)) }
    }

    pub fn record(&self, pod: &Pod, container: Option<&str>, kind: EventType, reason: &str, message: &str) {
        log(pod, container, kind, reason, message);
        let Some(api) = self.api.clone() else { return };
        let event = Event {
            type_: match kind {
                EventType::Normal => ApiEventType::Normal,
                EventType::Warning => ApiEventType::Warning,
            },
            reason: reason.to_string(),
            note: Some(message.to_string()),
            action: reason.to_string(),
            secondary: None,
        };
        let reference = reference(pod, container);
        // Events are best effort and must never hold up the pod's worker.
        tokio::spawn(async move {
            if let Err(e) = api.publish(&event, &reference).await {
                tracing::debug!(error = %e, "cannot publish event");
            }
        });
    }
}

fn log(pod: &Pod, container: Option<&str>, kind: EventType, reason: &str, message: &str) {
    let pod_name = spec::full_name(pod);
    let uid = spec::uid(pod);
    let container = container.unwrap_or_default();
    match kind {
        EventType::Normal => tracing::info!(pod = %pod_name, pod_uid = uid, container, reason, "{message}"),
        EventType::Warning => tracing::warn!(pod = %pod_name, pod_uid = uid, container, reason, "{message}"),
    }
}

/// The pod (and container, as upstream's `spec.containers{name}` field path) an event is about.
fn reference(pod: &Pod, container: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        field_path: container.map(|c| format!("spec.containers{{{c}}}")),
        ..Default::default()
    }
}
