//! End-to-end: the maintenance controller's container image (`scripts/image`) imported into the
//! node's containerd and run as a pod on a Gantry node, the way `deploy/controller.yaml` runs
//! it (its Namespace, ServiceAccount, RBAC, and the Deployment's pod template), then draining a
//! node through its in-cluster service account.
//!
//! The pod differs from the Deployment's only where this machine needs it: it is bound to the
//! node directly (the test API server runs no workload controllers), uses the host network
//! with the API server's address in `KUBERNETES_SERVICE_HOST`/`PORT` (no kube-proxy here,
//! and the API server listens on loopback), and serves metrics and probes on a free
//! loopback port. The test API server has no RBAC objects, so its authorizer evaluates the
//! Roles of `deploy/controller.yaml` for the service account; a real cluster gets the objects.

mod common;
#[path = "common/maintenance_kit.rs"]
mod kit;

use std::path::{Path, PathBuf};

use common::cluster::{self, Cluster};
use gantry_maintenance::api::{CONDITION_DRAINED, NodeMaintenance};
use gantry_test_apiserver::{AccessRequest, Decision};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::serde::de::DeserializeOwned;
use kit::{KubeletStandIn, install_crd};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const MANIFESTS: &str = include_str!("../../../deploy/controller.yaml");
const NAMESPACE: &str = "gantry-system";
const SERVICE_ACCOUNT: &str = "system:serviceaccount:gantry-system:maintenance-controller";

/// The documents of `deploy/controller.yaml` of one kind.
fn documents<T: DeserializeOwned>(kind: &str) -> Vec<T> {
    MANIFESTS
        .split("\n---\n")
        .filter(|doc| doc.lines().any(|l| l == format!("kind: {kind}")))
        .map(|doc| serde_yaml_ng::from_str(doc).unwrap_or_else(|e| panic!("deploy/controller.yaml {kind}: {e}")))
        .collect()
}

/// `scripts/image` on the binary under test; the tarball it wrote.
fn build_image(dir: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/image");
    let out = std::process::Command::new(script)
        .env("GANTRY_BIN", env!("CARGO_BIN_EXE_gantry"))
        .env("IMAGE_OUT", dir.join("gantry-dev.oci.tar"))
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/image failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// RBAC's rule match, for the test API server's authorizer.
fn allows(rule: &PolicyRule, req: &AccessRequest) -> bool {
    let resource =
        if req.subresource.is_empty() { req.resource.clone() } else { format!("{}/{}", req.resource, req.subresource) };
    let has = |list: &Option<Vec<String>>, value: &str| {
        list.as_ref().is_some_and(|l| l.iter().any(|v| v == "*" || v == value))
    };
    has(&rule.api_groups, &req.api_group)
        && has(&rule.resources, &resource)
        && rule.verbs.iter().any(|v| v == "*" || *v == req.verb)
        && rule.resource_names.as_ref().is_none_or(|names| names.is_empty() || names.contains(&req.name))
}

/// Grants the service account what the ClusterRole (anywhere) and the Role (in its namespace)
/// of `deploy/controller.yaml` grant; no opinion on anything else.
fn deployed_rbac(req: &AccessRequest) -> Decision {
    if req.user.username != SERVICE_ACCOUNT {
        return Decision::NoOpinion(String::new());
    }
    let cluster_rules = documents::<ClusterRole>("ClusterRole").into_iter().flat_map(|r| r.rules.unwrap_or_default());
    let namespaced = documents::<Role>("Role")
        .into_iter()
        .filter(|r| r.metadata.namespace.as_deref() == Some(req.namespace.as_str()))
        .flat_map(|r| r.rules.unwrap_or_default());
    if cluster_rules.chain(namespaced).any(|rule| allows(&rule, req)) {
        Decision::Allow
    } else {
        Decision::NoOpinion(format!("deploy/controller.yaml grants no {} on {}", req.verb, req.resource))
    }
}

async fn create<K>(api: Api<K>, object: &K)
where
    K: kube::Resource + Clone + DeserializeOwned + k8s_openapi::serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("cannot create {:?}: {e}", object.meta().name),
    }
}

/// Namespace and ServiceAccount everywhere; the RBAC objects on a real cluster (the test
/// server evaluates them itself, see [`deployed_rbac`]).
async fn apply_deploy(cluster: &Cluster, client: &kube::Client) {
    for ns in documents::<Namespace>("Namespace") {
        create(Api::all(client.clone()), &ns).await;
    }
    for sa in documents::<ServiceAccount>("ServiceAccount") {
        create(Api::namespaced(client.clone(), NAMESPACE), &sa).await;
    }
    match cluster {
        Cluster::Test(server) => server.set_authorizer(deployed_rbac),
        Cluster::Real(_) => {
            for role in documents::<ClusterRole>("ClusterRole") {
                create(Api::all(client.clone()), &role).await;
            }
            for binding in documents::<ClusterRoleBinding>("ClusterRoleBinding") {
                create(Api::all(client.clone()), &binding).await;
            }
            for role in documents::<Role>("Role") {
                create(Api::namespaced(client.clone(), NAMESPACE), &role).await;
            }
            for binding in documents::<RoleBinding>("RoleBinding") {
                create(Api::namespaced(client.clone(), NAMESPACE), &binding).await;
            }
        }
    }
}

/// The API server's host and port, from the kubeconfig the test uses.
fn api_address(kubeconfig: &Path) -> (String, String) {
    let config = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let server = config.clusters[0].cluster.as_ref().unwrap().server.clone().unwrap();
    let uri: http::Uri = server.parse().unwrap();
    (uri.host().unwrap().trim_matches(['[', ']']).to_string(), uri.port_u16().unwrap_or(443).to_string())
}

/// The Deployment's pod, adapted to this machine (see the module comment).
fn controller_pod(node: &str, kubeconfig: &Path, metrics_port: u16) -> Pod {
    let deployment = documents::<Deployment>("Deployment").pop().expect("deploy/controller.yaml has a Deployment");
    let template = deployment.spec.unwrap().template;
    let mut pod = serde_json::to_value(Pod {
        metadata: template.metadata.unwrap_or_default(),
        spec: template.spec,
        status: None,
    })
    .unwrap();
    let (host, port) = api_address(kubeconfig);
    pod["metadata"]["name"] = json!(format!("maintenance-controller-{node}"));
    pod["metadata"]["namespace"] = json!(NAMESPACE);
    let spec = &mut pod["spec"];
    spec["nodeName"] = json!(node);
    spec["hostNetwork"] = json!(true);
    let container = &mut spec["containers"][0];
    assert_eq!(container["image"], "gantry:dev", "the image scripts/image names");
    container["args"] = json!([format!("--metrics-bind-address=127.0.0.1:{metrics_port}")]);
    container["env"] = json!([
        {"name": "KUBERNETES_SERVICE_HOST", "value": host},
        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
    ]);
    container["ports"][0]["containerPort"] = json!(metrics_port);
    for probe in ["livenessProbe", "readinessProbe"] {
        container[probe]["httpGet"]["host"] = json!("127.0.0.1");
    }
    serde_json::from_value(pod).unwrap()
}

fn ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A pod of a ReplicaSet bound to `node`, which has no agent.
fn replica(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("rs-{node}"),
            "uid": "5a0b6d1e-0000-4000-8000-000000000009", "controller": true,
        }]},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": gantry_testkit::BUSYBOX_IMAGE}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_controller_image_runs_as_a_pod_on_a_gantry_node_and_drains_a_node() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let dir = tempfile::tempdir().unwrap();
    env.ctd.import_tarball(&build_image(dir.path())).await.unwrap();
    let gantry = cluster::start_node(&env, &cluster);
    let client = cluster.admin().await;
    install_crd(&client).await;
    apply_deploy(&cluster, &client).await;

    let kubeconfig = cluster.admin_kubeconfig(dir.path());
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = controller_pod(&env.node, &kubeconfig, metrics_port);
    let name = pod.metadata.name.clone().unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = common::eventually("the controller pod to be Ready", &gantry, || async {
        pods.get(&name).await.ok().filter(ready)
    })
    .await;
    let status = running.status.unwrap();
    let container = &status.container_statuses.unwrap()[0];
    assert!(container.image.ends_with("gantry:dev"), "{container:?}");
    assert_eq!(container.restart_count, 0, "{container:?}");

    // A node without an agent, with two replicas on it; the stand-in finishes their deletion.
    let target = cluster.unique_node_name("image-drain");
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": target}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let default_pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for pod in ["a", "b"] {
        default_pods.create(&PostParams::default(), &replica(&format!("{target}-{pod}"), &target)).await.unwrap();
    }
    let _kubelet = KubeletStandIn::start(default_pods.clone(), &target, false);
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let maintenance: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "maintenance.gantry.dev/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {"name": format!("image-{target}")},
        "spec": {
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [target]}
            ]}]},
            "stage": "Drain",
        },
    }))
    .unwrap();
    maintenances.create(&PostParams::default(), &maintenance).await.unwrap();
    let m_name = maintenance.metadata.name.clone().unwrap();
    common::eventually("the controller in the pod to drain the node", &gantry, || async {
        let m = maintenances.get(&m_name).await.ok()?;
        let drained = m.status?.conditions.iter().any(|c| c.type_ == CONDITION_DRAINED && c.status == "True");
        let left = default_pods.list(&Default::default()).await.ok()?.items;
        let empty = !left.iter().any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(target.as_str()));
        let cordoned = nodes.get(&target).await.ok()?.spec?.unschedulable == Some(true);
        (drained && empty && cordoned).then_some(())
    })
    .await;
    let after = pods.get(&name).await.unwrap();
    assert_eq!(after.status.unwrap().container_statuses.unwrap()[0].restart_count, 0, "the controller restarted");

    let _ = maintenances.delete(&m_name, &DeleteParams::default()).await;
    let _ = pods.delete(&name, &DeleteParams::default()).await;
    cluster.cleanup(&target).await;
    cluster.cleanup(&env.node).await;
}
