//! Mirror pods: the read-only API copy of each static pod, so `kubectl get pods` shows static
//! pods too. One per static pod, recreated when deleted or stale, removed when its static pod
//! goes.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};
use tokio::sync::watch;

use super::pod_source::MIRROR_ANNOTATION;
use gantry_vocab::keys::CONFIG_HASH;
use gantry_vocab::spec;

#[derive(Debug, Clone, PartialEq)]
pub enum MirrorAction {
    Create(Box<Pod>),
    Delete { namespace: String, name: String, uid: String },
}

/// What to change so that every static pod has exactly one up-to-date mirror pod.
pub fn plan(static_pods: &[Pod], mirrors: &[Pod], node: &str, node_uid: &str) -> Vec<MirrorAction> {
    let by_name: HashMap<String, &Pod> = mirrors.iter().map(|m| (spec::full_name(m), m)).collect();
    let mut actions = Vec::new();
    for s in static_pods {
        match by_name.get(&spec::full_name(s)) {
            None => actions.push(MirrorAction::Create(Box::new(mirror_of(s, node, node_uid)))),
            // Recreated on a later round, once the watch reports the old one gone.
            Some(m) if is_stale(m, s) => actions.push(delete(m)),
            Some(_) => {}
        }
    }
    let wanted: std::collections::HashSet<String> = static_pods.iter().map(spec::full_name).collect();
    actions.extend(mirrors.iter().filter(|m| !wanted.contains(&spec::full_name(m))).map(delete));
    actions
}

fn is_stale(mirror: &Pod, static_pod: &Pod) -> bool {
    let annotation = |p: &Pod, key: &str| p.metadata.annotations.as_ref().and_then(|a| a.get(key).cloned());
    mirror.metadata.deletion_timestamp.is_some()
        || annotation(mirror, MIRROR_ANNOTATION) != annotation(static_pod, CONFIG_HASH)
}

fn delete(m: &Pod) -> MirrorAction {
    MirrorAction::Delete {
        namespace: spec::namespace(m).to_string(),
        name: spec::name(m).to_string(),
        uid: spec::uid(m).to_string(),
    }
}

/// The mirror pod of a static pod: same name, labels, annotations and spec, plus the mirror
/// annotation and the Node as owner (NodeRestriction requires both).
pub fn mirror_of(static_pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut annotations = static_pod.metadata.annotations.clone().unwrap_or_default();
    let hash = annotations.get(CONFIG_HASH).cloned().unwrap_or_default();
    annotations.insert(MIRROR_ANNOTATION.to_string(), hash);
    Pod {
        metadata: ObjectMeta {
            name: static_pod.metadata.name.clone(),
            namespace: static_pod.metadata.namespace.clone(),
            labels: static_pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                uid: node_uid.to_string(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: static_pod.spec.clone(),
        status: None,
    }
}

const RESYNC: Duration = Duration::from_secs(10);

/// Keeps mirror pods in line with the static pods, forever. Nothing is created while the
/// Node's UID is unknown (NodeRestriction requires it as the owner).
pub async fn run(
    client: Client,
    node: String,
    mut node_uid: watch::Receiver<Option<String>>,
    mut statics: watch::Receiver<Vec<Pod>>,
    mut mirrors: watch::Receiver<Vec<Pod>>,
) {
    loop {
        let uid = node_uid.borrow_and_update().clone();
        if let Some(uid) = uid {
            let actions = plan(&statics.borrow_and_update(), &mirrors.borrow_and_update(), &node, &uid);
            for action in actions {
                apply(&client, action).await;
            }
        }
        tokio::select! {
            _ = statics.changed() => {}
            _ = mirrors.changed() => {}
            _ = node_uid.changed() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
    }
}

async fn apply(client: &Client, action: MirrorAction) {
    match action {
        MirrorAction::Create(pod) => {
            let api: Api<Pod> = Api::namespaced(client.clone(), spec::namespace(&pod));
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => tracing::info!(pod = %spec::full_name(&pod), "created mirror pod"),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => tracing::warn!(pod = %spec::full_name(&pod), error = %e, "cannot create mirror pod"),
            }
        }
        MirrorAction::Delete { namespace, name, uid } => {
            let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
                ..Default::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => tracing::info!(pod = %format!("{namespace}/{name}"), "deleted mirror pod"),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => tracing::warn!(pod = %format!("{namespace}/{name}"), error = %e, "cannot delete mirror pod"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn static_pod(name: &str, hash: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("kube-system".into()),
                uid: Some(hash.into()),
                annotations: Some(BTreeMap::from([(CONFIG_HASH.to_string(), hash.to_string())])),
                ..Default::default()
            },
            spec: Some(Default::default()),
            ..Default::default()
        }
    }

    fn mirror(name: &str, hash: &str, uid: &str) -> Pod {
        let mut m = mirror_of(&static_pod(name, hash), "n1", "node-uid");
        m.metadata.uid = Some(uid.into());
        m
    }

    #[test]
    fn missing_mirror_is_created_with_owner_and_annotation() {
        let actions = plan(&[static_pod("etcd-n1", "h1")], &[], "n1", "node-uid");
        let [MirrorAction::Create(pod)] = actions.as_slice() else { panic!("{actions:?}") };
        assert_eq!(pod.metadata.annotations.as_ref().unwrap()[MIRROR_ANNOTATION], "h1");
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Node", "n1", "node-uid"));
        assert!(pod.metadata.uid.is_none());
    }

    #[test]
    fn up_to_date_mirror_is_left_alone() {
        assert!(plan(&[static_pod("etcd-n1", "h1")], &[mirror("etcd-n1", "h1", "m1")], "n1", "u").is_empty());
    }

    #[test]
    fn stale_terminating_and_orphaned_mirrors_are_deleted() {
        let stale = plan(&[static_pod("etcd-n1", "h2")], &[mirror("etcd-n1", "h1", "m1")], "n1", "u");
        assert_eq!(
            stale,
            [MirrorAction::Delete { namespace: "kube-system".into(), name: "etcd-n1".into(), uid: "m1".into() }]
        );
        let mut terminating = mirror("etcd-n1", "h1", "m2");
        terminating.metadata.deletion_timestamp = Some(gantry_pod::status::time(1));
        assert_eq!(plan(&[static_pod("etcd-n1", "h1")], &[terminating], "n1", "u").len(), 1);
        let orphan = plan(&[], &[mirror("old-n1", "h", "m3")], "n1", "u");
        assert!(matches!(&orphan[..], [MirrorAction::Delete { uid, .. }] if uid == "m3"));
    }
}
