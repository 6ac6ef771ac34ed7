//! Injected faults, seen from a client: failures with their status and Retry-After, hangs that
//! end, and watches cut while the connection stays.

mod common;

use std::time::{Duration, Instant};

use common::{client_without_retries, start};
use futures::StreamExt;
use gantry_test_apiserver::{Failure, User};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

#[tokio::test]
async fn failures_answer_before_the_api_and_are_not_counted_as_requests() {
    let (server, _) = start().await;
    let client = client_without_retries(&server, &User::Admin).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    server.faults().fail(Failure::InternalError, Duration::from_secs(60));
    let e = common::status(cms.create(&PostParams::default(), &cm("a")).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    assert_eq!(e.message, "Internal error occurred: injected fault");
    assert_eq!(server.requests().total("create", "configmaps"), 0, "never reached the API");
    assert_eq!(server.faults().answered(), 1);

    server.faults().clear();
    server.faults().fail(Failure::TooManyRequests, Duration::from_secs(60));
    let res = client
        .send(http::Request::get("/api/v1/namespaces/default/configmaps").body(kube::client::Body::empty()).unwrap());
    let res = res.await.unwrap();
    assert_eq!(res.status().as_u16(), 429);
    assert_eq!(res.headers()["retry-after"], "1", "429 says when to retry, as kube-apiserver");

    server.faults().clear();
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    assert_eq!(server.requests().total("create", "configmaps"), 1);
}

#[tokio::test]
async fn a_hang_holds_requests_until_it_ends_after_the_faults_before_it() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client_without_retries(&server, &User::Admin).await, "default");
    let faults = server.faults();
    faults.fail(Failure::InternalError, Duration::from_millis(500));
    faults.hang(Duration::from_secs(1));
    let started = Instant::now();
    assert_eq!(common::status(cms.get_opt("x").await.unwrap_err()).code, 500, "the failure comes first");
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Now in the hang: the request is answered when it ends, 1.5 s after the faults began.
    assert!(cms.get_opt("x").await.unwrap().is_none());
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(5), "answered after {took:?}");
    tokio::time::timeout(WAIT, faults.recovered()).await.unwrap();
    assert!(faults.recovery().is_none());
    let _ = Api::<ConfigMap>::namespaced(client, "default").get_opt("x").await.unwrap();
}

#[tokio::test]
async fn dropped_watches_end_and_new_ones_work() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut watch = cms.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let server = &server;
    let open_watches = |n: usize| async move {
        tokio::time::timeout(WAIT, async {
            while server.open_watches().len() != n {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("never {n} open watches"));
    };
    open_watches(1).await;
    server.faults().drop_watches();
    // (After the namespace's existing objects, the stream ends.)
    tokio::time::timeout(WAIT, async { while watch.next().await.is_some() {} }).await.expect("the watch ends");
    open_watches(0).await;

    let mut again = cms.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    cms.create(&PostParams::default(), &cm("after")).await.unwrap();
    let added = |e: &kube::api::WatchEvent<ConfigMap>| matches!(e, kube::api::WatchEvent::Added(c) if c.metadata.name.as_deref() == Some("after"));
    tokio::time::timeout(WAIT, async { while !added(&again.next().await.expect("the new watch goes on").unwrap()) {} })
        .await
        .expect("the new watch sees the new object");
}

#[tokio::test]
async fn dropped_connections_close_with_their_watches_and_clients_reconnect() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut watch = cms.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    assert!(server.connections().iter().any(|c| c.open));
    server.faults().drop_connections();
    tokio::time::timeout(WAIT, async { while let Some(Ok(_)) = watch.next().await {} })
        .await
        .expect("the watch ends with its connection");
    tokio::time::timeout(WAIT, async {
        while server.connections().iter().any(|c| c.open) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every connection closed");
    cms.create(&PostParams::default(), &cm("again")).await.expect("a new connection works");
    assert!(server.connections().iter().any(|c| c.open));
}
