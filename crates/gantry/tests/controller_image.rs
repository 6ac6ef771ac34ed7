//! End-to-end: the maintenance controller's container image (`scripts/image`, which links the
//! binary statically; the test checks that the layer holds a static binary and no library)
//! imported into the node's containerd and run as a pod on a Gantry node, the way
//! `deploy/controller.yaml` runs it (its Namespace, ServiceAccount, RBAC, and the Deployment's
//! pod template), then draining a node through its in-cluster service account.
//!
//! The pod differs from the Deployment's only where this machine needs it: it is bound to the
//! node directly (the test API server runs no workload controllers), uses the host network
//! with the API server's address in `KUBERNETES_SERVICE_HOST`/`PORT` (no kube-proxy here,
//! and the API server listens on loopback; the test server is named by a host alias, so the
//! static binary resolves a name), and serves metrics and probes on a free loopback port. The test API server has no RBAC objects, so its authorizer evaluates the
//! Roles of `deploy/controller.yaml` for the service account; a real cluster gets the objects.

mod common;
#[path = "common/maintenance_kit.rs"]
mod kit;

use std::collections::BTreeMap;
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
/// The in-cluster name of the API server, which the test server's certificate carries.
const API_SERVER_NAME: &str = "kubernetes.default.svc";
const SERVICE_ACCOUNT: &str = "system:serviceaccount:gantry-system:maintenance-controller";

/// The documents of `deploy/controller.yaml` of one kind.
fn documents<T: DeserializeOwned>(kind: &str) -> Vec<T> {
    MANIFESTS
        .split("\n---\n")
        .filter(|doc| doc.lines().any(|l| l == format!("kind: {kind}")))
        .map(|doc| serde_yaml_ng::from_str(doc).unwrap_or_else(|e| panic!("deploy/controller.yaml {kind}: {e}")))
        .collect()
}

/// The environment variables cargo sets for a test (names and prefixes).
const CARGO_SET_FOR_TESTS: [&str; 8] = [
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

fn image_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/image")
}

/// `scripts/image` as a user runs it, from the profile and the target dir of the binary under
/// test: it links that binary statically (beside, not over, the test's); the tarball it wrote.
fn build_image(dir: &Path) -> PathBuf {
    let profile_dir = Path::new(env!("CARGO_BIN_EXE_gantry")).parent().unwrap();
    let profile = match profile_dir.file_name().unwrap().to_str().unwrap() {
        "debug" => "dev",
        other => other,
    };
    let mut command = std::process::Command::new(image_script());
    // What cargo set for this test describes the test's package, not the build: some build
    // scripts rerun when such variables change (ring's on OUT_DIR, CARGO_PKG_NAME, …), and a
    // rerun here would rebuild their dependents for the next `cargo test` too.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if CARGO_SET_FOR_TESTS.iter().any(|prefix| name.starts_with(prefix)) {
            command.env_remove(&*name);
        }
    }
    let out = command
        .env("CARGO", env!("CARGO"))
        .env("CARGO_TARGET_DIR", profile_dir.parent().unwrap())
        .env("IMAGE_PROFILE", profile)
        .env("IMAGE_OUT", dir.join("gantry-dev.oci.tar"))
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/image failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The one layer of the image-layout tarball: its regular files, path → content. Checks on the
/// way that Docker's manifest names the same blobs.
fn layer_files(tarball: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut blobs = BTreeMap::new();
    for entry in tar::Archive::new(std::fs::File::open(tarball).unwrap()).entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        blobs.insert(path, data);
    }
    let blob = |digest: &serde_json::Value| {
        let digest = digest.as_str().unwrap().strip_prefix("sha256:").unwrap();
        blobs[&format!("blobs/sha256/{digest}")].as_slice()
    };
    let index: serde_json::Value = serde_json::from_slice(&blobs["index.json"]).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(blob(&index["manifests"][0]["digest"])).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    // What `docker load` reads instead of index.json: the same config and layer blobs, under
    // the reference deploy/controller.yaml runs.
    let docker: serde_json::Value = serde_json::from_slice(&blobs["manifest.json"]).unwrap();
    let blob_path = |digest: &serde_json::Value| format!("blobs/sha256/{}", &digest.as_str().unwrap()[7..]);
    assert_eq!(docker[0]["RepoTags"], json!(["gantry:dev"]), "{docker}");
    assert_eq!(docker[0]["Config"], blob_path(&manifest["config"]["digest"]), "{docker}");
    assert_eq!(docker[0]["Layers"], json!([blob_path(&layers[0]["digest"])]), "{docker}");
    let mut files = BTreeMap::new();
    for entry in tar::Archive::new(blob(&layers[0]["digest"])).entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type().is_file() {
            let path = entry.path().unwrap().to_string_lossy().trim_start_matches("./").to_string();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
            files.insert(path, data);
        }
    }
    files
}

/// The program headers' answer to "does this binary need the dynamic loader?": a static
/// binary has no interpreter (`PT_INTERP`) and names no shared library (`DT_NEEDED`).
fn assert_static(binary: &[u8]) {
    use object::elf::{DT_NEEDED, PT_INTERP};
    use object::read::elf::{Dyn, ElfFile64, ProgramHeader};
    let elf = ElfFile64::<object::Endianness>::parse(binary).expect("the image's gantry is an ELF binary");
    let endian = elf.endian();
    for header in elf.elf_program_headers() {
        assert_ne!(header.p_type(endian), PT_INTERP, "the image's gantry asks for a program interpreter");
        if let Some(dynamic) = header.dynamic(endian, binary).unwrap() {
            assert!(!dynamic.iter().any(|d| d.d_tag(endian) == DT_NEEDED), "the image's gantry needs libraries");
        }
    }
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
    let (mut host, port) = api_address(kubeconfig);
    pod["metadata"]["name"] = json!(format!("maintenance-controller-{node}"));
    pod["metadata"]["namespace"] = json!(NAMESPACE);
    let spec = &mut pod["spec"];
    spec["nodeName"] = json!(node);
    spec["hostNetwork"] = json!(true);
    // The test server by a name from the pod's hosts file (its certificate has the name): the
    // static binary resolves names with glibc's built-in `files` service, no module to load.
    if host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()) {
        spec["hostAliases"] = json!([{"ip": host, "hostnames": [API_SERVER_NAME]}]);
        host = API_SERVER_NAME.to_string();
    }
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
    let image = build_image(dir.path());
    let files = layer_files(&image);
    // The binary and the three files it may read; nothing a dynamic loader would want.
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(names, ["etc/group", "etc/nsswitch.conf", "etc/passwd", "usr/bin/gantry"]);
    assert_static(&files["usr/bin/gantry"]);
    env.ctd.import_tarball(&image).await.unwrap();
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

#[test]
fn scripts_image_refuses_a_dynamically_linked_binary() {
    // The test's gantry is linked the usual way, against the system's glibc.
    let dynamic = env!("CARGO_BIN_EXE_gantry");
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(image_script())
        .env("GANTRY_BIN", dynamic)
        .env("IMAGE_OUT", dir.path().join("image.tar"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("{dynamic} is dynamically linked")), "{stderr}");
    assert!(!dir.path().join("image.tar").exists());
}
