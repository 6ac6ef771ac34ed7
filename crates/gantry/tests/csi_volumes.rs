//! End-to-end, cluster mode: PersistentVolumeClaims served by a CSI driver. The test kit's CSI
//! driver (a real gRPC server on a unix socket; volumes are directories it bind-mounts)
//! registers through `<root-dir>/plugins_registry`; Gantry records it in the node's CSINode and
//! its topology label on the Node, keeps a pod whose claim is not bound waiting with upstream's
//! `FailedMount` message, then stages the volume, publishes it for the pod and mounts it into
//! the container; deleting the pod unpublishes and unstages it, each exactly once and in order,
//! leaving nothing mounted. A second pod on the same claim reads what the first one wrote.
//! Against the test API server, or a real cluster (`GANTRY_E2E_KUBECONFIG`).

mod common;

use std::path::Path;

use common::cluster::{self, Cluster};
use common::node_api::NodeApi;
use common::{Env, container_output, eventually};
use gantry_plugins::api::deviceplugin::DevicePluginOptions;
use gantry_plugins::api::podresources::ListPodResourcesRequest;
use gantry_plugins::api::podresources::pod_resources_lister_client::PodResourcesListerClient;
use gantry_testkit::{CsiCall, PluginCall, TestCsiDriver, TestDevicePlugin};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass, VolumeAttachment};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// A pod bound to the node with the claim `data` mounted at `/data`.
fn claim_pod(node: &str, name: &str, command: &str, read_only: bool) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": gantry_testkit::BUSYBOX_IMAGE,
                "command": ["sh", "-c", command],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": read_only}}],
        },
    }))
    .unwrap()
}

/// The mount points below `root` (from this process's mount table).
fn mounts_below(root: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = root.display().to_string();
    table.lines().filter_map(|l| l.split(' ').nth(4)).filter(|m| m.starts_with(&root)).map(String::from).collect()
}

/// The stage/publish/unpublish/unstage calls, without their paths.
fn volume_calls(driver: &TestCsiDriver) -> Vec<&'static str> {
    driver
        .calls()
        .iter()
        .filter_map(|c| match c {
            CsiCall::NodeStageVolume { .. } => Some("stage"),
            CsiCall::NodePublishVolume { .. } => Some("publish"),
            CsiCall::NodeUnpublishVolume { .. } => Some("unpublish"),
            CsiCall::NodeUnstageVolume { .. } => Some("unstage"),
            _ => None,
        })
        .collect()
}

/// Waits until the driver has seen `n` stage/publish/unpublish/unstage calls in all (the last
/// of a teardown is the unstage).
async fn calls_reach(gantry: &common::Gantry, driver: &TestCsiDriver, n: usize) {
    eventually(&format!("{n} volume calls"), gantry, || async { (volume_calls(driver).len() == n).then_some(()) })
        .await;
}

async fn running(gantry: &common::Gantry, pods: &Api<Pod>, name: &str) {
    eventually(&format!("{name} runs"), gantry, || async {
        (pods.get(name).await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await;
}

async fn deleted(gantry: &common::Gantry, pods: &Api<Pod>, name: &str) {
    pods.delete(name, &DeleteParams::default()).await.unwrap();
    eventually(&format!("{name} is gone"), gantry, || async { pods.get_opt(name).await.ok()?.is_none().then_some(()) })
        .await;
}

/// The claim `data` and its PV `pv` (CSI `driver`, handle `vol-1`), the claim not yet bound.
async fn claim_and_volume(admin: &Client, driver: &str, pv: &str) -> PersistentVolumeClaim {
    claim_and_volume_named(admin, driver, pv, "data").await
}

/// The claim `claim` and its PV `pv` (CSI `driver`, handle `vol-1`), the claim not yet bound.
async fn claim_and_volume_named(admin: &Client, driver: &str, pv: &str, claim: &str) -> PersistentVolumeClaim {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Mi"}}},
    }))
    .unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"}, "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": "default", "name": claim.metadata.name.clone().unwrap(), "uid": claim.metadata.uid.clone().unwrap()},
            "csi": {"driver": driver, "volumeHandle": "vol-1", "fsType": "ext4", "volumeAttributes": {"kind": "dir"}},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(admin.clone()).create(&PostParams::default(), &volume).await.unwrap();
    claim
}

/// Binds them as the PV controller would.
async fn bind(admin: &Client, pv: &str) {
    bind_named(admin, pv, "data").await
}

async fn bind_named(admin: &Client, pv: &str, claim: &str) {
    let bound = Patch::Merge(json!({"status": {"phase": "Bound"}}));
    Api::<PersistentVolume>::all(admin.clone()).patch_status(pv, &PatchParams::default(), &bound).await.unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    claims.patch_status(claim, &PatchParams::default(), &bound).await.unwrap();
}

/// The test driver `driver_name` on its socket in the node's `plugins_registry`.
async fn start_driver(root: &Path, node: &str, driver_name: &str, stages: bool, max_volumes: i64) -> TestCsiDriver {
    let socket = root.join(format!("plugins_registry/{driver_name}.sock"));
    TestCsiDriver::start(&socket, driver_name, node, stages, max_volumes).await.unwrap()
}

/// The driver's CSIDriver object, saying its volumes need no attaching.
async fn no_attach(admin: &Client, driver_name: &str) {
    let driver: CSIDriver =
        serde_json::from_value(json!({"metadata": {"name": driver_name}, "spec": {"attachRequired": false}})).unwrap();
    Api::<CSIDriver>::all(admin.clone()).create(&PostParams::default(), &driver).await.unwrap();
}

/// The claim `data` bound to the driver's volume `pv`; returns `pv`.
async fn bound_claim(admin: &Client, driver_name: &str, pv: &str) -> String {
    claim_and_volume(admin, driver_name, pv).await;
    bind(admin, pv).await;
    pv.to_string()
}

/// What each test starts from: the node's environment and cluster, an admin client with the
/// default namespace's pods and claims, and the test driver, named after the test (names of
/// the node's own, as cluster-scoped objects on a real cluster need).
struct Setup {
    env: Env,
    cluster: Cluster,
    admin: Client,
    pods: Api<Pod>,
    claims: Api<PersistentVolumeClaim>,
    driver: TestCsiDriver,
    driver_name: String,
}

/// The test driver's capabilities, and whether its CSIDriver object (saying its volumes need no
/// attaching) is created.
struct DriverKind {
    stages: bool,
    max_volumes: i64,
    no_attach: bool,
}

const STAGING: DriverKind = DriverKind { stages: true, max_volumes: 0, no_attach: true };

async fn setup(tag: &str, kind: DriverKind) -> Option<Setup> {
    let (env, cluster) = cluster::setup().await?;
    let admin = cluster.admin().await;
    let driver_name = format!("{}.{tag}.gantry.test", env.node);
    let driver = start_driver(&env.root, &env.node, &driver_name, kind.stages, kind.max_volumes).await;
    if kind.no_attach {
        no_attach(&admin, &driver_name).await;
    }
    let (pods, claims) = (Api::namespaced(admin.clone(), "default"), Api::namespaced(admin.clone(), "default"));
    Some(Setup { env, cluster, admin, pods, claims, driver, driver_name })
}

/// Removes the cluster-scoped objects a real cluster keeps after the test.
async fn cleanup(cluster: &Cluster, admin: &Client, node: &str, driver: &str, pv: &str) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    let _ = claims.delete("data", &DeleteParams::default()).await;
    let _ = Api::<PersistentVolume>::all(admin.clone()).delete(pv, &DeleteParams::default()).await;
    let _ = Api::<CSIDriver>::all(admin.clone()).delete(driver, &DeleteParams::default()).await;
    let _ = Api::<CSINode>::all(admin.clone()).delete(node, &DeleteParams::default()).await;
    cluster.cleanup(node).await;
}

#[tokio::test]
async fn a_claim_is_staged_published_and_torn_down_in_order_and_keeps_its_data() {
    let kind = DriverKind { max_volumes: 8, ..STAGING };
    let Some(Setup { env, cluster, admin, pods, driver, driver_name, .. }) = setup("csi", kind).await else { return };
    let Env { ref root, ref node, .. } = env;
    // Cluster-scoped names of their own on a real cluster.
    let pv = format!("{node}-pv");
    let gantry = cluster::start_node(&env, &cluster);

    // Registration: the driver in CSINode, its topology on the Node.
    let csi_nodes: Api<CSINode> = Api::all(admin.clone());
    let entry = eventually("the driver is in the node's CSINode", &gantry, || async {
        let csi_node = csi_nodes.get_opt(node).await.ok()??;
        csi_node.spec.drivers.into_iter().find(|d| d.name == driver_name)
    })
    .await;
    let topology_key = gantry_testkit::csi_driver::topology_key(&driver_name);
    assert_eq!(entry.node_id, *node);
    assert_eq!(entry.topology_keys, Some(vec![topology_key.clone()]));
    assert_eq!(entry.allocatable.and_then(|a| a.count), Some(8));
    let calls = driver.calls();
    assert_eq!(calls[0], CsiCall::GetInfo, "{calls:?}");
    assert!(calls.contains(&CsiCall::NotifyRegistrationStatus { registered: true, error: String::new() }), "{calls:?}");
    let nodes: Api<Node> = Api::all(admin.clone());
    eventually("the Node has the driver's topology label", &gantry, || async {
        let labels = nodes.get(node).await.ok()?.metadata.labels?;
        (labels.get(&topology_key) == Some(node)).then_some(())
    })
    .await;

    // A pod on a claim not yet bound waits, with upstream's message.
    claim_and_volume(&admin, &driver_name, &pv).await;
    let write = "echo written-through-csi > /data/file && echo wrote; sleep 3600";
    pods.create(&PostParams::default(), &claim_pod(node, "writer", write, false)).await.unwrap();
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let waiting = eventually("the FailedMount event of the unbound claim", &gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.involved_object.name.as_deref() == Some("writer") && e.reason.as_deref() == Some("FailedMount"))
    })
    .await;
    assert_eq!(
        waiting.message.as_deref(),
        Some(format!("error processing PVC default/data: PVC default/data has non-bound phase (\"Pending\") or empty pvc.Spec.VolumeName (\"{pv}\")").as_str())
    );
    assert_eq!(pods.get("writer").await.unwrap().status.unwrap().phase.as_deref(), Some("Pending"));
    assert!(volume_calls(&driver).is_empty(), "nothing is staged for an unbound claim");

    // Bound: staged once, published for the pod, mounted in the container.
    bind(&admin, &pv).await;
    running(&gantry, &pods, "writer").await;
    eventually("the writer wrote", &gantry, || async {
        container_output(&env, "writer").contains("wrote").then_some(())
    })
    .await;
    assert_eq!(std::fs::read_to_string(driver.volume_dir("vol-1").join("file")).unwrap(), "written-through-csi\n");
    let uid = pods.get("writer").await.unwrap().metadata.uid.unwrap();
    let published = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/{pv}"));
    let vol_data: serde_json::Value =
        serde_json::from_slice(&std::fs::read(published.join("vol_data.json")).unwrap()).unwrap();
    assert_eq!(vol_data["driverName"], driver_name.as_str());
    assert_eq!(vol_data["volumeHandle"], "vol-1");
    assert_eq!(vol_data["specVolID"], pv.as_str());
    let calls = driver.calls();
    let staging = calls.iter().find_map(|c| match c {
        CsiCall::NodeStageVolume { staging, .. } => Some(staging.clone()),
        _ => None,
    });
    let staging = staging.expect("staged");
    assert!(staging.starts_with(root.join(format!("plugins/kubernetes.io/csi/{driver_name}"))), "{staging:?}");
    assert!(staging.ends_with("globalmount"));
    assert!(calls.contains(&CsiCall::NodePublishVolume {
        volume: "vol-1".into(),
        staging: Some(staging.clone()),
        target: published.join("mount"),
        read_only: false,
    }));
    assert_eq!(volume_calls(&driver), ["stage", "publish"]);

    // Deleted: unpublished, then unstaged (no other pod uses it), nothing left mounted.
    deleted(&gantry, &pods, "writer").await;
    calls_reach(&gantry, &driver, 4).await;
    assert_eq!(volume_calls(&driver), ["stage", "publish", "unpublish", "unstage"]);
    assert!(mounts_below(root).iter().all(|m| !m.contains("kubernetes.io")), "{:?}", mounts_below(root));
    assert!(!published.exists() && !staging.exists(), "the node's volume directories are removed");

    // A new pod on the same claim, read-only, reads what the first one wrote.
    let read = "cat /data/file; touch /data/new 2>/dev/null || echo read-only; sleep 3600";
    pods.create(&PostParams::default(), &claim_pod(node, "reader", read, true)).await.unwrap();
    running(&gantry, &pods, "reader").await;
    let output = eventually("the reader read", &gantry, || async {
        let out = container_output(&env, "reader");
        out.contains("read-only").then_some(out)
    })
    .await;
    assert!(output.contains("written-through-csi"), "{output}");
    assert!(!driver.volume_dir("vol-1").join("new").exists());
    assert!(driver.calls().iter().any(|c| matches!(c, CsiCall::NodePublishVolume { read_only: true, .. })));
    deleted(&gantry, &pods, "reader").await;
    eventually("the volume is unstaged again", &gantry, || async { (volume_calls(&driver).len() == 8).then_some(()) })
        .await;
    let each_pod = ["stage", "publish", "unpublish", "unstage"];
    assert_eq!(volume_calls(&driver), [each_pod, each_pod].concat());
    assert!(mounts_below(root).iter().all(|m| !m.contains("kubernetes.io")), "{:?}", mounts_below(root));

    // The driver goes away: it leaves the CSINode.
    drop(driver);
    eventually("the driver left the CSINode", &gantry, || async {
        let csi_node = csi_nodes.get_opt(node).await.ok()??;
        csi_node.spec.drivers.iter().all(|d| d.name != driver_name).then_some(())
    })
    .await;
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}

#[tokio::test]
async fn a_volume_that_needs_attaching_waits_for_its_volume_attachment() {
    // A driver without STAGE_UNSTAGE_VOLUME, and no CSIDriver object: attach is required.
    let kind = DriverKind { stages: false, max_volumes: 0, no_attach: false };
    let Some(Setup { env, cluster, admin, pods, driver, driver_name, .. }) = setup("attach", kind).await else {
        return;
    };
    let Env { ref root, ref node, .. } = env;
    let pv = format!("{node}-attached-pv");
    let gantry = cluster::start_node(&env, &cluster);
    let csi_nodes: Api<CSINode> = Api::all(admin.clone());
    let entry = eventually("the driver is in the node's CSINode", &gantry, || async {
        let csi_node = csi_nodes.get_opt(node).await.ok()??;
        csi_node.spec.drivers.into_iter().find(|d| d.name == driver_name)
    })
    .await;
    assert_eq!(entry.allocatable, None, "no volume limit reported, none recorded");

    claim_and_volume(&admin, &driver_name, &pv).await;
    bind(&admin, &pv).await;
    pods.create(&PostParams::default(), &claim_pod(node, "attached", "echo mounted; sleep 3600", false)).await.unwrap();
    let attachment = gantry_agent::runtime::csi::attachment_name("vol-1", &driver_name, node);
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let waiting = eventually("the FailedMount event of the missing attachment", &gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("attached")
                && e.reason.as_deref() == Some("FailedMount")
                && e.message.as_deref().is_some_and(|m| m.starts_with("MountVolume.WaitForAttach failed"))
        })
    })
    .await;
    assert!(waiting.message.unwrap().contains(&format!("volume {pv:?}")));
    assert!(volume_calls(&driver).is_empty(), "nothing is published before the volume is attached");

    // The attacher's part: the VolumeAttachment, upstream's name, attached with metadata.
    let attachments: Api<VolumeAttachment> = Api::all(admin.clone());
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": attachment},
        "spec": {"attacher": driver_name, "nodeName": node, "source": {"persistentVolumeName": pv}},
    }))
    .unwrap();
    attachments.create(&PostParams::default(), &va).await.unwrap();
    let attached = Patch::Merge(json!({"status": {"attached": true, "attachmentMetadata": {"device": "/dev/x"}}}));
    attachments.patch_status(&attachment, &PatchParams::default(), &attached).await.unwrap();
    running(&gantry, &pods, "attached").await;
    let uid = pods.get("attached").await.unwrap().metadata.uid.unwrap();
    let published = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/{pv}"));
    assert!(driver.calls().contains(&CsiCall::NodePublishVolume {
        volume: "vol-1".into(),
        staging: None,
        target: published.join("mount"),
        read_only: false,
    }));
    let vol_data: serde_json::Value =
        serde_json::from_slice(&std::fs::read(published.join("vol_data.json")).unwrap()).unwrap();
    assert_eq!(vol_data["attachmentID"], attachment.as_str());

    deleted(&gantry, &pods, "attached").await;
    eventually("the volume is unpublished", &gantry, || async { (volume_calls(&driver).len() == 2).then_some(()) })
        .await;
    assert_eq!(volume_calls(&driver), ["publish", "unpublish"], "a driver that does not stage is never staged");
    assert!(mounts_below(root).iter().all(|m| !m.contains("kubernetes.io")), "{:?}", mounts_below(root));
    let _ = attachments.delete(&attachment, &DeleteParams::default()).await;
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}

#[tokio::test]
async fn a_restart_repeats_no_call_and_tears_down_what_the_earlier_run_set_up() {
    let Some(Setup { env, cluster, admin, pods, driver, driver_name, .. }) = setup("restart", STAGING).await else {
        return;
    };
    let Env { ref root, ref node, .. } = env;
    let pv = bound_claim(&admin, &driver_name, &format!("{node}-restart-pv")).await;
    let mut gantry = cluster::start_node(&env, &cluster);
    pods.create(&PostParams::default(), &claim_pod(node, "kept", "sleep 3600", false)).await.unwrap();
    running(&gantry, &pods, "kept").await;
    assert_eq!(volume_calls(&driver), ["stage", "publish"]);

    // Gantry restarts: the pod keeps running, its volume is neither staged nor published again.
    let before = env.running("kept").await;
    let registrations = driver.calls().iter().filter(|c| **c == CsiCall::GetInfo).count();
    gantry.kill();
    let gantry = cluster::start_node(&env, &cluster);
    eventually("the restarted node registers the driver again", &gantry, || async {
        (driver.calls().iter().filter(|c| **c == CsiCall::GetInfo).count() > registrations).then_some(())
    })
    .await;
    running(&gantry, &pods, "kept").await;
    assert_eq!(env.running("kept").await, before, "the pod keeps running, unchanged");
    assert_eq!(volume_calls(&driver), ["stage", "publish"], "nothing repeated after the restart");

    // Deleted after the restart: torn down from the record on disk, once each, in order.
    deleted(&gantry, &pods, "kept").await;
    calls_reach(&gantry, &driver, 4).await;
    assert_eq!(volume_calls(&driver), ["stage", "publish", "unpublish", "unstage"]);
    assert!(mounts_below(root).iter().all(|m| !m.contains("kubernetes.io")), "{:?}", mounts_below(root));
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}

#[tokio::test]
async fn a_published_volume_is_measured_and_reported_in_use() {
    // No CSIDriver object: attach is required, so the volume is one the node reports in use.
    let kind = DriverKind { no_attach: false, ..STAGING };
    let Some(Setup { env, cluster, admin, pods, driver, driver_name, .. }) = setup("stats", kind).await else { return };
    let Env { ref root, ref node, .. } = env;
    let pv = bound_claim(&admin, &driver_name, &format!("{node}-stats-pv")).await;
    let attachment = gantry_agent::runtime::csi::attachment_name("vol-1", &driver_name, node);
    let attachments: Api<VolumeAttachment> = Api::all(admin.clone());
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": attachment},
        "spec": {"attacher": driver_name, "nodeName": node, "source": {"persistentVolumeName": pv}},
    }))
    .unwrap();
    attachments.create(&PostParams::default(), &va).await.unwrap();
    let attached = Patch::Merge(json!({"status": {"attached": true}}));
    attachments.patch_status(&attachment, &PatchParams::default(), &attached).await.unwrap();

    let api = NodeApi::new(&env.ctd.dir());
    let kubeconfig = format!("--kubeconfig={}", cluster.node_kubeconfig(&env.ctd.dir(), node).display());
    // The volumes measured every 2 s (upstream's default is a minute).
    let gantry =
        api.start_agent(&env, &[&kubeconfig, "--authorization-mode=AlwaysAllow", "--volume-stats-agg-period=2s"]).await;
    let reader = api.ca.client("stats-reader", &[]);
    let get = |path: &'static str| {
        let request = api.client(Some(&reader)).get(api.url(path));
        async move { request.send().await.ok()?.text().await.ok() }
    };
    let write = "dd if=/dev/zero of=/data/blob bs=1024 count=1024 && echo wrote; sleep 3600";
    pods.create(&PostParams::default(), &claim_pod(node, "measured", write, false)).await.unwrap();
    // In use from the moment the node knows it needs the attached volume (upstream's unique name).
    let unique = format!("kubernetes.io/csi/{driver_name}^vol-1");
    let nodes: Api<Node> = Api::all(admin.clone());
    let in_use = || async { nodes.get(node).await.ok()?.status?.volumes_in_use };
    eventually("the Node reports the volume in use", &gantry, || async {
        (in_use().await? == [unique.clone()]).then_some(())
    })
    .await;
    running(&gantry, &pods, "measured").await;
    eventually("the pod wrote", &gantry, || async {
        container_output(&env, "measured").contains("wrote").then_some(())
    })
    .await;

    // /stats/summary: the pod's volume by its name, with its claim, as the driver measured it
    // (in the background, after the write).
    let volume = eventually("the claim's volume in /stats/summary", &gantry, || async {
        let summary: serde_json::Value = serde_json::from_str(&get("/stats/summary").await?).ok()?;
        let pod = summary["pods"].as_array()?.iter().find(|p| p["podRef"]["name"] == "measured")?.clone();
        let volume = pod["volume"].as_array()?.iter().find(|v| v["name"] == "data").cloned()?;
        (volume["usedBytes"].as_i64()? >= 1024 * 1024).then_some(volume)
    })
    .await;
    let [bytes, inodes] = gantry_testkit::csi_driver::statvfs_usage(&driver.volume_dir("vol-1")).unwrap();
    assert_eq!(volume["pvcRef"], json!({"name": "data", "namespace": "default"}), "{volume}");
    assert_eq!(volume["capacityBytes"], bytes.total, "{volume}");
    assert_eq!(volume["inodes"], inodes.total, "{volume}");
    assert!(volume["usedBytes"].as_i64().unwrap() >= 1024 * 1024, "the 1 MiB written counts: {volume}");
    assert!(volume["availableBytes"].as_i64().unwrap() > 0 && volume["inodesFree"].as_i64().unwrap() > 0);
    assert!(volume["inodesUsed"].as_i64().unwrap() > 0, "{volume}");
    assert!(volume["time"].as_str().is_some_and(|t| !t.is_empty()), "{volume}");
    let uid = pods.get("measured").await.unwrap().metadata.uid.unwrap();
    let target = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/{pv}/mount"));
    assert!(
        driver.calls().contains(&CsiCall::NodeGetVolumeStats { volume: "vol-1".into(), path: target }),
        "asked about the published path: {:?}",
        driver.calls()
    );

    // Scrapes read the last measure: they do not ask the driver each time.
    let asked = || driver.calls().iter().filter(|c| matches!(c, CsiCall::NodeGetVolumeStats { .. })).count();
    let before = asked();
    let mut times = std::collections::BTreeSet::new();
    for _ in 0..5 {
        let summary: serde_json::Value = serde_json::from_str(&get("/stats/summary").await.unwrap()).unwrap();
        let pod = summary["pods"].as_array().unwrap().iter().find(|p| p["podRef"]["name"] == "measured").cloned();
        times.insert(pod.unwrap()["volume"][0]["time"].as_str().unwrap().to_string());
    }
    assert!(asked() - before <= 1 && times.len() <= 2, "5 scrapes, {} calls, times {times:?}", asked() - before);

    // /metrics: upstream's gauges by claim.
    let metrics = get("/metrics").await.unwrap();
    let claim = r#"{namespace="default",persistentvolumeclaim="data"}"#;
    let sample = |name: &str| {
        metrics.lines().find_map(|l| l.strip_prefix(&format!("{name}{claim} "))).map(|v| v.parse::<i64>().unwrap())
    };
    assert_eq!(sample("kubelet_volume_stats_capacity_bytes"), Some(bytes.total), "{metrics}");
    assert_eq!(sample("kubelet_volume_stats_inodes"), Some(inodes.total), "{metrics}");
    assert!(sample("kubelet_volume_stats_used_bytes").unwrap() >= 1024 * 1024, "{metrics}");
    for name in ["available_bytes", "inodes_free", "inodes_used"] {
        assert!(sample(&format!("kubelet_volume_stats_{name}")).is_some(), "{name} in {metrics}");
    }

    deleted(&gantry, &pods, "measured").await;
    calls_reach(&gantry, &driver, 4).await;
    let metrics = get("/metrics").await.unwrap();
    assert!(!metrics.contains(claim), "a claim no pod mounts is not measured: {metrics}");
    eventually("the volume is no longer in use", &gantry, || async { in_use().await.is_none().then_some(()) }).await;
    let _ = attachments.delete(&attachment, &DeleteParams::default()).await;
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}

#[tokio::test]
async fn an_inline_ephemeral_volume_is_published_for_its_pod_alone() {
    // A driver that stages its persistent volumes: an inline one is still never staged. Its
    // CSIDriver object is the test's own.
    let kind = DriverKind { no_attach: false, ..STAGING };
    let Some(Setup { env, cluster, admin, pods, driver, driver_name, .. }) = setup("inline", kind).await else {
        return;
    };
    let Env { ref root, ref node, .. } = env;
    let csi_driver = |modes: &[&str]| -> CSIDriver {
        serde_json::from_value(json!({
            "metadata": {"name": driver_name},
            "spec": {"attachRequired": false, "podInfoOnMount": true, "volumeLifecycleModes": modes,
                     "fsGroupPolicy": "File"},
        }))
        .unwrap()
    };
    let drivers: Api<CSIDriver> = Api::all(admin.clone());
    drivers.create(&PostParams::default(), &csi_driver(&["Persistent"])).await.unwrap();
    let gantry = cluster::start_node(&env, &cluster);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "inline"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "securityContext": {"fsGroup": 2345},
            "containers": [{
                "name": "main",
                "image": gantry_testkit::BUSYBOX_IMAGE,
                "command": ["sh", "-c", "echo inline > /scratch/file && echo wrote; sleep 3600"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }],
            "volumes": [{"name": "scratch", "csi": {"driver": driver_name, "volumeAttributes": {"size": "1Mi"}}}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    // The driver does not serve ephemeral volumes: the pod waits, with upstream's message.
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let refused = eventually("the FailedMount event of the unsupported mode", &gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.involved_object.name.as_deref() == Some("inline") && e.reason.as_deref() == Some("FailedMount"))
    })
    .await;
    assert_eq!(
        refused.message.as_deref(),
        Some(
            format!(
                "MountVolume.SetUp failed for volume \"scratch\" : kubernetes.io/csi: mounter.SetupAt failed to check \
             volume lifecycle mode: volume mode \"Ephemeral\" not supported by driver {driver_name} (only supports \
             [\"Persistent\"])"
            )
            .as_str()
        )
    );
    assert!(volume_calls(&driver).is_empty(), "nothing is published for an unsupported mode");

    // Now it does (the modes cannot change in place): published once, for the pod, unstaged.
    drivers.delete(&driver_name, &DeleteParams::default()).await.unwrap();
    drivers.create(&PostParams::default(), &csi_driver(&["Persistent", "Ephemeral"])).await.unwrap();
    running(&gantry, &pods, "inline").await;
    eventually("the pod wrote", &gantry, || async { container_output(&env, "inline").contains("wrote").then_some(()) })
        .await;
    let uid = pods.get("inline").await.unwrap().metadata.uid.unwrap();
    let id = gantry_agent::runtime::csi::inline_volume_id(&uid, "scratch");
    assert_eq!(std::fs::read_to_string(driver.volume_dir(&id).join("file")).unwrap(), "inline\n");
    // The CSIDriver's fsGroupPolicy File: the volume belongs to the pod's fsGroup, setgid, so
    // what the container writes does too.
    use std::os::unix::fs::MetadataExt;
    let root_meta = std::fs::metadata(driver.volume_dir(&id)).unwrap();
    assert_eq!((root_meta.gid(), root_meta.mode() & 0o2070), (2345, 0o2070));
    assert_eq!(std::fs::metadata(driver.volume_dir(&id).join("file")).unwrap().gid(), 2345);
    let published = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/scratch"));
    let target = published.join("mount");
    assert!(driver.calls().contains(&CsiCall::NodePublishVolume {
        volume: id.clone(),
        staging: None,
        target: target.clone(),
        read_only: false,
    }));
    assert_eq!(volume_calls(&driver), ["publish"]);
    let context = driver.publish_context(&target).unwrap();
    assert_eq!(context["size"], "1Mi", "{context:?}");
    assert_eq!(context["csi.storage.k8s.io/ephemeral"], "true", "{context:?}");
    assert_eq!(context["csi.storage.k8s.io/pod.name"], "inline", "{context:?}");
    assert_eq!(context["csi.storage.k8s.io/pod.namespace"], "default", "{context:?}");
    assert_eq!(context["csi.storage.k8s.io/pod.uid"], uid, "{context:?}");
    assert!(context.contains_key("csi.storage.k8s.io/serviceAccount.name"), "{context:?}");
    let vol_data: serde_json::Value =
        serde_json::from_slice(&std::fs::read(published.join("vol_data.json")).unwrap()).unwrap();
    assert_eq!(vol_data["volumeLifecycleMode"], "Ephemeral");
    assert_eq!(vol_data["specVolID"], "scratch");
    assert_eq!(vol_data["volumeHandle"], id.as_str());

    deleted(&gantry, &pods, "inline").await;
    eventually("the volume is unpublished", &gantry, || async { (volume_calls(&driver).len() == 2).then_some(()) })
        .await;
    assert_eq!(volume_calls(&driver), ["publish", "unpublish"]);
    assert!(mounts_below(root).iter().all(|m| !m.contains("kubernetes.io")), "{:?}", mounts_below(root));
    assert!(!published.exists());
    let _ = drivers.delete(&driver_name, &DeleteParams::default()).await;
    let _ = Api::<CSINode>::all(admin.clone()).delete(node, &DeleteParams::default()).await;
    cluster.cleanup(node).await;
}

#[tokio::test]
async fn a_generic_ephemeral_volume_uses_only_the_claim_its_pod_controls() {
    let Some(Setup { env, cluster, admin, pods, claims, driver, driver_name }) = setup("generic", STAGING).await else {
        return;
    };
    let Env { ref root, ref node, .. } = env;
    let pv = format!("{node}-generic-pv");
    // The test plays the binder, and the ephemeral volume controller only in part: a claim of
    // the right name (`<pod>-<volume>`) that the pod does not control yet.
    claim_and_volume_named(&admin, &driver_name, &pv, "eph-data").await;
    bind_named(&admin, &pv, "eph-data").await;
    let gantry = cluster::start_node(&env, &cluster);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "eph"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": gantry_testkit::BUSYBOX_IMAGE,
                "command": ["sh", "-c", "echo generic > /data/file && echo wrote; sleep 3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                "resources": {"requests": {"storage": "1Mi"}},
            }}}}],
        },
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let refused = eventually("the FailedMount event of the claim the pod does not own", &gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("eph")
                && e.reason.as_deref() == Some("FailedMount")
                && e.message.as_deref().is_some_and(|m| m.contains("not owner"))
        })
    })
    .await;
    assert_eq!(
        refused.message.as_deref(),
        Some("PVC default/eph-data was not created for pod default/eph (pod is not owner)")
    );
    assert!(volume_calls(&driver).is_empty(), "someone else's claim is never mounted");

    // The controller's part: the pod controls its claim. Then it is a claim like any other.
    let owner = json!({"metadata": {"ownerReferences": [{
        "apiVersion": "v1", "kind": "Pod", "name": "eph", "uid": pod.metadata.uid.clone().unwrap(),
        "controller": true, "blockOwnerDeletion": true,
    }]}});
    claims.patch("eph-data", &PatchParams::default(), &Patch::Merge(owner)).await.unwrap();
    running(&gantry, &pods, "eph").await;
    eventually("the pod wrote", &gantry, || async { container_output(&env, "eph").contains("wrote").then_some(()) })
        .await;
    assert_eq!(std::fs::read_to_string(driver.volume_dir("vol-1").join("file")).unwrap(), "generic\n");
    assert_eq!(volume_calls(&driver), ["stage", "publish"]);
    let uid = pod.metadata.uid.unwrap();
    let published = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/{pv}"));
    assert!(published.join("vol_data.json").exists(), "published under the PV's name, as a claim's volume");

    deleted(&gantry, &pods, "eph").await;
    calls_reach(&gantry, &driver, 4).await;
    assert_eq!(volume_calls(&driver), ["stage", "publish", "unpublish", "unstage"]);
    assert!(mounts_below(root).iter().all(|m| !m.contains("kubernetes.io")), "{:?}", mounts_below(root));
    let _ = claims.delete("eph-data", &DeleteParams::default()).await;
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}

#[tokio::test]
async fn a_block_volume_is_a_device_in_the_container() {
    let Some(Setup { env, cluster, admin, pods, claims, driver, driver_name }) = setup("block", STAGING).await else {
        return;
    };
    let Env { ref root, ref node, .. } = env;
    let pv = format!("{node}-block-pv");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "disk"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv, "volumeMode": "Block",
                 "resources": {"requests": {"storage": "16Mi"}}},
    }))
    .unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "16Mi"}, "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain", "volumeMode": "Block",
            "claimRef": {"namespace": "default", "name": "disk", "uid": claim.metadata.uid.clone().unwrap()},
            "csi": {"driver": driver_name, "volumeHandle": "blk-1"},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(admin.clone()).create(&PostParams::default(), &volume).await.unwrap();
    bind_named(&admin, &pv, "disk").await;
    // The node API on, for the block volume's stats (measured every 2 s).
    let api = NodeApi::new(&env.ctd.dir());
    let kubeconfig = format!("--kubeconfig={}", cluster.node_kubeconfig(&env.ctd.dir(), node).display());
    let flags = [kubeconfig.as_str(), "--authorization-mode=AlwaysAllow", "--volume-stats-agg-period=2s"];
    let gantry = api.start_agent(&env, &flags).await;

    // The container writes the raw device and reads it back.
    let script = "echo written-to-the-device | dd of=/dev/xvda conv=fsync 2>/dev/null && \
                  dd if=/dev/xvda bs=24 count=1 2>/dev/null; echo; echo done; sleep 3600";
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "raw"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": gantry_testkit::BUSYBOX_IMAGE,
                "command": ["sh", "-c", script],
                "volumeDevices": [{"name": "disk", "devicePath": "/dev/xvda"}],
            }],
            "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": "disk"}}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    running(&gantry, &pods, "raw").await;
    let output = eventually("the pod used its device", &gantry, || async {
        let out = container_output(&env, "raw");
        out.contains("done").then_some(out)
    })
    .await;
    assert!(output.contains("written-to-the-device"), "read back in the container: {output}");
    let backing = std::fs::read(driver.block_file("blk-1")).unwrap();
    assert!(backing.starts_with(b"written-to-the-device\n"), "the loop device's file holds what was written");

    // Staged and published as a block device, in upstream's volumeDevices layout.
    let uid = pods.get("raw").await.unwrap().metadata.uid.unwrap();
    let devices = root.join("plugins/kubernetes.io/csi/volumeDevices");
    let (staging, target) = (devices.join(format!("staging/{pv}")), devices.join(format!("publish/{pv}/{uid}")));
    assert!(driver.calls().contains(&CsiCall::NodeStageVolume { volume: "blk-1".into(), staging: staging.clone() }));
    assert!(driver.calls().contains(&CsiCall::NodePublishVolume {
        volume: "blk-1".into(),
        staging: Some(staging.clone()),
        target: target.clone(),
        read_only: false,
    }));
    assert_eq!(volume_calls(&driver), ["stage", "publish"]);
    let record = root.join(format!("pods/{uid}/volumeDevices/kubernetes.io~csi/{pv}/vol_data.json"));
    assert!(record.exists(), "the pod's record of its block volume");

    // Its size as the driver reports it, asked at the device file, in the summary and /metrics.
    let reader = api.ca.client("stats-reader", &[]);
    let get = |path: &'static str| {
        let request = api.client(Some(&reader)).get(api.url(path));
        async move { request.send().await.ok()?.text().await.ok() }
    };
    let volume = eventually("the block volume in /stats/summary", &gantry, || async {
        let summary: serde_json::Value = serde_json::from_str(&get("/stats/summary").await?).ok()?;
        let pod = summary["pods"].as_array()?.iter().find(|p| p["podRef"]["name"] == "raw")?.clone();
        pod["volume"].as_array()?.iter().find(|v| v["name"] == "disk").cloned()
    })
    .await;
    assert_eq!(volume["capacityBytes"], 16 << 20, "{volume}");
    assert_eq!(volume["pvcRef"], json!({"name": "disk", "namespace": "default"}), "{volume}");
    assert!(driver.calls().contains(&CsiCall::NodeGetVolumeStats { volume: "blk-1".into(), path: target.clone() }));
    let metrics = get("/metrics").await.unwrap();
    let sample = r#"kubelet_volume_stats_capacity_bytes{namespace="default",persistentvolumeclaim="disk"} 16777216"#;
    assert!(metrics.lines().any(|l| l == sample), "{metrics}");

    deleted(&gantry, &pods, "raw").await;
    calls_reach(&gantry, &driver, 4).await;
    assert_eq!(volume_calls(&driver), ["stage", "publish", "unpublish", "unstage"]);
    assert!(mounts_below(root).iter().all(|m| !m.contains("kubernetes.io")), "{:?}", mounts_below(root));
    assert!(!target.exists() && !staging.exists() && !record.exists(), "the node's files are removed");
    let _ = claims.delete("disk", &DeleteParams::default()).await;
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}

#[tokio::test]
async fn a_pod_deleted_while_gantry_was_down_has_its_volume_torn_down() {
    let Some(Setup { env, cluster, admin, pods, driver, driver_name, .. }) = setup("down", STAGING).await else {
        return;
    };
    let Env { ref root, ref node, .. } = env;
    let pv = bound_claim(&admin, &driver_name, &format!("{node}-down-pv")).await;
    let mut gantry = cluster::start_node(&env, &cluster);
    pods.create(&PostParams::default(), &claim_pod(node, "gone", "sleep 3600", false)).await.unwrap();
    running(&gantry, &pods, "gone").await;
    assert_eq!(volume_calls(&driver), ["stage", "publish"]);

    // Gantry is down while the pod is deleted for good: the next run finds only the runtime's
    // pod and the records on disk, and tears the volume down from them.
    gantry.kill();
    pods.delete("gone", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    assert!(pods.get_opt("gone").await.unwrap().is_none());
    let gantry = cluster::start_node(&env, &cluster);
    calls_reach(&gantry, &driver, 4).await;
    assert_eq!(volume_calls(&driver), ["stage", "publish", "unpublish", "unstage"]);
    assert!(mounts_below(root).iter().all(|m| !m.contains("kubernetes.io")), "{:?}", mounts_below(root));
    let pod_dirs = || std::fs::read_dir(root.join("pods")).into_iter().flatten().count();
    eventually("the pod's directory is removed", &gantry, || async { (pod_dirs() == 0).then_some(()) }).await;
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}

/// The example device plugin's resource.
const GPU: &str = "example.com/gpu";

/// A StatefulSet `name` of one replica on the node: its pods ask for one `GPU` and mount the
/// claim from the template `data` (storage class `class`) at `/data`; the first one writes
/// there, a later one reads it.
fn stateful_set(node: &str, name: &str, class: &str) -> StatefulSet {
    let script = "if [ -f /data/file ]; then echo \"found=$(cat /data/file)\"; \
                  else echo kept-by-the-claim > /data/file && echo wrote; fi; \
                  echo devices=$EXAMPLE_DEVICES; ls /run/example-devices; echo done; sleep 3600";
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeName": node,
                    "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": false,
                    "containers": [{
                        "name": "main",
                        "image": gantry_testkit::BUSYBOX_IMAGE,
                        "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                         "resources": {"requests": {"storage": "1Mi"}}},
            }],
        },
    }))
    .unwrap()
}

/// The StatefulSet controller's part on the test server (a real cluster's controller does it):
/// the claim `<template>-<set>-0` from the template, unless it exists, and the pod `<set>-0`
/// from the pod template, controlled by the set, with the claim as its volume.
async fn play_stateful_set_controller(admin: &Client, set: &StatefulSet) -> String {
    let name = set.metadata.name.clone().unwrap();
    let spec = set.spec.clone().unwrap();
    let pod_name = format!("{name}-0");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    let mut template = spec.volume_claim_templates.unwrap()[0].clone();
    let claim_name = format!("{}-{pod_name}", template.metadata.name.as_deref().unwrap());
    if claims.get_opt(&claim_name).await.unwrap().is_none() {
        template.metadata = kube::api::ObjectMeta {
            name: Some(claim_name.clone()),
            labels: spec.selector.match_labels.clone(),
            ..Default::default()
        };
        template.status = None;
        claims.create(&PostParams::default(), &template).await.unwrap();
    }
    let mut pod = Pod { metadata: spec.template.metadata.unwrap_or_default(), spec: spec.template.spec, status: None };
    pod.metadata.name = Some(pod_name.clone());
    let labels = pod.metadata.labels.get_or_insert_default();
    labels.insert("statefulset.kubernetes.io/pod-name".into(), pod_name.clone());
    labels.insert("apps.kubernetes.io/pod-index".into(), "0".into());
    pod.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": set.metadata.uid.clone().unwrap(),
            "controller": true, "blockOwnerDeletion": true,
        }))
        .unwrap(),
    ]);
    let pod_spec = pod.spec.as_mut().unwrap();
    pod_spec.hostname = Some(pod_name.clone());
    pod_spec.subdomain = spec.service_name.clone();
    pod_spec.volumes = Some(vec![
        serde_json::from_value(json!({"name": "data", "persistentVolumeClaim": {"claimName": claim_name}})).unwrap(),
    ]);
    Api::<Pod>::namespaced(admin.clone(), "default").create(&PostParams::default(), &pod).await.unwrap();
    claim_name
}

/// The provisioner's part (the test driver has none): a PV of the driver for the claim,
/// pre-bound to it. On the test server the test also plays the PV controller and binds them.
async fn provision(admin: &Client, claim_name: &str, class: &str, driver: &str, pv: &str, binder: bool) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    let claim = claims.get(claim_name).await.unwrap();
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv, "annotations": {"pv.kubernetes.io/provisioned-by": driver}},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"}, "storageClassName": class,
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": "default", "name": claim_name, "uid": claim.metadata.uid.unwrap()},
            "csi": {"driver": driver, "volumeHandle": "sts-vol", "fsType": "ext4"},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(admin.clone()).create(&PostParams::default(), &volume).await.unwrap();
    if binder {
        let volume_name = Patch::Merge(json!({"spec": {"volumeName": pv}}));
        claims.patch(claim_name, &PatchParams::default(), &volume_name).await.unwrap();
        bind_named(admin, pv, claim_name).await;
    }
}

/// What the container of the pod with `uid` printed.
fn pod_output(env: &Env, pod: &str, uid: &str) -> String {
    let dir = env.pod_logs.join(format!("default_{pod}_{uid}/main"));
    let logs = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let lines: Vec<String> = logs
        .flat_map(|l| {
            std::fs::read_to_string(l.path())
                .unwrap_or_default()
                .lines()
                .map(|line| line.splitn(4, ' ').nth(3).unwrap_or_default().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    lines.join("\n")
}

/// The pod `name` running, not `old_uid` (a recreated pod): its UID.
async fn running_pod(gantry: &common::Gantry, pods: &Api<Pod>, name: &str, old_uid: Option<&str>) -> String {
    eventually(&format!("{name} runs"), gantry, || async {
        let pod = pods.get_opt(name).await.ok()??;
        let uid = pod.metadata.uid?;
        (pod.status?.phase? == "Running" && Some(uid.as_str()) != old_uid).then_some(uid)
    })
    .await
}

/// The issue's done criterion: a StatefulSet with a claim and a pod asking for an extended
/// resource run on the node, through the test CSI driver and device plugin (both speaking the
/// upstream protocols). The recreated pod finds the data on its claim and gets a device again.
#[tokio::test]
async fn a_stateful_set_with_a_claim_and_a_device_runs_through_the_node_plugins() {
    let Some(Setup { env, cluster, admin, pods, claims, driver, driver_name }) = setup("sts", STAGING).await else {
        return;
    };
    let Env { ref root, ref node, .. } = env;
    let test_server = matches!(cluster, Cluster::Test(_));
    let (pv, class, set_name) = (format!("{node}-sts-pv"), format!("{node}-sts"), format!("{node}-db"));
    let options = DevicePluginOptions::default();
    let plugin =
        TestDevicePlugin::start(&root.join("plugins_registry/example-gpu.sock"), GPU, 1, options).await.unwrap();
    let storage_class: StorageClass =
        serde_json::from_value(json!({"metadata": {"name": class}, "provisioner": driver_name})).unwrap();
    Api::<StorageClass>::all(admin.clone()).create(&PostParams::default(), &storage_class).await.unwrap();
    let gantry = cluster::start_node(&env, &cluster);
    let nodes: Api<Node> = Api::all(admin.clone());
    eventually("the Node offers the device", &gantry, || async {
        let allocatable = nodes.get(node).await.ok()?.status?.allocatable?;
        (allocatable.get(GPU)?.0 == "1").then_some(())
    })
    .await;

    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), "default");
    let set = sets.create(&PostParams::default(), &stateful_set(node, &set_name, &class)).await.unwrap();
    let pod_name = format!("{set_name}-0");
    let claim_name = format!("data-{pod_name}");
    if test_server {
        play_stateful_set_controller(&admin, &set).await;
    }
    eventually("the set's claim exists", &gantry, || async { claims.get_opt(&claim_name).await.ok()? }).await;
    provision(&admin, &claim_name, &class, &driver_name, &pv, test_server).await;

    // Running: the claim's volume staged and published, the device allocated.
    let uid = running_pod(&gantry, &pods, &pod_name, None).await;
    let pod = pods.get(&pod_name).await.unwrap();
    let owner = &pod.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("StatefulSet", set_name.as_str(), Some(true))
    );
    let output = eventually("the first pod wrote", &gantry, || async {
        let out = pod_output(&env, &pod_name, &uid);
        out.contains("done").then_some(out)
    })
    .await;
    assert!(output.contains("wrote") && output.contains("devices=dev-0"), "{output}");
    assert!(output.lines().any(|l| l == "dev-0"), "the device's file is mounted: {output}");
    assert_eq!(std::fs::read_to_string(driver.volume_dir("sts-vol").join("file")).unwrap(), "kept-by-the-claim\n");
    assert_eq!(volume_calls(&driver), ["stage", "publish"]);
    assert!(plugin.calls().contains(&PluginCall::Allocate { devices: vec!["dev-0".into()] }));
    let checkpoint_file = root.join("device-plugins/kubelet_internal_checkpoint");
    let checkpoint = std::fs::read_to_string(&checkpoint_file).unwrap();
    assert!(checkpoint.contains(&uid) && checkpoint.contains(GPU), "the allocation is accounted: {checkpoint}");
    let channel = gantry_testkit::cri::connect(&root.join("pod-resources/kubelet.sock")).await.unwrap();
    let list = PodResourcesListerClient::new(channel).list(ListPodResourcesRequest {}).await.unwrap().into_inner();
    let listed = list.pod_resources.iter().find(|p| p.name == pod_name).expect("the pod in pod-resources");
    let devices: Vec<_> =
        listed.containers[0].devices.iter().map(|d| (d.resource_name.as_str(), d.device_ids.clone())).collect();
    assert_eq!(devices, [(GPU, vec!["dev-0".to_string()])]);

    // The pod is deleted; the controller makes it again, on the same claim and the freed device.
    pods.delete(&pod_name, &DeleteParams::default()).await.unwrap();
    if test_server {
        // As the controller, once the first pod is gone (its device freed, its volume torn down).
        eventually("the first pod is gone", &gantry, || async {
            let freed = !std::fs::read_to_string(&checkpoint_file).ok()?.contains(&uid);
            (pods.get_opt(&pod_name).await.ok()?.is_none() && freed && volume_calls(&driver).len() == 4).then_some(())
        })
        .await;
        play_stateful_set_controller(&admin, &set).await;
    }
    let second = running_pod(&gantry, &pods, &pod_name, Some(&uid)).await;
    let output = eventually("the recreated pod read the claim", &gantry, || async {
        let out = pod_output(&env, &pod_name, &second);
        out.contains("done").then_some(out)
    })
    .await;
    assert!(output.contains("found=kept-by-the-claim"), "{output}");
    assert!(output.contains("devices=dev-0"), "the freed device again: {output}");
    // A real controller may recreate the pod before the first one's volume is torn down; then
    // the volume stays staged for it.
    let calls = volume_calls(&driver);
    let each_pod = ["stage", "publish", "unpublish", "unstage", "stage", "publish"];
    assert!(calls == each_pod || (!test_server && calls == ["stage", "publish", "publish", "unpublish"]), "{calls:?}");
    let checkpoint = std::fs::read_to_string(&checkpoint_file).unwrap();
    assert!(checkpoint.contains(&second) && !checkpoint.contains(&uid), "{checkpoint}");

    // Removed (as `kubectl delete` would, the set first): torn down, nothing left mounted.
    sets.delete(&set_name, &DeleteParams::default()).await.unwrap();
    let _ = pods.delete(&pod_name, &DeleteParams::default()).await;
    eventually("the volume is unstaged", &gantry, || async {
        let calls = volume_calls(&driver);
        let count = |c: &str| calls.iter().filter(|x| **x == c).count();
        (calls.last() == Some(&"unstage") && count("publish") == count("unpublish")).then_some(())
    })
    .await;
    assert!(mounts_below(root).iter().all(|m| !m.contains("kubernetes.io")), "{:?}", mounts_below(root));
    let _ = claims.delete(&claim_name, &DeleteParams::default()).await;
    let _ = Api::<StorageClass>::all(admin.clone()).delete(&class, &DeleteParams::default()).await;
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}

/// The PV's `nodeStageSecretRef` and `nodePublishSecretRef`: the Secrets' data go to the
/// driver with `NodeStageVolume` and `NodePublishVolume`; while one is missing the pod waits,
/// with upstream's `FailedMount` message, and nothing is staged.
#[tokio::test]
async fn a_volumes_node_secrets_reach_the_driver() {
    let Some(Setup { env, cluster, admin, pods, claims, driver, driver_name }) = setup("secrets", STAGING).await else {
        return;
    };
    let Env { ref root, ref node, .. } = env;
    let pv = format!("{node}-secrets-pv");
    let (stage_secret, publish_secret) = (format!("{node}-stage"), format!("{node}-publish"));
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Mi"}}},
    }))
    .unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"}, "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": "default", "name": "data", "uid": claim.metadata.uid.unwrap()},
            "csi": {
                "driver": driver_name, "volumeHandle": "vol-1",
                "nodeStageSecretRef": {"name": stage_secret, "namespace": "default"},
                "nodePublishSecretRef": {"name": publish_secret, "namespace": "default"},
            },
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(admin.clone()).create(&PostParams::default(), &volume).await.unwrap();
    bind(&admin, &pv).await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    let secret = |name: &str, key: &str, value: &str| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {key: value}})).unwrap()
    };
    secrets.create(&PostParams::default(), &secret(&publish_secret, "token", "publish-token")).await.unwrap();
    let gantry = cluster::start_node(&env, &cluster);
    pods.create(&PostParams::default(), &claim_pod(node, "secret-user", "sleep 3600", false)).await.unwrap();

    // The stage secret is missing: the pod waits, nothing is staged.
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let waiting = eventually("the FailedMount event of the missing secret", &gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("secret-user") && e.reason.as_deref() == Some("FailedMount")
        })
    })
    .await;
    assert_eq!(
        waiting.message.unwrap(),
        format!(
            "MountVolume.MountDevice failed for volume {pv:?} : fetching NodeStageSecretRef default/{stage_secret} \
             failed: kubernetes.io/csi: failed to find the secret {stage_secret} in the namespace default with \
             error: secrets {stage_secret:?} not found"
        )
    );
    assert_eq!(pods.get("secret-user").await.unwrap().status.unwrap().phase.as_deref(), Some("Pending"));
    assert!(volume_calls(&driver).is_empty(), "nothing is staged without its secret");

    // There: staged and published, each with its own secret's data.
    secrets.create(&PostParams::default(), &secret(&stage_secret, "user", "stage-user")).await.unwrap();
    running(&gantry, &pods, "secret-user").await;
    let uid = pods.get("secret-user").await.unwrap().metadata.uid.unwrap();
    let target = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/{pv}/mount"));
    let want = |k: &str, v: &str| Some([(k.to_string(), v.to_string())].into_iter().collect());
    assert_eq!(driver.stage_secrets("vol-1"), want("user", "stage-user"));
    assert_eq!(driver.publish_secrets(&target), want("token", "publish-token"));
    assert_eq!(volume_calls(&driver), ["stage", "publish"]);

    deleted(&gantry, &pods, "secret-user").await;
    calls_reach(&gantry, &driver, 4).await;
    for name in [&stage_secret, &publish_secret] {
        let _ = secrets.delete(name, &DeleteParams::default()).await;
    }
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}

/// A Block claim in a container's `volumeMounts`, or a file system claim in its
/// `volumeDevices`, is refused as upstream refuses it: the pod waits with a `FailedMount`
/// event, nothing is staged or published for it, and other pods run.
#[tokio::test]
async fn a_volume_used_against_its_mode_is_refused() {
    let Some(Setup { env, cluster, admin, pods, claims, driver, driver_name }) = setup("mode", STAGING).await else {
        return;
    };
    let Env { ref node, .. } = env;
    let pv = bound_claim(&admin, &driver_name, &format!("{node}-mode-pv")).await;
    let block_pv = format!("{node}-mode-block-pv");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "disk"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": block_pv,
                 "volumeMode": "Block", "resources": {"requests": {"storage": "16Mi"}}},
    }))
    .unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": block_pv},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "16Mi"}, "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain", "volumeMode": "Block",
            "claimRef": {"namespace": "default", "name": "disk", "uid": claim.metadata.uid.unwrap()},
            "csi": {"driver": driver_name, "volumeHandle": "blk-1"},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(admin.clone()).create(&PostParams::default(), &volume).await.unwrap();
    bind_named(&admin, &block_pv, "disk").await;
    let gantry = cluster::start_node(&env, &cluster);

    // The block claim mounted, the file system claim as a device.
    let mut mounts_block = claim_pod(node, "mounts-block", "sleep 3600", false);
    let spec = mounts_block.spec.as_mut().unwrap();
    spec.volumes = Some(vec![
        serde_json::from_value(json!({"name": "disk", "persistentVolumeClaim": {"claimName": "disk"}})).unwrap(),
    ]);
    spec.containers[0].volume_mounts =
        Some(vec![serde_json::from_value(json!({"name": "disk", "mountPath": "/disk"})).unwrap()]);
    let mut maps_files = claim_pod(node, "maps-files", "sleep 3600", false);
    maps_files.spec.as_mut().unwrap().containers[0].volume_mounts = None;
    maps_files.spec.as_mut().unwrap().containers[0].volume_devices =
        Some(vec![serde_json::from_value(json!({"name": "data", "devicePath": "/dev/xvda"})).unwrap()]);
    for pod in [&mounts_block, &maps_files] {
        pods.create(&PostParams::default(), pod).await.unwrap();
    }
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    for (pod, want) in [
        ("mounts-block", "volume disk has volumeMode Block, but is specified in volumeMounts"),
        ("maps-files", "volume data has volumeMode Filesystem, but is specified in volumeDevices"),
    ] {
        let event = eventually(&format!("the FailedMount event of {pod}"), &gantry, || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.involved_object.name.as_deref() == Some(pod) && e.reason.as_deref() == Some("FailedMount"))
        })
        .await;
        assert_eq!(event.message.as_deref(), Some(want));
    }

    // A pod using the file system claim as a file system runs beside them.
    pods.create(&PostParams::default(), &claim_pod(node, "fine", "sleep 3600", false)).await.unwrap();
    running(&gantry, &pods, "fine").await;
    for pod in ["mounts-block", "maps-files"] {
        let status = pods.get(pod).await.unwrap().status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Pending"), "{pod}");
        let waiting = status.container_statuses.unwrap_or_default();
        assert!(waiting.iter().all(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_none()), "{pod}");
    }
    assert_eq!(volume_calls(&driver), ["stage", "publish"], "only the fine pod's volume");
    assert!(driver.calls().iter().all(|c| !matches!(c, CsiCall::NodeStageVolume { volume, .. } if volume == "blk-1")));

    for pod in ["fine", "mounts-block", "maps-files"] {
        deleted(&gantry, &pods, pod).await;
    }
    let _ = claims.delete("disk", &DeleteParams::default()).await;
    let _ = Api::<PersistentVolume>::all(admin.clone()).delete(&block_pv, &DeleteParams::default()).await;
    cleanup(&cluster, &admin, node, &driver_name, &pv).await;
}
