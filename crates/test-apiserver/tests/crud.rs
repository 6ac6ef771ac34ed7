//! Create/get/list/update/delete semantics, errors as Status objects.

mod common;

use common::{RawClient, create_pod, pod, rv, start, status};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use serde_json::json;

#[tokio::test]
async fn create_get_and_errors() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = create_pod(&client, "default", "p1", None).await;
    let meta = &created.metadata;
    assert!(meta.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    assert_eq!(pods.get("p1").await.unwrap().metadata.uid, meta.uid);

    let dup = status(pods.create(&PostParams::default(), &pod("p1", None)).await.unwrap_err());
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(dup.message, "pods \"p1\" already exists");

    let missing = status(pods.get("nope").await.unwrap_err());
    assert_eq!(
        (missing.code, missing.reason.as_str(), missing.message.as_str()),
        (404, "NotFound", "pods \"nope\" not found")
    );
    let details = missing.details.unwrap();
    assert_eq!((details.name.as_str(), details.kind.as_str()), ("nope", "pods"));
}

#[tokio::test]
async fn generate_name() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "cfg-"}, "data": {"a": "b"}})).unwrap();
    let a = cms.create(&PostParams::default(), &cm).await.unwrap();
    let b = cms.create(&PostParams::default(), &cm).await.unwrap();
    let (na, nb) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(na.starts_with("cfg-") && na.len() == 9, "{na}");
    assert_ne!(na, nb);
}

#[tokio::test]
async fn validation_errors() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let nameless: ConfigMap = serde_json::from_value(json!({"data": {}})).unwrap();
    let e = status(cms.create(&PostParams::default(), &nameless).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(e.message.contains("metadata.name: Required value"), "{}", e.message);

    let wrong_ns: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "kube-system"}})).unwrap();
    let e = status(cms.create(&PostParams::default(), &wrong_ns).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));

    let bad_name: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "Upper_Case"}})).unwrap();
    assert_eq!(status(cms.create(&PostParams::default(), &bad_name).await.unwrap_err()).code, 422);

    let elsewhere: Api<ConfigMap> = Api::namespaced(client, "does-not-exist");
    let e = status(
        elsewhere
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap())
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", "namespaces \"does-not-exist\" not found")
    );
}

#[tokio::test]
async fn update_conflicts_on_stale_resource_version() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"v": "1"}})).unwrap();
    let v1 = cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut edit = v1.clone();
    edit.data.as_mut().unwrap().insert("v".into(), "2".into());
    let v2 = cms.replace("c", &PostParams::default(), &edit).await.unwrap();
    assert!(rv(&v2) > rv(&v1));

    // Same stale resourceVersion again: conflict with upstream's wording.
    edit.data.as_mut().unwrap().insert("v".into(), "3".into());
    let e = status(cms.replace("c", &PostParams::default(), &edit).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again"
    );

    // Without a resourceVersion the update is unconditional.
    edit.metadata.resource_version = None;
    let v3 = cms.replace("c", &PostParams::default(), &edit).await.unwrap();
    assert_eq!(v3.data.as_ref().unwrap()["v"], "3");

    // A no-op update keeps the resourceVersion.
    let same = cms.replace("c", &PostParams::default(), &v3.clone()).await;
    let v3 = cms.get("c").await.unwrap();
    assert_eq!(rv(&same.unwrap()), rv(&v3));

    // uid is immutable.
    let mut forged = v3.clone();
    forged.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    assert_eq!(status(cms.replace("c", &PostParams::default(), &forged).await.unwrap_err()).code, 422);

    // PUT to a missing configmap is a 404 (no create-on-update).
    let mut ghost = v3.clone();
    ghost.metadata.name = Some("ghost".into());
    ghost.metadata.resource_version = None;
    assert_eq!(status(cms.replace("ghost", &PostParams::default(), &ghost).await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn list_has_resource_version_and_pages() {
    let (_server, client) = start().await;
    for i in 0..5 {
        create_pod(&client, "default", &format!("p{i}"), None).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let all = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 5);
    let list_rv: u64 = all.metadata.resource_version.unwrap().parse().unwrap();
    assert!(all.items.iter().all(|p| rv(p) <= list_rv));

    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(2);
    loop {
        let page = pods.list(&lp).await.unwrap();
        names.extend(page.items.into_iter().map(|p| p.metadata.name.unwrap()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
        // Writes between pages do not show up: pages come from the first page's snapshot.
        create_pod(&client, "default", &format!("late{}", names.len()), None).await;
    }
    assert_eq!(names, vec!["p0", "p1", "p2", "p3", "p4"]);

    let everywhere: Api<Pod> = Api::all(client);
    assert_eq!(everywhere.list(&ListParams::default()).await.unwrap().items.len(), 7);
}

#[tokio::test]
async fn delete_preconditions() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "d"}})).unwrap();
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions { uid: Some("nope".into()), resource_version: None }),
        ..Default::default()
    };
    let e = status(cms.delete("d", &wrong_uid).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(e.message.contains("Precondition failed: UID in precondition: nope"), "{}", e.message);
    let wrong_rv = DeleteParams {
        preconditions: Some(Preconditions { uid: None, resource_version: Some("1".into()) }),
        ..Default::default()
    };
    assert_eq!(status(cms.delete("d", &wrong_rv).await.unwrap_err()).code, 409);
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: created.metadata.resource_version.clone(),
        }),
        propagation_policy: Some(kube::api::PropagationPolicy::Background),
        ..Default::default()
    };
    let deleted = cms.delete("d", &right).await.unwrap();
    assert!(deleted.is_right(), "configmaps answer a success Status");
    assert_eq!(status(cms.get("d").await.unwrap_err()).code, 404);
    assert_eq!(status(cms.delete("d", &DeleteParams::default()).await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn lease_create_and_update_conflict() {
    let (_server, client) = start().await;
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}}),
    )
    .unwrap();
    let first = leases.create(&PostParams::default(), &lease).await.unwrap();
    assert_eq!(status(leases.create(&PostParams::default(), &lease).await.unwrap_err()).code, 409);
    let mut renew = first.clone();
    renew.spec.as_mut().unwrap().lease_duration_seconds = Some(41);
    leases.replace("n1", &PostParams::default(), &renew).await.unwrap();
    renew.spec.as_mut().unwrap().lease_duration_seconds = Some(42);
    let e = status(leases.replace("n1", &PostParams::default(), &renew).await.unwrap_err());
    assert_eq!(e.reason, "Conflict");
    assert!(
        e.message.starts_with("Operation cannot be fulfilled on leases.coordination.k8s.io \"n1\""),
        "{}",
        e.message
    );
    // Leases allow create-on-update.
    let mut other = lease.clone();
    other.metadata.name = Some("n2".into());
    leases.replace("n2", &PostParams::default(), &other).await.unwrap();
}

#[tokio::test]
async fn namespaces_and_defaults() {
    let (_server, client) = start().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for want in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(names.contains(&want.to_string()), "{want} missing from {names:?}");
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    namespaces.create(&PostParams::default(), &ns).await.unwrap();
    // The service account and root CA controllers' objects appear in new namespaces.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), "team");
    sas.get("default").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    assert!(cms.get("kube-root-ca.crt").await.unwrap().data.unwrap()["ca.crt"].contains("BEGIN CERTIFICATE"));
    // Deleting a namespace deletes its content; the namespace goes once empty.
    namespaces.delete("team", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(namespaces.get("team").await.unwrap_err()).code, 404);
    assert_eq!(status(namespaces.delete("default", &DeleteParams::default()).await.unwrap_err()).code, 403);
}

#[tokio::test]
async fn malformed_bodies_are_bad_requests() {
    let (server, _client) = start().await;
    let http = RawClient::new(&server, &gantry_test_apiserver::User::Admin).await;
    let (code, body) = http.post("/api/v1/namespaces/default/configmaps", "{not json").await;
    assert_eq!(code, 400);
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "BadRequest");
    let (code, _) = http.post("/api/v1/namespaces/default/configmaps", "[1,2]").await;
    assert_eq!(code, 400);
    let (code, body) = http.get("/api/v1/namespaces/default/frobs").await;
    assert_eq!((code, body["reason"].as_str()), (404, Some("NotFound")));
    let (code, body) =
        http.patch("/api/v1/namespaces/default/configmaps/kube-root-ca.crt", "application/json-patch+json", "{}").await;
    assert_eq!(code, 400, "{body}");
    let (code, _) = http.patch("/api/v1/namespaces/default/configmaps/kube-root-ca.crt", "text/plain", "{}").await;
    assert_eq!(code, 415);
}
