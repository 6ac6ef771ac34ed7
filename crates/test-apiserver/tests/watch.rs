//! Watches: resume from a resourceVersion, initial events, bookmarks, 410 after
//! compaction (raw and through kube-runtime's watcher, which relists), selectors, timeouts,
//! streaming lists, and watches closed by stop().

mod common;

use std::time::Duration;

use common::{create_pod, rv, start, status};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(10);

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})).unwrap()
}

async fn next<T: Clone + serde::de::DeserializeOwned + std::fmt::Debug>(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<T>>> + Unpin),
) -> WatchEvent<T> {
    timeout(WAIT, stream.next()).await.expect("event in time").expect("stream open").expect("event")
}

fn name_of(e: &WatchEvent<ConfigMap>) -> (&'static str, String) {
    match e {
        WatchEvent::Added(o) => ("ADDED", o.metadata.name.clone().unwrap()),
        WatchEvent::Modified(o) => ("MODIFIED", o.metadata.name.clone().unwrap()),
        WatchEvent::Deleted(o) => ("DELETED", o.metadata.name.clone().unwrap()),
        WatchEvent::Bookmark(_) => ("BOOKMARK", String::new()),
        WatchEvent::Error(e) => panic!("error event {e:?}"),
    }
}

#[tokio::test]
async fn list_then_watch_resumes_from_resource_version() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("a", json!({}))).await.unwrap();
    let list = cms.list(&ListParams::default()).await.unwrap();
    let from = list.metadata.resource_version.unwrap();
    // Changes after the list, before the watch starts, are replayed in order.
    cms.create(&PostParams::default(), &cm("b", json!({}))).await.unwrap();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "w"}}))).await.unwrap();
    cms.delete("b", &Default::default()).await.unwrap();
    let mut w = cms.watch(&WatchParams::default(), &from).await.unwrap().boxed();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(name_of(&next(&mut w).await));
    }
    assert_eq!(seen, vec![("ADDED", "b".into()), ("MODIFIED", "a".into()), ("DELETED", "b".into())]);
    // And live changes keep coming.
    cms.create(&PostParams::default(), &cm("c", json!({}))).await.unwrap();
    assert_eq!(name_of(&next(&mut w).await), ("ADDED", "c".into()));
}

#[tokio::test]
async fn watch_from_zero_sends_current_objects_first() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("x", json!({}))).await.unwrap();
    let mut w = cms.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let mut added = Vec::new();
    for _ in 0..2 {
        added.push(name_of(&next(&mut w).await));
    }
    added.sort();
    assert_eq!(added, vec![("ADDED", "kube-root-ca.crt".into()), ("ADDED", "x".into())]);
}

#[tokio::test]
async fn deleted_events_carry_a_new_resource_version() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let created = cms.create(&PostParams::default(), &cm("d", json!({}))).await.unwrap();
    let mut w =
        cms.watch(&WatchParams::default(), &created.metadata.resource_version.clone().unwrap()).await.unwrap().boxed();
    cms.delete("d", &Default::default()).await.unwrap();
    match next(&mut w).await {
        WatchEvent::Deleted(o) => assert!(rv(&o) > rv(&created)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn compaction_expires_old_resource_versions() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let old = cms.create(&PostParams::default(), &cm("e", json!({}))).await.unwrap();
    cms.patch("e", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    server.compact();
    let old_rv = old.metadata.resource_version.unwrap();
    let mut w = cms.watch(&WatchParams::default(), &old_rv).await.unwrap().boxed();
    match next(&mut w).await {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert!(e.message.starts_with(&format!("too old resource version: {old_rv} (")), "{}", e.message);
        }
        other => panic!("expected 410, got {other:?}"),
    }
    assert!(timeout(WAIT, w.next()).await.unwrap().is_none(), "the watch ends after the error");
    let exact = ListParams::default().at(&old_rv).matching(kube::api::VersionMatch::Exact);
    let e = status(cms.list(&exact).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
    // The current resourceVersion still works.
    let list = cms.list(&ListParams::default()).await.unwrap();
    let mut w = cms.watch(&WatchParams::default(), &list.metadata.resource_version.unwrap()).await.unwrap().boxed();
    cms.create(&PostParams::default(), &cm("f", json!({}))).await.unwrap();
    assert_eq!(name_of(&next(&mut w).await), ("ADDED", "f".into()));
}

#[tokio::test]
async fn exact_list_reads_the_past() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let a = cms.create(&PostParams::default(), &cm("a", json!({}))).await.unwrap();
    cms.create(&PostParams::default(), &cm("b", json!({}))).await.unwrap();
    let past = cms
        .list(&ListParams::default().at(&a.metadata.resource_version.unwrap()).matching(kube::api::VersionMatch::Exact))
        .await
        .unwrap();
    let names: Vec<_> = past.items.into_iter().filter_map(|c| c.metadata.name).collect();
    assert_eq!(names, vec!["a", "kube-root-ca.crt"]);
}

#[tokio::test]
async fn watcher_relists_after_410() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("w1", json!({"watched": "yes"}))).await.unwrap();
    // Short watches without bookmarks, so the watcher reconnects from the list's version.
    let config = watcher::Config::default().labels("watched=yes").timeout(1).disable_bookmarks();
    let mut events = watcher::watcher(cms.clone(), config).boxed();
    let mut inits = 0;
    let mut seen_w1 = false;
    while !(inits == 1 && seen_w1) {
        match timeout(WAIT, events.try_next()).await.unwrap().unwrap().unwrap() {
            Event::Init => inits += 1,
            Event::InitApply(o) => seen_w1 |= o.metadata.name.as_deref() == Some("w1"),
            _ => {}
        }
    }
    // Changes the watcher does not see (other labels), then compaction: its version expires.
    cms.create(&PostParams::default(), &cm("other", json!({"watched": "no"}))).await.unwrap();
    server.compact();
    cms.create(&PostParams::default(), &cm("w2", json!({"watched": "yes"}))).await.unwrap();
    // The watcher gets 410 on reconnect, relists (a second Init) and sees w2.
    let mut relisted = false;
    let mut seen_w2 = false;
    while !(relisted && seen_w2) {
        match timeout(WAIT, events.next()).await.unwrap().unwrap() {
            Ok(Event::Init) => relisted = true,
            Ok(Event::InitApply(o) | Event::Apply(o)) => seen_w2 |= o.metadata.name.as_deref() == Some("w2"),
            Ok(_) => {}
            Err(e) => assert!(e.to_string().contains("410") || e.to_string().to_lowercase().contains("expired"), "{e}"),
        }
    }
}

#[tokio::test]
async fn bookmarks_and_timeouts() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let list = cms.list(&ListParams::default()).await.unwrap();
    let started = std::time::Instant::now();
    let mut w =
        cms.watch(&WatchParams::default().timeout(2), &list.metadata.resource_version.unwrap()).await.unwrap().boxed();
    assert!(timeout(WAIT, w.next()).await.unwrap().is_none(), "timeoutSeconds ends the watch");
    assert!(started.elapsed() >= Duration::from_millis(1900));
    let list = cms.list(&ListParams::default()).await.unwrap();
    let mut w =
        cms.watch(&WatchParams::default().timeout(15), &list.metadata.resource_version.unwrap()).await.unwrap().boxed();
    match timeout(Duration::from_secs(14), w.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::<ConfigMap>::Bookmark(b) => assert!(!b.metadata.resource_version.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn field_selected_watch_reports_objects_leaving_the_selection() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create_pod(&client, "default", "p", Some("n1")).await;
    let list = pods.list(&ListParams::default().fields("status.phase=Pending")).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let mut w = pods
        .watch(&WatchParams::default().fields("status.phase=Pending"), &list.metadata.resource_version.unwrap())
        .await
        .unwrap()
        .boxed();
    pods.patch_status("p", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Running"}})))
        .await
        .unwrap();
    match next(&mut w).await {
        WatchEvent::Deleted(p) => assert_eq!(p.status.unwrap().phase.as_deref(), Some("Running")),
        other => panic!("expected DELETED, got {other:?}"),
    }
    pods.patch_status("p", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Pending"}})))
        .await
        .unwrap();
    assert!(matches!(next(&mut w).await, WatchEvent::Added(_)));
}

#[tokio::test]
async fn streaming_list_watcher() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("s1", json!({}))).await.unwrap();
    let mut events = watcher::watcher(cms.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match timeout(WAIT, events.try_next()).await.unwrap().unwrap().unwrap() {
            Event::InitApply(o) => initial.push(o.metadata.name.unwrap()),
            Event::InitDone => break,
            _ => {}
        }
    }
    initial.sort();
    assert_eq!(initial, vec!["kube-root-ca.crt", "s1"]);
    cms.create(&PostParams::default(), &cm("s2", json!({}))).await.unwrap();
    match timeout(WAIT, events.try_next()).await.unwrap().unwrap().unwrap() {
        Event::Apply(o) => assert_eq!(o.metadata.name.as_deref(), Some("s2")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn send_initial_events_requires_bookmarks() {
    let (server, _client) = start().await;
    let http = common::RawClient::new(&server, &gantry_test_apiserver::User::Admin).await;
    let (code, body) = http
        .get(
            "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        )
        .await;
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")));
}

#[tokio::test]
async fn stop_closes_watches() {
    let (mut server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let list = cms.list(&ListParams::default()).await.unwrap();
    let mut w = cms.watch(&WatchParams::default(), &list.metadata.resource_version.unwrap()).await.unwrap().boxed();
    server.stop().await;
    let end = timeout(WAIT, w.next()).await.expect("watch ends when the server stops");
    assert!(end.is_none() || end.unwrap().is_err());
}

/// The server counts requests by verb, resource and object, and lists the watches it serves
/// until the client goes away; a `metadata.name` watch sees only its object.
#[tokio::test]
async fn requests_and_open_watches_are_counted() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("a", json!({}))).await.unwrap();
    cms.create(&PostParams::default(), &cm("b", json!({}))).await.unwrap();
    let before = server.requests();
    cms.get("a").await.unwrap();
    cms.get("a").await.unwrap();
    let list = cms.list(&ListParams::default().fields("metadata.name=a")).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let mut w = cms
        .watch(&WatchParams::default().fields("metadata.name=a"), &list.metadata.resource_version.unwrap())
        .await
        .unwrap()
        .boxed();
    cms.patch("b", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    assert_eq!(name_of(&next(&mut w).await), ("MODIFIED", "a".to_string()));
    let counted = server.requests().since(&before);
    assert_eq!(counted.of("get", "configmaps", "default", "a"), 2);
    assert_eq!(counted.of("list", "configmaps", "default", "a"), 1);
    assert_eq!(counted.of("watch", "configmaps", "default", "a"), 1);
    assert_eq!(counted.total("patch", "configmaps"), 2);
    assert_eq!(counted.total("get", "configmaps"), 2);
    let open = server.open_watches();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(
        (open[0].resource.as_str(), open[0].namespace.as_deref(), open[0].name.as_deref()),
        ("configmaps", Some("default"), Some("a"))
    );
    drop(w);
    let deadline = std::time::Instant::now() + WAIT;
    while !server.open_watches().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the watch is still open after the client left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
