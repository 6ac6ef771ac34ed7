//! Pod events (Pulled, Created, Started, Killing, BackOff, Failed, …) with the Go kubelet's
//! reasons and messages: always a structured log line, and in cluster mode also a core/v1
//! Event, written as the Go kubelet's recorder writes it (`source` and `reporting*` =
//! kubelet on this node, `firstTimestamp`/`lastTimestamp`/`count` from upstream's correlator).

use std::collections::BTreeMap;
use std::time::Duration;

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
    api: Option<(mpsc::Sender<Event>, String)>,
}

impl Recorder {
    /// A recorder that also publishes to the API server, reporting as the kubelet on `node`,
    /// and its writer: the one task that correlates and writes the events in order (as
    /// upstream's broadcaster), for the caller to run under its supervisor. The writer ends
    /// when the last recorder is dropped.
    pub fn to_api(client: kube::Client, node: &str) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (queue, events) = mpsc::channel(MAX_QUEUED);
        (Recorder { api: Some((queue, node.to_string())) }, write_events(client, events))
    }

    /// An event about the Node, through the same writer and correlator as pod events.
    pub fn record_node(&self, ev: &NodeEvent) {
        let Some((queue, node)) = &self.api else {
            log_node(None, ev);
            return;
        };
        log_node(Some(node), ev);
        let _ = queue.try_send(super::node::event_object(node, ev, Timestamp::now()));
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
        // Events are best effort and must never hold up the pod's worker: one that finds the
        // queue full (the API server away for long) is dropped, as upstream's broadcaster does.
        let _ = queue.try_send(event);
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

/// How upstream's recorder retries an event it could not send (`maxTriesPerEvent`, and the
/// sleep between tries, of which the first is a random part).
const MAX_TRIES: u32 = 12;
const RETRY_SLEEP: Duration = Duration::from_secs(10);
/// Events waiting to be written, at most (upstream's `maxQueuedEvents`).
const MAX_QUEUED: usize = 1000;

async fn write_events(client: kube::Client, mut events: mpsc::Receiver<Event>) {
    let mut correlator = Correlator::default();
    let mut failing = false;
    while let Some(event) = events.recv().await {
        let outcome = correlator.correlate(event, Timestamp::now());
        write_with_retries(&client, &outcome, &mut failing).await;
    }
}

/// Writes one event as upstream's `recordToSink` does: an answer from the server, even an
/// error, is final (the same request would be refused again); an unreachable server is tried
/// again, [`MAX_TRIES`] times in all, holding the later events back meanwhile. `failing`
/// carries across events, so an outage is logged once and its end once.
async fn write_with_retries(client: &kube::Client, outcome: &Outcome, failing: &mut bool) {
    for tries in 1..=MAX_TRIES {
        let error = match write(client, outcome).await {
            Ok(()) => {
                if std::mem::take(failing) {
                    tracing::info!("events are written again");
                }
                return;
            }
            Err(kube::Error::Api(e)) => {
                tracing::debug!(code = e.code, reason = %e.reason, "server rejected event (will not retry)");
                return;
            }
            Err(e) => e,
        };
        if !std::mem::replace(failing, true) {
            tracing::warn!(error = %error, "cannot write events; each is tried {MAX_TRIES} times, 10s apart");
        }
        let pause = if tries == 1 { first_pause() } else { RETRY_SLEEP };
        if tries < MAX_TRIES {
            tokio::time::sleep(pause).await;
        }
    }
    tracing::debug!("event dropped (retry limit exceeded)");
}

/// A random part of [`RETRY_SLEEP`], so that the nodes of a cluster whose API server went
/// away do not all come back at once (the clock's nanoseconds are random enough for that).
fn first_pause() -> Duration {
    let fraction = f64::from(Timestamp::now().subsec_nanosecond().unsigned_abs()) / 1e9;
    RETRY_SLEEP.mul_f64(fraction)
}

/// Creates or patches the event; a patch of an event gone from the server creates it again.
async fn write(client: &kube::Client, outcome: &Outcome) -> Result<(), kube::Error> {
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
    api.create(&PostParams::default(), event).await.map(drop)
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A client whose server is unreachable for the first `down` calls (a transport error),
    /// then answers `code`; counts the calls.
    fn flaky_client(down: usize, code: u16) -> (kube::Client, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < down {
                    return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "unreachable"));
                }
                let body = if code == 201 {
                    json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "default"},
                        "involvedObject": {}})
                } else {
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": "Invalid",
                        "message": "refused"})
                };
                let body = http_body_util::Full::from(serde_json::to_vec(&body).unwrap());
                Ok(http::Response::builder().status(code).body(body).unwrap())
            }
        });
        (kube::Client::new(service, "default"), calls)
    }

    fn outcome() -> Outcome {
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default", "uid": "u"}})).unwrap();
        Outcome::Create(event_object("n1", &pod, None, EventType::Normal, "Pulled", "m", Timestamp::now()))
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_server_is_tried_again_every_ten_seconds_up_to_twelve_times() {
        let (client, calls) = flaky_client(3, 201);
        let (mut failing, start) = (false, tokio::time::Instant::now());
        write_with_retries(&client, &outcome(), &mut failing).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4, "three failures, then written");
        let waited = start.elapsed();
        assert!(waited >= Duration::from_secs(20) && waited <= Duration::from_secs(30), "{waited:?}");
        assert!(!failing, "the outage is over");

        let (client, calls) = flaky_client(usize::MAX, 201);
        write_with_retries(&client, &outcome(), &mut failing).await;
        assert_eq!(calls.load(Ordering::SeqCst), 12, "then dropped");
        assert!(failing);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_from_the_server_is_not_tried_again() {
        let (client, calls) = flaky_client(0, 422);
        let start = tokio::time::Instant::now();
        write_with_retries(&client, &outcome(), &mut false).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

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
