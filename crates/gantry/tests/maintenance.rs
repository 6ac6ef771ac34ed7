//! End-to-end: `gantry maintenance-controller` draining a real Gantry node (containerd, the
//! test API server or a real cluster): the drain waits on a PodDisruptionBudget and goes on as
//! soon as the budget allows, and Complete restores the node.
//!
//! The controller-side cases (plan order, restart mid-drain, overlapping maintenances, two
//! replicas, metrics) need no containerd: the test stands in for the kubelet by finishing the
//! deletion of pods the controller evicted (see [`KubeletStandIn`]), which also records the
//! order in which pods started terminating.

mod common;
#[path = "common/maintenance_kit.rs"]
mod kit;

use common::cluster::{self, Cluster};
use common::{Gantry, eventually, pod_yaml};
use gantry_maintenance::api::{CONDITION_DRAINED, FINALIZER, NodeMaintenance};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kit::{Controller, KubeletStandIn, install_crd};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A Gantry node that has registered, and an admin client of a cluster that knows the CRD.
async fn registered_node_with_crd(env: &common::Env, cluster: &Cluster) -> (Gantry, kube::Client) {
    let gantry = cluster::start_node(env, cluster);
    let client = cluster.admin().await;
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("the node to register", &gantry, || async { nodes.get_opt(&env.node).await.ok().flatten() }).await;
    install_crd(&client).await;
    (gantry, client)
}

fn web_pod(node: &str, name: &str, app: &str) -> Pod {
    let spec =
        format!("  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  automountServiceAccountToken: false\n");
    let mut pod: Pod = serde_yaml_ng::from_str(&pod_yaml(name, "sleep 3600", &spec)).unwrap();
    pod.metadata.labels = Some([("app".to_string(), app.to_string())].into());
    pod
}

async fn running(pods: &Api<Pod>, name: &str) -> bool {
    let pod = pods.get_opt(name).await.ok().flatten();
    pod.and_then(|p| p.status?.phase).as_deref() == Some("Running")
}

async fn gone(pods: &Api<Pod>, name: &str) -> bool {
    matches!(pods.get_opt(name).await, Ok(None))
}

fn unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
}

#[tokio::test]
async fn drain_waits_for_the_pdb_then_complete_restores_the_node() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let (gantry, client) = registered_node_with_crd(&env, &cluster).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = env.node.clone();
    // Another schedulable node, so the safety check does not refuse the maintenance.
    let spare = cluster.unique_node_name("spare");
    let spare_node: Node = serde_json::from_value(json!({"metadata": {"name": spare}})).unwrap();
    let _ = nodes.create(&PostParams::default(), &spare_node).await;

    let app = format!("web-{node}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["web-a", "web-b"] {
        pods.create(&PostParams::default(), &web_pod(&node, name, &app)).await.unwrap();
    }
    for name in ["web-a", "web-b"] {
        eventually(&format!("{name} running"), &gantry, || async { running(&pods, name).await.then_some(()) }).await;
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": app},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    eventually("the PDB to allow one disruption", &gantry, || async {
        let status = pdbs.get(&app).await.ok()?.status?;
        (status.disruptions_allowed == 1).then_some(())
    })
    .await;

    let _controller = Controller::start(&cluster, &env.ctd.dir());
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let name = format!("maint-{node}");
    // The web pods are bare (no controller): only the explicit opt-in lets the drain evict them.
    let mut maintenance = maintenance_for(&name, &[&node], "Drain");
    maintenance.spec.evict_bare_pods = true;
    maintenances.create(&PostParams::default(), &maintenance).await.unwrap();

    // One pod goes; the PDB holds the other, and the status says so.
    let blocked = eventually("the drain to block on the PDB", &gantry, || async {
        let m = maintenances.get(&name).await.ok()?;
        let status = m.status?;
        let node_status = status.node_statuses.into_iter().find(|s| s.node_name == node)?;
        let reason =
            node_status.blocking_pods.iter().find(|b| b.reason.contains("PodDisruptionBudget"))?.reason.clone();
        let one_gone = gone(&pods, "web-a").await != gone(&pods, "web-b").await;
        one_gone.then_some((reason, node_status.was_unschedulable))
    })
    .await;
    assert!(blocked.0.contains(&app), "the blocking reason names the PDB: {}", blocked.0);
    assert_eq!(blocked.1, Some(false), "the node was schedulable before the maintenance");
    assert!(unschedulable(&nodes.get(&node).await.unwrap()), "the node is cordoned while draining");
    eventually("the node to show the drain", &gantry, || async {
        let n = nodes.get(&node).await.ok()?;
        let shown = node_condition(&n, "MaintenanceInProgress") == Some("True".into())
            && node_condition(&n, "DrainInProgress") == Some("True".into())
            && node_condition(&n, "Drained") == Some("False".into());
        shown.then_some(())
    })
    .await;
    let m = maintenances.get(&name).await.unwrap();
    assert_eq!(m.spec.drain_plan.len(), 12, "the default drain plan is written back");
    assert!(m.metadata.finalizers.unwrap_or_default().iter().any(|f| f == FINALIZER));

    // Once the budget allows it, the second pod goes too, without waiting for a retry timer.
    pdbs.patch(&app, &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 0}}))).await.unwrap();
    eventually("the drain to finish", &gantry, || async {
        let status = maintenances.get(&name).await.ok()?.status?;
        let drained = status.conditions.iter().any(|c| c.type_ == CONDITION_DRAINED && c.status == "True");
        (drained && gone(&pods, "web-a").await && gone(&pods, "web-b").await).then_some(())
    })
    .await;
    eventually("the node to show it is drained", &gantry, || async {
        let n = nodes.get(&node).await.ok()?;
        let shown = node_condition(&n, "Drained") == Some("True".into())
            && node_condition(&n, "DrainInProgress") == Some("False".into());
        shown.then_some(())
    })
    .await;

    maintenances
        .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"stage": "Complete"}})))
        .await
        .unwrap();
    eventually("Complete to restore the node", &gantry, || async {
        let restored = !unschedulable(&nodes.get(&node).await.ok()?);
        let m = maintenances.get(&name).await.ok()?;
        let released = !m.metadata.finalizers.unwrap_or_default().iter().any(|f| f == FINALIZER);
        (restored && released).then_some(())
    })
    .await;
    eventually("the maintenance conditions to clear", &gantry, || async {
        let n = nodes.get(&node).await.ok()?;
        let cleared = ["MaintenanceInProgress", "DrainInProgress", "Drained"]
            .iter()
            .all(|ty| node_condition(&n, ty) == Some("False".into()));
        cleared.then_some(())
    })
    .await;
    // The node agent's conditions were never disturbed by the controller's, nor the reverse.
    let n = nodes.get(&node).await.unwrap();
    assert_eq!(node_condition(&n, "Ready"), Some("True".into()), "the agent's Ready condition stays");
    let taints = nodes.get(&node).await.unwrap().spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(taints.iter().all(|t| t.key != gantry_maintenance::api::DRAIN_TAINT_KEY), "{taints:?}");

    let _ = maintenances.delete(&name, &DeleteParams::default()).await;
    let _ = pdbs.delete(&app, &DeleteParams::default()).await;
    let _ = nodes.delete(&spare, &DeleteParams::default()).await;
    cluster.cleanup(&node).await;
}

fn node_condition(node: &Node, ty: &str) -> Option<String> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == ty).map(|c| c.status.clone())
}

fn maintenance_for(name: &str, nodes: &[&str], stage: &str) -> NodeMaintenance {
    serde_json::from_value(json!({
        "apiVersion": "maintenance.gantry.dev/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": nodes}
            ]}]},
            "stage": stage,
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn deleting_a_maintenance_restores_exactly_the_previous_cordon_state() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let (gantry, client) = registered_node_with_crd(&env, &cluster).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = env.node.clone();
    let (spare, other) = (cluster.unique_node_name("spare"), cluster.unique_node_name("other"));
    for extra in [&spare, &other] {
        let n: Node = serde_json::from_value(json!({"metadata": {"name": extra}})).unwrap();
        let _ = nodes.create(&PostParams::default(), &n).await;
    }
    // The agent's node was cordoned by someone else before the maintenance.
    nodes.patch(&node, &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": true}}))).await.unwrap();

    let _controller = Controller::start(&cluster, &env.ctd.dir());
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let name = format!("cordon-{node}");
    let m = maintenance_for(&name, &[&node, &other], "Cordon");
    maintenances.create(&PostParams::default(), &m).await.unwrap();
    eventually("both nodes cordoned, with the previous state remembered", &gantry, || async {
        let status = maintenances.get(&name).await.ok()?.status?;
        let memory = |n: &str| status.node_statuses.iter().find(|s| s.node_name == n)?.was_unschedulable;
        let other_cordoned = unschedulable(&nodes.get(&other).await.ok()?);
        (memory(&node) == Some(true) && memory(&other) == Some(false) && other_cordoned).then_some(())
    })
    .await;

    // Deleting runs Complete through the finalizer: only the node this maintenance cordoned
    // is uncordoned.
    maintenances.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually("the maintenance to be gone and the nodes restored", &gantry, || async {
        let deleted = matches!(maintenances.get_opt(&name).await, Ok(None));
        let other_free = !unschedulable(&nodes.get(&other).await.ok()?);
        (deleted && other_free).then_some(())
    })
    .await;
    assert!(unschedulable(&nodes.get(&node).await.unwrap()), "a node cordoned before stays cordoned");

    for extra in [&spare, &other] {
        let _ = nodes.delete(extra, &DeleteParams::default()).await;
    }
    cluster.cleanup(&node).await;
}

// ---- Controller-side cases: no containerd, the test stands in for the kubelet. ----

/// An API server, an admin client knowing the CRD, a scratch folder, and two Nodes: the one
/// to maintain and a spare (so the safety check does not refuse the maintenance).
struct Bench {
    cluster: Cluster,
    client: kube::Client,
    dir: tempfile::TempDir,
    node: String,
    spare: String,
}

impl Bench {
    async fn start() -> Bench {
        gantry_testkit::init_test_tracing();
        let cluster = Cluster::start().await;
        let client = cluster.admin().await;
        install_crd(&client).await;
        let (node, spare) = (cluster.unique_node_name("maintained"), cluster.unique_node_name("spare"));
        let nodes: Api<Node> = Api::all(client.clone());
        for name in [&node, &spare] {
            let n: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            nodes.create(&PostParams::default(), &n).await.unwrap();
        }
        Bench { cluster, client, dir: tempfile::tempdir().unwrap(), node, spare }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    fn maintenances(&self) -> Api<NodeMaintenance> {
        Api::all(self.client.clone())
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// A pod bound to `node`, of the given priority class (with its value, which the
    /// test server does not resolve), controlled by a DaemonSet or else a ReplicaSet.
    async fn pod(&self, node: &str, name: &str, app: &str, priority: Option<(&str, i32)>, daemon_set: bool) {
        let mut pod = Bench::pod_json(node, name, app);
        if let Some((class, value)) = priority {
            pod["spec"]["priorityClassName"] = json!(class);
            pod["spec"]["priority"] = json!(value);
        }
        let owner = if daemon_set { ("DaemonSet", "ds") } else { ("ReplicaSet", "rs") };
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": owner.0, "name": format!("{}-{app}", owner.1),
            "uid": "5a0b6d1e-0000-4000-8000-000000000001", "controller": true,
        }]);
        self.create_running(pod).await;
    }

    fn pod_json(node: &str, name: &str, app: &str) -> serde_json::Value {
        json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {
                "nodeName": node,
                "automountServiceAccountToken": false,
                "containers": [{"name": "main", "image": gantry_testkit::BUSYBOX_IMAGE}],
            },
        })
    }

    /// Creates the pod, then reports it Running and Ready as a kubelet would, so
    /// PodDisruptionBudgets count it.
    async fn create_running(&self, pod: serde_json::Value) {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let name = pod.metadata.name.clone().unwrap();
        self.pods().create(&PostParams::default(), &pod).await.unwrap();
        let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        self.pods().patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    }

    async fn pdb(&self, app: &str, min_available: i32) {
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": app},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
        }))
        .unwrap();
        Api::<PodDisruptionBudget>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &pdb)
            .await
            .unwrap();
    }

    async fn set_pdb(&self, app: &str, min_available: i32) {
        let patch = Patch::Merge(json!({"spec": {"minAvailable": min_available}}));
        Api::<PodDisruptionBudget>::namespaced(self.client.clone(), "default")
            .patch(app, &PatchParams::default(), &patch)
            .await
            .unwrap();
    }

    async fn set_stage(&self, name: &str, stage: &str) {
        let patch = Patch::Merge(json!({"spec": {"stage": stage}}));
        self.maintenances().patch(name, &PatchParams::default(), &patch).await.unwrap();
    }

    async fn status(&self, name: &str) -> Option<gantry_maintenance::api::NodeMaintenanceStatus> {
        self.maintenances().get(name).await.ok()?.status
    }

    async fn drained(&self, name: &str) -> bool {
        let status = self.status(name).await.unwrap_or_default();
        status.conditions.iter().any(|c| c.type_ == CONDITION_DRAINED && c.status == "True")
    }

    async fn cordoned(&self, node: &str) -> bool {
        self.nodes().get(node).await.is_ok_and(|n| unschedulable(&n))
    }

    /// Removes what the test made on a real cluster.
    async fn cleanup(&self, maintenances: &[&str]) {
        if let Cluster::Real(_) = self.cluster {
            for name in maintenances {
                let _ = self.maintenances().delete(name, &DeleteParams::default()).await;
            }
            let _ = self.nodes().delete(&self.spare, &DeleteParams::default()).await;
            self.cluster.cleanup(&self.node).await;
        }
    }
}

/// Polls `check` until it returns `Some`, or panics after the deadline with `what` and the
/// controller logs.
async fn until<T, F, Fut>(what: &str, controllers: &[&Controller], check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let logs = || {
        let logs: Vec<String> = controllers.iter().map(|c| common::tail(&c.log(), 60)).collect();
        format!("--- controller logs ---\n{}", logs.join("\n---\n"))
    };
    common::poll(what, logs, check).await
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET over plain HTTP/1.0 (the endpoint closes the connection after answering).
async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    Some(response)
}

/// The value of one sample line (`name{labels} value`) in a metrics exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn event_reasons(client: &kube::Client, maintenance: &str) -> Vec<(String, String)> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let list = events.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(maintenance))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn drain_evicts_in_plan_order_across_pod_types_and_priorities_and_metrics_count_it() {
    let bench = Bench::start().await;
    let node = bench.node.clone();
    // Created in an order unlike the plan's, so creation order cannot pass for plan order.
    bench.pod(&node, "ds-critical", "ds", Some(("system-node-critical", 2_000_001_000)), true).await;
    bench.pod(&node, "node-critical", "nc", Some(("system-node-critical", 2_000_001_000)), false).await;
    bench.pod(&node, "ds-plain", "dsp", None, true).await;
    bench.pod(&node, "cluster-critical", "cc", Some(("system-cluster-critical", 2_000_000_000)), false).await;
    bench.pod(&node, "plain", "plain", None, false).await;
    bench.pod(&bench.spare, "elsewhere", "plain", None, false).await;
    let kubelet = KubeletStandIn::start(bench.pods(), &node, false);
    let spare_kubelet = KubeletStandIn::start(bench.pods(), &bench.spare, false);

    let port = free_port();
    let metrics_flag = format!("--metrics-bind-address=127.0.0.1:{port}");
    let controller =
        Controller::start_as(&bench.cluster, bench.dir.path(), "controller", &["--leader-elect=false", &metrics_flag]);
    let name = format!("order-{node}");
    bench.maintenances().create(&PostParams::default(), &maintenance_for(&name, &[&node], "Drain")).await.unwrap();
    until("the drain to finish", &[&controller], || async { bench.drained(&name).await.then_some(()) }).await;

    // The default plan: Default pods by priority (≤1e9, ≤2e9, ≤2000001000), then DaemonSet
    // pods by priority, each entry only once the previous one's pods are gone.
    assert_eq!(kubelet.order(), ["plain", "cluster-critical", "node-critical", "ds-plain", "ds-critical"]);
    assert!(spare_kubelet.order().is_empty(), "pods on other nodes are left alone");
    assert!(gone(&bench.pods(), "ds-critical").await);
    let taints = bench.nodes().get(&node).await.unwrap().spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(taints.iter().any(|t| t.key == gantry_maintenance::api::DRAIN_TAINT_KEY), "DaemonSet pods need the taint");

    // Every step is in the events.
    let events = until("the Drained event", &[&controller], || async {
        let events = event_reasons(&bench.client, &name).await;
        events.iter().any(|(reason, _)| reason == CONDITION_DRAINED).then_some(events)
    })
    .await;
    for reason in ["StageStarted", "Cordoned", "Tainted", "Evicted", "DrainTargetReached"] {
        assert!(events.iter().any(|(r, _)| r == reason), "no {reason} event in {events:?}");
    }
    let evicted: Vec<&String> = events.iter().filter(|(r, _)| r == "Evicted").map(|(_, note)| note).collect();
    assert_eq!(evicted.len(), 5, "one Evicted event per pod: {evicted:?}");

    let metrics = until("the metrics to show the drain", &[&controller], || async {
        let text = http_get(port, "/metrics").await?;
        (sample(&text, "gantry_maintenance_drain_duration_seconds_count") == Some(1.0)).then_some(text)
    })
    .await;
    assert_eq!(sample(&metrics, "gantry_maintenance_evictions_total{result=\"attempted\"}"), Some(5.0), "{metrics}");
    assert_eq!(sample(&metrics, "gantry_maintenance_evictions_total{result=\"refused\"}"), Some(0.0), "{metrics}");
    assert_eq!(sample(&metrics, "gantry_maintenance_evictions_total{result=\"failed\"}"), Some(0.0), "{metrics}");
    assert_eq!(sample(&metrics, "gantry_maintenance_maintenances{stage=\"Drain\"}"), Some(1.0), "{metrics}");
    for path in ["/healthz", "/readyz"] {
        let answer = http_get(port, path).await.unwrap_or_default();
        assert!(answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }
    bench.cleanup(&[&name]).await;
}

#[tokio::test]
async fn bare_and_empty_dir_pods_block_the_drain_until_the_maintenance_opts_in() {
    let bench = Bench::start().await;
    let node = bench.node.clone();
    bench.pod(&node, "web", "web", None, false).await;
    bench.create_running(Bench::pod_json(&node, "lonely", "lonely")).await;
    let mut cache = Bench::pod_json(&node, "cache", "cache");
    cache["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
    cache["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs-cache",
        "uid": "5a0b6d1e-0000-4000-8000-000000000002", "controller": true,
    }]);
    bench.create_running(cache).await;
    let kubelet = KubeletStandIn::start(bench.pods(), &node, false);
    let controller = Controller::start_as(&bench.cluster, bench.dir.path(), "controller", &["--leader-elect=false"]);

    // Cordon already shows what the drain will evict and what blocks it.
    let name = format!("bare-{node}");
    bench.maintenances().create(&PostParams::default(), &maintenance_for(&name, &[&node], "Cordon")).await.unwrap();
    let preview = until("Cordon to preview the drain", &[&controller], || async {
        let s = bench.status(&name).await?.node_statuses.into_iter().find(|s| s.node_name == node)?;
        // The status is written before the node is cordoned: wait for both.
        (s.blocking_pods.len() == 2 && bench.cordoned(&node).await).then_some(s)
    })
    .await;
    assert_eq!(preview.pods_remaining, 3, "{preview:?}");

    bench.set_stage(&name, "Drain").await;
    let m = until("the drain to report both blocking pods", &[&controller], || async {
        let m = bench.maintenances().get(&name).await.ok()?;
        let s = m.status.as_ref()?.node_statuses.iter().find(|s| s.node_name == node)?;
        s.drain_message.starts_with("Blocked").then_some(m)
    })
    .await;
    let text = gantry_maintenance::cli::table::status(&m);
    eprintln!("--- kubectl maintenance status ---\n{text}");
    assert!(text.contains("default/lonely   no controller: would not be recreated"), "{text}");
    assert!(text.contains("default/cache    emptyDir data would be deleted (volumes scratch"), "{text}");
    let events = until("the EvictionBlocked events", &[&controller], || async {
        let events = event_reasons(&bench.client, &name).await;
        (events.iter().filter(|(r, _)| r == "EvictionBlocked").count() == 2).then_some(events)
    })
    .await;
    assert!(events.iter().all(|(r, _)| r != "Evicted"), "nothing is evicted from a blocked node: {events:?}");
    assert!(kubelet.order().is_empty(), "no pod started terminating: {:?}", kubelet.order());

    // One opt-in is not the other: the emptyDir pod still blocks the node.
    let opt_in = |field: &str| Patch::Merge(json!({"spec": {field: true}}));
    bench.maintenances().patch(&name, &PatchParams::default(), &opt_in("evictBarePods")).await.unwrap();
    until("only the emptyDir pod to block", &[&controller], || async {
        let s = bench.status(&name).await?.node_statuses.into_iter().find(|s| s.node_name == node)?;
        let names: Vec<&str> = s.blocking_pods.iter().map(|b| b.name.as_str()).collect();
        (names == ["cache"]).then_some(())
    })
    .await;
    assert!(kubelet.order().is_empty(), "still nothing evicted: {:?}", kubelet.order());

    bench.maintenances().patch(&name, &PatchParams::default(), &opt_in("deleteEmptyDirData")).await.unwrap();
    until("the drain to finish", &[&controller], || async { bench.drained(&name).await.then_some(()) }).await;
    let mut order = kubelet.order();
    order.sort();
    assert_eq!(order, ["cache", "lonely", "web"]);
    bench.cleanup(&[&name]).await;
}

#[tokio::test]
async fn a_controller_killed_mid_drain_continues_without_evicting_a_pod_twice() {
    let mut bench = Bench::start().await;
    let Some(server) = bench.cluster.test_server("controller restart (counts eviction requests)") else { return };
    let _ = server;
    let node = bench.node.clone();
    for pod in ["web-a", "web-b", "web-c"] {
        bench.pod(&node, pod, "web", None, false).await;
    }
    // One disruption allowed: one pod goes, the PDB holds the other two.
    bench.pdb("web", 2).await;
    // The evicted pod stays terminating (as with a long grace period) across the restart.
    let kubelet = KubeletStandIn::start(bench.pods(), &node, true);

    let metrics_port = free_port();
    let flags = ["--leader-elect=false", "--metrics-bind-address=0"];
    let mut first = Controller::start_as(&bench.cluster, bench.dir.path(), "first", &flags);
    let name = format!("restart-{node}");
    bench.maintenances().create(&PostParams::default(), &maintenance_for(&name, &[&node], "Drain")).await.unwrap();
    let held = until("one eviction, the others held by the PDB", &[&first], || async {
        let status = bench.status(&name).await?;
        let node_status = status.node_statuses.iter().find(|s| s.node_name == node)?;
        let by_pdb = node_status.blocking_pods.iter().filter(|b| b.reason.contains("PodDisruptionBudget")).count();
        (kubelet.order().len() == 1 && by_pdb == 2).then_some(node_status.was_unschedulable)
    })
    .await;
    assert_eq!(held, Some(false), "the cordon memory is the node's state before the maintenance");
    until("an event naming the PDB for each held pod", &[&first], || async {
        let events = event_reasons(&bench.client, &name).await;
        let by_pdb = events.iter().filter(|(r, note)| r == "EvictionBlocked" && note.contains("default/web")).count();
        (by_pdb == 2).then_some(())
    })
    .await;
    first.kill();

    let evicted_first = kubelet.order()[0].clone();
    let metrics_flag = format!("--metrics-bind-address=127.0.0.1:{metrics_port}");
    let second =
        Controller::start_as(&bench.cluster, bench.dir.path(), "second", &["--leader-elect=false", &metrics_flag]);
    // The second controller has reconciled once it reports the maintenance in its gauge.
    until("the restarted controller to reconcile", &[&second], || async {
        let text = http_get(metrics_port, "/metrics").await?;
        (sample(&text, "gantry_maintenance_maintenances{stage=\"Drain\"}") == Some(1.0)).then_some(())
    })
    .await;
    let status = bench.status(&name).await.unwrap();
    let memory = status.node_statuses.iter().find(|s| s.node_name == node).and_then(|s| s.was_unschedulable);
    assert_eq!(memory, Some(false), "the restart did not take the controller's own cordon for the old state");

    // The terminating pod goes; the PDB still allows nothing (2 healthy, 2 required).
    kubelet.release();
    until("the evicted pod to be gone", &[&second], || async {
        gone(&bench.pods(), &evicted_first).await.then_some(())
    })
    .await;
    bench.set_pdb("web", 0).await;
    until("the drain to finish after the restart", &[&second], || async { bench.drained(&name).await.then_some(()) })
        .await;

    let server = bench.cluster.test_server("controller restart").unwrap();
    let evictions = server.evictions();
    assert!(evictions.iter().all(|e| !e.terminating), "no eviction of a terminating pod: {evictions:#?}");
    for pod in ["web-a", "web-b", "web-c"] {
        let accepted = evictions.iter().filter(|e| e.name == pod && (200..300).contains(&e.code)).count();
        assert_eq!(accepted, 1, "{pod} evicted exactly once: {evictions:#?}");
    }
    let mut order = kubelet.order();
    order.sort();
    assert_eq!(order, ["web-a", "web-b", "web-c"]);
    assert!(bench.cordoned(&node).await);
}

#[tokio::test]
async fn overlapping_maintenances_least_advanced_wins_and_the_cordon_stays_until_both_complete() {
    let bench = Bench::start().await;
    let node = bench.node.clone();
    bench.pod(&node, "batch", "batch", None, false).await;
    bench.pod(&node, "critical", "critical", Some(("system-cluster-critical", 2_000_000_000)), false).await;
    let kubelet = KubeletStandIn::start(bench.pods(), &node, false);
    let controller = Controller::start(&bench.cluster, bench.dir.path());

    // `low` only drains pods up to priority 1e9; `full` uses the default plan.
    let low = format!("low-{node}");
    let mut m = maintenance_for(&low, &[&node], "Drain");
    m.spec.drain_plan = serde_json::from_value(json!([{"podType": "Default", "podPriority": 1_000_000_000}])).unwrap();
    bench.maintenances().create(&PostParams::default(), &m).await.unwrap();
    until("low to drain its pods", &[&controller], || async { bench.drained(&low).await.then_some(()) }).await;
    let full = format!("full-{node}");
    bench.maintenances().create(&PostParams::default(), &maintenance_for(&full, &[&node], "Drain")).await.unwrap();

    let reached = until("full to be limited by low", &[&controller], || async {
        let status = bench.status(&full).await?;
        let node_status = status.node_statuses.iter().find(|s| s.node_name == node)?;
        let limited = node_status.blocking_pods.iter().any(|b| b.name == "critical" && b.reason.contains(&low));
        limited.then_some(status.drain_status.reached_drain_targets.len())
    })
    .await;
    assert_eq!(kubelet.order(), ["batch"], "the critical pod stays while `low` does not target it");
    assert!(!gone(&bench.pods(), "critical").await);

    // `low` completes: the node stays cordoned because `full` still covers it.
    bench.set_stage(&low, "Complete").await;
    until("full to drain once low completed", &[&controller], || async { bench.drained(&full).await.then_some(()) })
        .await;
    let status = bench.status(&full).await.unwrap();
    assert!(status.drain_status.reached_drain_targets.len() >= reached, "drain targets never go back");
    assert_eq!(kubelet.order(), ["batch", "critical"]);
    let low_done = bench.maintenances().get(&low).await.unwrap();
    assert!(!low_done.metadata.finalizers.unwrap_or_default().iter().any(|f| f == FINALIZER));
    assert!(bench.cordoned(&node).await, "Complete of one keeps the cordon while the other covers the node");
    let memory = status.node_statuses.iter().find(|s| s.node_name == node).and_then(|s| s.was_unschedulable);
    assert_eq!(memory, Some(false), "full took low's memory, not the cordon low made");

    bench.set_stage(&full, "Complete").await;
    until("the node to be restored", &[&controller], || async { (!bench.cordoned(&node).await).then_some(()) }).await;
    bench.cleanup(&[&low, &full]).await;
}

async fn lease_holder(client: &kube::Client, namespace: &str) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), namespace);
    leases.get_opt(gantry_maintenance::leader::LEASE_NAME).await.ok()??.spec?.holder_identity
}

fn acquired(controller: &Controller) -> bool {
    controller.log().contains("successfully acquired lease")
}

#[tokio::test]
async fn two_replicas_only_the_lease_holder_acts_and_the_other_takes_over() {
    let bench = Bench::start().await;
    let node = bench.node.clone();
    // Its own namespace for the Lease, so parallel tests on a real cluster do not compete.
    let namespace = match bench.cluster {
        Cluster::Test(_) => "kube-system".to_string(),
        Cluster::Real(_) => {
            let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(bench.client.clone());
            let ns = bench.cluster.unique_node_name("lease");
            let object = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
            namespaces.create(&PostParams::default(), &object).await.unwrap();
            ns
        }
    };
    let flags = ["--leader-elect=true", &format!("--leader-elect-namespace={namespace}"), "--metrics-bind-address=0"];
    let mut one = Controller::start_as(&bench.cluster, bench.dir.path(), "one", &flags);
    until("the first replica to lead", &[&one], || async { acquired(&one).then_some(()) }).await;
    let mut two = Controller::start_as(&bench.cluster, bench.dir.path(), "two", &flags);
    until("the second replica to wait on the Lease", &[&one, &two], || async {
        two.log().contains("held by another replica").then_some(())
    })
    .await;
    let leader = lease_holder(&bench.client, &namespace).await.expect("a holder");

    let name = format!("lease-{node}");
    bench.maintenances().create(&PostParams::default(), &maintenance_for(&name, &[&node], "Cordon")).await.unwrap();
    until("the node to be cordoned", &[&one, &two], || async { bench.cordoned(&node).await.then_some(()) }).await;
    let events = until("the Cordoned event", &[&one, &two], || async {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(bench.client.clone());
        let list = events.list(&Default::default()).await.ok()?.items;
        let cordoned: Vec<_> = list
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
            .filter(|e| e.reason.as_deref() == Some("Cordoned"))
            .collect();
        (!cordoned.is_empty()).then_some(cordoned)
    })
    .await;
    for event in &events {
        assert_eq!(event.reporting_instance.as_deref(), Some(leader.as_str()), "only the Lease holder acts");
    }
    assert!(!acquired(&two), "the second replica never led while the first lived");
    assert!(!two.log().contains("maintenance controller running"));

    // The leader dies without releasing: the other takes over once the Lease expires.
    one.kill();
    until("the second replica to take over", &[&two], || async { acquired(&two).then_some(()) }).await;
    let successor = lease_holder(&bench.client, &namespace).await.expect("a holder");
    assert_ne!(successor, leader);
    bench.set_stage(&name, "Complete").await;
    until("the new leader to restore the node", &[&two], || async { (!bench.cordoned(&node).await).then_some(()) })
        .await;

    // A clean shutdown releases the Lease at once and exits 0.
    let status =
        two.terminate().await.unwrap_or_else(|| panic!("no exit on SIGTERM\n{}", common::tail(&two.log(), 40)));
    assert!(status.success(), "exit status on SIGTERM: {status}");
    assert_eq!(lease_holder(&bench.client, &namespace).await, None, "the Lease is released");
    bench.cleanup(&[&name]).await;
}

#[tokio::test]
async fn a_leader_that_loses_the_lease_stops_at_once_with_a_failure_exit() {
    let mut bench = Bench::start().await;
    if bench.cluster.test_server("losing the Lease (overwrites the shared Lease)").is_none() {
        return;
    }
    let flags = ["--leader-elect=true", "--leader-elect-namespace=kube-system", "--metrics-bind-address=0"];
    let mut leader = Controller::start_as(&bench.cluster, bench.dir.path(), "leader", &flags);
    until("the replica to lead", &[&leader], || async { acquired(&leader).then_some(()) }).await;

    // Someone else takes the Lease (as after a partition during which it expired).
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(bench.client.clone(), "kube-system");
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now());
    let patch = json!({"spec": {"holderIdentity": "usurper_1", "renewTime": now, "leaseDurationSeconds": 15}});
    leases.patch(gantry_maintenance::leader::LEASE_NAME, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();

    let status = leader.exit().await.unwrap_or_else(|| panic!("still running\n{}", common::tail(&leader.log(), 40)));
    assert!(!status.success(), "losing the Lease is a failure exit (the Deployment restarts it): {status}");
    assert!(leader.log().contains("leader election lost"), "{}", leader.log());
    assert_eq!(lease_holder(&bench.client, "kube-system").await.as_deref(), Some("usurper_1"), "not released");
}
