//! Benchmark, node maintenance: drain a Gantry node (real containerd, the in-process test API
//! server) running 10 replicas of a ReplicaSet guarded by a PDB with `maxUnavailable: 1`, once
//! with `gantry maintenance-controller` and once the way `kubectl drain` does it (cordon, evict
//! every pod, retry a refused eviction every 5 s), in the same run. There is no ReplicaSet
//! controller here, so the benchmark plays it: when a pod starts terminating it creates a
//! replacement on another (simulated) node, which becomes Ready 1 s later. Prints the time to
//! drained for both and the most replicas ever unavailable; asserts the PDB was never violated.
//!
//! `cargo bench -p gantry --bench drain` (as root).

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use gantry_maintenance::api::{CONDITION_DRAINED, NodeMaintenance};
use gantry_test_apiserver::{TestApiServer, User};
use gantry_testkit::{BUSYBOX_IMAGE, Containerd};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt, ResourceExt};
use serde_json::json;

const NODE: &str = "drain-node";
const SPARE: &str = "spare-node";
const REPLICAS: i64 = 10;
const APP: &str = "web";
/// How long a replacement takes to become Ready on the other node.
const REPLACEMENT_STARTUP: Duration = Duration::from_secs(1);
/// `kubectl drain` retries a refused eviction after this long.
const KUBECTL_RETRY: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() {
    let Some(ctd) = Containerd::start_or_skip().await else { return };
    let server = TestApiServer::start().await;
    let dir = ctd.dir().join("drain-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let mut agent = common::spawn(&dir, "gantry.log", &common::cluster_node_args(&ctd, &server, &dir, NODE));
    // No client-side retries: a refused eviction must come back at once, as kubectl sees it.
    let mut config = server.config(&User::Admin).await;
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    let setup = Setup::new(client.clone()).await;

    let mut controller = common::spawn(&dir, "controller.log", &controller_args(&server, &dir));
    let gantry = setup.round(|| drain_with_controller(&client)).await;
    finish_maintenance(&client).await;
    let _ = controller.kill();
    let _ = controller.wait();
    let kubectl = setup.round(|| drain_like_kubectl(&client)).await;

    println!(
        "drain: replicas={REPLICAS} gantry_controller={:.2}s kubectl_style={:.2}s speedup={:.2}x \
         max_unavailable_gantry={} max_unavailable_kubectl={} (PDB maxUnavailable=1)",
        gantry.elapsed.as_secs_f64(),
        kubectl.elapsed.as_secs_f64(),
        kubectl.elapsed.as_secs_f64() / gantry.elapsed.as_secs_f64(),
        gantry.max_unavailable,
        kubectl.max_unavailable,
    );
    assert!(gantry.max_unavailable <= 1 && kubectl.max_unavailable <= 1, "the PDB was violated");
    let _ = agent.kill();
    let _ = agent.wait();
}

fn controller_args(server: &TestApiServer, dir: &std::path::Path) -> Vec<String> {
    let kubeconfig = server.kubeconfig(dir, &User::Admin);
    // One replica, no metrics port to collide with: only the drain is measured.
    vec![
        "maintenance-controller".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--leader-elect=false".into(),
        "--metrics-bind-address=0".into(),
    ]
}

struct Outcome {
    elapsed: Duration,
    max_unavailable: i64,
}

/// The objects both rounds share: the CRD, the other node, the ReplicaSet and its PDB.
struct Setup {
    client: kube::Client,
    pods: Api<Pod>,
    rs_uid: String,
}

impl Setup {
    async fn new(client: kube::Client) -> Setup {
        let nodes: Api<Node> = Api::all(client.clone());
        wait("the node to register", || async { nodes.get_opt(NODE).await.ok().flatten() }).await;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &NodeMaintenance::crd()).await.unwrap();
        let spare: Node = serde_json::from_value(json!({"metadata": {"name": SPARE}})).unwrap();
        nodes.create(&PostParams::default(), &spare).await.unwrap();
        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": APP},
            "spec": {
                "replicas": REPLICAS,
                "selector": {"matchLabels": {"app": APP}},
                "template": {"metadata": {"labels": {"app": APP}}, "spec": {"containers": [{"name": "main", "image": BUSYBOX_IMAGE}]}},
            },
        }))
        .unwrap();
        let rs =
            Api::<ReplicaSet>::namespaced(client.clone(), "default").create(&PostParams::default(), &rs).await.unwrap();
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": APP},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": APP}}},
        }))
        .unwrap();
        Api::<PodDisruptionBudget>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &pdb)
            .await
            .unwrap();
        let pods = Api::namespaced(client.clone(), "default");
        Setup { client, pods, rs_uid: rs.uid().unwrap() }
    }

    /// Puts the replicas on the Gantry node, then times `drain` while playing the ReplicaSet
    /// controller and watching availability; undoes the drain afterwards.
    async fn round<F, Fut>(&self, drain: F) -> Outcome
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        self.reset().await;
        let running = Arc::new(AtomicBool::new(true));
        let max_unavailable = Arc::new(AtomicI64::new(0));
        let replacer = tokio::spawn(replace_terminating(self.pods.clone(), self.rs_uid.clone(), running.clone()));
        let monitor = tokio::spawn(watch_availability(self.pods.clone(), running.clone(), max_unavailable.clone()));
        let start = Instant::now();
        drain().await;
        let elapsed = start.elapsed();
        running.store(false, Ordering::SeqCst);
        let _ = tokio::join!(replacer, monitor);
        Outcome { elapsed, max_unavailable: max_unavailable.load(Ordering::SeqCst) }
    }

    /// No pods anywhere, the Gantry node schedulable and untainted, then all replicas on it,
    /// Ready.
    async fn reset(&self) {
        let maintenances: Api<NodeMaintenance> = Api::all(self.client.clone());
        for m in maintenances.list(&ListParams::default()).await.unwrap() {
            let _ = maintenances
                .patch(&m.name_any(), &PatchParams::default(), &Patch::Merge(json!({"spec": {"stage": "Complete"}})))
                .await;
            let _ = maintenances.delete(&m.name_any(), &DeleteParams::default()).await;
        }
        wait("maintenances to finish", || async {
            maintenances.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
        })
        .await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch(
                NODE,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": null, "taints": null}})),
            )
            .await
            .unwrap();
        for pod in self.pods.list(&ListParams::default()).await.unwrap() {
            let _ = self.pods.delete(&pod.name_any(), &DeleteParams::default().grace_period(0)).await;
        }
        wait("old pods to go", || async {
            self.pods.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
        })
        .await;
        for i in 0..REPLICAS {
            self.pods
                .create(&PostParams::default(), &replica(&format!("{APP}-{i}"), NODE, &self.rs_uid))
                .await
                .unwrap();
        }
        wait("all replicas Ready", || async {
            let list = self.pods.list(&ListParams::default()).await.ok()?;
            (list.items.iter().filter(|p| ready(p)).count() as i64 == REPLICAS).then_some(())
        })
        .await;
    }
}

fn replica(name: &str, node: &str, rs_uid: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"app": APP},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": APP, "uid": rs_uid, "controller": true}],
        },
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}],
        },
    }))
    .unwrap()
}

fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The ReplicaSet controller's part: a replacement on the other node for every pod that
/// starts terminating, Ready after [`REPLACEMENT_STARTUP`].
async fn replace_terminating(pods: Api<Pod>, rs_uid: String, running: Arc<AtomicBool>) {
    let mut replaced = HashSet::new();
    let mut next = 0;
    while running.load(Ordering::SeqCst) {
        for pod in pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
            if pod.metadata.deletion_timestamp.is_none() || !replaced.insert(pod.uid().unwrap_or_default()) {
                continue;
            }
            next += 1;
            let (pods, name, rs_uid) =
                (pods.clone(), format!("{APP}-spare-{next}-{}", std::process::id()), rs_uid.clone());
            tokio::spawn(async move {
                pods.create(&PostParams::default(), &replica(&name, SPARE, &rs_uid)).await.unwrap();
                tokio::time::sleep(REPLACEMENT_STARTUP).await;
                let status =
                    json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn watch_availability(pods: Api<Pod>, running: Arc<AtomicBool>, max: Arc<AtomicI64>) {
    while running.load(Ordering::SeqCst) {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            let healthy = list.items.iter().filter(|p| ready(p)).count() as i64;
            max.fetch_max(REPLICAS - healthy, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn on_node(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE)
}

async fn drain_with_controller(client: &kube::Client) {
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let m: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "maintenance.gantry.dev/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": "bench"},
        "spec": {
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
            "stage": "Drain",
        },
    }))
    .unwrap();
    maintenances.create(&PostParams::default(), &m).await.unwrap();
    wait("Drained", || async {
        let status = maintenances.get("bench").await.ok()?.status?;
        status.conditions.iter().any(|c| c.type_ == CONDITION_DRAINED && c.status == "True").then_some(())
    })
    .await;
}

/// Completes and deletes the benchmark's maintenance (while the controller still runs, as its
/// finalizer needs it).
async fn finish_maintenance(client: &kube::Client) {
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let complete = Patch::Merge(json!({"spec": {"stage": "Complete"}}));
    maintenances.patch("bench", &PatchParams::default(), &complete).await.unwrap();
    maintenances.delete("bench", &DeleteParams::default()).await.unwrap();
    wait("the maintenance to finish", || async { maintenances.get_opt("bench").await.ok()?.is_none().then_some(()) })
        .await;
}

/// What `kubectl drain` does: cordon, evict every pod at once, retry each refused eviction
/// every 5 s, wait until the pods are gone.
async fn drain_like_kubectl(client: &kube::Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.patch(NODE, &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": true}}))).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let on: Vec<Pod> = pods.list(&ListParams::default()).await.unwrap().items.into_iter().filter(on_node).collect();
    let evictions = on.into_iter().map(|pod| {
        let pods = pods.clone();
        async move {
            let name = pod.name_any();
            let body = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}});
            loop {
                let result: Result<serde_json::Value, kube::Error> =
                    pods.create_subresource("eviction", &name, &PostParams::default(), &body).await;
                match result {
                    Err(kube::Error::Api(e)) if e.code == 429 => tokio::time::sleep(KUBECTL_RETRY).await,
                    _ => break,
                }
            }
        }
    });
    futures::future::join_all(evictions).await;
    wait("the node to be empty", || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        (!list.items.iter().any(on_node)).then_some(())
    })
    .await;
}

async fn wait<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
