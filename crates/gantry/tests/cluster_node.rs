//! End-to-end tests of the node side of cluster mode: registration, node status, lease,
//! and start-up errors, against the in-process test API server (with the Node authorizer and
//! NodeRestriction) or a real cluster (`GANTRY_E2E_KUBECONFIG`), and a private containerd.
//! The node side runs in-process through `gantry_agent::node::start`, the entry point the
//! binary calls with `--kubeconfig`.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use gantry_agent::api::{self, ApiError};
use gantry_agent::node::{self, KUBELET_VERSION, NodeAgent, Startup};
use gantry_config::{self as config, Flags, Settings};
use gantry_test_apiserver::{TestApiServer, User};
use gantry_testkit::Containerd;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);

/// Fast cadences: status every 1 s but reported (without changes) only every 5 minutes, so
/// a heartbeat that moves proves a forced report; lease of 4 s, renewed every second.
const FAST: &str = "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 5m\nnodeLeaseDurationSeconds: 4\n";

struct Harness {
    cluster: Cluster,
    ctd: Containerd,
    dir: tempfile::TempDir,
}

impl Harness {
    async fn start() -> Option<Harness> {
        gantry_testkit::init_test_tracing();
        let ctd = Containerd::start_or_skip().await?;
        let cluster = Cluster::start().await;
        Some(Harness { cluster, ctd, dir: tempfile::tempdir().unwrap() })
    }

    /// The node name for a test: `name` on the test server, a unique one on a real cluster.
    fn node(&self, name: &str) -> String {
        self.cluster.unique_node_name(name)
    }

    /// Settings as `gantry kubelet` would resolve them from these flags and config body.
    fn settings(&self, node: &str, extra: &[&str], config_body: &str) -> Settings {
        let kubeconfig = self.cluster.node_kubeconfig(self.dir.path(), node);
        settings_for(&kubeconfig, &self.ctd.endpoint(), &self.dir.path().join(node), node, extra, config_body)
    }

    async fn start_node(&self, settings: &Settings) -> NodeAgent {
        let cri = gantry_cri::connect(&settings.container_runtime_endpoint, None, settings.runtime_request_timeout)
            .await
            .expect("CRI connects");
        let (shutting_down, pressure) =
            (tokio::sync::watch::channel(false).1, tokio::sync::watch::channel(Default::default()).1);
        node::start(
            settings,
            cri,
            Startup::RequireServer,
            &Default::default(),
            shutting_down,
            pressure,
            Default::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("node side starts: {e}"))
    }

    async fn admin(&self) -> kube::Client {
        self.cluster.admin().await
    }

    /// Stops the node side and removes what the test left on a real cluster.
    async fn finish(&self, agent: NodeAgent, node: &str) {
        agent.task.abort();
        self.cluster.cleanup(node).await;
    }
}

fn settings_for(kubeconfig: &Path, endpoint: &str, root: &Path, node: &str, extra: &[&str], body: &str) -> Settings {
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--container-runtime-endpoint={endpoint}"),
        format!("--root-dir={}", root.display()),
        format!("--hostname-override={node}"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let flags = Flags::parse_args(&args).unwrap();
    let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}");
    config::resolve(flags, Some((PathBuf::from("/test/kubelet.yaml"), &text)), "unused").unwrap()
}

async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

fn heartbeat(node: &Node) -> Timestamp {
    condition(node, "Ready").and_then(|c| c.last_heartbeat_time.as_ref()).map(|t| t.0).unwrap()
}

async fn get_node(client: &kube::Client, name: &str) -> Option<Node> {
    Api::<Node>::all(client.clone()).get_opt(name).await.ok().flatten()
}

async fn wait_ready(client: &kube::Client, name: &str) -> Node {
    wait_for("the node to be Ready", || async {
        get_node(client, name).await.filter(|n| condition(n, "Ready").is_some_and(|c| c.status == "True"))
    })
    .await
}

async fn lease(client: &kube::Client, name: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), "kube-node-lease").get_opt(name).await.ok().flatten()
}

fn renew_time(l: &Lease) -> Timestamp {
    l.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn registers_the_node_with_node_info_and_a_renewed_lease() {
    let Some(c) = Harness::start().await else { return };
    let name = c.node("n-register");
    let settings = c.settings(
        &name,
        &["--node-labels=node.kubernetes.io/pool=blue", "--register-with-taints=dedicated=infra:NoSchedule"],
        FAST,
    );
    let mut agent = c.start_node(&settings).await;
    let registration = agent.registered().await;
    assert!(registration.created);
    let admin = c.admin().await;
    let node = wait_ready(&admin, &name).await;
    let uid = node.metadata.uid.clone().unwrap();
    assert_eq!(registration.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(agent.node_uid.borrow().as_deref(), Some(uid.as_str()));

    let labels = node.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], name);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["node.kubernetes.io/pool"], "blue");
    assert!(!labels["kubernetes.io/arch"].is_empty());
    assert_eq!(node.metadata.annotations.as_ref().unwrap()[node::CMAD_ANNOTATION], "true");
    let taints = node.spec.as_ref().unwrap().taints.as_ref().unwrap();
    assert_eq!((taints[0].key.as_str(), taints[0].effect.as_str()), ("dedicated", "NoSchedule"));

    let status = node.status.as_ref().unwrap();
    let info = status.node_info.as_ref().unwrap();
    let cri =
        c.ctd.runtime_client().await.version(gantry_cri::api::VersionRequest::default()).await.unwrap().into_inner();
    let expected = gantry_agent::node::status::container_runtime_version(&cri.runtime_name, Some(&cri.runtime_version));
    assert_eq!(info.container_runtime_version, expected);
    assert!(info.container_runtime_version.starts_with("containerd://"), "{}", info.container_runtime_version);
    assert!(!info.container_runtime_version.ends_with("Unknown"));
    assert_eq!(info.kubelet_version, KUBELET_VERSION);
    assert_eq!(info.kube_proxy_version, "", "KEP-4004: empty by default");
    assert_eq!(info.operating_system, "linux");
    assert!(!info.boot_id.is_empty() && !info.kernel_version.is_empty());
    assert_eq!(status.daemon_endpoints.as_ref().unwrap().kubelet_endpoint.as_ref().unwrap().port, 10250);
    let capacity = status.capacity.as_ref().unwrap();
    for r in ["cpu", "memory", "ephemeral-storage", "pods"] {
        assert!(capacity.contains_key(r) && status.allocatable.as_ref().unwrap().contains_key(r), "{r}");
    }
    // The machine's identity and huge pages, read as cAdvisor reads them for the Go kubelet.
    let uuid_files = [
        "/sys/class/dmi/id/product_uuid",
        "/proc/device-tree/system-id",
        "/proc/device-tree/vm,uuid",
        "/etc/machine-id",
    ];
    let expected_uuid = uuid_files.iter().find_map(|f| std::fs::read_to_string(f).ok()).unwrap_or_default();
    assert_eq!(info.system_uuid, expected_uuid.trim().trim_end_matches('\0'), "systemUUID");
    assert!(!info.system_uuid.is_empty(), "this machine has a system UUID or a machine-id");
    for (dir, resource) in [("hugepages-2048kB", "hugepages-2Mi"), ("hugepages-1048576kB", "hugepages-1Gi")] {
        let Ok(pages) = std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/{dir}/nr_hugepages")) else {
            eprintln!("SKIPPED {resource}: the kernel offers no such page size");
            continue;
        };
        let size = if resource.ends_with("2Mi") { 2u64 << 20 } else { 1u64 << 30 };
        let bytes = pages.trim().parse::<u64>().unwrap() * size;
        let shown = capacity.get(resource).map(|q| q.0.clone());
        assert_eq!(shown, Some(gantry_vocab::quantity::format_binary_bytes(i128::from(bytes))), "{resource}");
        assert!(status.allocatable.as_ref().unwrap().contains_key(resource), "{resource}");
    }
    let addresses = status.addresses.as_ref().unwrap();
    assert!(addresses.iter().any(|a| a.type_ == "Hostname" && a.address == name), "{addresses:?}");
    let internal: Vec<String> =
        addresses.iter().filter(|a| a.type_ == "InternalIP").map(|a| a.address.clone()).collect();
    assert_eq!(registration.host_ips, internal);
    assert_eq!(agent.host_ips, internal);
    for t in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert!(condition(&node, t).is_some(), "{t}");
    }
    assert_eq!(condition(&node, "Ready").unwrap().reason.as_deref(), Some("KubeletReady"));

    // The lease: owned by the Node, renewed about every second.
    let first = wait_for("the lease", || lease(&admin, &name)).await;
    let owner = &first.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.api_version.as_str(), owner.kind.as_str(), owner.name.as_str()), ("v1", "Node", name.as_str()));
    assert_eq!(owner.uid, uid);
    let spec = first.spec.as_ref().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(name.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(4));
    let t0 = renew_time(&first);
    let renewed =
        wait_for("the lease to be renewed", || async { lease(&admin, &name).await.filter(|l| renew_time(l) > t0) })
            .await;
    let gap = renew_time(&renewed).duration_since(t0);
    assert!(gap.as_secs_f64() < 3.0, "renewed after {gap:?}");

    // Events of the registration.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(admin.clone(), "default");
    let reasons = wait_for("node events", || async {
        let list = events.list(&Default::default()).await.ok()?;
        let reasons: Vec<String> = list
            .items
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name.as_str()))
            .filter_map(|e| e.reason.clone())
            .collect();
        reasons.iter().any(|r| r == "NodeHasSufficientMemory").then_some(reasons)
    })
    .await;
    assert!(reasons.iter().any(|r| r == "Starting"), "{reasons:?}");
    // Written by the same recorder as pod events: upstream's source, reporting fields and count.
    let list = events.list(&Default::default()).await.expect("events list");
    let starting = list
        .items
        .iter()
        .find(|e| e.involved_object.name.as_deref() == Some(name.as_str()) && e.reason.as_deref() == Some("Starting"))
        .expect("the Starting event");
    let source = starting.source.clone().unwrap_or_default();
    assert_eq!((source.component.as_deref(), source.host.as_deref()), (Some("kubelet"), Some(name.as_str())));
    assert_eq!(starting.reporting_component.as_deref(), Some("kubelet"));
    assert_eq!(starting.reporting_instance.as_deref(), Some(name.as_str()));
    assert_eq!(starting.involved_object.kind.as_deref(), Some("Node"));
    assert!(starting.count.unwrap_or(0) >= 1, "{starting:?}");
    c.finish(agent, &name).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_proxy_version_with_the_gate_disabled() {
    let Some(c) = Harness::start().await else { return };
    let name = c.node("n-kpv");
    let settings = c.settings(&name, &["--feature-gates=DisableNodeKubeProxyVersion=false"], FAST);
    let agent = c.start_node(&settings).await;
    let node = wait_ready(&c.admin().await, &name).await;
    assert_eq!(node.status.unwrap().node_info.unwrap().kube_proxy_version, KUBELET_VERSION);
    c.finish(agent, &name).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn clears_a_kube_proxy_version_an_older_kubelet_set() {
    let Some(c) = Harness::start().await else { return };
    let name = c.node("n-old");
    let admin = c.admin().await;
    let nodes = Api::<Node>::all(admin.clone());
    // A Node left by an older kubelet: registered, with kubeProxyVersion set and a label
    // value the agent owns that is stale.
    let old: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": "stale", "team": "a"}},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &old).await.unwrap();
    let info = json!({"status": {"nodeInfo": {
        "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
        "containerRuntimeVersion": "containerd://1.5.0", "kubeletVersion": "v1.28.3", "kubeProxyVersion": "v1.28.3",
        "operatingSystem": "linux", "architecture": "amd64"
    }}});
    nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&info)).await.unwrap();

    let mut agent = c.start_node(&c.settings(&name, &[], FAST)).await;
    assert!(!agent.registered().await.created);
    let node = wait_for("kubeProxyVersion to be cleared", || async {
        get_node(&admin, &name).await.filter(|n| {
            n.status.as_ref().and_then(|s| s.node_info.as_ref()).is_some_and(|i| i.kube_proxy_version.is_empty())
        })
    })
    .await;
    let info = node.status.as_ref().unwrap().node_info.as_ref().unwrap();
    assert_eq!(info.kubelet_version, KUBELET_VERSION);
    let labels = node.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], name, "owned labels are reconciled");
    assert_eq!(labels["team"], "a", "other labels are left alone");
    c.finish(agent, &name).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn status_and_lease_catch_up_after_the_api_server_was_down() {
    let Some(mut c) = Harness::start().await else { return };
    if c.cluster.test_server("status_and_lease_catch_up_after_the_api_server_was_down").is_none() {
        return;
    }
    let name = c.node("n-outage");
    let agent = c.start_node(&c.settings(&name, &[], FAST)).await;
    let admin = c.admin().await;
    wait_ready(&admin, &name).await;
    // Let the first report of the status loop go out, then check that heartbeat-only
    // changes are not reported (the report frequency is 5 minutes).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = get_node(&admin, &name).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = get_node(&admin, &name).await.unwrap();
    assert_eq!(heartbeat(&still), heartbeat(&before), "heartbeat-only changes wait for nodeStatusReportFrequency");
    let lease_before = wait_for("the lease", || lease(&admin, &name)).await;

    let server = c.cluster.test_server("outage").expect("checked above");
    server.stop().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!agent.task.is_finished(), "the loops survive the outage");
    server.restart().await;

    let admin = c.admin().await;
    // Nothing changed: only the catch-up report owed after the failed passes can move the
    // heartbeat.
    let after = wait_for("a status report after the outage", || async {
        get_node(&admin, &name).await.filter(|n| heartbeat(n) > heartbeat(&before))
    })
    .await;
    assert_eq!(condition(&after, "Ready").unwrap().status, "True");
    assert_eq!(
        condition(&after, "Ready").unwrap().last_transition_time,
        condition(&before, "Ready").unwrap().last_transition_time
    );
    wait_for("the lease to be renewed after the outage", || async {
        lease(&admin, &name).await.filter(|l| renew_time(l) > renew_time(&lease_before) + Duration::from_secs(3))
    })
    .await;
    c.finish(agent, &name).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_conditions_survive_status_updates() {
    let Some(c) = Harness::start().await else { return };
    let name = c.node("n-maint");
    // Report every pass, so many patches go out while the foreign condition is there.
    let agent = c.start_node(&c.settings(&name, &[], "nodeStatusUpdateFrequency: 1s\n")).await;
    let admin = c.admin().await;
    let before = wait_ready(&admin, &name).await;
    let maintenance = json!({"status": {"conditions": [
        {"type": "MaintenanceInProgress", "status": "True", "reason": "Scheduled", "message": "kernel upgrade",
         "lastHeartbeatTime": "2024-01-01T00:00:00Z", "lastTransitionTime": "2024-01-01T00:00:00Z"},
        {"type": "Drained", "status": "False", "reason": "NotYet", "message": "",
         "lastHeartbeatTime": "2024-01-01T00:00:00Z", "lastTransitionTime": "2024-01-01T00:00:00Z"}
    ]}});
    Api::<Node>::all(admin.clone())
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&maintenance))
        .await
        .unwrap();
    // Several reports later...
    let later = wait_for("three more status reports", || async {
        get_node(&admin, &name).await.filter(|n| heartbeat(n) >= heartbeat(&before) + Duration::from_secs(3))
    })
    .await;
    let m = condition(&later, "MaintenanceInProgress").expect("foreign condition kept");
    assert_eq!(
        (m.status.as_str(), m.reason.as_deref(), m.message.as_deref()),
        ("True", Some("Scheduled"), Some("kernel upgrade"))
    );
    assert_eq!(m.last_heartbeat_time.as_ref().unwrap().0.to_string(), "2024-01-01T00:00:00Z");
    assert!(condition(&later, "Drained").is_some());
    assert_eq!(condition(&later, "Ready").unwrap().status, "True");
    c.finish(agent, &name).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn register_node_false_does_not_create_the_node() {
    let Some(c) = Harness::start().await else { return };
    let name = c.node("n-manual");
    let mut agent = c.start_node(&c.settings(&name, &["--register-node=false"], FAST)).await;
    let registration = agent.registered().await;
    assert_eq!(registration.uid, None);
    assert!(!registration.created);
    let admin = c.admin().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(get_node(&admin, &name).await.is_none(), "the Node must not be created");
    assert!(lease(&admin, &name).await.is_none(), "no lease without a Node to own it");

    // Once an administrator creates the Node, the agent reports its status and takes the lease.
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    let created = Api::<Node>::all(admin.clone()).create(&PostParams::default(), &node).await.unwrap();
    let uid = created.metadata.uid.unwrap();
    wait_ready(&admin, &name).await;
    let mut uids = agent.node_uid.clone();
    tokio::time::timeout(DEADLINE, uids.wait_for(|u| u.as_deref() == Some(uid.as_str()))).await.unwrap().unwrap();
    let l = wait_for("the lease", || lease(&admin, &name)).await;
    assert_eq!(l.metadata.owner_references.as_ref().unwrap()[0].uid, uid);
    c.finish(agent, &name).await;
}

// ---- start-up errors (no runtime needed) ------------------------------------------------------
// These stage broken credentials and a stopped server, which only the test API server can do,
// so they use it even when `GANTRY_E2E_KUBECONFIG` points the other tests at a real cluster.

fn settings_without_runtime(kubeconfig: &Path, node: &str) -> Settings {
    settings_for(kubeconfig, "unix:///nonexistent.sock", Path::new("/tmp/gantry-unused"), node, &[], "")
}

async fn connect_error(settings: &Settings) -> ApiError {
    match api::connect(settings).await {
        Ok(_) => panic!("connect should fail"),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_credentials_fail_start_up_clearly() {
    let server = TestApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig(dir.path(), &User::ExpiredToken);
    let e = connect_error(&settings_without_runtime(&kubeconfig, "n1")).await;
    assert!(matches!(e, ApiError::Unauthorized { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("the API server rejected the node's credentials (expired or invalid)"), "{msg}");
    assert!(msg.contains(&kubeconfig.display().to_string()) && msg.contains(&server.url()), "{msg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_nodes_credentials_are_forbidden() {
    let server = TestApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig(dir.path(), &User::Node("someone-else".into()));
    let e = connect_error(&settings_without_runtime(&kubeconfig, "n1")).await;
    assert!(matches!(e, ApiError::Forbidden { .. }), "{e:?}");
    assert!(e.to_string().contains("system:node:n1"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn token_file_credentials_work_and_a_stopped_server_is_named() {
    let mut server = TestApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig_with_token_file(dir.path(), &User::Node("n1".into()));
    let settings = settings_without_runtime(&kubeconfig, "n1");
    api::connect(&settings).await.unwrap_or_else(|e| panic!("{e}"));
    server.stop().await;
    let e = connect_error(&settings).await;
    assert!(matches!(e, ApiError::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains(&server.url()), "{e}");
    assert!(e.is_transient());
}
