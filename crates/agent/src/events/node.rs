//! Node events (`NodeReady`, `NodeNotReady`, `Rebooted`, `Starting`, ...)
//! as core/v1 Events, the way the Go kubelet's recorder writes them: in the
//! `default` namespace, about the Node (whose reference upstream gives the
//! node name as UID), from component `kubelet` on host `<node>`.
//!
//! Posting is best effort: an event that cannot be written is logged and
//! dropped, never retried in a way that could hold up the node's loops.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

use super::{EventType, NodeEvent};

pub const COMPONENT: &str = "kubelet";
pub const EVENT_NAMESPACE: &str = "default";
const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// The Event object for `ev` (pure).
pub fn event_object(node: &str, ev: &NodeEvent, now: Timestamp) -> Event {
    let nanos = now.as_nanosecond();
    let seconds = Time(Timestamp::from_second(now.as_second()).unwrap_or(now));
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{node}.{nanos:x}")),
            namespace: Some(EVENT_NAMESPACE.to_string()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            uid: Some(node.to_string()),
            ..Default::default()
        },
        reason: Some(ev.reason.clone()),
        message: Some(ev.message.clone()),
        source: Some(EventSource { component: Some(COMPONENT.into()), host: Some(node.to_string()) }),
        first_timestamp: Some(seconds.clone()),
        last_timestamp: Some(seconds),
        count: Some(1),
        type_: Some(ev.type_.as_str().to_string()),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.to_string()),
        ..Default::default()
    }
}

/// Writes node events to the API server (and the log).
#[derive(Clone)]
pub struct EventRecorder {
    api: Api<Event>,
    node: String,
}

impl EventRecorder {
    pub fn new(client: Client, node: &str) -> Self {
        EventRecorder { api: Api::namespaced(client, EVENT_NAMESPACE), node: node.to_string() }
    }

    pub async fn record(&self, ev: &NodeEvent) {
        match ev.type_ {
            EventType::Normal => tracing::info!(node = %self.node, reason = %ev.reason, "{}", ev.message),
            EventType::Warning => tracing::warn!(node = %self.node, reason = %ev.reason, "{}", ev.message),
        }
        let event = event_object(&self.node, ev, Timestamp::now());
        match tokio::time::timeout(POST_TIMEOUT, self.api.create(&PostParams::default(), &event)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(node = %self.node, reason = %ev.reason, error = %e, "cannot write event"),
            Err(_) => tracing::debug!(node = %self.node, reason = %ev.reason, "cannot write event: timed out"),
        }
    }

    pub async fn record_all(&self, events: &[NodeEvent]) {
        for ev in events {
            self.record(ev).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_shape_matches_upstream() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let ev = NodeEvent {
            type_: EventType::Warning,
            reason: "Rebooted".into(),
            message: "Node n1 has been rebooted, boot id: b".into(),
        };
        let e = event_object("n1", &ev, now);
        assert_eq!(e.metadata.name.as_deref(), Some("n1.17979cfe362a0000"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("n1"));
        assert_eq!(e.involved_object.namespace, None);
        assert_eq!(e.source.as_ref().and_then(|s| s.component.as_deref()), Some("kubelet"));
        assert_eq!(e.source.as_ref().and_then(|s| s.host.as_deref()), Some("n1"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.count, Some(1));
    }
}
