//! End-to-end: the maintenance-aware node agent. A real `gantry kubelet` (containerd, the test
//! API server or a real cluster) runs a static pod; the maintenance controller drains the node
//! down to the Static entries; the agent stops the pod gracefully, its mirror pod goes, and the
//! maintenance reaches Drained. The pod stays stopped across an agent restart and runs again
//! on Complete (given through `kubectl-maintenance`).

mod common;
#[path = "common/maintenance_kit.rs"]
mod kit;

use common::cluster::{self, Cluster};
use common::{Gantry, eventually, pod_yaml};
use gantry_maintenance::api::{CONDITION_DRAINED, FINALIZER, NodeMaintenance};
use gantry_test_apiserver::Decision;
use k8s_openapi::api::core::v1::{Node, Pod};
use kit::{Controller, Invocation, install_crd, plugin};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const HOLD_LOG: &str = "stopping static pod for node maintenance";
const LISTED_LOG: &str = "listed NodeMaintenances";
const WATCH_FAILED_LOG: &str = "cannot watch NodeMaintenances";
const WATCH_WORKS_LOG: &str = "watching NodeMaintenances";

/// Nodes may read NodeMaintenances: the test server's stand-in for the ClusterRoleBinding in
/// `deploy/node-agent.yaml` (a real cluster needs that applied). Counts the nodes' reads, so a
/// test can see the agent retry (None on a real cluster).
fn let_nodes_read_maintenances(cluster: &Cluster) -> Option<Arc<AtomicUsize>> {
    let Cluster::Test(server) = cluster else { return None };
    let reads = Arc::new(AtomicUsize::new(0));
    let counter = reads.clone();
    server.set_authorizer(move |req| {
        let node = req.user.groups.iter().any(|g| g == "system:nodes");
        let read = matches!(req.verb.as_str(), "get" | "list" | "watch");
        if node && read && req.api_group == "maintenance.gantry.dev" && req.resource == "nodemaintenances" {
            counter.fetch_add(1, Ordering::SeqCst);
            Decision::Allow
        } else {
            Decision::NoOpinion(String::new())
        }
    });
    Some(reads)
}

async fn mirror_exists(pods: &Api<Pod>, name: &str) -> bool {
    matches!(pods.get_opt(name).await, Ok(Some(_)))
}

async fn containers_of(env: &common::Env, pod: &str) -> usize {
    env.containers().await.into_iter().filter(|c| c.pod == pod).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn static_pod_stops_for_the_drain_stays_stopped_across_restart_and_returns_on_complete() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let maintenance_reads = let_nodes_read_maintenances(&cluster);
    let node = env.node.clone();
    env.write_manifest(
        "web-static.yaml",
        &pod_yaml(
            "web-static",
            "sleep 3600",
            "  terminationGracePeriodSeconds: 2\n  priorityClassName: system-node-critical\n",
        ),
    );
    let static_name = format!("web-static-{node}");

    // The agent starts before the CRD exists: it must run its pods anyway.
    let mut gantry = cluster::start_node(&env, &cluster);
    let client = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually("the static pod running with its mirror pod", &gantry, || async {
        let running = !env.running(&static_name).await.is_empty();
        (running && mirror_exists(&pods, &static_name).await).then_some(())
    })
    .await;
    if let Some(reads) = &maintenance_reads {
        // Several failed attempts before the CRD appears, so the single warning below means
        // the retries were quiet.
        eventually("the agent to retry listing NodeMaintenances", &gantry, || async {
            (reads.load(Ordering::SeqCst) >= 3).then_some(())
        })
        .await;
    }
    install_crd(&client).await;

    let nodes: Api<Node> = Api::all(client.clone());
    let spare = cluster.unique_node_name("spare");
    let spare_node: Node = serde_json::from_value(json!({"metadata": {"name": spare}})).unwrap();
    let _ = nodes.create(&PostParams::default(), &spare_node).await;
    let _controller = Controller::start(&cluster, &env.ctd.dir());
    // The dry run shows the static pod under the Static entry of its class (planner and agent
    // resolve system-node-critical alike), left to the node agent.
    let kubeconfig = cluster.admin_kubeconfig(&env.ctd.dir());
    let kubectl = Invocation::Kubectl { link_dir: &env.ctd.dir(), kubeconfig: &kubeconfig };
    let out = plugin(&kubectl, &["plan", "--nodes", &node]).await;
    let row = out.stdout.lines().find(|l| l.contains(&format!("default/{static_name}")));
    let row = row.unwrap_or_else(|| panic!("{}{}", out.stdout, out.stderr));
    assert!(row.contains("11: Static priority<=2000001000") && row.ends_with("node agent stops it"), "{row}");

    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let name = format!("static-{node}");
    let m: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "maintenance.gantry.dev/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
            "stage": "Drain",
        },
    }))
    .unwrap();
    maintenances.create(&PostParams::default(), &m).await.unwrap();

    // The drain reaches the Static entries: the agent stops the pod (CRI shows it gone), then
    // deletes the mirror, and the controller sees the node drained.
    eventually("the static pod stopped and the maintenance Drained", &gantry, || async {
        let gone = containers_of(&env, &static_name).await == 0 && !mirror_exists(&pods, &static_name).await;
        let status = maintenances.get(&name).await.ok()?.status?;
        let drained = status.conditions.iter().any(|c| c.type_ == CONDITION_DRAINED && c.status == "True");
        (gone && drained).then_some(())
    })
    .await;
    let log = gantry.log();
    let hold_line = log.lines().find(|l| l.contains(HOLD_LOG)).unwrap_or_default();
    let after_hold = &log[log.find(HOLD_LOG).unwrap()..];
    assert!(after_hold.contains("Stopping container main"), "stopped through the normal graceful path (Killing event)");
    assert!(
        hold_line.contains(&static_name) && hold_line.contains(&name),
        "the hold names pod and maintenance: {hold_line}"
    );
    if let Cluster::Real(_) = cluster {
        eprintln!("SKIPPED missing-CRD warning check: a real cluster may have had the CRD before the agent started");
    } else {
        let warnings = log.matches(WATCH_FAILED_LOG).count();
        assert_eq!(warnings, 1, "a missing CRD is reported once, then retried quietly");
    }

    // A restarted agent never starts the held pod, not even briefly: it applies the saved holds
    // before its first sync, then the API's.
    gantry.kill();
    let before = gantry.log().len();
    let gantry = restart(&env, &cluster);
    let since_restart = |g: &Gantry| g.log().get(before..).unwrap_or_default().to_string();
    eventually("the restarted agent to hold the pod from its saved state and list maintenances", &gantry, || async {
        assert_eq!(containers_of(&env, &static_name).await, 0, "the held static pod was started after the restart");
        let log = since_restart(&gantry);
        (log.contains(HOLD_LOG) && log.contains(LISTED_LOG)).then_some(())
    })
    .await;
    assert_eq!(containers_of(&env, &static_name).await, 0);
    let log = since_restart(&gantry);
    assert!(!log.lines().any(|l| l.contains("adding pod") && l.contains(&static_name)), "{log}");
    assert!(!mirror_exists(&pods, &static_name).await, "no mirror pod while held");

    // Complete (through the kubectl plugin) releases the pod: it runs again, with its mirror.
    let out = plugin(&kubectl, &["complete", &name]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually("the static pod running again after Complete", &gantry, || async {
        let running = !env.running(&static_name).await.is_empty();
        let m = maintenances.get(&name).await.ok()?;
        let released = !m.metadata.finalizers.unwrap_or_default().iter().any(|f| f == FINALIZER);
        (running && released && mirror_exists(&pods, &static_name).await).then_some(())
    })
    .await;
    assert!(since_restart(&gantry).contains("node maintenance released static pod"));

    let _ = maintenances.delete(&name, &DeleteParams::default()).await;
    let _ = nodes.delete(&spare, &DeleteParams::default()).await;
    cluster.cleanup(&node).await;
}

/// Without the NodeMaintenance RBAC a node's reads of them are forbidden (403): the agent says
/// so once, retries with a growing delay, and says again when the RBAC arrives.
#[tokio::test(flavor = "multi_thread")]
async fn forbidden_maintenance_watch_is_logged_once_backs_off_and_logs_the_recovery() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let Cluster::Test(server) = &cluster else {
        eprintln!(
            "SKIPPED forbidden watch: needs the test API server's authorizer (a real cluster's RBAC is not changed)"
        );
        return;
    };
    install_crd(&cluster.admin().await).await;
    // Stands in for the ClusterRoleBinding of `deploy/node-agent.yaml`: absent (no opinion, so
    // the default 403 as from RBAC) until `allowed`; records when each node read arrived.
    let allowed = Arc::new(AtomicBool::new(false));
    let attempts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (allow, seen) = (allowed.clone(), attempts.clone());
    server.set_authorizer(move |req| {
        let node = req.user.groups.iter().any(|g| g == "system:nodes");
        let read = matches!(req.verb.as_str(), "get" | "list" | "watch");
        if !(node && read && req.api_group == "maintenance.gantry.dev" && req.resource == "nodemaintenances") {
            return Decision::NoOpinion(String::new());
        }
        seen.lock().unwrap().push(Instant::now());
        if allow.load(Ordering::SeqCst) { Decision::Allow } else { Decision::NoOpinion(String::new()) }
    });

    let gantry = cluster::start_node(&env, &cluster);
    // Five attempts take about 12 s with the backoff (0.8 s doubling); a retry every second
    // would show as equal gaps.
    eventually("five forbidden NodeMaintenance reads", &gantry, || async {
        (attempts.lock().unwrap().len() >= 5).then_some(())
    })
    .await;
    let gaps: Vec<Duration> = attempts.lock().unwrap().windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[3] >= Duration::from_secs(3) && gaps[3] >= gaps[0] * 3, "the retries back off: {gaps:?}");
    let log = gantry.log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(WATCH_FAILED_LOG)).collect();
    assert_eq!(warnings.len(), 1, "one warning for a lasting 403, not one per retry: {warnings:#?}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("forbidden"), "{}", warnings[0]);
    // Nothing else repeats the 403 either (kube's watcher warns on every failed attempt).
    let forbidden: Vec<&str> = log.lines().filter(|l| l.to_lowercase().contains("forbidden")).collect();
    assert_eq!(forbidden, warnings, "the agent's warning is the only line about the 403");
    assert!(!log.contains(WATCH_WORKS_LOG), "no recovery while forbidden");

    // The RBAC arrives: the next retry (within the 5 minute cap; about 13 s here) lists, and
    // the agent says the watch works.
    allowed.store(true, Ordering::SeqCst);
    eventually("the agent to log that the NodeMaintenance watch works", &gantry, || async {
        gantry.log().contains(WATCH_WORKS_LOG).then_some(())
    })
    .await;
    let log = gantry.log();
    assert!(log.contains(LISTED_LOG), "{log}");
    assert_eq!(log.matches(WATCH_FAILED_LOG).count(), 1, "no further warning after the recovery");
}

fn restart(env: &common::Env, cluster: &Cluster) -> Gantry {
    cluster::start_node(env, cluster)
}
