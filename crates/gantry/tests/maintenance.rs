//! End-to-end: `gantry maintenance-controller` draining a real Gantry node (containerd, the
//! test API server or a real cluster): the drain waits on a PodDisruptionBudget and goes on as
//! soon as the budget allows, and Complete restores the node.

mod common;

use std::process::{Child, Command, Stdio};

use common::cluster::{self, Cluster};
use common::{Gantry, eventually, pod_yaml};
use gantry_maintenance::api::{CONDITION_DRAINED, FINALIZER, NodeMaintenance};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt};
use serde_json::json;

/// The controller process; killed on drop.
struct Controller(Child);

impl Controller {
    fn start(cluster: &Cluster, dir: &std::path::Path) -> Controller {
        let kubeconfig = cluster.admin_kubeconfig(dir);
        let log = std::fs::File::create(dir.join("maintenance-controller.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(["maintenance-controller", &format!("--kubeconfig={}", kubeconfig.display())])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn the controller");
        Controller(child)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn install_crd(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.create(&PostParams::default(), &NodeMaintenance::crd()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("cannot create the NodeMaintenance CRD: {e}"),
    }
}

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
    let maintenance = maintenance_for(&name, &[&node], "Drain");
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
    let taints = nodes.get(&node).await.unwrap().spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(taints.iter().all(|t| t.key != gantry_maintenance::api::DRAIN_TAINT_KEY), "{taints:?}");

    let _ = maintenances.delete(&name, &DeleteParams::default()).await;
    let _ = pdbs.delete(&app, &DeleteParams::default()).await;
    let _ = nodes.delete(&spare, &DeleteParams::default()).await;
    cluster.cleanup(&node).await;
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
