//! End-to-end, cluster mode: in-place pod resize through the API's `pods/resize` subresource
//! (as `kubectl patch --subresource resize` sends it), applied on the real containerd without
//! restarting the containers: CPU and memory up and down, seen in the container's cgroup and in
//! `status.containerStatuses[].resources`; a `RestartContainer` policy restarts exactly that
//! container; a request beyond the node gives `PodResizePending`/`Infeasible`. Runs against
//! the test API server or a real one (`GANTRY_E2E_KUBECONFIG`).

mod common;

use common::node_api::NodeApi;
use common::{cluster, eventually};
use gantry_cri::api::ExecSyncRequest;
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod, PodCondition};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn container(name: &str, policy: Option<Value>) -> Value {
    let mut c = json!({
        "name": name, "image": gantry_testkit::BUSYBOX_IMAGE, "command": ["sleep", "3600"],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
    });
    if let Some(policy) = policy {
        c["resizePolicy"] = policy;
    }
    c
}

/// A container that holds 48 MiB of memory (a file in its tmpfs `/dev/shm`).
fn hog() -> Value {
    json!({
        "name": "hog", "image": gantry_testkit::BUSYBOX_IMAGE,
        "command": ["sh", "-c", "head -c 50331648 /dev/zero > /dev/shm/fill && exec sleep 3600"],
        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
    })
}

fn status_of(pod: &Pod, name: &str) -> Option<ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|s| s.name == name).cloned()
}

fn condition(pod: &Pod, type_: &str) -> Option<PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_).cloned()
}

/// The reported `resources.limits` of a container: (cpu, memory).
fn reported_limits(pod: &Pod, name: &str) -> Option<(String, String)> {
    let limits = status_of(pod, name)?.resources?.limits?;
    Some((limits.get("cpu")?.0.clone(), limits.get("memory")?.0.clone()))
}

/// (CFS quota in µs, memory limit in bytes) as the container itself sees them in its cgroup
/// (v1: `cpu.cfs_quota_us`, `memory.limit_in_bytes`; v2: `cpu.max`, `memory.max`).
async fn cgroup_limits(env: &common::Env, container_id: &str) -> (i64, i64) {
    let script = "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null \
                  || cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/memory.max";
    let request = ExecSyncRequest {
        container_id: container_id.to_string(),
        cmd: vec!["sh".into(), "-c".into(), script.into()],
        timeout: 10,
    };
    let out = env.ctd.runtime_client().await.exec_sync(request).await.unwrap().into_inner();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let values: Vec<i64> = text.lines().filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect();
    assert_eq!(
        values.len(),
        2,
        "cgroup values from the container: {text:?} {:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    (values[0], values[1])
}

/// The pod cgroup's (CFS quota, memory limit) on a cgroup v1 host.
fn pod_cgroup_limits(env: &common::Env, uid: &str) -> Option<(i64, i64)> {
    let dir = |controller: &str| {
        std::path::Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(env.ctd.cgroup_root().trim_start_matches('/'))
            .join(format!("kubepods/burstable/pod{uid}"))
    };
    let read =
        |controller: &str, file: &str| std::fs::read_to_string(dir(controller).join(file)).ok()?.trim().parse().ok();
    Some((read("cpu", "cpu.cfs_quota_us")?, read("memory", "memory.limit_in_bytes")?))
}

#[tokio::test(flavor = "multi_thread")]
async fn resize_cpu_and_memory_in_place_restart_by_policy_and_infeasible() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let api = NodeApi::new(&env.ctd.dir());
    let kubeconfig = format!("--kubeconfig={}", cluster.node_kubeconfig(&env.ctd.dir(), &env.node).display());
    let gantry = api.start_agent(&env, &[&kubeconfig, "--authorization-mode=AlwaysAllow"]).await;
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let restart_on_memory = json!([{"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "resizable"},
        "spec": {"nodeName": env.node, "terminationGracePeriodSeconds": 2, "automountServiceAccountToken": false,
                 "containers": [container("app", None), container("jvm", Some(restart_on_memory)), hog()]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = eventually("the pod running", &gantry, || async {
        let pod = pods.get("resizable").await.ok()?;
        (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
    })
    .await;
    let id_of = |pod: &Pod, name: &str| {
        let id = status_of(pod, name).and_then(|s| s.container_id).unwrap();
        id.trim_start_matches("containerd://").to_string()
    };
    let (app_id, jvm_id) = (id_of(&running, "app"), id_of(&running, "jvm"));
    assert_eq!(cgroup_limits(&env, &app_id).await, (20_000, 128 << 20));
    let uid = running.metadata.uid.clone().unwrap();
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    if v1 {
        assert_eq!(pod_cgroup_limits(&env, &uid), Some((60_000, 384 << 20)), "the pod cgroup: all three containers");
    }
    assert_eq!(reported_limits(&running, "app"), Some(("200m".into(), "128Mi".into())));

    let resize = |name: &str, resources: Value| {
        Patch::Strategic(json!({"spec": {"containers": [{"name": name, "resources": resources}]}}))
    };
    let resized_to = |cpu: &'static str, memory: &'static str| {
        let pods = pods.clone();
        async move {
            let pod = pods.get("resizable").await.ok()?;
            let done = reported_limits(&pod, "app")? == (cpu.to_string(), memory.to_string())
                && condition(&pod, "PodResizeInProgress").is_none();
            done.then_some(pod)
        }
    };

    // Up: CPU and memory limits doubled, in place.
    let up = resize("app", json!({"limits": {"cpu": "400m", "memory": "256Mi"}}));
    let patched = pods.patch_resize("resizable", &PatchParams::default(), &up).await.unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    let pod = eventually("the larger limits reported", &gantry, || resized_to("400m", "256Mi")).await;
    assert_eq!(cgroup_limits(&env, &app_id).await, (40_000, 256 << 20), "the container's cgroup follows");
    if v1 {
        assert_eq!(pod_cgroup_limits(&env, &uid), Some((80_000, 512 << 20)), "the pod cgroup grows with it");
    }
    let app = status_of(&pod, "app").unwrap();
    assert_eq!((app.restart_count, id_of(&pod, "app")), (0, app_id.clone()), "not restarted");

    // Down: below the original values, again in place.
    let down = resize("app", json!({"limits": {"cpu": "100m", "memory": "96Mi"}}));
    pods.patch_resize("resizable", &PatchParams::default(), &down).await.unwrap();
    let pod = eventually("the smaller limits reported", &gantry, || resized_to("100m", "96Mi")).await;
    assert_eq!(cgroup_limits(&env, &app_id).await, (10_000, 96 << 20));
    if v1 {
        assert_eq!(pod_cgroup_limits(&env, &uid), Some((50_000, 352 << 20)), "and shrinks after it");
    }
    assert_eq!((status_of(&pod, "app").unwrap().restart_count, id_of(&pod, "app")), (0, app_id.clone()));

    let events: Api<Event> = Api::namespaced(admin, "default");
    let resize_events = eventually("ResizeStarted and ResizeCompleted events", &gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        let reasons: Vec<String> = list
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("resizable"))
            .filter_map(|e| e.reason)
            .filter(|r| r.starts_with("Resize"))
            .collect();
        (reasons.iter().any(|r| r == "ResizeStarted") && reasons.iter().any(|r| r == "ResizeCompleted"))
            .then_some(reasons)
    })
    .await;
    assert!(!resize_events.iter().any(|r| r == "ResizeError"), "{resize_events:?}");

    // RestartContainer for memory: exactly that container is restarted, with the new limit.
    let jvm = resize("jvm", json!({"limits": {"memory": "192Mi"}}));
    pods.patch_resize("resizable", &PatchParams::default(), &jvm).await.unwrap();
    let pod = eventually("the jvm container restarted with its new memory limit", &gantry, || async {
        let pod = pods.get("resizable").await.ok()?;
        let status = status_of(&pod, "jvm")?;
        let limits = reported_limits(&pod, "jvm")?;
        (status.restart_count == 1 && status.state?.running.is_some() && limits.1 == "192Mi").then_some(pod)
    })
    .await;
    let new_jvm_id = id_of(&pod, "jvm");
    assert_ne!(new_jvm_id, jvm_id);
    assert_eq!(cgroup_limits(&env, &new_jvm_id).await.1, 192 << 20);
    let app = status_of(&pod, "app").unwrap();
    assert_eq!((app.restart_count, id_of(&pod, "app")), (0, app_id.clone()), "the other container is untouched");

    // A memory limit below what the container uses is not set (best effort, 1.33+): the
    // resize stays in progress with an error, the container keeps its limit and runs on.
    let hog_id = id_of(&pod, "hog");
    let too_small = resize("hog", json!({"limits": {"memory": "32Mi"}}));
    pods.patch_resize("resizable", &PatchParams::default(), &too_small).await.unwrap();
    let in_progress = eventually("PodResizeInProgress with an error", &gantry, || async {
        let c = condition(&pods.get("resizable").await.ok()?, "PodResizeInProgress")?;
        (c.reason.as_deref() == Some("Error")).then_some(c)
    })
    .await;
    assert!(in_progress.message.as_deref().unwrap_or_default().contains("below current usage"), "{in_progress:?}");
    assert_eq!(cgroup_limits(&env, &hog_id).await.1, 128 << 20, "not lowered");
    // A limit above the usage is applied, and the resize completes.
    let enough = resize("hog", json!({"limits": {"memory": "96Mi"}}));
    pods.patch_resize("resizable", &PatchParams::default(), &enough).await.unwrap();
    let pod = eventually("the hog's smaller limit applied", &gantry, || async {
        let pod = pods.get("resizable").await.ok()?;
        let done = reported_limits(&pod, "hog")?.1 == "96Mi" && condition(&pod, "PodResizeInProgress").is_none();
        done.then_some(pod)
    })
    .await;
    assert_eq!(cgroup_limits(&env, &hog_id).await.1, 96 << 20);
    assert_eq!((status_of(&pod, "hog").unwrap().restart_count, id_of(&pod, "hog")), (0, hog_id));

    // Beyond any node: pending as Infeasible; the container keeps what it has.
    let huge = resize("app", json!({"requests": {"cpu": "100000"}, "limits": {"cpu": "100000"}}));
    pods.patch_resize("resizable", &PatchParams::default(), &huge).await.unwrap();
    let pending = eventually("PodResizePending", &gantry, || async {
        condition(&pods.get("resizable").await.ok()?, "PodResizePending")
    })
    .await;
    assert_eq!((pending.status.as_str(), pending.reason.as_deref()), ("True", Some("Infeasible")));
    // The pod's requests: 100000 CPUs for app, 100m each for jvm and hog.
    let message = pending.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("Node didn't have enough capacity: cpu, requested: 100000200, capacity: "),
        "{message}"
    );
    assert_eq!(cgroup_limits(&env, &app_id).await.0, 10_000);
    let pod = pods.get("resizable").await.unwrap();
    assert_eq!(reported_limits(&pod, "app").unwrap().0, "100m");

    pods.delete("resizable", &DeleteParams::default()).await.unwrap();
    eventually("the pod gone", &gantry, || async { pods.get_opt("resizable").await.ok()?.is_none().then_some(()) })
        .await;
    cluster.cleanup(&env.node).await;
}
