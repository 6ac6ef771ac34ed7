//! Reports pod status to the API server: each pod's status subresource (for static pods, their
//! mirror pod's), patched when it changed, with the pod's UID as a precondition so a status
//! never lands on a different pod with the same name.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::watch;

use super::retry::WatchRetry;
use crate::status_store::StatusStore;
use gantry_vocab::keys::is_api_pod;
use gantry_vocab::spec;

/// Upstream batch-syncs statuses this often, besides syncing on every change.
const RESYNC: Duration = Duration::from_secs(10);

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

pub async fn run(client: Client, statuses: Arc<StatusStore>, mut mirrors: watch::Receiver<Vec<Pod>>) {
    let mut changes = statuses.subscribe();
    // The status each pod's object has: the store's own, not a copy.
    let mut sent: HashMap<Target, Arc<PodStatus>> = HashMap::new();
    // Failed patches are retried on the next pass; only the first failure of a run, and a
    // change of cause, are logged (its delays go unused: the passes set the pace).
    let mut failures = WatchRetry::default();
    loop {
        let version = *changes.borrow_and_update();
        let mirror_pods = mirrors.borrow_and_update().clone();
        let mut live = Vec::new();
        let mut all_sent = true;
        for record in statuses.all() {
            let (Some(target), status) = (target(&record.pod, &mirror_pods), &record.status) else { continue };
            live.push(target.clone());
            if sent.get(&target).is_some_and(|s| Arc::ptr_eq(s, status) || s == status) {
                continue;
            }
            if patch(&client, &target, status, &mut failures).await {
                sent.insert(target, status.clone());
            } else {
                all_sent = false;
            }
        }
        sent.retain(|t, _| live.contains(t));
        if all_sent {
            statuses.mark_reported(version);
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = mirrors.changed() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
    }
}

/// Returns whether the API now has this status (a pod that is gone needs none).
async fn patch(client: &Client, target: &Target, status: &PodStatus, failures: &mut WatchRetry) -> bool {
    let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    let body = patch_body(target, status);
    let pod = format!("{}/{}", target.namespace, target.name);
    let result = api.patch_status(&target.name, &PatchParams::default(), &Patch::Merge(&body)).await;
    match result {
        Ok(_) => {
            if failures.recovered() {
                tracing::info!(pod = %pod, "pod status updates work again");
            }
            true
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
            tracing::debug!(pod = %pod, reason = %e.reason, "pod status not applied");
            true
        }
        Err(e) => {
            if failures.failed(failure_kind(&e)).log {
                tracing::warn!(pod = %pod, error = %e, "cannot update pod status; will retry (repeats of this failure are not logged)");
            }
            false
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

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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
}
