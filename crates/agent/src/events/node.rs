//! Node events (`NodeReady`, `NodeNotReady`, `Rebooted`, `Starting`, ...)
//! as core/v1 Events, the way the Go kubelet's recorder writes them: in the
//! `default` namespace, about the Node (whose reference upstream gives the
//! node name as UID), from component `kubelet` on host `<node>`.
//!
//! They go through the same [`super::Recorder`] as pod events: one writer task, upstream's
//! correlator (counts, aggregation), best effort.

use super::NodeEvent;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

pub const COMPONENT: &str = "kubelet";
pub const EVENT_NAMESPACE: &str = "default";

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventType;

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
