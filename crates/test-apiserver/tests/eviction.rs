//! Evictions and PodDisruptionBudgets (status maintained by the server).

mod common;

use std::time::Duration;

use common::{create_pod, pod_json, start_without_retries, status};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

async fn set_ready(pods: &Api<Pod>, name: &str, ready: bool) {
    let st = if ready { "True" } else { "False" };
    let patch = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": st}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch)).await.unwrap();
}

async fn ready_pods(client: &Client, names: &[&str]) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for n in names {
        create_pod(client, "default", n, Some("node-1")).await;
        set_ready(&pods, n, true).await;
    }
    pods
}

async fn pdb(client: &Client, name: &str, spec: serde_json::Value) -> Api<PodDisruptionBudget> {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let obj: PodDisruptionBudget = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    pdbs.create(&PostParams::default(), &obj).await.unwrap();
    pdbs
}

async fn final_delete(pods: &Api<Pod>, name: &str) {
    pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
}

#[tokio::test]
async fn eviction_without_budget_deletes_gracefully() {
    let (_server, client) = start_without_retries().await;
    let pods = ready_pods(&client, &["a"]).await;
    let s = pods.evict("a", &EvictParams::default()).await.unwrap();
    assert_eq!(s.code, 201);
    let p = pods.get("a").await.unwrap();
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
    // Evicting a terminating pod succeeds and changes nothing.
    pods.evict("a", &EvictParams::default()).await.unwrap();
    assert_eq!(pods.get("a").await.unwrap().metadata.resource_version, p.metadata.resource_version);
    // The eviction's DeleteOptions apply. (kube 5's EvictParams serialises them as
    // `delete_options`, which real servers ignore too, so post a proper Eviction.)
    create_pod(&client, "default", "b", Some("node-1")).await;
    set_ready(&pods, "b", true).await;
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "b"}, "deleteOptions": {"gracePeriodSeconds": 5}});
    let s: kube::core::Status =
        pods.create_subresource("eviction", "b", &PostParams::default(), &eviction).await.unwrap();
    assert_eq!(s.code, 201);
    assert_eq!(pods.get("b").await.unwrap().metadata.deletion_grace_period_seconds, Some(5));
    // policy/v1beta1 bodies are accepted as well.
    create_pod(&client, "default", "c", Some("node-1")).await;
    set_ready(&pods, "c", true).await;
    let old = json!({"apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": "c"}});
    let _: kube::core::Status = pods.create_subresource("eviction", "c", &PostParams::default(), &old).await.unwrap();
    assert_eq!(status(pods.evict("missing", &EvictParams::default()).await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn budget_blocks_with_429_and_recovers_when_pods_are_ready() {
    let (_server, client) = start_without_retries().await;
    let pods = ready_pods(&client, &["a", "b"]).await;
    let pdbs = pdb(&client, "web", json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}})).await;
    let st = pdbs.get("web").await.unwrap().status.unwrap();
    assert_eq!((st.current_healthy, st.desired_healthy, st.expected_pods, st.disruptions_allowed), (2, 1, 2, 1));

    pods.evict("a", &EvictParams::default()).await.unwrap();
    let e = status(pods.evict("b", &EvictParams::default()).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(e.message, "Cannot evict pod as it would violate the pod's disruption budget.");
    let cause = &e.details.unwrap().causes[0];
    assert_eq!(cause.reason, "DisruptionBudget");
    assert_eq!(cause.message, "The disruption budget web needs 1 healthy pods and has 1 currently");

    // The evicted pod goes away; a replacement becomes ready: evictions are allowed again.
    final_delete(&pods, "a").await;
    create_pod(&client, "default", "c", Some("node-1")).await;
    assert_eq!(status(pods.evict("b", &EvictParams::default()).await.unwrap_err()).code, 429);
    set_ready(&pods, "c", true).await;
    pods.evict("b", &EvictParams::default()).await.unwrap();
}

#[tokio::test]
async fn pdb_status_changes_are_watchable() {
    let (_server, client) = start_without_retries().await;
    let pods = ready_pods(&client, &["a"]).await;
    let pdbs = pdb(&client, "one", json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}})).await;
    let current = pdbs.get("one").await.unwrap();
    assert_eq!(current.status.as_ref().unwrap().disruptions_allowed, 0);
    let mut w = pdbs.watch(&WatchParams::default(), &current.metadata.resource_version.unwrap()).await.unwrap().boxed();
    create_pod(&client, "default", "b", Some("node-1")).await;
    set_ready(&pods, "b", true).await;
    let allowed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match w.next().await {
                Some(Ok(WatchEvent::Modified(p))) if p.status.as_ref().unwrap().disruptions_allowed == 1 => {
                    return true;
                }
                Some(_) => {}
                None => return false,
            }
        }
    })
    .await
    .unwrap();
    assert!(allowed);
}

#[tokio::test]
async fn max_unavailable_over_a_replicaset_allows_one_at_a_time() {
    let (_server, client) = start_without_retries().await;
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let rs: ReplicaSet = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"replicas": 3,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": "i"}]}}}}))
    .unwrap();
    let rs = rss.create(&PostParams::default(), &rs).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let owned = |name: &str| {
        let mut p = pod_json(name, Some("node-1"));
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
            "uid": rs.metadata.uid.clone().unwrap(), "controller": true}]);
        serde_json::from_value::<Pod>(p).unwrap()
    };
    for n in ["w1", "w2", "w3"] {
        pods.create(&PostParams::default(), &owned(n)).await.unwrap();
        set_ready(&pods, n, true).await;
    }
    let pdbs = pdb(&client, "web", json!({"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}})).await;
    let st = pdbs.get("web").await.unwrap().status.unwrap();
    assert_eq!((st.expected_pods, st.desired_healthy, st.disruptions_allowed), (3, 2, 1));

    pods.evict("w1", &EvictParams::default()).await.unwrap();
    let e = status(pods.evict("w2", &EvictParams::default()).await.unwrap_err());
    assert_eq!(
        e.details.unwrap().causes[0].message,
        "The disruption budget web needs 2 healthy pods and has 2 currently"
    );
    assert_eq!(status(pods.evict("w3", &EvictParams::default()).await.unwrap_err()).code, 429);
    // The kubelet finishes w1, the ReplicaSet's replacement becomes ready: next one may go.
    final_delete(&pods, "w1").await;
    pods.create(&PostParams::default(), &owned("w4")).await.unwrap();
    set_ready(&pods, "w4", true).await;
    pods.evict("w2", &EvictParams::default()).await.unwrap();
    assert_eq!(status(pods.evict("w3", &EvictParams::default()).await.unwrap_err()).code, 429);
}

#[tokio::test]
async fn unhealthy_pods_and_policies() {
    let (_server, client) = start_without_retries().await;
    let pods = ready_pods(&client, &["a", "b", "c"]).await;
    pdb(&client, "web", json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}})).await;
    // The budget is met (3 >= 2): an unready pod may be evicted without taking a disruption.
    set_ready(&pods, "c", false).await;
    pods.evict("c", &EvictParams::default()).await.unwrap();
    // Budget exactly met with 2 ready: the next ready pod is protected.
    assert_eq!(status(pods.evict("a", &EvictParams::default()).await.unwrap_err()).code, 429);
    // Not met (1 ready of 2 needed): an unready pod is protected under IfHealthyBudget...
    set_ready(&pods, "b", false).await;
    assert_eq!(status(pods.evict("b", &EvictParams::default()).await.unwrap_err()).code, 429);
    // ... but AlwaysAllow lets it go.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}})),
    )
    .await
    .unwrap();
    pods.evict("b", &EvictParams::default()).await.unwrap();
    let st = pdbs.get("web").await.unwrap();
    assert_eq!(st.status.unwrap().observed_generation, st.metadata.generation);
}

#[tokio::test]
async fn more_than_one_budget_is_an_error() {
    let (_server, client) = start_without_retries().await;
    let pods = ready_pods(&client, &["a", "b"]).await;
    pdb(&client, "one", json!({"minAvailable": 0, "selector": {"matchLabels": {"app": "web"}}})).await;
    pdb(
        &client,
        "two",
        json!({"maxUnavailable": 1, "selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}),
    )
    .await;
    let e = status(pods.evict("a", &EvictParams::default()).await.unwrap_err());
    assert_eq!(e.code, 500);
    assert_eq!(
        e.message,
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
}

#[tokio::test]
async fn pending_pods_ignore_budgets() {
    let (_server, client) = start_without_retries().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create_pod(&client, "default", "p", Some("node-1")).await;
    pdb(&client, "strict", json!({"minAvailable": 5, "selector": {"matchLabels": {"app": "web"}}})).await;
    pods.evict("p", &EvictParams::default()).await.unwrap();
    assert!(pods.get("p").await.unwrap().metadata.deletion_timestamp.is_some());
}
