//! Reports pod status to the API server: each pod's status subresource (for static pods, their
//! mirror pod's), patched when it changed, with the pod's UID as a precondition so a status
//! never lands on a different pod with the same name. Every [`RESYNC`] it also sends again a
//! status that another writer changed in the API (upstream's status manager reconciles so).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::watch;

use super::retry::WatchRetry;
use crate::status_store::{PodRecord, StatusStore};
use gantry_pod::status::is_kubelet_condition;
use gantry_vocab::keys::is_api_pod;
use gantry_vocab::spec;

/// Upstream batch-syncs statuses this often, besides syncing on every change.
const RESYNC: Duration = Duration::from_secs(10);
/// How old a patch must be before the API's copy of the pod is compared with it: a younger
/// one may not have come back through the pod watch yet.
const SETTLE: Duration = Duration::from_secs(2);

/// Where a pod's status goes in the API.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The API object that carries `pod`'s status: the pod itself, or a static pod's mirror pod.
pub fn target(pod: &Pod, mirrors: &[Pod]) -> Option<Target> {
    let object =
        if is_api_pod(pod) { pod } else { mirrors.iter().find(|m| spec::full_name(m) == spec::full_name(pod))? };
    Some(Target {
        namespace: spec::namespace(object).to_string(),
        name: spec::name(object).to_string(),
        uid: spec::uid(object).to_string(),
    })
}

/// The merge patch body: the status, guarded by the target's UID.
pub fn patch_body(target: &Target, status: &PodStatus) -> serde_json::Value {
    serde_json::json!({ "metadata": { "uid": target.uid }, "status": status })
}

/// A status the API server has from the node.
struct Sent {
    /// The store's own, not a copy.
    status: Arc<PodStatus>,
    /// `None` when the pod was gone, so there is nothing to reconcile.
    stored: Option<Stored>,
    at: Instant,
}

/// What the server stored, and the API's copy of the pod the node held when it sent it.
struct Stored {
    fingerprint: u64,
    version: u64,
    /// Until the pod watch brings a newer copy than this, the node's own write is still on its
    /// way back: nothing to compare yet (the copy can lag while the pod's worker is busy).
    version_before: u64,
}

impl Sent {
    fn is_of(&self, status: &Arc<PodStatus>) -> bool {
        Arc::ptr_eq(&self.status, status) || self.status == *status
    }

    /// Whether the API's copy of the pod shows that another writer changed the kubelet's part
    /// of its status since the node sent it.
    fn overwritten(&self, in_api: Option<&Pod>) -> bool {
        let Some(stored) = &self.stored else { return false };
        let version = version_of(in_api);
        version != stored.version
            && version != stored.version_before
            && self.at.elapsed() >= SETTLE
            && in_api.and_then(|p| p.status.as_ref()).map(kubelet_fingerprint) != Some(stored.fingerprint)
    }
}

/// A fingerprint of the kubelet's part of a status, to tell whether another writer changed
/// it: every field, and of the conditions only the kubelet's own, by their status, reason,
/// message and observed generation (not their times), as upstream's status manager compares
/// the API's copy with its own before it reconciles.
fn kubelet_fingerprint(status: &PodStatus) -> u64 {
    let owned: Vec<_> = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| is_kubelet_condition(c))
        .map(|c| (&c.type_, &c.status, &c.reason, &c.message, c.observed_generation))
        .collect();
    let rest = PodStatus { conditions: None, ..status.clone() };
    let mut hasher = HashWriter(DefaultHasher::new());
    // Writing into a hasher cannot fail, and these types always serialize.
    let _ = serde_json::to_writer(&mut hasher, &(owned, rest));
    hasher.0.finish()
}

struct HashWriter(DefaultHasher);

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A resource version, hashed: only ever compared for equality, as the API asks.
fn version_of(pod: Option<&Pod>) -> u64 {
    let mut hasher = DefaultHasher::new();
    pod.and_then(|p| p.metadata.resource_version.as_deref()).hash(&mut hasher);
    hasher.finish()
}

/// What a status patch came to.
enum Patched {
    /// The server stored it: the pod as it now is.
    Stored(Box<Pod>),
    /// The pod is gone, or another has its name: it needs no status.
    Gone,
    Failed,
}

pub async fn run(client: Client, statuses: Arc<StatusStore>, mut mirrors: watch::Receiver<Vec<Pod>>) {
    let mut changes = statuses.subscribe();
    let mut sent: HashMap<Target, Sent> = HashMap::new();
    // Failed patches are retried on the next pass; only the first failure of a run, and a
    // change of cause, are logged (its delays go unused: the passes set the pace).
    let mut failures = WatchRetry::default();
    let mut next_reconcile = Instant::now() + RESYNC;
    loop {
        let version = *changes.borrow_and_update();
        let mirror_pods = mirrors.borrow_and_update().clone();
        let reconcile = Instant::now() >= next_reconcile;
        if reconcile {
            next_reconcile = Instant::now() + RESYNC;
        }
        let mut live = Vec::new();
        let mut all_sent = true;
        for record in statuses.all() {
            let (Some(target), status) = (target(&record.pod, &mirror_pods), &record.status) else { continue };
            live.push(target.clone());
            if let Some(s) = sent.get(&target).filter(|s| s.is_of(status)) {
                if !(reconcile && s.overwritten(in_api(&record, &target, &mirror_pods))) {
                    continue;
                }
                tracing::debug!(pod = %format!("{}/{}", target.namespace, target.name), "the pod's status in the API is not the node's; sending it again");
            }
            let version_before = version_of(in_api(&record, &target, &mirror_pods));
            let stored = match patch(&client, &target, status, &mut failures).await {
                Patched::Stored(pod) => Some(Stored {
                    fingerprint: pod.status.as_ref().map(kubelet_fingerprint).unwrap_or_default(),
                    version: version_of(Some(&pod)),
                    version_before,
                }),
                Patched::Gone => None,
                Patched::Failed => {
                    all_sent = false;
                    continue;
                }
            };
            sent.insert(target, Sent { status: status.clone(), stored, at: Instant::now() });
        }
        sent.retain(|t, _| live.contains(t));
        if all_sent {
            statuses.mark_reported(version);
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = mirrors.changed() => {}
            _ = tokio::time::sleep_until(next_reconcile) => {}
        }
    }
}

/// The API's copy of the object that carries `record`'s status: the pod (the copy its worker
/// holds, renewed by the pod watch) or its mirror pod.
fn in_api<'a>(record: &'a PodRecord, target: &Target, mirrors: &'a [Pod]) -> Option<&'a Pod> {
    if is_api_pod(&record.pod) { Some(&record.pod) } else { mirrors.iter().find(|m| spec::uid(m) == target.uid) }
}

async fn patch(client: &Client, target: &Target, status: &PodStatus, failures: &mut WatchRetry) -> Patched {
    let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    let body = patch_body(target, status);
    let pod = format!("{}/{}", target.namespace, target.name);
    let result = api.patch_status(&target.name, &PatchParams::default(), &Patch::Merge(&body)).await;
    match result {
        Ok(stored) => {
            if failures.recovered() {
                tracing::info!(pod = %pod, "pod status updates work again");
            }
            Patched::Stored(Box::new(stored))
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
            tracing::debug!(pod = %pod, reason = %e.reason, "pod status not applied");
            Patched::Gone
        }
        Err(e) => {
            if failures.failed(failure_kind(&e)).log {
                tracing::warn!(pod = %pod, error = %e, "cannot update pod status; will retry (repeats of this failure are not logged)");
            }
            Patched::Failed
        }
    }
}

/// What makes one failure a repeat of the last: the API's status code, or the kind of
/// transport failure (their texts carry addresses and timings that change every time).
fn failure_kind(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) if s.code >= 500 => "server error",
        kube::Error::Api(s) if s.code == 429 => "throttled",
        kube::Error::Api(_) => "refused",
        kube::Error::HyperError(_) | kube::Error::Service(_) => "unreachable",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::PodCondition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use gantry_vocab::keys::CONFIG_SOURCE;

    fn pod(name: &str, uid: &str, source: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                annotations: source.map(|s| BTreeMap::from([(CONFIG_SOURCE.to_string(), s.to_string())])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn api_pods_report_to_themselves_and_static_pods_to_their_mirror() {
        let api = pod("web", "u1", Some("api"));
        assert_eq!(target(&api, &[]).unwrap().uid, "u1");
        let static_pod = pod("etcd-n1", "hash", Some("file"));
        assert_eq!(target(&static_pod, &[]), None, "no mirror yet, nothing to report to");
        let mirror = pod("etcd-n1", "m1", None);
        assert_eq!(target(&static_pod, &[mirror]).unwrap().uid, "m1");
    }

    #[test]
    fn failures_repeat_by_status_class_not_by_text() {
        let api = |code: u16, message: &str| {
            kube::Error::Api(kube::core::Status::failure(message, "").with_code(code).boxed())
        };
        assert_eq!(failure_kind(&api(500, "etcd timeout")), failure_kind(&api(503, "shutting down")));
        assert_ne!(failure_kind(&api(500, "x")), failure_kind(&api(429, "x")));
        assert_ne!(failure_kind(&api(403, "x")), failure_kind(&api(500, "x")));
        let mut failures = WatchRetry::default();
        assert!(failures.failed(failure_kind(&api(500, "a"))).log);
        assert!(!failures.failed(failure_kind(&api(500, "b"))).log, "a repeat with another text is not logged");
    }

    #[test]
    fn patch_carries_the_uid_precondition() {
        let t = Target { namespace: "default".into(), name: "web".into(), uid: "u1".into() };
        let status = PodStatus { phase: Some("Running".into()), ..Default::default() };
        let body = patch_body(&t, &status);
        assert_eq!(body["metadata"]["uid"], "u1");
        assert_eq!(body["status"]["phase"], "Running");
    }

    #[test]
    fn the_kubelet_fingerprint_moves_with_the_kubelets_part_of_the_status_only() {
        let condition = |type_: &str| PodCondition { type_: type_.into(), status: "True".into(), ..Default::default() };
        let status = PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![condition("Ready"), condition("ContainersReady")]),
            ..Default::default()
        };
        let fingerprint = kubelet_fingerprint(&status);
        let changed = |change: fn(&mut PodStatus)| {
            let mut other = status.clone();
            change(&mut other);
            kubelet_fingerprint(&other)
        };
        assert_eq!(fingerprint, kubelet_fingerprint(&status.clone()));
        assert_ne!(
            fingerprint,
            changed(|s| s.conditions.as_mut().unwrap()[0].status = "False".into()),
            "Ready flipped"
        );
        assert_ne!(fingerprint, changed(|s| s.conditions.as_mut().unwrap()[0].reason = Some("Overwritten".into())));
        assert_ne!(fingerprint, changed(|s| s.phase = Some("Failed".into())));
        assert_ne!(fingerprint, changed(|s| s.conditions.as_mut().unwrap().truncate(1)), "ContainersReady removed");
        assert_eq!(
            fingerprint,
            changed(|s| s.conditions.as_mut().unwrap()[0].last_probe_time = Some(Time(Timestamp::UNIX_EPOCH))),
            "condition times are not compared"
        );
        assert_eq!(
            fingerprint,
            changed(|s| s.conditions.as_mut().unwrap().push(PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                ..Default::default()
            })),
            "another component's condition is its own"
        );
    }
}
