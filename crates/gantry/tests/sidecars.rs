//! End-to-end, cluster mode: native sidecar containers (init containers with
//! `restartPolicy: Always`, KEP-753) on the real containerd, through the test API server or a
//! real one (`GANTRY_E2E_KUBECONFIG`). The containers write host uptimes (one clock for all of
//! them) into a hostPath directory, so the test checks the order things happened in.

mod common;

use std::path::{Path, PathBuf};

use common::cluster::{self, Cluster};
use common::node_api::{NodeApi, free_port};
use common::{Env, Gantry, eventually};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

/// A shell line that records the host's uptime (seconds, 10 ms resolution) in `/order/<what>`.
fn mark(what: &str) -> String {
    format!(r#"cut -d" " -f1 /proc/uptime > /order/{what}"#)
}

/// A container running `script`; on SIGTERM it takes half a second to stop, then records
/// `<name>.term` and exits, so stops that overlap show in the marks.
fn container(name: &str, script: &str) -> Value {
    let script = format!("trap 'sleep 0.5; {}; exit 0' TERM; {script}", mark(&format!("{name}.term")));
    json!({"name": name, "image": gantry_testkit::BUSYBOX_IMAGE, "command": ["sh", "-c", script],
           "volumeMounts": [{"name": "order", "mountPath": "/order"}]})
}

fn sidecar(name: &str, script: &str) -> Value {
    let mut c = container(name, script);
    c["restartPolicy"] = json!("Always");
    c
}

/// A pod bound to `node`, with the hostPath `order` volume at `dir`.
fn pod(node: &str, name: &str, policy: &str, dir: &Path, init: Vec<Value>, containers: Vec<Value>) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": node, "restartPolicy": policy, "terminationGracePeriodSeconds": 20,
            "automountServiceAccountToken": false,
            "volumes": [{"name": "order", "hostPath": {"path": dir, "type": "DirectoryOrCreate"}}],
            "initContainers": init, "containers": containers,
        }
    }))
    .unwrap()
}

/// A fresh host directory for one pod's marks.
fn marks_dir(env: &Env, pod: &str) -> PathBuf {
    env.ctd.dir().join(format!("order-{pod}"))
}

/// The uptime recorded in mark `what`, once it exists.
fn read_mark(dir: &Path, what: &str) -> Option<f64> {
    std::fs::read_to_string(dir.join(what)).ok()?.trim().parse().ok()
}

/// kubectl's READY column: ready regular containers and ready, started sidecars, over both.
fn ready_column(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let sidecar_names: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let sidecars: Vec<&ContainerStatus> =
        status.init_container_statuses.iter().flatten().filter(|s| sidecar_names.contains(&s.name.as_str())).collect();
    let regular = status.container_statuses.as_deref().unwrap_or_default();
    let ready = regular.iter().filter(|c| c.ready).count()
        + sidecars.iter().filter(|s| s.ready && s.started == Some(true)).count();
    format!("{ready}/{}", regular.len() + sidecars.len())
}

fn condition(status: &PodStatus, type_: &str) -> Option<String> {
    status.conditions.iter().flatten().find(|c| c.type_ == type_).map(|c| c.status.clone())
}

fn init_status<'a>(status: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    status.init_container_statuses.iter().flatten().find(|s| s.name == name)
}

/// A node agent joined to the cluster, serving `/pods` on a plain read-only port.
async fn node_with_read_only_port(env: &Env, cluster: &Cluster) -> (Gantry, u16) {
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let read_only = free_port();
    let api = NodeApi::new(&env.ctd.dir());
    let flags = [format!("--kubeconfig={}", kubeconfig.display()), format!("--read-only-port={read_only}")];
    let gantry = api.start_agent(env, &flags.iter().map(String::as_str).collect::<Vec<_>>()).await;
    (gantry, read_only)
}

/// The pod as the node API's `/pods` lists it.
async fn node_api_pod(read_only: u16, name: &str) -> Option<Pod> {
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let body = plain.get(format!("http://127.0.0.1:{read_only}/pods")).send().await.ok()?.text().await.ok()?;
    let list: Value = serde_json::from_str(&body).ok()?;
    let item = list["items"].as_array()?.iter().find(|p| p["metadata"]["name"] == name)?;
    serde_json::from_value(item.clone()).ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn sidecars_start_in_order_count_as_ready_and_stop_after_the_app_in_reverse() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let (gantry, read_only) = node_with_read_only_port(&env, &cluster).await;
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let dir = marks_dir(&env, "ordered");
    let wait_forever = "sleep 3600 & wait";
    // `proxy` becomes ready 2 s after it starts; its startup probe holds `setup` back until then.
    let mut proxy =
        sidecar("proxy", &format!("{}; sleep 2; {}; {wait_forever}", mark("proxy.start"), mark("proxy.ready")));
    let probe =
        json!({"exec": {"command": ["test", "-f", "/order/proxy.ready"]}, "periodSeconds": 1, "failureThreshold": 60});
    proxy["startupProbe"] = probe.clone();
    proxy["readinessProbe"] = probe;
    let init = vec![
        sidecar("log", &format!("{}; {wait_forever}", mark("log.start"))),
        proxy,
        container("setup", &mark("setup.start")),
    ];
    let main = container("main", &format!("{}; {wait_forever}", mark("main.start")));
    pods.create(&PostParams::default(), &pod(&env.node, "ordered", "Always", &dir, init, vec![main])).await.unwrap();

    let running = eventually("the pod Running and Ready, 3/3", &gantry, || async {
        let pod = pods.get("ordered").await.ok()?;
        let status = pod.status.as_ref()?;
        let ready = condition(status, "Ready")? == "True" && status.phase.as_deref() == Some("Running");
        // Running comes before the shell wrote its mark.
        let marked = read_mark(&dir, "main.start").is_some();
        (ready && marked && ready_column(&pod) == "3/3").then_some(pod)
    })
    .await;
    let at = |what: &str| read_mark(&dir, what).unwrap_or_else(|| panic!("mark {what} written"));
    assert!(at("log.start") <= at("proxy.start"), "sidecars start in order");
    assert!(at("proxy.ready") <= at("setup.start"), "setup waits for proxy's startup probe");
    assert!(at("setup.start") <= at("main.start"), "main starts after initialization");

    let status = running.status.unwrap();
    assert_eq!(condition(&status, "Initialized").as_deref(), Some("True"));
    for name in ["log", "proxy"] {
        let s = init_status(&status, name).unwrap();
        assert_eq!((s.started, s.ready, s.restart_count), (Some(true), true, 0), "{name}");
        assert!(s.state.as_ref().unwrap().running.is_some(), "{name} runs next to main");
    }
    assert!(init_status(&status, "setup").unwrap().state.as_ref().unwrap().terminated.is_some());
    let listed = eventually("the pod ready in /pods", &gantry, || async {
        node_api_pod(read_only, "ordered").await.filter(|p| ready_column(p) == "3/3")
    })
    .await;
    assert_eq!(listed.metadata.uid, running.metadata.uid);

    pods.delete("ordered", &DeleteParams::default()).await.unwrap();
    eventually("the pod gone", &gantry, || async { pods.get_opt("ordered").await.ok()?.is_none().then_some(()) }).await;
    let (main, proxy, log) = (at("main.term"), at("proxy.term"), at("log.term"));
    // Each stop takes 0.5 s: stopped one after the other, the marks are that far apart.
    assert!(proxy - main >= 0.4 && log - proxy >= 0.4, "main, then proxy, then log: {main} {proxy} {log}");
    cluster.cleanup(&env.node).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sidecar_is_restarted_after_it_exits_in_a_never_pod() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let dir = marks_dir(&env, "flaky");
    // The first instance fails at once; the second one stays.
    let flaky =
        sidecar("proxy", "if [ -f /order/crashed ]; then sleep 3600 & wait; else touch /order/crashed; exit 3; fi");
    let main = container("main", "sleep 3600 & wait");
    pods.create(&PostParams::default(), &pod(&env.node, "flaky", "Never", &dir, vec![flaky], vec![main]))
        .await
        .unwrap();

    let status = eventually("the sidecar running again after one restart", &gantry, || async {
        let status = pods.get("flaky").await.ok()?.status?;
        let proxy = init_status(&status, "proxy")?;
        let back = proxy.restart_count == 1 && proxy.state.as_ref()?.running.is_some();
        let main_runs = status.container_statuses.as_ref()?.first()?.state.as_ref()?.running.is_some();
        (back && main_runs).then_some(status)
    })
    .await;
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let proxy = init_status(&status, "proxy").unwrap();
    let last = proxy.last_state.as_ref().and_then(|s| s.terminated.as_ref()).expect("last termination reported");
    assert_eq!(last.exit_code, 3);
    assert_eq!(status.container_statuses.unwrap()[0].restart_count, 0, "the regular container is untouched");
    cluster.cleanup(&env.node).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn job_like_pods_complete_from_their_regular_containers_while_the_sidecar_runs() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    for (name, exit) in [("job-ok", 0), ("job-fails", 1)] {
        let dir = marks_dir(&env, name);
        let helper = sidecar("helper", "sleep 3600 & wait");
        let job = container("job", &format!("sleep 2; {}; exit {exit}", mark("job.done")));
        pods.create(&PostParams::default(), &pod(&env.node, name, "Never", &dir, vec![helper], vec![job]))
            .await
            .unwrap();
    }
    for (name, phase) in [("job-ok", "Succeeded"), ("job-fails", "Failed")] {
        let status = eventually(&format!("{name} {phase}"), &gantry, || async {
            let status = pods.get(name).await.ok()?.status?;
            (status.phase.as_deref() == Some(phase)).then_some(status)
        })
        .await;
        let helper = init_status(&status, "helper").unwrap();
        let stopped = helper.state.as_ref().and_then(|s| s.terminated.as_ref()).expect("the sidecar was stopped");
        let job = status.container_statuses.as_ref().unwrap()[0].state.clone().unwrap().terminated.unwrap();
        assert!(stopped.finished_at >= job.finished_at, "{name}: the sidecar ran until the job was done");
        let dir = marks_dir(&env, name);
        let (done, helper_term) = (read_mark(&dir, "job.done").unwrap(), read_mark(&dir, "helper.term").unwrap());
        assert!(done <= helper_term, "{name}: stopped only after the job finished");
        assert_eq!(helper.restart_count, 0, "{name}: not restarted once the pod completed");
        let reason = status.conditions.iter().flatten().find(|c| c.type_ == "Ready").and_then(|c| c.reason.clone());
        let expected = if phase == "Succeeded" { "PodCompleted" } else { "PodFailed" };
        assert_eq!(reason.as_deref(), Some(expected));
    }
    assert!(env.running("job-ok").await.is_empty(), "nothing of the completed pod runs");
    cluster.cleanup(&env.node).await;
}
