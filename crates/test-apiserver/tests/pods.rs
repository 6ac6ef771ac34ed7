//! Pod semantics: graceful deletion, finalizers, status subresource isolation, update
//! restrictions, defaults.

mod common;

use common::{create_pod, pod_json, rv, start, status};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams};
use serde_json::json;

#[tokio::test]
async fn graceful_deletion_of_a_bound_pod() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = create_pod(&client, "default", "g", Some("node-1")).await;
    let mut w =
        pods.watch(&WatchParams::default(), &created.metadata.resource_version.clone().unwrap()).await.unwrap().boxed();

    // First DELETE: marked with deletionTimestamp and the pod's grace period; still there.
    let first = pods.delete("g", &DeleteParams::default()).await.unwrap().left().expect("pods answer the object");
    assert_eq!(first.metadata.deletion_grace_period_seconds, Some(30));
    let deadline = first.metadata.deletion_timestamp.clone().expect("deletionTimestamp");
    assert!(pods.get("g").await.is_ok());
    match w.next().await.unwrap().unwrap() {
        WatchEvent::Modified(p) => assert!(p.metadata.deletion_timestamp.is_some()),
        other => panic!("{other:?}"),
    }

    // A longer grace period changes nothing; a shorter one moves the deadline earlier.
    let longer = pods
        .delete("g", &DeleteParams { grace_period_seconds: Some(100), ..Default::default() })
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(longer.metadata.deletion_grace_period_seconds, Some(30));
    assert_eq!(rv(&longer), rv(&first));
    let shorter = pods
        .delete("g", &DeleteParams { grace_period_seconds: Some(10), ..Default::default() })
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(shorter.metadata.deletion_grace_period_seconds, Some(10));
    assert!(shorter.metadata.deletion_timestamp.unwrap().0 < deadline.0);

    // The kubelet's final delete: grace 0 with a UID precondition.
    let wrong = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: Some("other".into()), resource_version: None }),
        ..Default::default()
    };
    assert_eq!(status(pods.delete("g", &wrong).await.unwrap_err()).code, 409);
    let final_delete = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: created.metadata.uid.clone(), resource_version: None }),
        ..Default::default()
    };
    pods.delete("g", &final_delete).await.unwrap();
    assert_eq!(status(pods.get("g").await.unwrap_err()).code, 404);
    let mut kinds = Vec::new();
    while let Some(Ok(e)) = w.next().await {
        let deleted = matches!(e, WatchEvent::Deleted(_));
        kinds.push(deleted);
        if deleted {
            break;
        }
    }
    assert_eq!(kinds.last(), Some(&true));
}

#[tokio::test]
async fn unbound_and_terminal_pods_go_at_once() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create_pod(&client, "default", "unbound", None).await;
    pods.delete("unbound", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(pods.get("unbound").await.unwrap_err()).code, 404);

    create_pod(&client, "default", "done", Some("n")).await;
    pods.patch_status("done", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Succeeded"}})))
        .await
        .unwrap();
    pods.delete("done", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(pods.get("done").await.unwrap_err()).code, 404);

    // An explicit grace period of 0 removes a running pod at once (force delete).
    create_pod(&client, "default", "forced", Some("n")).await;
    pods.delete("forced", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    assert_eq!(status(pods.get("forced").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn finalizers_hold_objects_until_removed() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "f", "finalizers": ["example.com/hold"]}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let pending = cms.delete("f", &DeleteParams::default()).await.unwrap().left().expect("object still present");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(0));
    // No new finalizers while deleting.
    let add = Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}}));
    assert_eq!(status(cms.patch("f", &PatchParams::default(), &add).await.unwrap_err()).code, 422);
    // Other updates still work; the deletionTimestamp cannot be cleared.
    let labelled = cms
        .patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}, "deletionTimestamp": null}})),
        )
        .await
        .unwrap();
    assert!(labelled.metadata.deletion_timestamp.is_some());
    // Removing the last finalizer deletes it.
    cms.patch("f", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert_eq!(status(cms.get("f").await.unwrap_err()).code, 404);

    // A pod with a finalizer: the grace-0 delete leaves it until the finalizer goes.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut p = pod_json("pf", Some("n"));
    p["metadata"]["finalizers"] = json!(["example.com/keep"]);
    pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap()).await.unwrap();
    pods.delete("pf", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    assert_eq!(pods.get("pf").await.unwrap().metadata.deletion_grace_period_seconds, Some(0));
    pods.patch(
        "pf",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(json!([{"op": "remove", "path": "/metadata/finalizers"}])).unwrap()),
    )
    .await
    .unwrap();
    assert_eq!(status(pods.get("pf").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn status_subresource_isolation() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = create_pod(&client, "default", "s", Some("n")).await;
    assert_eq!(created.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));

    // The main resource ignores status...
    let mut edited = created.clone();
    edited.status.as_mut().unwrap().phase = Some("Running".into());
    edited.metadata.labels.as_mut().unwrap().insert("tier".into(), "x".into());
    let after = pods.replace("s", &PostParams::default(), &edited).await.unwrap();
    assert_eq!(after.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(after.metadata.labels.unwrap()["tier"], "x");

    // ... and /status ignores spec.
    let patch = json!({"spec": {"activeDeadlineSeconds": 5}, "status": {"phase": "Running", "podIP": "10.0.0.5"}});
    let after = pods.patch_status("s", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    assert_eq!(after.spec.unwrap().active_deadline_seconds, None);
    assert_eq!(after.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    let mut whole = pods.get_status("s").await.unwrap();
    whole.status.as_mut().unwrap().pod_ip = Some("10.0.0.6".into());
    whole.spec.as_mut().unwrap().containers[0].image = Some("changed:2".into());
    let replaced = pods.replace_status("s", &PostParams::default(), &whole).await.unwrap();
    assert_eq!(replaced.status.unwrap().pod_ip.as_deref(), Some("10.0.0.6"));
    assert_eq!(replaced.spec.unwrap().containers[0].image.as_deref(), Some("registry.local/app:1"));

    // Nodes too.
    let nodes: Api<Node> = Api::all(client);
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "4"}}})).unwrap();
    let n = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(n.status.as_ref().unwrap().capacity.as_ref().unwrap()["cpu"].0, "4", "nodes keep status on create");
    let n = nodes
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}, "status": {"capacity": {"cpu": "8"}}})),
        )
        .await
        .unwrap();
    assert_eq!(n.spec.unwrap().unschedulable, Some(true));
    assert_eq!(n.status.unwrap().capacity.unwrap()["cpu"].0, "4");
}

#[tokio::test]
async fn pod_spec_is_mostly_immutable() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create_pod(&client, "default", "im", Some("n")).await;
    let image = Patch::Strategic(json!({"spec": {"containers": [{"name": "app", "image": "registry.local/app:2"}]}}));
    let p = pods.patch("im", &PatchParams::default(), &image).await.unwrap();
    assert_eq!(p.spec.unwrap().containers[0].image.as_deref(), Some("registry.local/app:2"));
    let e = status(
        pods.patch("im", &PatchParams::default(), &Patch::Merge(json!({"spec": {"nodeName": "other"}})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message.starts_with("Pod \"im\" is invalid: spec: Forbidden: pod updates may not change fields other than"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn pod_defaults_and_service_account_token() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut p = pod_json("d", Some("n"));
    p["spec"].as_object_mut().unwrap().remove("automountServiceAccountToken");
    let created = pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap()).await.unwrap();
    let spec = created.spec.unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("IfNotPresent"));
    let volume =
        spec.volumes.unwrap().into_iter().find(|v| v.name.starts_with("kube-api-access-")).expect("token volume");
    assert!(volume.projected.is_some());
    let mounts = spec.containers[0].volume_mounts.clone().unwrap();
    assert!(mounts.iter().any(|m| m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount"));
    assert_eq!(created.status.unwrap().qos_class.as_deref(), Some("BestEffort"));

    // A limit without a request defaults the request (SetDefaults_Pod); a given request stays.
    let mut p = pod_json("limited", Some("n"));
    p["spec"]["containers"][0]["resources"] =
        json!({"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {"cpu": "100m"}});
    let created = pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap()).await.unwrap();
    let requests = created.spec.unwrap().containers[0].resources.clone().unwrap().requests.unwrap();
    assert_eq!((requests["cpu"].0.as_str(), requests["memory"].0.as_str()), ("100m", "64Mi"));
    assert_eq!(created.status.unwrap().qos_class.as_deref(), Some("Burstable"));

    // A missing service account is refused like the ServiceAccount admission plugin does.
    let mut p = pod_json("nosa", Some("n"));
    p["spec"]["serviceAccountName"] = json!("ghost");
    let e = status(pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap()).await.unwrap_err());
    assert_eq!(e.code, 403);
    assert!(e.message.contains("serviceaccount \"ghost\" not found"), "{}", e.message);
}

#[tokio::test]
async fn ephemeral_containers_are_only_added_through_their_subresource() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // Not on create.
    let mut p = pod_json("direct", Some("n"));
    p["spec"]["ephemeralContainers"] = json!([{"name": "debug", "image": "busybox"}]);
    let e = status(pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap()).await.unwrap_err());
    assert_eq!(e.code, 422);
    assert!(e.message.contains("spec.ephemeralContainers: Forbidden: cannot be set on create"), "{}", e.message);

    // Added as kubectl debug does: a strategic merge patch of the subresource.
    let created = create_pod(&client, "default", "dbg", Some("n")).await;
    let debug = json!({"spec": {"ephemeralContainers": [
        {"name": "debugger", "image": "busybox", "targetContainerName": "app", "stdin": true, "tty": true}
    ]}});
    let patched =
        pods.patch_ephemeral_containers("dbg", &PatchParams::default(), &Patch::Strategic(debug)).await.unwrap();
    let spec = patched.spec.clone().unwrap();
    let added = &spec.ephemeral_containers.as_ref().unwrap()[0];
    assert_eq!(added.target_container_name.as_deref(), Some("app"));
    assert_eq!(added.termination_message_path.as_deref(), Some("/dev/termination-log"), "container defaults");
    assert_eq!(spec.containers, created.spec.clone().unwrap().containers, "nothing else changes");
    assert!(rv(&patched) > rv(&created));
    let read = pods.get_ephemeral_containers("dbg").await.unwrap();
    assert_eq!(read.spec.unwrap().ephemeral_containers.unwrap().len(), 1);

    // The main resource cannot change them.
    let through_main = Patch::Merge(json!({"spec": {"ephemeralContainers": null}}));
    assert_eq!(status(pods.patch("dbg", &PatchParams::default(), &through_main).await.unwrap_err()).code, 422);

    // Existing ones cannot change or go; new ones are validated.
    let mut changed = patched.clone();
    changed.spec.as_mut().unwrap().ephemeral_containers.as_mut().unwrap()[0].image = Some("other".into());
    let e = status(pods.replace_ephemeral_containers("dbg", &PostParams::default(), &changed).await.unwrap_err());
    assert!(
        e.message.contains(
            r#"spec.ephemeralContainers[0]: Forbidden: existing ephemeral containers "debugger" may not be changed"#
        ),
        "{}",
        e.message
    );
    let mut removed = patched.clone();
    removed.spec.as_mut().unwrap().ephemeral_containers = Some(vec![]);
    let e = status(pods.replace_ephemeral_containers("dbg", &PostParams::default(), &removed).await.unwrap_err());
    assert!(e.message.contains(r#"existing ephemeral containers "debugger" may not be removed"#), "{}", e.message);
    let bad = json!({"spec": {"ephemeralContainers": [{"name": "app", "image": "busybox", "targetContainerName": "ghost",
        "ports": [{"containerPort": 80}], "readinessProbe": {"exec": {"command": ["true"]}}}]}});
    let e = status(
        pods.patch_ephemeral_containers("dbg", &PatchParams::default(), &Patch::Strategic(bad)).await.unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    for want in [
        r#"spec.ephemeralContainers[1].name: Duplicate value: "app""#,
        "spec.ephemeralContainers[1].ports: Forbidden: cannot be set for an Ephemeral Container",
        "spec.ephemeralContainers[1].readinessProbe: Forbidden: cannot be set for an Ephemeral Container",
        r#"spec.ephemeralContainers[1].targetContainerName: Not found: "ghost""#,
    ] {
        assert!(e.message.contains(want), "{want} in {}", e.message);
    }
}

/// The fields a 1.34 kubelet reports are stored as given; `ValidatePodStatusUpdate` rejects a
/// negative observedGeneration and user ids outside the uid/gid range; spec changes bump
/// metadata.generation, which starts at 1.
#[tokio::test]
async fn kubelet_status_fields_are_stored_and_validated() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = create_pod(&client, "default", "k", Some("n")).await;
    assert_eq!(created.metadata.generation, Some(1));

    let reported = json!({"status": {
        "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 1}],
        "containerStatuses": [{
            "name": "app", "image": "registry.local/app:1", "imageID": "", "ready": true, "restartCount": 0,
            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true, "recursiveReadOnly": "Disabled"}],
            "user": {"linux": {"uid": 1000, "gid": 3000, "supplementalGroups": [3000, 4000]}},
            "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}}
        }]
    }});
    let stored = pods.patch_status("k", &PatchParams::default(), &Patch::Merge(reported)).await.unwrap();
    let status = stored.status.unwrap();
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.conditions.unwrap()[0].observed_generation, Some(1));
    let cs = &status.container_statuses.unwrap()[0];
    assert_eq!(cs.volume_mounts.as_ref().unwrap()[0].recursive_read_only.as_deref(), Some("Disabled"));
    let linux = cs.user.as_ref().unwrap().linux.as_ref().unwrap();
    assert_eq!((linux.uid, linux.gid, linux.supplemental_groups.clone()), (1000, 3000, Some(vec![3000, 4000])));
    assert_eq!(cs.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"].0, "64Mi");

    let bumped = pods
        .patch("k", &PatchParams::default(), &Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 600}})))
        .await
        .unwrap();
    assert_eq!(bumped.metadata.generation, Some(2));

    let negative = json!({"status": {"observedGeneration": -1}});
    let err = status_of(pods.patch_status("k", &PatchParams::default(), &Patch::Merge(negative)).await);
    assert_eq!(err.code, 422);
    assert!(err.message.contains("status.observedGeneration: Invalid value: -1"), "{}", err.message);
    let bad_user = json!({"status": {"containerStatuses": [{
        "name": "app", "image": "registry.local/app:1", "imageID": "", "ready": true, "restartCount": 0,
        "user": {"linux": {"uid": -5, "gid": 0, "supplementalGroups": [4294967296_i64]}}
    }]}});
    let err = status_of(pods.patch_status("k", &PatchParams::default(), &Patch::Merge(bad_user)).await);
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains(
            "status.containerStatuses[0].user.linux.uid: Invalid value: -5: must be between 0 and 2147483647, inclusive"
        ),
        "{}",
        err.message
    );
    assert!(err.message.contains("user.linux.supplementalGroups[0]"), "{}", err.message);

    // A Windows pod's containers have no Linux identity.
    let mut windows = pod_json("w", Some("n"));
    windows["spec"]["os"] = json!({"name": "windows"});
    pods.create(&PostParams::default(), &serde_json::from_value(windows).unwrap()).await.unwrap();
    let linux_user = json!({"status": {"containerStatuses": [{
        "name": "app", "image": "registry.local/app:1", "imageID": "", "ready": true, "restartCount": 0,
        "user": {"linux": {"uid": 0, "gid": 0}}
    }]}});
    let err = status_of(pods.patch_status("w", &PatchParams::default(), &Patch::Merge(linux_user)).await);
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("status.containerStatuses[0].user.linux: Forbidden: cannot be set for a windows pod"),
        "{}",
        err.message
    );
}

fn status_of(r: kube::Result<Pod>) -> Box<kube::core::Status> {
    status(r.unwrap_err())
}

/// A Burstable pod with one regular container and one sidecar, both with cpu/memory
/// requests and limits.
fn resizable_pod(name: &str) -> Pod {
    let resources =
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}});
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": "n", "automountServiceAccountToken": false,
            "initContainers": [
                {"name": "init", "image": "busybox", "resources": resources},
                {"name": "side", "image": "busybox", "restartPolicy": "Always", "resources": resources}
            ],
            "containers": [{"name": "app", "image": "busybox", "resources": resources,
                "resizePolicy": [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]}]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn resize_changes_only_cpu_and_memory_through_its_subresource() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods.create(&PostParams::default(), &resizable_pod("r")).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    // setDefaultResizePolicy: NotRequired for each used resource the container does not name.
    let policy = serde_json::to_value(&created.spec.as_ref().unwrap().containers[0].resize_policy).unwrap();
    assert_eq!(
        policy,
        json!([{"resourceName": "memory", "restartPolicy": "RestartContainer"}, {"resourceName": "cpu", "restartPolicy": "NotRequired"}])
    );
    let init = created.spec.as_ref().unwrap().init_containers.clone().unwrap();
    assert_eq!(init[0].resize_policy, None, "not for regular init containers");
    assert_eq!(init[1].resize_policy.as_ref().map(Vec::len), Some(2), "sidecars get both");

    // The main resource keeps refusing resource changes.
    let grow = json!({"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "300m"}}}]}});
    let e = status(pods.patch("r", &PatchParams::default(), &Patch::Strategic(grow.clone())).await.unwrap_err());
    assert_eq!(e.code, 422);
    assert!(e.message.contains("pod updates may not change fields"), "{}", e.message);

    // The resize subresource takes it, and a sidecar's too; the generation counts it.
    let resized = pods.patch_resize("r", &PatchParams::default(), &Patch::Strategic(grow)).await.unwrap();
    let spec = resized.spec.clone().unwrap();
    let limits = spec.containers[0].resources.as_ref().unwrap().limits.clone().unwrap();
    assert_eq!(limits["cpu"].0, "300m");
    assert_eq!(limits["memory"].0, "128Mi", "strategic merge keeps the rest");
    assert_eq!(resized.metadata.generation, Some(2));
    let side = json!({"spec": {"initContainers": [{"name": "side", "resources": {"requests": {"memory": "100Mi"}}}]}});
    let resized = pods.patch_resize("r", &PatchParams::default(), &Patch::Strategic(side)).await.unwrap();
    let sidecar = &resized.spec.clone().unwrap().init_containers.unwrap()[1];
    assert_eq!(sidecar.resources.as_ref().unwrap().requests.as_ref().unwrap()["memory"].0, "100Mi");
    assert_eq!(pods.get_resize("r").await.unwrap().metadata.resource_version, resized.metadata.resource_version);

    // Anything else in the request is ignored, as upstream's resize strategy drops it.
    let mut other = resized.clone();
    other.spec.as_mut().unwrap().containers[0].image = Some("other".into());
    other.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    let kept = pods.replace_resize("r", &PostParams::default(), &other).await.unwrap();
    assert_eq!(kept.spec.unwrap().containers[0].image.as_deref(), Some("busybox"));
    assert_eq!(kept.metadata.labels, None);
}

#[tokio::test]
async fn resize_is_validated_as_upstream() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &resizable_pod("r")).await.unwrap();
    let refused = |patch: serde_json::Value| {
        let pods = pods.clone();
        async move {
            let e =
                status(pods.patch_resize("r", &PatchParams::default(), &Patch::Strategic(patch)).await.unwrap_err());
            assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{}", e.message);
            e.message
        }
    };
    let app = |resources: serde_json::Value| json!({"spec": {"containers": [{"name": "app", "resources": resources}]}});

    // As upstream's e2e: a BestEffort pod cannot gain a request.
    create_pod(&client, "default", "best-effort", Some("n")).await;
    let e = status(
        pods.patch_resize(
            "best-effort",
            &PatchParams::default(),
            &Patch::Strategic(app(json!({"requests": {"memory": "40Mi"}}))),
        )
        .await
        .unwrap_err(),
    );
    assert!(
        e.message
            .contains(r#"spec: Invalid value: "BestEffort": Pod QOS Class may not change as a result of resizing"#),
        "{}",
        e.message
    );
    let m = refused(app(json!({"limits": {"ephemeral-storage": "1Gi"}}))).await;
    assert!(m.contains("spec: Forbidden: only cpu and memory resources are mutable"), "{m}");
    let m = refused(app(json!({"limits": {"memory": null}}))).await;
    assert!(m.contains("spec.containers[0].resources.limits: Forbidden: resource limits cannot be removed"), "{m}");
    let m = refused(app(json!({"requests": {"cpu": "300m"}}))).await;
    assert!(
        m.contains(r#"spec.containers[0].resources.requests: Invalid value: "300m": must be less than or equal to cpu limit of 200m"#),
        "{m}"
    );
    let init = json!({"spec": {"initContainers": [{"name": "init", "resources": {"limits": {"cpu": "300m"}}}]}});
    let m = refused(init).await;
    assert!(m.contains("spec: Forbidden: resources for non-sidecar init containers are immutable"), "{m}");
    let policy = json!({"spec": {"containers": [{"name": "app", "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]}]}});
    let m = refused(policy).await;
    assert!(m.contains("spec: Forbidden: only cpu and memory resources are mutable"), "{m}");

    // Static pods cannot be resized.
    let mut mirror = resizable_pod("mirror");
    mirror.metadata.annotations = Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
    pods.create(&PostParams::default(), &mirror).await.unwrap();
    let e = status(
        pods.patch_resize("mirror", &PatchParams::default(), &Patch::Strategic(app(json!({})))).await.unwrap_err(),
    );
    assert!(e.message.contains("Forbidden: static pods cannot be resized"), "{}", e.message);

    // resizePolicy values are checked on create.
    let mut bad = resizable_pod("bad");
    bad.spec.as_mut().unwrap().containers[0].resize_policy =
        Some(vec![serde_json::from_value(json!({"resourceName": "disk", "restartPolicy": "Sometimes"})).unwrap()]);
    let e = status(pods.create(&PostParams::default(), &bad).await.unwrap_err());
    assert!(
        e.message.contains(r#"spec.containers[0].resizePolicy[0].restartPolicy: Unsupported value: "Sometimes": supported values: "NotRequired", "RestartContainer""#),
        "{}",
        e.message
    );
    assert!(
        e.message.contains(r#"spec.containers[0].resizePolicy[0].resourceName: Unsupported value: "disk""#),
        "{}",
        e.message
    );
    let mut never = resizable_pod("never");
    never.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    let e = status(pods.create(&PostParams::default(), &never).await.unwrap_err());
    let want = r#"spec.containers[0].resizePolicy[0].restartPolicy: Invalid value: "RestartContainer": must be 'NotRequired' when `restartPolicy` is 'Never'"#;
    assert!(e.message.contains(want), "{}", e.message);
}

#[tokio::test]
async fn recursive_read_only_mounts_are_validated_on_create() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let with_mount = |name: &str, mount: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [{"name": "app", "image": "busybox", "volumeMounts": [mount]}]
            }
        }))
        .unwrap()
    };
    let refused = |pod: Pod| {
        let pods = pods.clone();
        async move { status(pods.create(&PostParams::default(), &pod).await.unwrap_err()) }
    };
    let e = refused(with_mount("rw", json!({"name": "data", "mountPath": "/d", "recursiveReadOnly": "Enabled"}))).await;
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains(
            "spec.containers[0].volumeMounts.recursiveReadOnly: Forbidden: may only be specified when readOnly is true"
        ),
        "{}",
        e.message
    );
    let propagated = json!({"name": "data", "mountPath": "/d", "readOnly": true, "recursiveReadOnly": "IfPossible",
        "mountPropagation": "HostToContainer"});
    let e = refused(with_mount("prop", propagated)).await;
    assert!(
        e.message.contains("Forbidden: may only be specified when mountPropagation is None or not specified"),
        "{}",
        e.message
    );
    let e = refused(with_mount(
        "odd",
        json!({"name": "data", "mountPath": "/d", "readOnly": true, "recursiveReadOnly": "Always"}),
    ))
    .await;
    assert!(
        e.message.contains(
            r#"recursiveReadOnly: Unsupported value: "Always": supported values: "Disabled", "Enabled", "IfPossible""#
        ),
        "{}",
        e.message
    );
    let fine = json!({"name": "data", "mountPath": "/d", "readOnly": true, "recursiveReadOnly": "Enabled", "mountPropagation": "None"});
    pods.create(&PostParams::default(), &with_mount("fine", fine)).await.unwrap();
    pods.create(
        &PostParams::default(),
        &with_mount("off", json!({"name": "data", "mountPath": "/d", "recursiveReadOnly": "Disabled"})),
    )
    .await
    .unwrap();
}
