//! End-to-end, cluster mode: ephemeral containers added through the API's
//! `pods/ephemeralcontainers` subresource, as `kubectl debug -it --target` adds them, run in the
//! running pod's sandbox on the real containerd, sharing the target's process namespace, and
//! reached with `attach` through the node API. Runs against the test API server or a real
//! one (`GANTRY_E2E_KUBECONFIG`).

mod common;

use std::time::Instant;

use common::node_api::{NodeApi, WebSocket};
use common::{DEADLINE, cluster, eventually};
use futures::{SinkExt, StreamExt};
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

const CHANNEL: &str = "v4.channel.k8s.io";

fn debugger_status(pod: &Pod) -> Option<ContainerStatus> {
    pod.status.as_ref()?.ephemeral_container_statuses.as_ref()?.iter().find(|s| s.name == "debugger").cloned()
}

/// Sends one line on the attach stream's stdin channel.
async fn send_line(ws: &mut WebSocket, line: &str) {
    let mut frame = vec![0u8];
    frame.extend_from_slice(format!("{line}\n").as_bytes());
    ws.send(Message::binary(frame)).await.unwrap();
}

/// Reads stdout frames until the output holds `want`; returns all of it.
async fn read_until(ws: &mut WebSocket, want: &str) -> String {
    let deadline = Instant::now() + DEADLINE;
    let mut stdout = String::new();
    while !stdout.contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Binary(data)))) if data.first() == Some(&1) => {
                stdout.push_str(&String::from_utf8_lossy(&data[1..]));
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("no {want:?} on the attach stream ({other:?}); so far: {stdout}"),
        }
    }
    stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn debug_container_shares_the_target_processes_reports_status_and_attaches() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let api = NodeApi::new(&env.ctd.dir());
    let kubeconfig = format!("--kubeconfig={}", cluster.node_kubeconfig(&env.ctd.dir(), &env.node).display());
    let gantry = api.start_agent(&env, &[&kubeconfig, "--authorization-mode=AlwaysAllow"]).await;
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let target: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "distroless"},
        "spec": {"nodeName": env.node, "terminationGracePeriodSeconds": 2, "automountServiceAccountToken": false,
                 "containers": [{"name": "app", "image": gantry_testkit::BUSYBOX_IMAGE,
                                 "command": ["sleep", "4242"]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &target).await.unwrap();
    eventually("the target running", &gantry, || async {
        (pods.get("distroless").await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await;

    // What `kubectl debug -it distroless --image=busybox --target=app` sends: a shell that runs
    // each line it reads, so the test drives it through attach.
    let debug = json!({"spec": {"ephemeralContainers": [{
        "name": "debugger", "image": gantry_testkit::BUSYBOX_IMAGE, "targetContainerName": "app",
        "stdin": true, "tty": false, "command": ["sh", "-c", "while read l; do $l; done"],
    }]}});
    pods.patch_ephemeral_containers("distroless", &PatchParams::default(), &Patch::Strategic(debug)).await.unwrap();
    let running = eventually("the debugger's status running", &gantry, || async {
        let status = debugger_status(&pods.get("distroless").await.ok()?)?;
        status.state.as_ref()?.running.is_some().then_some(status)
    })
    .await;
    assert!(running.container_id.as_deref().is_some_and(|id| id.starts_with("containerd://")));
    assert_eq!(running.restart_count, 0);
    let pod = pods.get("distroless").await.unwrap();
    assert_eq!(pod.status.unwrap().container_statuses.unwrap()[0].restart_count, 0, "the target is untouched");

    let path = "/attach/default/distroless/debugger?input=1&output=1";
    let alice = api.ca.client("alice", &["dev"]);
    let mut ws = api.websocket(Some(&alice), path, CHANNEL).await.expect("attach upgrade");
    send_line(&mut ws, "ps").await;
    let ps = read_until(&mut ws, "sleep 4242").await;
    assert!(ps.contains("sleep 4242"), "the debugger sees the target's processes: {ps}");

    let events: Api<Event> = Api::namespaced(admin, "default");
    eventually("the debugger's Started event", &gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("distroless")
                && e.reason.as_deref() == Some("Started")
                && e.involved_object.field_path.as_deref() == Some("spec.ephemeralContainers{debugger}")
        })
    })
    .await;

    // Leaving the shell ends the ephemeral container for good; the pod keeps running.
    send_line(&mut ws, "exit").await;
    let ended = eventually("the debugger terminated", &gantry, || async {
        let pod = pods.get("distroless").await.ok()?;
        let status = debugger_status(&pod)?;
        let done = status.state.as_ref()?.terminated.is_some() && pod.status?.phase? == "Running";
        done.then_some(status)
    })
    .await;
    assert_eq!(ended.restart_count, 0);
    let instances = env.containers().await.into_iter().filter(|c| c.name == "debugger").count();
    assert_eq!(instances, 1, "not restarted");

    // Its log is served like any container's.
    let logs =
        api.client(Some(&alice)).get(api.url("/containerLogs/default/distroless/debugger")).send().await.unwrap();
    assert_eq!(logs.status().as_u16(), 200);
    assert!(logs.text().await.unwrap().contains("sleep 4242"), "the ps output is in the debugger's log");

    pods.delete("distroless", &DeleteParams::default()).await.unwrap();
    eventually("the pod gone", &gantry, || async { pods.get_opt("distroless").await.ok()?.is_none().then_some(()) })
        .await;
    assert!(env.containers().await.iter().all(|c| c.pod != "distroless"), "removed with the pod");
    cluster.cleanup(&env.node).await;
}
