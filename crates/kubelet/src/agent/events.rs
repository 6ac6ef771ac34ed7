//! Pod events (Pulled, Created, Started, Killing, BackOff, Failed, …) with the Go kubelet's
//! reasons and messages. In standalone mode they are structured log lines.

use k8s_openapi::api::core::v1::Pod;

use crate::pod::spec;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

pub fn record(pod: &Pod, container: Option<&str>, kind: EventType, reason: &str, message: &str) {
    let pod_name = spec::full_name(pod);
    let uid = spec::uid(pod);
    let container = container.unwrap_or_default();
    match kind {
        EventType::Normal => tracing::info!(pod = %pod_name, pod_uid = uid, container, reason, "{message}"),
        EventType::Warning => tracing::warn!(pod = %pod_name, pod_uid = uid, container, reason, "{message}"),
    }
}
