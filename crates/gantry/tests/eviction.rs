//! End-to-end, cluster mode: node-pressure eviction on the real containerd, as the API server
//! sees it (pod statuses, events, Node conditions). Memory pressure is made real without
//! exhausting the machine: the threshold is set a few hundred MiB below what the node has
//! available when the test starts, and one pod allocates more than that margin.

mod common;

use common::cluster;
use common::eventually;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::PostParams;

/// Appends eviction settings to the environment's config file.
fn configure(env: &common::Env, yaml: &str) {
    let mut config = std::fs::read_to_string(&env.config).unwrap();
    config.push_str(yaml);
    std::fs::write(&env.config, config).unwrap();
}

/// A bound pod from its `spec` lines (indented by two spaces, after `spec:`).
fn pod(node: &str, name: &str, spec: &str) -> Pod {
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n  \
         terminationGracePeriodSeconds: 2\n  automountServiceAccountToken: false\n{spec}"
    );
    serde_yaml_ng::from_str(&yaml).unwrap()
}

/// One busybox container `name` running `command`, with extra container lines.
fn container(name: &str, command: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    image: {image}\n    command: [\"sh\", \"-c\", {command:?}]\n{extra}",
        image = gantry_testkit::BUSYBOX_IMAGE
    )
}

async fn running(pods: &Api<Pod>, name: &str) -> Option<()> {
    let status = pods.get(name).await.ok()?.status?;
    (status.phase.as_deref() == Some("Running")).then_some(())
}

/// The pod once it is `Failed`.
async fn failed(pods: &Api<Pod>, name: &str) -> Option<Pod> {
    let pod = pods.get(name).await.ok()?;
    (pod.status.as_ref()?.phase.as_deref() == Some("Failed")).then_some(pod)
}

/// The pod's `Evicted` event.
async fn evicted_event(events: &Api<Event>, name: &str) -> Option<Event> {
    let list = events.list(&Default::default()).await.ok()?;
    list.items
        .into_iter()
        .find(|e| e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some("Evicted"))
}

fn reason_and_message(pod: &Pod) -> (Option<String>, Option<String>) {
    let status = pod.status.clone().unwrap_or_default();
    (status.reason, status.message)
}

fn has_condition(pod: &Pod, type_: &str) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    conditions.iter().any(|c| c.type_ == type_)
}

/// The Node's condition `type_` status, as the API has it.
async fn node_condition(nodes: &Api<Node>, node: &str, type_: &str) -> Option<(String, Option<String>)> {
    let status = nodes.get(node).await.ok()?.status?;
    let c = status.conditions?.into_iter().find(|c| c.type_ == type_)?;
    Some((c.status, c.reason))
}

/// An emptyDir over its `sizeLimit` gets its pod evicted with upstream's message and no
/// `DisruptionTarget` condition, whatever the node's pressure; a pod writing as much into an
/// emptyDir without a limit is left alone, and the node has no DiskPressure.
#[tokio::test]
async fn an_empty_dir_over_its_size_limit_evicts_its_pod_only() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    // Only a memory threshold the machine is far above: the node's disk does not matter here.
    // The volumes are measured every second (upstream's default is a minute).
    configure(&env, "evictionHard: {memory.available: 1Mi}\nvolumeStatsAggPeriod: 1s\n");
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let fill = "dd if=/dev/zero of=/scratch/fill bs=1024 count=4096 && sleep 3600";
    let mount = "    volumeMounts: [{name: scratch, mountPath: /scratch}]\n";
    let limited = format!(
        "  volumes: [{{name: scratch, emptyDir: {{sizeLimit: 1Mi}}}}]\n  containers:\n{}",
        container("main", fill, mount)
    );
    let unlimited =
        format!("  volumes: [{{name: scratch, emptyDir: {{}}}}]\n  containers:\n{}", container("main", fill, mount));
    pods.create(&PostParams::default(), &pod(&env.node, "bystander", &unlimited)).await.unwrap();
    eventually("the bystander running", &gantry, || running(&pods, "bystander")).await;
    pods.create(&PostParams::default(), &pod(&env.node, "filler", &limited)).await.unwrap();

    let evicted = eventually("the filler evicted", &gantry, || failed(&pods, "filler")).await;
    let message = "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ";
    assert_eq!(reason_and_message(&evicted), (Some("Evicted".into()), Some(message.into())));
    assert!(!has_condition(&evicted, "DisruptionTarget"), "local storage evictions set no condition, as upstream");
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let event = eventually("the Evicted event", &gantry, || evicted_event(&events, "filler")).await;
    assert_eq!((event.type_.as_deref(), event.message.as_deref()), (Some("Warning"), Some(message)));
    assert_eq!(event.metadata.annotations, None, "local storage evictions annotate nothing, as upstream");
    assert!(env.running("filler").await.is_empty(), "the evicted pod's containers are stopped");

    let bystander = pods.get("bystander").await.unwrap();
    assert_eq!(bystander.status.unwrap().phase.as_deref(), Some("Running"), "the pod without a limit stays");
    assert_eq!(env.running("bystander").await.len(), 1);
    let nodes: Api<Node> = Api::all(admin);
    let disk = node_condition(&nodes, &env.node, "DiskPressure").await;
    assert_eq!(disk.map(|d| d.0).as_deref(), Some("False"));
    cluster.cleanup(&env.node).await;
}

/// A container writing more than its `ephemeral-storage` limit into its writable layer gets
/// its pod evicted with upstream's message (the pod as a whole stays under the sum of its
/// containers' limits, so the container's own limit is what it exceeds).
#[tokio::test]
async fn a_container_over_its_ephemeral_storage_limit_is_evicted() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    configure(&env, "evictionHard: {memory.available: 1Mi}\n");
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let limit = |q: &str| format!("    resources: {{limits: {{ephemeral-storage: {q}}}}}\n");
    let spec = format!(
        "  containers:\n{}{}",
        container("writer", "dd if=/dev/zero of=/fill bs=1024 count=4096 && sleep 3600", &limit("2Mi")),
        container("idle", "sleep 3600", &limit("64Mi")),
    );
    pods.create(&PostParams::default(), &pod(&env.node, "writer", &spec)).await.unwrap();
    pods.create(
        &PostParams::default(),
        &pod(&env.node, "quiet", &format!("  containers:\n{}", container("main", "sleep 3600", &limit("2Mi")))),
    )
    .await
    .unwrap();

    let evicted = eventually("the writer evicted", &gantry, || failed(&pods, "writer")).await;
    let message = "Container writer exceeded its local ephemeral storage limit \"2Mi\". ";
    assert_eq!(reason_and_message(&evicted), (Some("Evicted".into()), Some(message.into())));
    let events: Api<Event> = Api::namespaced(admin, "default");
    let event = eventually("the Evicted event", &gantry, || evicted_event(&events, "writer")).await;
    assert_eq!((event.type_.as_deref(), event.message.as_deref()), (Some("Warning"), Some(message)));
    eventually("the quiet pod running", &gantry, || running(&pods, "quiet")).await;
    assert!(env.running("writer").await.is_empty(), "the evicted pod's containers are stopped");
    cluster.cleanup(&env.node).await;
}

/// The machine's memory (`MemTotal`): the node's memory capacity, and the `kubepods` cgroup's
/// limit (node allocatable enforcement, nothing reserved).
fn mem_total() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:")).unwrap();
    kib.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
}

/// Real memory pressure, on `allocatableMemory.available` (what the pods' cgroup has left
/// under its limit): the threshold 1 GiB below that limit, so the pods reach it when they use
/// 1 GiB, and a pod above its request allocates 2 GiB. (`memory.available` counts the whole
/// machine, whose page cache and other processes move by gigabytes while tests and builds run
/// beside this one; the pods' cgroup holds only this test's pods.) That pod is evicted (the
/// pod under its request and the static pod are not), with upstream's status, condition and
/// event; the Node reports MemoryPressure, and no longer once the pressure has been gone for
/// the transition period.
#[tokio::test]
async fn memory_pressure_evicts_the_pod_above_its_request_and_the_node_recovers() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let threshold_ki = (mem_total() - (1 << 30)) / 1024;
    configure(
        &env,
        &format!(
            "evictionHard: {{allocatableMemory.available: {threshold_ki}Ki}}\nevictionPressureTransitionPeriod: 10s\n"
        ),
    );
    env.write_manifest("fixed.yaml", &common::pod_yaml("fixed", "sleep 3600", ""));
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let request = |q: &str| format!("    resources: {{requests: {{memory: {q}}}}}\n");
    let small = format!("  containers:\n{}", container("main", "sleep 3600", &request("100Mi")));
    pods.create(&PostParams::default(), &pod(&env.node, "small", &small)).await.unwrap();
    eventually("the small pod running", &gantry, || running(&pods, "small")).await;
    eventually("the static pod running", &gantry, || async {
        gantry.pod_in_phase(&common::static_name("fixed"), "Running")
    })
    .await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let before = node_condition(&nodes, &env.node, "MemoryPressure").await;
    assert_eq!(before.map(|c| c.0).as_deref(), Some("False"), "no pressure before the hog");

    // Each dd holds its 1000 MiB buffer while blocked writing into a pipe nobody reads.
    let allocate = "for i in 1 2; do dd if=/dev/zero bs=1000M count=1 | sleep 3600 & done; wait";
    let hog = format!("  containers:\n{}", container("main", allocate, &request("50Mi")));
    pods.create(&PostParams::default(), &pod(&env.node, "hog", &hog)).await.unwrap();
    let pressed = eventually("MemoryPressure on the Node", &gantry, || async {
        let c = node_condition(&nodes, &env.node, "MemoryPressure").await?;
        (c.0 == "True").then_some(c)
    })
    .await;
    assert_eq!(pressed.1.as_deref(), Some("KubeletHasInsufficientMemory"));
    let evicted = eventually("the hog evicted", &gantry, || failed(&pods, "hog")).await;
    let (reason, message) = reason_and_message(&evicted);
    let message = message.unwrap_or_default();
    assert_eq!(reason.as_deref(), Some("Evicted"));
    let start = format!("The node was low on resource: memory. Threshold quantity: {threshold_ki}Ki, available: ");
    assert!(message.starts_with(&start), "{message}");
    assert!(
        message.contains(". Container main was using ")
            && message.ends_with(", request is 50Mi, has larger consumption of memory. "),
        "{message}"
    );
    let conditions = evicted.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let target = conditions.iter().find(|c| c.type_ == "DisruptionTarget").expect("DisruptionTarget");
    assert_eq!(
        (target.reason.as_deref(), target.message.as_deref()),
        (Some("TerminationByKubelet"), Some(message.as_str()))
    );
    let events: Api<Event> = Api::namespaced(admin, "default");
    let event = eventually("the Evicted event", &gantry, || evicted_event(&events, "hog")).await;
    assert_eq!((event.type_.as_deref(), event.message.as_deref()), (Some("Warning"), Some(message.as_str())));
    // Upstream's annotations: the container over its request, its usage as the message says it.
    let used =
        message.split(". Container main was using ").nth(1).and_then(|m| m.split(',').next()).unwrap_or_default();
    let annotations = event.metadata.annotations.unwrap_or_default();
    let annotation = |k: &str| annotations.get(k).map(String::as_str);
    assert_eq!(
        (annotation("offending_containers"), annotation("offending_containers_usage"), annotation("starved_resource")),
        (Some("main"), Some(used), Some("memory")),
        "{annotations:?}"
    );

    // The pressure went with the hog: the condition clears after the transition period.
    let recovered = eventually("MemoryPressure cleared", &gantry, || async {
        let c = node_condition(&nodes, &env.node, "MemoryPressure").await?;
        (c.0 == "False").then_some(c)
    })
    .await;
    assert_eq!(recovered.1.as_deref(), Some("KubeletHasSufficientMemory"));
    assert_eq!(pods.get("small").await.unwrap().status.unwrap().phase.as_deref(), Some("Running"), "under its request");
    assert_eq!(env.running("small").await.len(), 1);
    assert!(gantry.pod_in_phase(&common::static_name("fixed"), "Running").is_some(), "a static pod is never evicted");
    cluster.cleanup(&env.node).await;
}
