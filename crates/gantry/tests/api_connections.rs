//! The node's connections to the API server (no runtime needed): its clients speak HTTP/2
//! (ALPN `h2`) and carry many watches on one connection, opening another only when one
//! carries as many streams as the server allows (kube-apiserver's default of 100, as the test
//! server); every watch sees its events, a watch dropped by the client ends on the server, and
//! watches come back after the server restarts. Counted by the test API server itself.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use gantry_agent::api;
use gantry_config::Settings;
use gantry_test_apiserver::{ClientConnection, HTTP2_MAX_STREAMS, TestApiServer, User};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

const USER: &str = "watcher";

/// The node's clients (`gantry_agent::api`), authenticated by a client certificate.
async fn node_clients(server: &TestApiServer, dir: &std::path::Path) -> api::ApiClients {
    let user = User::ClientCert { cn: USER.into(), groups: vec!["system:masters".into()] };
    let settings =
        Settings { node_name: "n1".into(), kubeconfig: Some(server.kubeconfig(dir, &user)), ..Settings::default() };
    api::connect_clients(&settings).await.expect("the clients connect")
}

fn open_connections_of(server: &TestApiServer) -> Vec<ClientConnection> {
    server.connections().into_iter().filter(|c| c.open && c.users.contains(USER)).collect()
}

/// A watch from `rv`; a request queued behind a full connection fails here instead of hanging.
async fn open_watch(
    api: &Api<ConfigMap>,
    params: &WatchParams,
    rv: &str,
) -> futures::stream::BoxStream<'static, kube::Result<WatchEvent<ConfigMap>>> {
    let watch = tokio::time::timeout(Duration::from_secs(10), api.watch(params, rv)).await;
    watch.expect("the server answers the watch within 10 s").expect("watch").boxed()
}

async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn watches_share_http2_connections_of_at_most_the_servers_streams() {
    let server = TestApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let clients = node_clients(&server, dir.path()).await;
    let admin: Api<ConfigMap> = Api::namespaced(server.client(&User::Admin).await, "default");
    let mine: Api<ConfigMap> = Api::namespaced(clients.client.clone(), "default");
    let heartbeat: Api<ConfigMap> = Api::namespaced(clients.heartbeat.clone(), "default");

    // Up to the server's limit, every request and watch of both clients shares one connection.
    let limit = HTTP2_MAX_STREAMS as usize;
    let rv = server.resource_version().to_string();
    let mut watches = Vec::new();
    for i in 0..limit - 1 {
        let api = if i % 2 == 0 { &mine } else { &heartbeat };
        let params = WatchParams::default().fields(&format!("metadata.name=cm-{i}"));
        watches.push(open_watch(api, &params, &rv).await);
    }
    assert_eq!(server.open_watches().len(), limit - 1);
    let open = open_connections_of(&server);
    assert_eq!(open.len(), 1, "{} watches on one connection: {open:?}", limit - 1);
    assert!(open[0].http2, "ALPN chose HTTP/2: {open:?}");

    // Past it, a second connection carries the rest: no watch waits for a free stream.
    for i in limit - 1..limit + 20 {
        let params = WatchParams::default().fields(&format!("metadata.name=cm-{i}"));
        watches.push(open_watch(&mine, &params, &rv).await);
    }
    assert_eq!(server.open_watches().len(), limit + 20);
    let open = open_connections_of(&server);
    assert_eq!(open.len(), 2, "{} watches need two connections: {open:?}", limit + 20);
    assert!(open.iter().all(|c| c.http2), "{open:?}");

    // Every watch sees its own object created.
    for i in 0..watches.len() {
        let cm = json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "1"}});
        admin.create(&PostParams::default(), &serde_json::from_value(cm).unwrap()).await.unwrap();
    }
    for (i, watch) in watches.iter_mut().enumerate() {
        let event = tokio::time::timeout(Duration::from_secs(30), watch.try_next()).await;
        match event {
            Ok(Ok(Some(WatchEvent::Added(cm)))) => assert_eq!(cm.name_any(), format!("cm-{i}")),
            other => panic!("watch {i}: {other:?}"),
        }
    }

    // A watch the client drops ends on the server (the stream is reset, the connection stays).
    watches.truncate(10);
    eventually("the dropped watches to end on the server", || (server.open_watches().len() == 10).then_some(())).await;
    drop(watches);
    eventually("every watch to end on the server", || server.open_watches().is_empty().then_some(())).await;
    assert!(!open_connections_of(&server).is_empty(), "the connections stay for the next requests");
}

#[tokio::test]
async fn a_watch_comes_back_on_a_new_connection_after_the_server_restarts() {
    let mut server = TestApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let clients = node_clients(&server, dir.path()).await;
    let admin: Api<ConfigMap> = Api::namespaced(server.client(&User::Admin).await, "default");
    let cm = json!({"metadata": {"name": "cm"}, "data": {"v": "1"}});
    admin.create(&PostParams::default(), &serde_json::from_value(cm).unwrap()).await.unwrap();
    let mine: Api<ConfigMap> = Api::namespaced(clients.client.clone(), "default");
    let config = watcher::Config::default().fields("metadata.name=cm");
    let mut events = watcher::watcher(mine, config).boxed();
    let mut next_value = async || loop {
        let event = tokio::time::timeout(Duration::from_secs(60), events.next()).await.expect("an event in time");
        if let Some(Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm))) = event {
            return cm.data.unwrap_or_default().get("v").cloned().unwrap_or_default();
        }
    };
    assert_eq!(next_value().await, "1");
    let of_user = |server: &TestApiServer| server.connections().into_iter().filter(|c| c.users.contains(USER)).count();
    let before = of_user(&server);

    server.restart().await;
    let patch = Patch::Merge(json!({"data": {"v": "2"}}));
    admin.patch("cm", &PatchParams::default(), &patch).await.unwrap();
    assert_eq!(next_value().await, "2", "the change made after the restart arrives");
    assert!(of_user(&server) > before, "over a new connection: {:?}", server.connections());
    let open = open_connections_of(&server);
    assert!(open.len() == 1 && open[0].http2, "{open:?}");
}
