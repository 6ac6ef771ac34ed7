//! stop()/restart(): data survives, connections are refused while stopped; discovery and
//! the informational endpoints.

mod common;

use common::{RawClient, start, status};
use gantry_test_apiserver::User;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn stop_and_restart_keep_data() {
    let (mut server, client) = start().await;
    let url = server.url();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "keep"}, "data": {"a": "1"}})).unwrap();
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();

    server.stop().await;
    let port = url.rsplit(':').next().unwrap();
    let refused = std::net::TcpStream::connect(format!("127.0.0.1:{port}"));
    assert_eq!(refused.unwrap_err().kind(), std::io::ErrorKind::ConnectionRefused);
    match cms.get("keep").await {
        Err(kube::Error::Api(s)) => panic!("expected a connection error, got API status {s:?}"),
        Err(_) => {}
        Ok(_) => panic!("request succeeded while stopped"),
    }

    server.restart().await;
    assert_eq!(server.url(), url);
    let again = cms.get("keep").await.unwrap();
    assert_eq!(again.metadata.uid, created.metadata.uid);
    assert_eq!(again.metadata.resource_version, created.metadata.resource_version);
    // Writes continue from the same resourceVersion sequence.
    let mut edit = again.clone();
    edit.data.as_mut().unwrap().insert("a".into(), "2".into());
    let updated = cms.replace("keep", &PostParams::default(), &edit).await.unwrap();
    assert!(common::rv(&updated) > common::rv(&again));
}

#[tokio::test]
async fn version_health_and_discovery() {
    let (server, client) = start().await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "34"));
    let raw = RawClient::new(&server, &User::Admin).await;
    let (code, groups) = raw.get("/apis").await;
    assert_eq!(code, 200);
    assert!(groups["groups"].as_array().unwrap().iter().any(|g| g["name"] == "coordination.k8s.io"));
    let (_, core) = raw.get("/api/v1").await;
    assert!(
        core["resources"].as_array().unwrap().iter().any(|r| r["name"] == "pods/eviction" && r["group"] == "policy")
    );
    let discovery = kube::discovery::Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group("policy") && discovery.has_group("apps"));
    let aggregated = kube::discovery::Discovery::new(client.clone()).run_aggregated().await.unwrap();
    assert!(aggregated.has_group("coordination.k8s.io"));

    // Unauthenticated: health is public, the API is not.
    let anonymous = RawClient::new(&server, &User::ClientCert { cn: "system:anonymous".into(), groups: vec![] }).await;
    assert_eq!(anonymous.get("/healthz").await.0, 200);

    // The kubernetes service points at this server.
    let svc = Api::<Service>::namespaced(client.clone(), "default").get("kubernetes").await.unwrap();
    assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.1"));
    let created: Service = Api::<Service>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})).unwrap(),
        )
        .await
        .unwrap();
    let spec = created.spec.unwrap();
    assert!(spec.cluster_ip.unwrap().starts_with("10.96."));
    assert_eq!(spec.ports.unwrap()[0].protocol.as_deref(), Some("TCP"));
    let _ = status;
}
