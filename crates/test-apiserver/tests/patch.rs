//! The patch flavours on pods and nodes, and server-side apply.

mod common;

use common::{create_node, create_pod, rv, start, status};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

#[tokio::test]
async fn merge_patch_on_pod() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create_pod(&client, "default", "m", Some("n")).await;
    let p = pods
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": null, "new": "1"}, "annotations": {"a": "b"}}})),
        )
        .await
        .unwrap();
    let labels = p.metadata.labels.unwrap();
    assert!(!labels.contains_key("app"));
    assert_eq!(labels["new"], "1");
    assert_eq!(p.metadata.annotations.unwrap()["a"], "b");
}

#[tokio::test]
async fn json_patch_on_pod() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create_pod(&client, "default", "j", Some("n")).await;
    let ops = json!([
        {"op": "test", "path": "/spec/nodeName", "value": "n"},
        {"op": "add", "path": "/metadata/annotations", "value": {"x": "1"}},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "registry.local/app:9"}
    ]);
    let p = pods
        .patch("j", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(ops).unwrap()))
        .await
        .unwrap();
    assert_eq!(p.spec.unwrap().containers[0].image.as_deref(), Some("registry.local/app:9"));
    let failing = json!([{"op": "test", "path": "/spec/nodeName", "value": "other"}]);
    let e = status(
        pods.patch("j", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(failing).unwrap()))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn strategic_patch_on_pod_status() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create_pod(&client, "default", "s", Some("n")).await;
    let first = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "app", "ready": false, "restartCount": 0, "image": "i", "imageID": ""}]}});
    pods.patch_status("s", &PatchParams::default(), &Patch::Strategic(first)).await.unwrap();
    // Like the kubelet's status manager: conditions merge by type, containerStatuses replace.
    let second = json!({"metadata": {"uid": pods.get("s").await.unwrap().metadata.uid},
        "status": {"$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}],
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "i", "imageID": ""}]}});
    let p = pods.patch_status("s", &PatchParams::default(), &Patch::Strategic(second)).await.unwrap();
    let st = p.status.unwrap();
    let conditions = st.conditions.unwrap();
    assert_eq!(conditions.len(), 2);
    assert_eq!(conditions.iter().find(|c| c.type_ == "Ready").unwrap().status, "True");
    assert_eq!(st.container_statuses.unwrap().len(), 1);
}

#[tokio::test]
async fn strategic_patch_merges_node_conditions_by_type() {
    let (_server, client) = start().await;
    let nodes: Api<Node> = Api::all(client.clone());
    create_node(&client, "n1").await;
    let initial = json!({"status": {
        "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}, {"type": "MemoryPressure", "status": "False"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n1"}]}});
    nodes.patch_status("n1", &PatchParams::default(), &Patch::Strategic(initial)).await.unwrap();
    let heartbeat = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}});
    let n = nodes.patch_status("n1", &PatchParams::default(), &Patch::Strategic(heartbeat)).await.unwrap();
    let status = n.status.unwrap();
    let conditions = status.conditions.unwrap();
    assert_eq!(conditions.len(), 2, "MemoryPressure kept");
    let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("True", Some("KubeletReady")));
    assert_eq!(status.addresses.unwrap().len(), 2);

    // A merge patch replaces the list instead.
    let merge = json!({"status": {"conditions": [{"type": "DiskPressure", "status": "False"}]}});
    let n = nodes.patch_status("n1", &PatchParams::default(), &Patch::Merge(merge)).await.unwrap();
    assert_eq!(n.status.unwrap().conditions.unwrap().len(), 1);

    // Taints are atomic: a strategic patch replaces them.
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();
    let n = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();
    let taints = n.spec.unwrap().taints.unwrap();
    assert_eq!(taints.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(), vec!["b"]);
}

#[tokio::test]
async fn strategic_delete_directive_on_containers_env() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c", "labels": {"a": "1", "b": "2"}}})).unwrap();
    cms.create(&Default::default(), &cm).await.unwrap();
    let c = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"$patch": "replace", "c": "3"}}})),
        )
        .await
        .unwrap();
    assert_eq!(c.metadata.labels.unwrap().into_keys().collect::<Vec<_>>(), vec!["c"]);
}

#[tokio::test]
async fn server_side_apply_creates_and_merges() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PatchParams::apply("gantry-test").force();
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1"}});
    let created = cms.patch("ssa", &pp, &Patch::Apply(&applied)).await.unwrap();
    assert_eq!(created.data.unwrap()["a"], "1");
    let more = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"b": "2"}});
    let merged = cms.patch("ssa", &pp, &Patch::Apply(&more)).await.unwrap();
    let data = merged.data.clone().unwrap();
    assert_eq!((data["a"].as_str(), data["b"].as_str()), ("1", "2"));
    // Applying the same again is a no-op.
    let again = cms.patch("ssa", &pp, &Patch::Apply(&more)).await.unwrap();
    assert_eq!(rv(&again), rv(&merged));
    // fieldManager is required.
    let e = status(cms.patch("ssa", &PatchParams::default(), &Patch::Apply(&more)).await.unwrap_err());
    assert_eq!(e.code, 400);
}
