//! End-to-end, cluster mode: pods bound to the node through the API server run on the real
//! containerd, report status, stop gracefully on deletion; static pods get mirror pods.

mod common;

use std::time::{Duration, Instant};

use common::cluster;
use common::{eventually, pod_yaml};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

/// A pod already bound to the node. No service-account token volume (the API server injects one
/// unless told not to): these tests are about the pod lifecycle, `pod_volumes.rs` covers volumes.
fn bound_pod(node: &str, name: &str, command: &str) -> Pod {
    let spec =
        format!("  nodeName: {node}\n  terminationGracePeriodSeconds: 2\n  automountServiceAccountToken: false\n");
    let yaml = pod_yaml(name, command, &spec);
    serde_yaml_ng::from_str(&yaml).unwrap()
}

#[tokio::test]
async fn api_pod_runs_reports_status_and_is_deleted_gracefully() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    // The process ignores SIGTERM, so deletion must wait the full grace period.
    pods.create(&PostParams::default(), &bound_pod(&env.node, "web", "trap '' TERM; while true; do sleep 1; done"))
        .await
        .unwrap();

    let running = eventually("API status Running and ready", &gantry, || async {
        let pod = pods.get("web").await.ok()?;
        let status = pod.status.clone()?;
        let ready = status.conditions.as_ref()?.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (status.phase.as_deref() == Some("Running") && ready).then_some(pod)
    })
    .await;
    let status = running.status.unwrap();
    assert!(status.pod_ip.is_some(), "pod IP reported");
    let cs = &status.container_statuses.unwrap()[0];
    assert!(cs.container_id.as_deref().unwrap().starts_with("containerd://"));
    assert!(cs.state.as_ref().unwrap().running.is_some());
    assert_eq!(env.running("web").await.len(), 1);

    let deleted_at = Instant::now();
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("pod gone from the API", &gantry, || async { pods.get_opt("web").await.ok()?.is_none().then_some(()) })
        .await;
    let took = deleted_at.elapsed();
    assert!(took >= Duration::from_secs(2), "grace period honoured: gone after {took:?}");
    assert!(env.sandboxes().await.iter().all(|s| s.1 != "web"), "sandbox removed");
    cluster.cleanup(&env.node).await;
}

/// Another writer changing the kubelet's part of a pod's status (here, a controller marking it
/// unready) gets the node's status back within the resync, as upstream's status manager does;
/// for a static pod, on its mirror pod.
#[tokio::test]
async fn a_status_another_writer_overwrites_is_sent_again() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    env.write_manifest("static.yaml", &pod_yaml("static", "sleep 3600", ""));
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    pods.create(&PostParams::default(), &bound_pod(&env.node, "overwritten", "sleep 3600")).await.unwrap();
    let names = ["overwritten".to_string(), format!("static-{}", env.node)];
    for name in &names {
        let running = eventually(&format!("{name} Ready"), &gantry, || ready_pod(&pods, name)).await;
        let mut conditions = running.status.unwrap().conditions.unwrap();
        let condition = conditions.iter_mut().find(|c| c.type_ == "Ready").unwrap();
        condition.status = "False".into();
        condition.reason = Some("Overwritten".into());
        let body = serde_json::json!({ "status": { "conditions": conditions } });
        let overwritten = pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&body)).await.unwrap();
        assert_eq!(
            ready_condition(&overwritten),
            Some(("False".into(), Some("Overwritten".into()))),
            "the API took the overwrite of {name}"
        );
    }
    for name in &names {
        eventually(&format!("the node's Ready condition back on {name}"), &gantry, || ready_pod(&pods, name)).await;
    }
    cluster.cleanup(&env.node).await;
}

/// The pod, once the API has it Ready as the node reports it.
async fn ready_pod(pods: &Api<Pod>, name: &str) -> Option<Pod> {
    let pod = pods.get(name).await.ok()?;
    (ready_condition(&pod) == Some(("True".into(), None))).then_some(pod)
}

fn ready_condition(pod: &Pod) -> Option<(String, Option<String>)> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == "Ready").map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn static_pods_get_mirror_pods_that_come_back_when_deleted() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    env.write_manifest("static.yaml", &pod_yaml("static", "sleep 3600", ""));
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let name = format!("static-{}", env.node);

    let mirror = eventually("mirror pod with Running status", &gantry, || async {
        let pod = pods.get(&name).await.ok()?;
        (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
    })
    .await;
    let annotations = mirror.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["kubernetes.io/config.mirror"], annotations["kubernetes.io/config.hash"]);
    let owner = &mirror.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", env.node.as_str()));
    let container = env.running(&name).await.pop().unwrap();

    pods.delete(&name, &DeleteParams::default().grace_period(0)).await.unwrap();
    let recreated = eventually("mirror pod recreated", &gantry, || async {
        pods.get_opt(&name).await.ok()?.filter(|p| p.metadata.uid != mirror.metadata.uid)
    })
    .await;
    assert!(recreated.metadata.annotations.unwrap().contains_key("kubernetes.io/config.mirror"));
    assert_eq!(
        env.running(&name).await.pop().unwrap().id,
        container.id,
        "deleting the mirror pod does not touch the static pod"
    );
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn a_pod_with_an_unsupported_volume_says_why_and_others_still_run() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut unsupported = bound_pod(&env.node, "needs-nfs", "sleep 3600");
    let spec = unsupported.spec.as_mut().unwrap();
    spec.volumes = Some(vec![
        serde_json::from_value(serde_json::json!({"name": "data", "nfs": {"server": "nfs.invalid", "path": "/"}}))
            .unwrap(),
    ]);
    pods.create(&PostParams::default(), &unsupported).await.unwrap();
    pods.create(&PostParams::default(), &bound_pod(&env.node, "fine", "sleep 3600")).await.unwrap();

    let waiting = eventually("waiting reason naming the unsupported volume", &gantry, || async {
        let status = pods.get("needs-nfs").await.ok()?.status?;
        let waiting = status.container_statuses?.pop()?.state?.waiting?;
        (waiting.reason.as_deref() == Some("CreateContainerConfigError")).then_some(waiting)
    })
    .await;
    assert!(waiting.message.unwrap().contains("\"data\""), "message names the volume");
    eventually("the other pod runs", &gantry, || async {
        (pods.get("fine").await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin, "default");
    eventually("a Failed event on the pod", &gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Failed") && e.involved_object.name.as_deref() == Some("needs-nfs"))
    })
    .await;
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn restarting_the_agent_keeps_api_pods_running_unchanged() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let mut gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    pods.create(&PostParams::default(), &bound_pod(&env.node, "steady", "sleep 3600")).await.unwrap();
    let before = eventually("steady running", &gantry, || async { env.running("steady").await.pop() }).await;

    gantry.kill();
    let gantry = cluster::start_node(&env, &cluster);
    eventually("the new agent reports the pod Running", &gantry, || async { gantry.pod_in_phase("steady", "Running") })
        .await;
    assert_eq!(env.running("steady").await, vec![before.clone()], "same container, nothing duplicated");
    eventually("the API status says Running", &gantry, || async {
        (pods.get("steady").await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await;
    assert_eq!(env.running("steady").await, vec![before], "still the same container");
    cluster.cleanup(&env.node).await;
}

/// Events as the Go kubelet writes them: core/v1 with `source` and `reporting*` set, init
/// containers under `spec.initContainers{…}`, a repeat counted on the first event, and the
/// v1.34 wording of the Created and BackOff messages.
#[tokio::test]
async fn pod_events_carry_source_field_paths_and_counts() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut pod = bound_pod(&env.node, "flaky", "exit 1");
    let init = serde_json::json!([{"name": "setup", "image": gantry_testkit::BUSYBOX_IMAGE, "command": ["true"]}]);
    pod.spec.as_mut().unwrap().init_containers = Some(serde_json::from_value(init).unwrap());
    pods.create(&PostParams::default(), &pod).await.unwrap();

    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin, "default");
    let started = |path: &'static str| {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.involved_object.name.as_deref() == Some("flaky")
                    && e.reason.as_deref() == Some("Started")
                    && e.involved_object.field_path.as_deref() == Some(path)
            })
        }
    };
    let init_started =
        eventually("the init container's Started event", &gantry, || started("spec.initContainers{setup}")).await;
    let source = init_started.source.clone().unwrap_or_default();
    assert_eq!(source.component.as_deref(), Some("kubelet"));
    assert_eq!(source.host.as_deref(), Some(env.node.as_str()));
    assert_eq!(init_started.reporting_component.as_deref(), Some("kubelet"));
    assert_eq!(init_started.reporting_instance.as_deref(), Some(env.node.as_str()));
    assert_eq!(init_started.message.as_deref(), Some("Started container setup"));
    assert!(init_started.first_timestamp.is_some() && init_started.last_timestamp.is_some());
    assert_eq!(init_started.count, Some(1));

    // The main container crashes and is started again: the same event, counted, keeping its
    // first timestamp (one object, not two).
    let again = eventually("the main container's Started event counted twice", &gantry, || async {
        let e = started("spec.containers{main}").await?;
        (e.count >= Some(2)).then_some(e)
    })
    .await;
    assert!(again.last_timestamp.as_ref().unwrap().0 >= again.first_timestamp.as_ref().unwrap().0, "{again:?}");
    let list = events.list(&Default::default()).await.unwrap().items;
    let main_started = list.iter().filter(|e| {
        e.involved_object.name.as_deref() == Some("flaky")
            && e.reason.as_deref() == Some("Started")
            && e.involved_object.field_path.as_deref() == Some("spec.containers{main}")
    });
    assert_eq!(main_started.count(), 1, "repeats patch the first event");
    // The v1.34 kubelet's wording, which differs by release. The first restart is immediate;
    // the second waits in back-off.
    let message = |reason: &'static str, path: &'static str| {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?.items;
            list.into_iter()
                .find(|e| {
                    e.involved_object.name.as_deref() == Some("flaky")
                        && e.reason.as_deref() == Some(reason)
                        && e.involved_object.field_path.as_deref() == Some(path)
                })
                .and_then(|e| e.message)
        }
    };
    let created =
        eventually("the init container's Created event", &gantry, || message("Created", "spec.initContainers{setup}"))
            .await;
    assert_eq!(created, "Created container: setup");
    let back_off = eventually("the BackOff event", &gantry, || message("BackOff", "spec.containers{main}")).await;
    let uid = pods.get("flaky").await.unwrap().metadata.uid.unwrap();
    assert_eq!(back_off, format!("Back-off restarting failed container main in pod flaky_default({uid})"));
    cluster.cleanup(&env.node).await;
}

/// The status fields a 1.34 kubelet reports beside the state: the container's volume mounts
/// (recursively read-only where asked and the runtime supports it; a pod that insists on it
/// without support is refused with upstream's message, the other pod runs), the identity of its process (as the runtime reports it), its resources while running, and
/// `observedGeneration` following a spec change the API allows on a running pod.
#[tokio::test]
async fn pod_status_reports_mounts_user_resources_and_observed_generation() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let mut pod = bound_pod(&env.node, "identity", "id; sleep 3600");
    let spec = pod.spec.as_mut().unwrap();
    spec.volumes = Some(serde_json::from_value(serde_json::json!([{"name": "data", "emptyDir": {}}])).unwrap());
    spec.security_context = Some(
        serde_json::from_value(
            serde_json::json!({"runAsUser": 1000, "runAsGroup": 3000, "supplementalGroups": [4000]}),
        )
        .unwrap(),
    );
    let main = &mut spec.containers[0];
    main.volume_mounts = Some(
        serde_json::from_value(serde_json::json!([
            {"name": "data", "mountPath": "/data"},
            {"name": "data", "mountPath": "/ro", "readOnly": true},
            {"name": "data", "mountPath": "/rro-if-possible", "readOnly": true, "recursiveReadOnly": "IfPossible"},
            {"name": "data", "mountPath": "/rro-disabled", "readOnly": true, "recursiveReadOnly": "Disabled"}
        ]))
        .unwrap(),
    );
    main.resources =
        Some(serde_json::from_value(serde_json::json!({"limits": {"cpu": "500m", "memory": "64Mi"}})).unwrap());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // A mount that insists on recursive read-only runs only where the runtime supports it.
    let mut insisting = bound_pod(&env.node, "rro-enabled", "sleep 3600");
    let spec = insisting.spec.as_mut().unwrap();
    spec.volumes = Some(serde_json::from_value(serde_json::json!([{"name": "data", "emptyDir": {}}])).unwrap());
    spec.containers[0].volume_mounts = Some(
        serde_json::from_value(serde_json::json!([
            {"name": "data", "mountPath": "/rro", "readOnly": true, "recursiveReadOnly": "Enabled"}
        ]))
        .unwrap(),
    );
    pods.create(&PostParams::default(), &insisting).await.unwrap();
    let rro = runtime_supports_recursive_read_only(&env).await;
    let rro_mode = if rro { "Enabled" } else { "Disabled" };

    let running = eventually("API status Running", &gantry, || async {
        let pod = pods.get("identity").await.ok()?;
        (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
    })
    .await;
    let status = running.status.clone().unwrap();
    assert_eq!(running.metadata.generation, Some(1));
    assert_eq!(status.observed_generation, Some(1));
    assert!(status.conditions.as_ref().unwrap().iter().all(|c| c.observed_generation == Some(1)), "{status:?}");
    let cs = &status.container_statuses.as_ref().unwrap()[0];
    let mounts = serde_json::to_value(&cs.volume_mounts).unwrap();
    assert_eq!(
        mounts,
        serde_json::json!([
            {"name": "data", "mountPath": "/data"},
            {"name": "data", "mountPath": "/ro", "readOnly": true, "recursiveReadOnly": "Disabled"},
            {"name": "data", "mountPath": "/rro-if-possible", "readOnly": true, "recursiveReadOnly": rro_mode},
            {"name": "data", "mountPath": "/rro-disabled", "readOnly": true, "recursiveReadOnly": "Disabled"}
        ])
    );
    let insisting = eventually("the recursive read-only pod's verdict", &gantry, || async {
        let cs = pods.get("rro-enabled").await.ok()?.status?.container_statuses?.pop()?;
        let state = cs.state.clone()?;
        let decided = state.running.is_some()
            || state.waiting.as_ref().is_some_and(|w| w.reason.as_deref() == Some("CreateContainerConfigError"));
        decided.then_some(cs)
    })
    .await;
    let state = insisting.state.unwrap();
    if rro {
        assert!(state.running.is_some(), "{state:?}");
        assert_eq!(insisting.volume_mounts.unwrap()[0].recursive_read_only.as_deref(), Some("Enabled"));
    } else {
        // Upstream's refusal on a runtime without the feature (Debian's containerd 1.6).
        assert_eq!(
            state.waiting.unwrap().message.as_deref(),
            Some(
                "failed to resolve recursive read-only mode: volume \"data\" requested recursive read-only \
                 mode, but it is not supported by the runtime"
            )
        );
        assert_eq!(insisting.volume_mounts.unwrap()[0].recursive_read_only.as_deref(), Some("Disabled"));
    }
    // Limits as the runtime applied them; requests defaulted from the limits by the API.
    let resources = serde_json::to_value(&cs.resources).unwrap();
    assert_eq!(
        resources,
        serde_json::json!({"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {"cpu": "500m", "memory": "64Mi"}})
    );
    assert_eq!(cs.allocated_resources, None, "InPlacePodVerticalScalingAllocatedStatus is off in 1.34");
    // The process runs as the pod asked ...
    let output = eventually("the container printed its identity", &gantry, || async {
        let out = common::container_output(&env, "identity");
        out.contains("uid=").then_some(out)
    })
    .await;
    assert!(output.contains("uid=1000 gid=3000") && output.contains("4000"), "{output}");
    // ... and `user` is what the runtime reports for it (containerd 2.0+ reports it; older ones
    // report nothing, and then neither does the Go kubelet).
    let runtime_user = runtime_user(&env, cs.container_id.as_deref().unwrap()).await;
    let reported =
        cs.user.as_ref().and_then(|u| u.linux.as_ref()).map(|l| (l.uid, l.gid, l.supplemental_groups.clone()));
    assert_eq!(reported, runtime_user.map(|l| (l.uid, l.gid, Some(l.supplemental_groups).filter(|g| !g.is_empty()))));
    if let Some((uid, gid, groups)) = reported {
        assert_eq!((uid, gid), (1000, 3000));
        assert!(groups.unwrap_or_default().contains(&4000));
    }

    // A spec change the API allows on a running pod bumps the generation; the status follows.
    let patch = serde_json::json!({"spec": {"activeDeadlineSeconds": 3600}});
    let bumped =
        pods.patch("identity", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch)).await.unwrap();
    assert_eq!(bumped.metadata.generation, Some(2));
    let observed = eventually("observedGeneration 2", &gantry, || async {
        let status = pods.get("identity").await.ok()?.status?;
        (status.observed_generation == Some(2)).then_some(status)
    })
    .await;
    let ready = observed.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.observed_generation, Some(2));
    cluster.cleanup(&env.node).await;
}

/// Whether the runtime's default handler supports recursive read-only mounts (CRI `Status`).
async fn runtime_supports_recursive_read_only(env: &common::Env) -> bool {
    let mut client = env.ctd.runtime_client().await;
    let status = client.status(gantry_cri::api::StatusRequest { verbose: false }).await.unwrap().into_inner();
    status
        .runtime_handlers
        .iter()
        .any(|h| h.name.is_empty() && h.features.as_ref().is_some_and(|f| f.recursive_read_only_mounts))
}

/// The CRI `ContainerStatus.user.linux` of a container, straight from the runtime.
async fn runtime_user(env: &common::Env, container_id: &str) -> Option<gantry_cri::api::LinuxContainerUser> {
    let id = container_id.trim_start_matches("containerd://").to_string();
    let mut client = env.ctd.runtime_client().await;
    let request = gantry_cri::api::ContainerStatusRequest { container_id: id, verbose: false };
    let status = client.container_status(request).await.unwrap().into_inner().status?;
    status.user?.linux
}
