//! End-to-end, cluster mode: device plugins. The test kit's device plugin (a real gRPC server
//! on a unix socket whose devices are files) registers through `<root-dir>/plugins_registry`
//! or on `device-plugins/kubelet.sock`; Gantry reports its devices on the Node, admits pods
//! against them, gives a container its devices (env, mounts, device nodes) from the plugin's
//! `Allocate`, keeps the allocations over a restart (the checkpoint), and lists them in the
//! pod-resources API. Against the test API server, or a real cluster (`GANTRY_E2E_KUBECONFIG`).

mod common;

use std::path::Path;

use common::cluster::{self, Cluster};
use common::node_api::NodeApi;
use common::{Env, Gantry, container_output, eventually};
use gantry_plugins::api::deviceplugin::DevicePluginOptions;
use gantry_plugins::api::podresources::pod_resources_lister_client::PodResourcesListerClient;
use gantry_plugins::api::podresources::{
    AllocatableResourcesRequest, GetPodResourcesRequest, ListPodResourcesRequest, PodResources,
};
use gantry_testkit::{PluginCall, TestDevicePlugin};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const GPU: &str = "example.com/gpu";

/// A pod bound to the node whose `main` container asks for `count` of `resource`.
fn device_pod(node: &str, name: &str, resource: &str, count: u32, command: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
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
                "resources": {"limits": {resource: count.to_string()}, "requests": {resource: count.to_string()}},
            }],
        },
    }))
    .unwrap()
}

/// The Node's capacity and allocatable of `resource`, once both are reported.
async fn node_amounts(nodes: &Api<Node>, node: &str, resource: &str) -> Option<(String, String)> {
    let status = nodes.get(node).await.ok()?.status?;
    let capacity = status.capacity?.get(resource)?.0.clone();
    let allocatable = status.allocatable?.get(resource)?.0.clone();
    Some((capacity, allocatable))
}

async fn wait_amounts(gantry: &Gantry, nodes: &Api<Node>, node: &str, resource: &str, want: (&str, &str)) {
    let what = format!("Node {resource} capacity/allocatable {want:?}");
    eventually(&what, gantry, || async {
        let got = node_amounts(nodes, node, resource).await?;
        (got.0 == want.0 && got.1 == want.1).then_some(())
    })
    .await;
}

async fn pod_resources(root: &Path) -> PodResourcesListerClient<tonic::transport::Channel> {
    let channel =
        gantry_testkit::cri::connect(&root.join("pod-resources/kubelet.sock")).await.expect("pod-resources socket");
    PodResourcesListerClient::new(channel)
}

/// The devices of `pod`'s `main` container in a pod-resources answer.
fn main_devices(list: &[PodResources], pod: &str) -> Option<Vec<(String, Vec<String>)>> {
    let p = list.iter().find(|p| p.name == pod && p.namespace == "default")?;
    let c = p.containers.iter().find(|c| c.name == "main")?;
    Some(c.devices.iter().map(|d| (d.resource_name.clone(), d.device_ids.clone())).collect())
}

struct Setup {
    env: Env,
    cluster: Cluster,
    nodes: Api<Node>,
    pods: Api<Pod>,
}

async fn setup() -> Option<Setup> {
    let (env, cluster) = cluster::setup().await?;
    let admin = cluster.admin().await;
    Some(Setup { nodes: Api::all(admin.clone()), pods: Api::namespaced(admin, "default"), env, cluster })
}

#[tokio::test]
async fn devices_are_reported_allocated_checkpointed_and_listed() {
    let Some(Setup { env, cluster, nodes, pods }) = setup().await else { return };
    let options = DevicePluginOptions { pre_start_required: true, get_preferred_allocation_available: true };
    let plugin =
        TestDevicePlugin::start(&env.root.join("plugins_registry/example-gpu.sock"), GPU, 2, options).await.unwrap();
    let mut gantry = cluster::start_node(&env, &cluster);
    let node = env.node.clone();

    // Registration through plugins_registry, then both devices on the Node.
    wait_amounts(&gantry, &nodes, &node, GPU, ("2", "2")).await;
    let calls = plugin.calls();
    assert_eq!(calls[0], PluginCall::GetInfo, "{calls:?}");
    assert!(calls.contains(&PluginCall::NotifyRegistrationStatus { registered: true, error: String::new() }));
    assert!(calls.contains(&PluginCall::GetDevicePluginOptions) && calls.contains(&PluginCall::ListAndWatch));

    // A pod asking for one device gets the plugin's preferred one (the last available).
    let command = "echo devices=$EXAMPLE_DEVICES; cat /run/example-devices/*; test -c /dev/example-dev-1 && echo node-ok; sleep 3600";
    pods.create(&PostParams::default(), &device_pod(&node, "gpu", GPU, 1, command)).await.unwrap();
    eventually("the device pod runs", &gantry, || async {
        (pods.get("gpu").await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await;
    let output = eventually("the container printed its devices", &gantry, || async {
        let out = container_output(&env, "gpu");
        out.contains("node-ok").then_some(out)
    })
    .await;
    assert!(output.contains("devices=dev-1"), "env from Allocate: {output}");
    assert!(output.contains("device dev-1"), "the device file is mounted: {output}");
    let calls = plugin.calls();
    assert!(
        calls
            .contains(&PluginCall::GetPreferredAllocation { available: vec!["dev-0".into(), "dev-1".into()], size: 1 }),
        "{calls:?}"
    );
    assert!(calls.contains(&PluginCall::Allocate { devices: vec!["dev-1".into()] }), "{calls:?}");
    assert!(calls.contains(&PluginCall::PreStartContainer { devices: vec!["dev-1".into()] }), "{calls:?}");
    let uid = pods.get("gpu").await.unwrap().metadata.uid.unwrap();

    // More than is free: rejected as upstream, and the running pod is untouched.
    pods.create(&PostParams::default(), &device_pod(&node, "greedy", GPU, 2, "sleep 3600")).await.unwrap();
    let status = eventually("the greedy pod is rejected", &gantry, || async {
        let status = pods.get("greedy").await.ok()?.status?;
        (status.phase.as_deref() == Some("Failed")).then_some(status)
    })
    .await;
    assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod was rejected: Allocate failed due to requested number of devices unavailable for example.com/gpu. \
             Requested: 2, Available: 1, which is unexpected"
        )
    );
    assert_eq!(pods.get("gpu").await.unwrap().status.unwrap().phase.as_deref(), Some("Running"));

    // The pod-resources API lists the allocation and the node's devices.
    let mut client = pod_resources(&env.root).await;
    let list = client.list(ListPodResourcesRequest {}).await.unwrap().into_inner().pod_resources;
    assert_eq!(main_devices(&list, "gpu"), Some(vec![(GPU.to_string(), vec!["dev-1".to_string()])]));
    let got = client
        .get(GetPodResourcesRequest { pod_name: "gpu".into(), pod_namespace: "default".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(main_devices(&got.pod_resources.into_iter().collect::<Vec<_>>(), "gpu").unwrap().len(), 1);
    let allocatable = client.get_allocatable_resources(AllocatableResourcesRequest {}).await.unwrap().into_inner();
    let mut ids: Vec<String> = allocatable.devices.iter().flat_map(|d| d.device_ids.clone()).collect();
    ids.sort();
    assert_eq!(ids, ["dev-0", "dev-1"]);
    assert!(allocatable.cpu_ids.is_empty() && allocatable.memory.is_empty(), "no CPU or memory manager");

    // An unhealthy device leaves allocatable, not capacity.
    plugin.set_healthy("dev-0", false);
    wait_amounts(&gantry, &nodes, &node, GPU, ("2", "1")).await;

    // The allocation is checkpointed and survives a restart; the pod keeps running.
    let checkpoint = std::fs::read_to_string(env.root.join("device-plugins/kubelet_internal_checkpoint")).unwrap();
    assert!(checkpoint.contains(&uid), "{checkpoint}");
    let before = env.running("gpu").await;
    let registrations = plugin.calls().iter().filter(|c| **c == PluginCall::GetInfo).count();
    gantry.kill();
    let gantry = cluster::start_node(&env, &cluster);
    eventually("the restarted node registers the plugin again", &gantry, || async {
        (plugin.calls().iter().filter(|c| **c == PluginCall::GetInfo).count() > registrations).then_some(())
    })
    .await;
    // Until the plugin lists its devices again, the restored resource has none.
    let client = eventually("the restarted node knows the plugin's devices again", &gantry, || async {
        let channel = gantry_testkit::cri::connect(&env.root.join("pod-resources/kubelet.sock")).await.ok()?;
        let mut client = PodResourcesListerClient::new(channel);
        let allocatable = client.get_allocatable_resources(AllocatableResourcesRequest {}).await.ok()?.into_inner();
        (allocatable.devices.len() == 2).then_some(client)
    })
    .await;
    wait_amounts(&gantry, &nodes, &node, GPU, ("2", "1")).await;
    let list = eventually("the restarted node lists the pod", &gantry, || {
        let mut client = client.clone();
        async move {
            let list = client.list(ListPodResourcesRequest {}).await.ok()?.into_inner().pod_resources;
            main_devices(&list, "gpu").is_some_and(|d| !d.is_empty()).then_some(list)
        }
    })
    .await;
    assert_eq!(main_devices(&list, "gpu"), Some(vec![(GPU.to_string(), vec!["dev-1".to_string()])]));
    assert_eq!(env.running("gpu").await, before, "the device pod keeps running, unchanged");
    // dev-1 is still the running pod's and dev-0 is unhealthy: nothing is free.
    pods.create(&PostParams::default(), &device_pod(&node, "late", GPU, 1, "sleep 3600")).await.unwrap();
    let status = eventually("the late pod is rejected", &gantry, || async {
        let status = pods.get("late").await.ok()?.status?;
        (status.phase.as_deref() == Some("Failed")).then_some(status)
    })
    .await;
    assert!(status.message.unwrap().contains("Requested: 1, Available: 0"), "the restored allocation holds dev-1");

    // Deleting the pod frees its device.
    pods.delete("gpu", &DeleteParams::default()).await.unwrap();
    eventually("the device pod is gone", &gantry, || async { pods.get_opt("gpu").await.ok()?.is_none().then_some(()) })
        .await;
    let checkpoint = std::fs::read_to_string(env.root.join("device-plugins/kubelet_internal_checkpoint")).unwrap();
    assert!(!checkpoint.contains(&uid), "freed in the checkpoint: {checkpoint}");
    let list = client.clone().list(ListPodResourcesRequest {}).await.unwrap().into_inner().pod_resources;
    assert!(main_devices(&list, "gpu").is_none());
    cluster.cleanup(&node).await;
}

#[tokio::test]
async fn plugins_register_on_kubelet_sock_or_are_told_why_not() {
    let Some(Setup { env, cluster, nodes, pods }) = setup().await else { return };
    // What an earlier run left in device-plugins/: a plugin's socket, and a file of someone's.
    let plugins_dir = env.root.join("device-plugins");
    std::fs::create_dir_all(&plugins_dir).unwrap();
    drop(std::os::unix::net::UnixListener::bind(plugins_dir.join("stale.sock")).unwrap());
    std::fs::write(plugins_dir.join("notes"), "kept").unwrap();
    // The node API on, for its /metrics.
    let api = NodeApi::new(&env.ctd.dir());
    let kubeconfig = format!("--kubeconfig={}", cluster.node_kubeconfig(&env.ctd.dir(), &env.node).display());
    let gantry = api.start_agent(&env, &[&kubeconfig, "--authorization-mode=AlwaysAllow"]).await;
    let node = env.node.clone();

    // Through plugins_registry with no version Gantry speaks: refused, with upstream's text.
    let old = TestDevicePlugin::start_with_versions(
        &env.root.join("plugins_registry/old.sock"),
        "example.com/old",
        1,
        DevicePluginOptions::default(),
        &["v1alpha"],
    )
    .await
    .unwrap();
    let refused = eventually("the old plugin is told why it is refused", &gantry, || async {
        old.calls().into_iter().find_map(|c| match c {
            PluginCall::NotifyRegistrationStatus { registered: false, error } => Some(error),
            _ => None,
        })
    })
    .await;
    assert_eq!(
        refused,
        "RegisterPlugin error -- plugin validation failed with err: manager version, v1beta1, is not among plugin \
         supported versions [v1alpha]"
    );

    // The classic way: Register on device-plugins/kubelet.sock.
    let kubelet_sock = env.root.join("device-plugins/kubelet.sock");
    eventually("kubelet.sock is served", &gantry, || async { kubelet_sock.exists().then_some(()) }).await;
    // Upstream's start: every socket but the checkpoint removed, other files kept.
    assert!(!plugins_dir.join("stale.sock").exists(), "the earlier run's socket is removed");
    assert_eq!(std::fs::read_to_string(plugins_dir.join("notes")).unwrap(), "kept");
    let classic = TestDevicePlugin::start(
        &env.root.join("device-plugins/classic.sock"),
        "example.com/classic",
        3,
        DevicePluginOptions::default(),
    )
    .await
    .unwrap();
    classic.register_with_kubelet(&kubelet_sock).await.unwrap();
    wait_amounts(&gantry, &nodes, &node, "example.com/classic", ("3", "3")).await;
    assert!(!classic.calls().contains(&PluginCall::GetInfo), "registered on kubelet.sock, not through the watcher");
    assert!(node_amounts(&nodes, &node, "example.com/old").await.is_none(), "the refused plugin has no resource");

    // A finished pod's devices are free again.
    let mut job = device_pod(&node, "job", "example.com/classic", 3, "true");
    job.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    pods.create(&PostParams::default(), &job).await.unwrap();
    eventually("the job pod succeeds", &gantry, || async {
        (pods.get("job").await.ok()?.status?.phase? == "Succeeded").then_some(())
    })
    .await;

    // An init container's devices go on to the pod's app container (upstream's reuse): all
    // three devices twice over would not fit otherwise (nor would the job's three, still held).
    let mut reuse = device_pod(&node, "reuse", "example.com/classic", 3, "echo app=$EXAMPLE_DEVICES; sleep 3600");
    let mut init = reuse.spec.as_ref().unwrap().containers[0].clone();
    init.name = "init".into();
    init.command = Some(vec!["sh".into(), "-c".into(), "echo init=$EXAMPLE_DEVICES".into()]);
    reuse.spec.as_mut().unwrap().init_containers = Some(vec![init]);
    pods.create(&PostParams::default(), &reuse).await.unwrap();
    eventually("the pod reusing its init container's devices runs", &gantry, || async {
        (pods.get("reuse").await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await;
    let output = eventually("the app container printed its devices", &gantry, || async {
        let out = container_output(&env, "reuse");
        out.contains("app=").then_some(out)
    })
    .await;
    assert!(output.contains("app=dev-0,dev-1,dev-2"), "{output}");

    // Registrations (refused ones too) and Allocate durations by resource, as upstream.
    let identity = api.ca.client("metrics-reader", &[]);
    let metrics = api.client(Some(&identity)).get(api.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        "kubelet_device_plugin_registration_total{resource_name=\"example.com/classic\"} 1",
        "kubelet_device_plugin_alloc_duration_seconds_count{resource_name=\"example.com/classic\"} 3",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert!(metrics.contains("kubelet_device_plugin_registration_total{resource_name=\"example.com/old\"}"));

    // The plugin goes away: its devices stay in capacity with nothing allocatable (upstream's
    // grace period before the resource is removed).
    drop(classic);
    wait_amounts(&gantry, &nodes, &node, "example.com/classic", ("3", "0")).await;
    cluster.cleanup(&node).await;
}
