//! apps/v1 StatefulSets and storage.k8s.io/v1 StorageClasses: the API's defaults, validation
//! and immutable fields, as a real API server applies them.

mod common;

use common::{start, status};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

fn stateful_set(name: &str, selector: serde_json::Value, labels: serde_json::Value) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "selector": selector,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
            }],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn a_stateful_set_gets_the_apis_defaults_and_its_selector_must_select_its_template() {
    let (_server, client) = start().await;
    let sets: Api<StatefulSet> = Api::namespaced(client, "default");
    let app = json!({"app": "db"});
    let created = sets
        .create(&PostParams::default(), &stateful_set("db", json!({"matchLabels": app}), app.clone()))
        .await
        .unwrap();
    let spec = created.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("OrderedReady"));
    assert_eq!(spec.revision_history_limit, Some(10));
    let strategy = spec.update_strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(strategy.rolling_update.unwrap().partition, Some(0));
    let retention = spec.persistent_volume_claim_retention_policy.unwrap();
    assert_eq!((retention.when_deleted.as_deref(), retention.when_scaled.as_deref()), (Some("Retain"), Some("Retain")));
    let template = &spec.volume_claim_templates.unwrap()[0];
    assert_eq!(template.spec.as_ref().unwrap().volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(created.status.unwrap().replicas, 0);
    assert_eq!(created.metadata.generation, Some(1));

    let e = status(
        sets.create(&PostParams::default(), &stateful_set("bad", json!({"matchLabels": {"app": "x"}}), app.clone()))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "StatefulSet.apps \"bad\" is invalid: spec.template.metadata.labels: Invalid value: {\"app\":\"db\"}: \
         `selector` does not match template `labels`"
    );
    let e =
        status(sets.create(&PostParams::default(), &stateful_set("empty", json!({}), app.clone())).await.unwrap_err());
    assert!(e.message.contains("empty selector is invalid for statefulset"), "{}", e.message);

    // Scaling is allowed; the claim templates are fixed.
    let scale = Patch::Merge(json!({"spec": {"replicas": 2}}));
    let scaled = sets.patch("db", &PatchParams::default(), &scale).await.unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(2));
    assert_eq!(scaled.metadata.generation, Some(2));
    let claims = Patch::Merge(json!({"spec": {"volumeClaimTemplates": []}}));
    let e = status(sets.patch("db", &PatchParams::default(), &claims).await.unwrap_err());
    assert_eq!(e.code, 422);
    assert!(e.message.contains("spec: Forbidden: updates to statefulset spec for fields other than"), "{}", e.message);
}

#[tokio::test]
async fn a_storage_class_names_its_provisioner_and_keeps_it() {
    let (_server, client) = start().await;
    let classes: Api<StorageClass> = Api::all(client);
    let class: StorageClass =
        serde_json::from_value(json!({"metadata": {"name": "fast"}, "provisioner": "csi.example.com"})).unwrap();
    let created = classes.create(&PostParams::default(), &class).await.unwrap();
    assert_eq!(created.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(created.volume_binding_mode.as_deref(), Some("Immediate"));
    let nameless: StorageClass =
        serde_json::from_value(json!({"metadata": {"name": "none"}, "provisioner": ""})).unwrap();
    let e = status(classes.create(&PostParams::default(), &nameless).await.unwrap_err());
    assert_eq!(e.message, "StorageClass.storage.k8s.io \"none\" is invalid: provisioner: Required value");
    let change = Patch::Merge(json!({"provisioner": "other.example.com"}));
    let e = status(classes.patch("fast", &PatchParams::default(), &change).await.unwrap_err());
    assert!(e.message.contains("provisioner: Forbidden: updates to provisioner are forbidden."), "{}", e.message);
    let labels = Patch::Merge(json!({"metadata": {"labels": {"tier": "fast"}}, "allowVolumeExpansion": true}));
    classes.patch("fast", &PatchParams::default(), &labels).await.unwrap();
}
