//! Pod events (Pulled, Created, Started, Killing, BackOff, Failed, …) with the Go kubelet's
//! reasons and messages: always a structured log line, and in cluster mode also a core/v1
//! Event, written as the Go kubelet's recorder writes it (`source` and `reporting*` =
//! kubelet on this node, `firstTimestamp`/`lastTimestamp`/`count` from upstream's correlator).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::mpsc;

use gantry_vocab::spec;

use super::correlator::{Correlator, Outcome, event_name};
use super::node::COMPONENT;
use super::{EventType, NodeEvent};

#[derive(Clone, Default)]
pub struct Recorder {
    /// The writer task's queue, in cluster mode.
    api: Option<(mpsc::UnboundedSender<Event>, String)>,
}

impl Recorder {
    /// A recorder that also publishes to the API server, reporting as the kubelet on `node`,
    /// and its writer: the one task that correlates and writes the events in order (as
    /// upstream's broadcaster), for the caller to run under its supervisor. The writer ends
    /// when the last recorder is dropped.
    pub fn to_api(client: kube::Client, node: &str) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (queue, events) = mpsc::unbounded_channel();
        (Recorder { api: Some((queue, node.to_string())) }, write_events(client, events))
    }

    /// An event about the Node, through the same writer and correlator as pod events.
    pub fn record_node(&self, ev: &NodeEvent) {
        let Some((queue, node)) = &self.api else {
            log_node(None, ev);
            return;
        };
        log_node(Some(node), ev);
        let _ = queue.send(super::node::event_object(node, ev, Timestamp::now()));
    }

    pub fn record(&self, pod: &Pod, container: Option<&str>, kind: EventType, reason: &str, message: &str) {
        self.record_annotated(pod, container, kind, reason, message, BTreeMap::new());
    }

    /// An event with annotations (upstream's `AnnotatedEventf`, as the eviction manager's).
    pub fn record_annotated(
        &self,
        pod: &Pod,
        container: Option<&str>,
        kind: EventType,
        reason: &str,
        message: &str,
        annotations: BTreeMap<String, String>,
    ) {
        log(pod, container, kind, reason, message);
        let Some((queue, node)) = &self.api else { return };
        let mut event = event_object(node, pod, container, kind, reason, message, Timestamp::now());
        event.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
        // Events are best effort and must never hold up the pod's worker.
        let _ = queue.send(event);
    }
}

/// The Event as upstream's recorder makes it, before correlation (pure).
pub fn event_object(
    node: &str,
    pod: &Pod,
    container: Option<&str>,
    kind: EventType,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Event {
    let seconds = Time(Timestamp::from_second(now.as_second()).unwrap_or(now));
    let involved = reference(pod, container);
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(involved.name.as_deref().unwrap_or_default(), now)),
            namespace: Some(involved.namespace.clone().unwrap_or_else(|| "default".into())),
            ..Default::default()
        },
        involved_object: involved,
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        source: Some(EventSource { component: Some(COMPONENT.into()), host: Some(node.to_string()) }),
        first_timestamp: Some(seconds.clone()),
        last_timestamp: Some(seconds),
        count: Some(1),
        type_: Some(kind.as_str().to_string()),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.to_string()),
        ..Default::default()
    }
}

async fn write_events(client: kube::Client, mut events: mpsc::UnboundedReceiver<Event>) {
    let mut correlator = Correlator::default();
    while let Some(event) = events.recv().await {
        let outcome = correlator.correlate(event, Timestamp::now());
        if let Err(e) = write(&client, outcome).await {
            tracing::debug!(error = %e, "cannot write event");
        }
    }
}

/// Creates or patches the event; a patch of an event gone from the server creates it again.
async fn write(client: &kube::Client, outcome: Outcome) -> Result<(), kube::Error> {
    let (event, patch) = match outcome {
        Outcome::Skip => return Ok(()),
        Outcome::Create(event) => (event, false),
        Outcome::Patch(event) => (event, true),
    };
    let api: Api<Event> = Api::namespaced(client.clone(), event.metadata.namespace.as_deref().unwrap_or("default"));
    let name = event.metadata.name.clone().unwrap_or_default();
    if patch {
        let body = json!({"count": event.count, "lastTimestamp": event.last_timestamp, "message": event.message});
        match api.patch(&name, &PatchParams::default(), &Patch::Strategic(body)).await {
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            other => return other.map(drop),
        }
    }
    api.create(&PostParams::default(), &event).await.map(drop)
}

fn log_node(node: Option<&str>, ev: &NodeEvent) {
    let node = node.unwrap_or_default();
    match ev.type_ {
        EventType::Normal => tracing::info!(node, reason = %ev.reason, "{}", ev.message),
        EventType::Warning => tracing::warn!(node, reason = %ev.reason, "{}", ev.message),
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

/// The pod (and container, by upstream's field path) an event is about.
fn reference(pod: &Pod, container: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        field_path: container.map(|c| field_path(pod, c)),
    }
}

/// `spec.containers{name}`, `spec.initContainers{name}` or `spec.ephemeralContainers{name}`,
/// whichever list of the pod holds the container (upstream's `GenerateContainerRef`).
fn field_path(pod: &Pod, container: &str) -> String {
    let spec = pod.spec.as_ref();
    let in_list = |names: Option<Vec<&str>>| names.is_some_and(|n| n.contains(&container));
    let init = spec.and_then(|s| s.init_containers.as_ref()).map(|l| l.iter().map(|c| c.name.as_str()).collect());
    let ephemeral =
        spec.and_then(|s| s.ephemeral_containers.as_ref()).map(|l| l.iter().map(|c| c.name.as_str()).collect());
    let list = if in_list(init) {
        "initContainers"
    } else if in_list(ephemeral) {
        "ephemeralContainers"
    } else {
        "containers"
    };
    format!("spec.{list}{{{container}}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "7"},
            "spec": {
                "initContainers": [{"name": "setup"}],
                "containers": [{"name": "main"}],
                "ephemeralContainers": [{"name": "debugger"}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn field_paths_name_the_list_holding_the_container() {
        let p = pod();
        assert_eq!(field_path(&p, "setup"), "spec.initContainers{setup}");
        assert_eq!(field_path(&p, "main"), "spec.containers{main}");
        assert_eq!(field_path(&p, "debugger"), "spec.ephemeralContainers{debugger}");
    }

    #[test]
    fn events_carry_every_field_tools_read() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let e = event_object("n1", &pod(), Some("setup"), EventType::Warning, "BackOff", "Back-off", now);
        assert_eq!(e.metadata.name.as_deref(), Some("web.17979cfe362a0000"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
        let source = e.source.unwrap();
        assert_eq!((source.component.as_deref(), source.host.as_deref()), (Some("kubelet"), Some("n1")));
        assert_eq!(e.reporting_component.as_deref(), Some("kubelet"));
        assert_eq!(e.reporting_instance.as_deref(), Some("n1"));
        assert_eq!(e.first_timestamp, Some(Time(now)));
        assert_eq!(e.last_timestamp, Some(Time(now)));
        assert_eq!(e.count, Some(1));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        let o = e.involved_object;
        assert_eq!(o.field_path.as_deref(), Some("spec.initContainers{setup}"));
        assert_eq!(
            (o.kind.as_deref(), o.api_version.as_deref(), o.uid.as_deref()),
            (Some("Pod"), Some("v1"), Some("u1"))
        );
        assert_eq!(o.resource_version.as_deref(), Some("7"));
    }
}
