//! Many clients at once: optimistic concurrency keeps every increment, and a watcher sees
//! every write in resourceVersion order.

mod common;

use std::time::{Duration, Instant};

use common::{rv, start};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const WRITERS: usize = 8;
const INCREMENTS: usize = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_increments_with_conflict_retries() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "counter"}, "data": {"n": "0"}})).unwrap();
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut watch = cms
        .watch(
            &WatchParams::default().fields("metadata.name=counter"),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();

    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        // Separate clients, so separate connections.
        let cms: Api<ConfigMap> = Api::namespaced(server.client(&gantry_test_apiserver::User::Admin).await, "default");
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0;
            for _ in 0..INCREMENTS {
                loop {
                    let mut current = cms.get("counter").await.unwrap();
                    let n: usize = current.data.as_ref().unwrap()["n"].parse().unwrap();
                    current.data.as_mut().unwrap().insert("n".into(), (n + 1).to_string());
                    match cms.replace("counter", &PostParams::default(), &current).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 => conflicts += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    let elapsed = started.elapsed();
    let total = WRITERS * INCREMENTS;
    let last = cms.get("counter").await.unwrap();
    assert_eq!(last.data.as_ref().unwrap()["n"], total.to_string());
    eprintln!("{total} increments by {WRITERS} writers in {elapsed:?} ({conflicts} conflicts retried)");

    // The watch saw every value 1..=total, in order, with increasing resourceVersions.
    let mut previous_rv = rv(&created);
    for expected in 1..=total {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
        let WatchEvent::Modified(obj) = event else { panic!("unexpected {event:?}") };
        assert_eq!(obj.data.as_ref().unwrap()["n"], expected.to_string());
        assert!(rv(&obj) > previous_rv);
        previous_rv = rv(&obj);
    }
    assert_eq!(previous_rv, rv(&last));
}
