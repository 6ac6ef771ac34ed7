//! End-to-end, cluster mode: what pods' ConfigMaps and Secrets cost the API server, counted
//! by the test API server itself (`configMapAndSecretChangeDetectionStrategy`). With `Watch`
//! (the default) a node whose pods run sends no GETs of them, yet a change still reaches the
//! volume at the next sync; immutable objects are read once and never watched; a watch stops
//! with the last pod using it. `Get` reads on every sync, `Cache` once per TTL (the Node's
//! `node.alpha.kubernetes.io/ttl`). Services for the environment come from one watch of the
//! pods' namespace, never from a LIST per container start. All the node's watches share one
//! HTTP/2 connection.

mod common;

use std::io::Write;
use std::time::Duration;

use common::cluster::{self, Cluster};
use common::{Env, Gantry, container_output, eventually, pod_yaml};
use gantry_test_apiserver::{OpenWatch, TestApiServer};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const SYNC: &str = "--sync-frequency=2s";

/// A pod bound to the node reading `/cfg/v` (ConfigMap `cm`), a Secret `secret` as env `S`
/// and, when given, the immutable ConfigMap `frozen` at `/frozen`.
fn pod(node: &str, name: &str, cm: &str, secret: &str, frozen: Option<&str>) -> Pod {
    let mut volumes = format!("  volumes:\n  - name: cfg\n    configMap:\n      name: {cm}\n");
    let mut mounts = "    volumeMounts:\n    - name: cfg\n      mountPath: /cfg\n".to_string();
    if let Some(f) = frozen {
        volumes += &format!("  - name: frozen\n    configMap:\n      name: {f}\n");
        mounts += "    - name: frozen\n      mountPath: /frozen\n";
    }
    let spec = format!(
        "  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  automountServiceAccountToken: false\n{volumes}"
    );
    let env = format!(
        "    env:\n    - name: S\n      valueFrom:\n        secretKeyRef:\n          name: {secret}\n          key: k\n"
    );
    let command = "echo S=$S; while true; do echo SEEN=$(cat /cfg/v); sleep 1; done";
    serde_yaml_ng::from_str(&format!("{}{env}{mounts}", pod_yaml(name, command, &spec))).unwrap()
}

fn config_map(name: &str, value: &str, immutable: bool) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": value}, "immutable": immutable})).unwrap()
}

fn secret(name: &str) -> Secret {
    serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "secret-value"}})).unwrap()
}

/// The test server (these tests read its request counts), or None on a real cluster.
async fn setup(case: &str, strategy: Option<&str>) -> Option<(Env, Cluster)> {
    let (env, mut cluster) = cluster::setup().await?;
    cluster.test_server(case)?;
    if let Some(s) = strategy {
        let mut config = std::fs::OpenOptions::new().append(true).open(&env.config).unwrap();
        writeln!(config, "configMapAndSecretChangeDetectionStrategy: {s}").unwrap();
    }
    Some((env, cluster))
}

fn server(cluster: &Cluster) -> &TestApiServer {
    match cluster {
        Cluster::Test(s) => s,
        Cluster::Real(_) => unreachable!("setup skips real clusters"),
    }
}

fn start(env: &Env, cluster: &Cluster) -> Gantry {
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    env.kubelet(&[&format!("--kubeconfig={}", kubeconfig.display()), SYNC])
}

fn watches_of(open: &[OpenWatch], resource: &str, name: &str) -> usize {
    open.iter().filter(|w| w.resource == resource && w.name.as_deref() == Some(name)).count()
}

async fn wait_seen(env: &Env, gantry: &Gantry, pod: &str, value: &str) {
    let line = format!("SEEN={value}");
    eventually(&format!("{pod} to see {value}"), gantry, || async {
        container_output(env, pod).contains(&line).then_some(())
    })
    .await;
}

#[tokio::test]
async fn watched_objects_are_not_read_again_and_watches_follow_the_pods() {
    let Some((env, cluster)) = setup("watched objects", None).await else { return };
    let admin = cluster.admin().await;
    let (cms, secrets): (Api<ConfigMap>, Api<Secret>) =
        (Api::namespaced(admin.clone(), "default"), Api::namespaced(admin.clone(), "default"));
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    cms.create(&PostParams::default(), &config_map("frozen", "ice", true)).await.unwrap();
    for i in 0..3 {
        cms.create(&PostParams::default(), &config_map(&format!("cm-{i}"), "v1", false)).await.unwrap();
        secrets.create(&PostParams::default(), &secret(&format!("s-{i}"))).await.unwrap();
    }
    let gantry = start(&env, &cluster);
    for i in 0..3 {
        let p = pod(&env.node, &format!("p{i}"), &format!("cm-{i}"), &format!("s-{i}"), Some("frozen"));
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    for i in 0..3 {
        wait_seen(&env, &gantry, &format!("p{i}"), "v1").await;
        assert!(container_output(&env, &format!("p{i}")).contains("S=secret-value"));
    }
    let api = server(&cluster);
    let before = api.requests();
    // A change reaches the volume at a later sync: the pods have synced while we waited.
    cms.patch("cm-1", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "v2"}}))).await.unwrap();
    wait_seen(&env, &gantry, "p1", "v2").await;
    // And a few more syncs of every pod.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counted = api.requests().since(&before);
    for resource in ["configmaps", "secrets", "services"] {
        for verb in ["get", "list"] {
            assert_eq!(counted.total(verb, resource), 0, "{verb} {resource} while pods run: {counted:?}");
        }
    }
    let open = api.open_watches();
    for i in 0..3 {
        assert_eq!(watches_of(&open, "configmaps", &format!("cm-{i}")), 1, "{open:?}");
        assert_eq!(watches_of(&open, "secrets", &format!("s-{i}")), 1, "{open:?}");
    }
    assert_eq!(watches_of(&open, "configmaps", "frozen"), 0, "immutable objects are not watched: {open:?}");
    let services: Vec<_> = open.iter().filter(|w| w.resource == "services").collect();
    assert_eq!(services.len(), 1, "one watch of the pods' namespace, which has default/kubernetes: {open:?}");
    assert_eq!((services[0].namespace.as_deref(), services[0].name.as_deref()), (Some("default"), None));
    // All of them, the pods' watch and the node's own requests share one HTTP/2 connection.
    let user = format!("system:node:{}", env.node);
    let node_connections: Vec<_> =
        api.connections().into_iter().filter(|c| c.open && c.users.contains(&user)).collect();
    assert_eq!(node_connections.len(), 1, "{} watches on one connection: {node_connections:?}", open.len());
    assert!(node_connections[0].http2, "{node_connections:?}");

    pods.delete("p0", &DeleteParams::default()).await.unwrap();
    eventually("p0 gone", &gantry, || async { pods.get_opt("p0").await.ok()?.is_none().then_some(()) }).await;
    let open = eventually("the watches of p0's objects to stop", &gantry, || async {
        let open = api.open_watches();
        (watches_of(&open, "configmaps", "cm-0") + watches_of(&open, "secrets", "s-0") == 0).then_some(open)
    })
    .await;
    assert_eq!(watches_of(&open, "configmaps", "cm-1"), 1, "other pods keep theirs: {open:?}");
    assert_eq!(watches_of(&open, "secrets", "s-2"), 1, "{open:?}");
    cluster.cleanup(&env.node).await;
}

/// Creates ConfigMap `cm` (`v: v1`) and Secret `s`, starts Gantry, creates pod `p` using both
/// and waits until its container has seen `v1`.
async fn start_pod_with_cm_and_secret(env: &Env, cluster: &Cluster) -> Gantry {
    let admin = cluster.admin().await;
    let (cms, secrets): (Api<ConfigMap>, Api<Secret>) =
        (Api::namespaced(admin.clone(), "default"), Api::namespaced(admin.clone(), "default"));
    cms.create(&PostParams::default(), &config_map("cm", "v1", false)).await.unwrap();
    secrets.create(&PostParams::default(), &secret("s")).await.unwrap();
    let gantry = start(env, cluster);
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    pods.create(&PostParams::default(), &pod(&env.node, "p", "cm", "s", None)).await.unwrap();
    wait_seen(env, &gantry, "p", "v1").await;
    gantry
}

/// A watch the server ends is resumed from the last version seen; when that version is gone
/// (410, the server's history compacted), the object is listed again and still followed.
#[tokio::test]
async fn a_watch_whose_version_is_gone_lists_again_and_follows_changes() {
    let Some((env, cluster)) = setup("watch expired", None).await else { return };
    let gantry = start_pod_with_cm_and_secret(&env, &cluster).await;
    let api = server(&cluster);
    let cms: Api<ConfigMap> = Api::namespaced(cluster.admin().await, "default");
    // A change the node's watches do not see, so that every version they hold is now older
    // than the history that the compaction keeps.
    cms.create(&PostParams::default(), &config_map("other", "x", false)).await.unwrap();
    let before = api.requests();
    api.compact();
    api.faults().drop_watches();
    eventually("the ConfigMap and Secret listed again", &gantry, || async {
        let counted = api.requests().since(&before);
        (counted.total("list", "configmaps") >= 1 && counted.total("list", "secrets") >= 1).then_some(())
    })
    .await;
    cms.patch("cm", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "v2"}}))).await.unwrap();
    wait_seen(&env, &gantry, "p", "v2").await;
    let open = api.open_watches();
    assert_eq!(watches_of(&open, "configmaps", "cm"), 1, "{open:?}");
    assert_eq!(watches_of(&open, "secrets", "s"), 1, "{open:?}");
    let counted = api.requests().since(&before);
    assert_eq!(counted.total("get", "configmaps"), 0, "{counted:?}");
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn get_strategy_reads_on_every_sync() {
    let Some((env, cluster)) = setup("Get strategy", Some("Get")).await else { return };
    let gantry = start_pod_with_cm_and_secret(&env, &cluster).await;
    let api = server(&cluster);
    let before = api.requests();
    eventually("GETs of the ConfigMap at each sync", &gantry, || async {
        (api.requests().since(&before).of("get", "configmaps", "default", "cm") >= 2).then_some(())
    })
    .await;
    assert_eq!(watches_of(&api.open_watches(), "configmaps", "cm"), 0, "Get does not watch");
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn cache_strategy_reads_once_per_node_ttl() {
    let Some((env, cluster)) = setup("Cache strategy", Some("Cache")).await else { return };
    let gantry = start_pod_with_cm_and_secret(&env, &cluster).await;
    let api = server(&cluster);
    // Without the annotation the TTL is a minute: several syncs, no GET.
    let before = api.requests();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let counted = api.requests().since(&before);
    assert_eq!(counted.of("get", "configmaps", "default", "cm"), 0, "{counted:?}");
    assert_eq!(watches_of(&api.open_watches(), "configmaps", "cm"), 0, "Cache does not watch");

    // A one-second TTL on the Node (read by the node status loop): reads resume, changes follow.
    let admin = cluster.admin().await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let nodes: Api<Node> = Api::all(admin);
    let ttl = json!({"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "1"}}});
    nodes.patch(&env.node, &PatchParams::default(), &Patch::Merge(&ttl)).await.unwrap();
    cms.patch("cm", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "v2"}}))).await.unwrap();
    wait_seen(&env, &gantry, "p", "v2").await;
    let before = api.requests();
    eventually("GETs once the TTL has passed", &gantry, || async {
        (api.requests().since(&before).of("get", "configmaps", "default", "cm") >= 2).then_some(())
    })
    .await;
    cluster.cleanup(&env.node).await;
}
