//! Pods bound to this node, from the API server: list and watch with
//! `spec.nodeName=<node>`, resuming from the last resourceVersion and relisting on 410 Gone
//! (kube-runtime's watcher does both).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use crate::source::{SourceKind, SourceUpdate};
use gantry_vocab::keys::{CONFIG_SEEN, CONFIG_SOURCE};
use gantry_vocab::spec;

pub use gantry_vocab::keys::{MIRROR as MIRROR_ANNOTATION, is_mirror};

/// Runs forever: sends a SET of the node's (non-mirror) pods after every change, and publishes
/// the node's mirror pods for the mirror pod manager when they change. Each pod is kept once,
/// prepared as the agent reads it, and shared with every SET: copying the node's pods on each
/// pod event was the largest allocation at start-up (16 MB of a 39 MB peak at 110 pods).
pub async fn run(client: Client, node: String, tx: mpsc::Sender<SourceUpdate>, mirrors: watch::Sender<Vec<Pod>>) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut pods: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
    let mut initial: Option<BTreeMap<String, Arc<Pod>>> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => initial = Some(BTreeMap::new()),
            Ok(Event::InitApply(pod)) => {
                if let Some(buffer) = initial.as_mut() {
                    let uid = spec::uid(&pod).to_string();
                    let pod = prepare(pod, pods.get(&uid));
                    buffer.insert(uid, pod);
                }
            }
            Ok(Event::InitDone) => pods = initial.take().unwrap_or_default(),
            Ok(Event::Apply(pod)) => {
                let uid = spec::uid(&pod).to_string();
                let pod = prepare(pod, pods.get(&uid));
                pods.insert(uid, pod);
            }
            Ok(Event::Delete(pod)) => {
                pods.remove(spec::uid(&pod));
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching this node's pods failed; retrying");
                continue;
            }
        }
        if initial.is_some() {
            continue; // wait for the complete list before acting on it
        }
        let (mirror, regular): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) = pods.values().partition(|p| is_mirror(p));
        publish_mirrors(&mirrors, mirror);
        let regular = regular.into_iter().cloned().collect();
        if tx.send(SourceUpdate { source: SourceKind::Api, pods: regular }).await.is_err() {
            return;
        }
    }
}

/// Drops what the agent never reads but would keep for each pod (server-side-apply
/// bookkeeping is often as large as the spec itself), and marks a regular pod as the API's,
/// seen when its `previous` version was (or now). Stamped here, the pod is the one the merger
/// passes on, not a copy of it (`source::merge`).
fn prepare(mut pod: Pod, previous: Option<&Arc<Pod>>) -> Arc<Pod> {
    pod.metadata.managed_fields = None;
    if let Some(spec) = pod.spec.as_mut() {
        // Decoding grows these lists by doubling, and each item is large (a `Volume` holds
        // every kind of volume source inline, 3.2 KB): three volumes took room for four.
        spec.volumes.as_mut().map(Vec::shrink_to_fit);
        spec.containers.shrink_to_fit();
        spec.init_containers.as_mut().map(Vec::shrink_to_fit);
    }
    if !is_mirror(&pod) {
        let seen = previous
            .and_then(|p| p.metadata.annotations.as_ref()?.get(CONFIG_SEEN).cloned())
            .unwrap_or_else(|| k8s_openapi::jiff::Timestamp::now().to_string());
        let annotations = pod.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(CONFIG_SOURCE.to_string(), "api".to_string());
        annotations.insert(CONFIG_SEEN.to_string(), seen);
    }
    // A relist delivers pods that have not changed: keep the copy the node already holds.
    match previous {
        Some(p) if **p == pod => p.clone(),
        _ => Arc::new(pod),
    }
}

/// The mirror pods' readers (mirror pod manager, status sync, maintenance holds) only wake
/// when the mirror pods changed, not on every event of a regular pod.
fn publish_mirrors(mirrors: &watch::Sender<Vec<Pod>>, now: Vec<&Arc<Pod>>) {
    mirrors.send_if_modified(|current| {
        let same = current.len() == now.len() && current.iter().zip(&now).all(|(c, n)| c == n.as_ref());
        if !same {
            *current = now.into_iter().map(|p| Pod::clone(p)).collect();
        }
        !same
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_pod(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        pod.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        pod.metadata.annotations = Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        pod
    }

    fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
        pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
    }

    #[test]
    fn a_pod_is_stamped_with_its_source_and_keeps_its_first_seen_time_across_updates() {
        let first = prepare(api_pod(&[], &[]), None);
        assert_eq!(annotation(&first, CONFIG_SOURCE), Some("api"));
        let seen = annotation(&first, CONFIG_SEEN).expect("stamped when first seen").to_string();
        assert!(seen.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "an RFC 3339 time: {seen}");

        let mut with_old_time = api_pod(&[], &[]);
        with_old_time.metadata.annotations.as_mut().unwrap().insert(CONFIG_SEEN.into(), "2020-01-01T00:00:00Z".into());
        let earlier = Arc::new(with_old_time);
        let updated = prepare(api_pod(&[("k", "v")], &[]), Some(&earlier));
        assert_eq!(annotation(&updated, CONFIG_SEEN), Some("2020-01-01T00:00:00Z"), "the first-seen time stays");
        assert_eq!(updated.metadata.labels.as_ref().unwrap()["k"], "v");
    }

    #[test]
    fn an_unchanged_pod_keeps_the_copy_already_held() {
        let held = prepare(api_pod(&[("k", "v")], &[]), None);
        let relisted = prepare(api_pod(&[("k", "v")], &[]), Some(&held));
        assert!(Arc::ptr_eq(&relisted, &held));
        let changed = prepare(api_pod(&[("k", "w")], &[]), Some(&held));
        assert!(!Arc::ptr_eq(&changed, &held));
    }

    #[test]
    fn decoded_lists_keep_no_spare_room() {
        let volume = |n: &str| serde_json::json!({"name": n, "emptyDir": {}});
        // From text, as the watch decodes it: no length is known ahead.
        let text = serde_json::json!({
            "metadata": {"uid": "u1"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}], "volumes": [volume("x"), volume("y"), volume("z")]}
        })
        .to_string();
        let decoded: Pod = serde_json::from_str(&text).unwrap();
        let spare = |p: &Pod| {
            let spec = p.spec.as_ref().unwrap();
            let volumes = spec.volumes.as_ref().unwrap();
            (volumes.capacity() - volumes.len(), spec.containers.capacity() - spec.containers.len())
        };
        assert_ne!(spare(&decoded), (0, 0), "serde leaves room to grow");
        assert_eq!(spare(&prepare(decoded, None)), (0, 0));
    }

    #[test]
    fn a_mirror_pod_is_left_as_the_api_has_it() {
        let mirror = prepare(api_pod(&[], &[(MIRROR_ANNOTATION, "hash")]), None);
        assert_eq!(annotation(&mirror, CONFIG_SEEN), None);
        assert_eq!(annotation(&mirror, CONFIG_SOURCE), None);
    }
}
