//! Fault tolerance, end to end on the real containerd: faults injected into the test API
//! server (`TestApiServer::faults`) and into the CRI (`CriProxy` in front of containerd), the
//! agent killed with SIGKILL, containerd restarted. Each case prints its recovery figure as
//! `FAULT <case> <seconds>`.
//!
//! Against a real cluster (`GANTRY_E2E_KUBECONFIG`), the cases that inject faults into the API
//! server are skipped with a printed reason; the others run unchanged.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::cluster::{self, Cluster};
use common::{Env, eventually, pod_yaml};
use gantry_test_apiserver::{Failure, TestApiServer};
use gantry_testkit::CriProxy;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;

/// The fault periods.
const API_FAILING: Duration = Duration::from_secs(30);
const API_HANGING: Duration = Duration::from_secs(30);
/// How soon after a fault ends everything must have caught up.
const CATCH_UP: Duration = Duration::from_secs(15);
/// How long a hung CRI call may hold a pod (`runtimeRequestTimeout` in case b).
const RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A pod bound to the node, no service-account token volume, a short grace period.
fn bound_pod(node: &str, name: &str, command: &str, extra_spec: &str) -> Pod {
    let spec = format!(
        "  nodeName: {node}\n  terminationGracePeriodSeconds: 2\n  automountServiceAccountToken: false\n{extra_spec}"
    );
    serde_yaml_ng::from_str(&pod_yaml(name, command, &spec)).unwrap()
}

fn figure(case: &str, took: Duration) {
    println!("FAULT {case} {:.1}", took.as_secs_f64());
    eprintln!("FAULT {case} {:.1}", took.as_secs_f64());
}

/// The test API server, or None (with the reason printed) on a real cluster.
fn test_server<'a>(cluster: &'a Cluster, case: &str) -> Option<&'a TestApiServer> {
    match cluster {
        Cluster::Test(server) => Some(server),
        Cluster::Real(_) => {
            eprintln!("SKIPPED {case}: injects faults into the API server, which a real cluster cannot take");
            None
        }
    }
}

async fn phase(pods: &Api<Pod>, name: &str) -> Option<String> {
    pods.get_opt(name).await.ok()??.status?.phase
}

/// Sum of the restart counts the API reports for `name`.
async fn restarts(pods: &Api<Pod>, name: &str) -> i32 {
    let status = pods.get(name).await.unwrap().status.unwrap_or_default();
    status.container_statuses.unwrap_or_default().iter().map(|c| c.restart_count).sum()
}

/// The running container IDs per pod, from containerd.
async fn running_containers(env: &Env) -> BTreeMap<String, Vec<String>> {
    let mut by_pod: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in env.containers().await.into_iter().filter(|c| c.running) {
        by_pod.entry(c.pod).or_default().push(c.id);
    }
    by_pod
}

fn host_dir(env: &Env, name: &str) -> PathBuf {
    let dir = env.ctd.dir().join(format!("data-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Adds a KubeletConfiguration field to the environment's config file.
fn configure(env: &Env, line: &str) {
    let mut yaml = std::fs::read_to_string(&env.config).unwrap();
    yaml.push_str(line);
    yaml.push('\n');
    std::fs::write(&env.config, yaml).unwrap();
}

/// Case a: the API server answers 500 for 30 s, then hangs for 30 s. The pods keep running
/// (no container is restarted), what changed on the node meanwhile (a pod finished, a static
/// pod appeared) reaches the API within 15 s of recovery, and nothing is written twice.
#[tokio::test]
async fn api_server_failing_then_hanging() {
    const CASE: &str = "api-500-30s-then-hang-30s";
    let Some((env, cluster)) = cluster::setup().await else { return };
    let Some(server) = test_server(&cluster, CASE) else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let signal = host_dir(&env, "signal");
    let steady = ["steady-0", "steady-1", "steady-2"];
    for name in steady {
        pods.create(&PostParams::default(), &bound_pod(&env.node, name, "sleep 3600", "")).await.unwrap();
    }
    let finisher_spec = format!(
        "  restartPolicy: Never\n  volumes:\n  - name: signal\n    hostPath:\n      path: {}\n",
        signal.display()
    );
    let mut finisher = bound_pod(&env.node, "finisher", "until [ -f /signal/done ]; do sleep 0.1; done", &finisher_spec);
    finisher.spec.as_mut().unwrap().containers[0].volume_mounts =
        Some(vec![serde_json::from_value(serde_json::json!({"name": "signal", "mountPath": "/signal"})).unwrap()]);
    pods.create(&PostParams::default(), &finisher).await.unwrap();
    for name in steady.iter().chain(&["finisher"]) {
        eventually(&format!("{name} Running in the API"), &gantry, || async {
            (phase(&pods, name).await? == "Running").then_some(())
        })
        .await;
    }
    let containers = running_containers(&env).await;

    let before_fault = server.requests();
    let faults = server.faults();
    faults.drop_watches();
    faults.fail(Failure::InternalError, API_FAILING);
    faults.hang(API_HANGING);
    // While the API is down, the node changes: a pod finishes, a static pod is added.
    std::fs::write(signal.join("done"), "").unwrap();
    env.write_manifest("static.yaml", &pod_yaml("static", "sleep 3600", ""));
    let mirror = format!("static-{}", env.node);
    eventually("the node sees the finisher Succeeded and the static pod Running", &gantry, || async {
        (gantry.phase("finisher")? == "Succeeded" && gantry.phase(&mirror)? == "Running").then_some(())
    })
    .await;

    faults.recovered().await;
    let recovered = Instant::now();
    let failed_requests = faults.answered();
    loop {
        if phase(&pods, "finisher").await.as_deref() == Some("Succeeded")
            && phase(&pods, &mirror).await.as_deref() == Some("Running")
        {
            break;
        }
        assert!(
            recovered.elapsed() < CATCH_UP,
            "statuses not caught up {CATCH_UP:?} after recovery\n{}",
            common::tail(&gantry.log(), 80)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = recovered.elapsed();
    figure(CASE, took);
    assert!(failed_requests > 0, "the agent met the failures");

    // Quiet for a while: then count the writes since the fault began.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = server.requests().since(&before_fault);
    for name in steady {
        assert_eq!(writes.of("patch", "pods/status", "default", name), 0, "{name}'s status did not change: {writes:?}");
        assert_eq!(restarts(&pods, name).await, 0, "{name} restarted");
    }
    assert_eq!(writes.of("patch", "pods/status", "default", "finisher"), 1, "one write of the new status: {writes:?}");
    // (A create names no object in its path: the one pod created since is the mirror pod.)
    assert_eq!(writes.of("create", "pods", "default", ""), 1, "one mirror pod created: {writes:?}");
    assert!(writes.of("patch", "pods/status", "default", &mirror) <= 1, "{writes:?}");
    let now = running_containers(&env).await;
    for name in steady {
        assert_eq!(now.get(name), containers.get(name), "{name}: the same container still runs");
    }
    cluster.cleanup(&env.node).await;
}

/// Starts `gantry kubelet` against the CRI proxy in front of the environment's containerd.
async fn node_behind_proxy(env: &Env, cluster: &Cluster) -> (CriProxy, common::Gantry) {
    let proxy = CriProxy::start(&env.ctd.dir().join("proxy.sock"), &env.ctd.socket_path()).await.unwrap();
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let mut args: Vec<String> =
        env.args().into_iter().filter(|a| !a.starts_with("--container-runtime-endpoint=")).collect();
    args.push(format!("--container-runtime-endpoint={}", proxy.endpoint()));
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    (proxy, common::Gantry::start(&args, &env.root.join("gantry.log")))
}

/// Case b: CreateContainer hangs for one pod. Only that pod waits, for no longer than
/// `runtimeRequestTimeout`; the others reach Running meanwhile; once the runtime answers
/// again the stuck pod runs too.
#[tokio::test]
async fn a_hung_cri_call_holds_only_its_pod() {
    const CASE: &str = "cri-create-container-hangs-for-one-pod";
    let Some((env, cluster)) = cluster::setup().await else { return };
    configure(&env, &format!("runtimeRequestTimeout: {}s", RUNTIME_REQUEST_TIMEOUT.as_secs()));
    let (proxy, gantry) = node_behind_proxy(&env, &cluster).await;
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    proxy.hang("CreateContainer", Some("stuck"));
    let started = Instant::now();
    pods.create(&PostParams::default(), &bound_pod(&env.node, "stuck", "sleep 3600", "")).await.unwrap();
    let others = ["free-0", "free-1", "free-2"];
    for name in others {
        pods.create(&PostParams::default(), &bound_pod(&env.node, name, "sleep 3600", "")).await.unwrap();
    }
    for name in others {
        eventually(&format!("{name} Running"), &gantry, || async {
            (phase(&pods, name).await? == "Running").then_some(())
        })
        .await;
    }
    let others_running = started.elapsed();
    let hung = proxy.calls_of("CreateContainer").into_iter().filter(|c| c.pod.as_deref() == Some("stuck")).count();
    assert!(hung >= 1, "the stuck pod's CreateContainer was held");
    assert_ne!(phase(&pods, "stuck").await.as_deref(), Some("Running"));

    // The hung call is given up after runtimeRequestTimeout and tried again: a second call.
    let retried = eventually("the stuck pod's CreateContainer tried again", &gantry, || async {
        let calls: Vec<_> =
            proxy.calls_of("CreateContainer").into_iter().filter(|c| c.pod.as_deref() == Some("stuck")).collect();
        (calls.len() >= 2).then(|| calls[1].at - calls[0].at)
    })
    .await;
    assert!(
        retried >= RUNTIME_REQUEST_TIMEOUT && retried < RUNTIME_REQUEST_TIMEOUT + Duration::from_secs(15),
        "the hung call was bounded by runtimeRequestTimeout: retried after {retried:?}"
    );
    figure(CASE, retried);
    eprintln!("others Running after {others_running:?} while one pod hung");

    proxy.release("CreateContainer");
    eventually("the stuck pod Running once the runtime answers", &gantry, || async {
        (phase(&pods, "stuck").await? == "Running").then_some(())
    })
    .await;
    let containers = running_containers(&env).await;
    assert_eq!(containers.get("stuck").map(Vec::len), Some(1), "one container, no leftover: {containers:?}");
    cluster.cleanup(&env.node).await;
}
