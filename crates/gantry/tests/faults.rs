//! Fault tolerance, end to end on the real containerd: faults injected into the test API
//! server (`TestApiServer::faults`) and into the CRI (`CriProxy` in front of containerd), the
//! agent killed with SIGKILL, containerd restarted. Each case prints its recovery figure as
//! `FAULT <case> <seconds>`.
//!
//! Against a real cluster (`GANTRY_E2E_KUBECONFIG`), the cases that inject faults into the API
//! server are skipped with a printed reason; the others run unchanged.

mod common;
#[path = "common/maintenance_kit.rs"]
mod kit;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::cluster::{self, Cluster};
use common::{Env, eventually, pod_yaml};
use gantry_maintenance::api::{CONDITION_DRAINED, NodeMaintenance};
use gantry_test_apiserver::{Failure, TestApiServer};
use gantry_testkit::CriProxy;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kit::{Controller, install_crd};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

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

/// A pod that runs until the file `done` appears in `signal` (a host directory), then
/// succeeds: a status change the test triggers at a moment of its choosing.
fn finisher(node: &str, signal: &std::path::Path) -> Pod {
    let spec = format!(
        "  restartPolicy: Never\n  volumes:\n  - name: signal\n    hostPath:\n      path: {}\n",
        signal.display()
    );
    let mut pod = bound_pod(node, "finisher", "until [ -f /signal/done ]; do sleep 0.1; done", &spec);
    pod.spec.as_mut().unwrap().containers[0].volume_mounts =
        Some(vec![serde_json::from_value(json!({"name": "signal", "mountPath": "/signal"})).unwrap()]);
    pod
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
    pods.create(&PostParams::default(), &finisher(&env.node, &signal)).await.unwrap();
    for name in steady.iter().chain(&["finisher"]) {
        eventually(&format!("{name} Running in the API"), &gantry, || async {
            (phase(&pods, name).await? == "Running").then_some(())
        })
        .await;
    }
    let containers = running_containers(&env).await;

    let before_fault = server.requests();
    let faults = server.faults();
    // Every connection is cut (watches with them): the agent must reconnect into the outage.
    faults.drop_connections();
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
    let (failed_requests, held_requests) = (faults.answered(), faults.held());
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
    assert!(failed_requests > 0 && held_requests > 0, "the agent met the failures and the hang");
    eprintln!("{failed_requests} requests failed, {held_requests} held");

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
    // A minute of retries logs each kind of failure once (connections cut, 500s, the hang),
    // not every attempt, and says when it works again.
    let log = gantry.log();
    let warned = log.lines().filter(|l| l.contains("cannot update pod status")).count();
    assert!((1..=3).contains(&warned), "{warned} pod status warnings\n{}", common::tail(&log, 80));
    assert!(log.contains("pod status updates work again"), "{}", common::tail(&log, 80));
    cluster.cleanup(&env.node).await;
}

/// Starts `gantry kubelet` against the CRI proxy in front of the environment's containerd.
async fn node_behind_proxy(env: &Env, cluster: &Cluster) -> (CriProxy, common::Gantry) {
    let proxy = CriProxy::start(&env.ctd.dir().join("proxy.sock"), &env.ctd.socket_path()).await.unwrap();
    let gantry = node_behind_proxy_again(env, cluster, &proxy);
    (proxy, gantry)
}

/// Starts (another) `gantry kubelet` against `proxy`.
fn node_behind_proxy_again(env: &Env, cluster: &Cluster, proxy: &CriProxy) -> common::Gantry {
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let mut args: Vec<String> =
        env.args().into_iter().filter(|a| !a.starts_with("--container-runtime-endpoint=")).collect();
    args.push(format!("--container-runtime-endpoint={}", proxy.endpoint()));
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    common::Gantry::start(&args, &env.root.join("gantry.log"))
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

/// Case d, first half: `gantry kubelet` killed with SIGKILL while it starts 30 pods. The new
/// agent finishes the job: every pod Running, one sandbox and one container each.
#[tokio::test]
async fn agent_killed_while_starting_pods() {
    const CASE: &str = "kill-9-while-starting-30-pods";
    const PODS: usize = 30;
    let Some((env, cluster)) = cluster::setup().await else { return };
    let mut gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let names: Vec<String> = (0..PODS).map(|i| format!("many-{i}")).collect();
    for name in &names {
        pods.create(&PostParams::default(), &bound_pod(&env.node, name, "sleep 3600", "")).await.unwrap();
    }
    let sandboxes = eventually("half of the sandboxes created", &gantry, || async {
        let sandboxes = env.sandboxes().await.len();
        (sandboxes >= PODS / 2).then_some(sandboxes)
    })
    .await;
    let running = env.containers().await.iter().filter(|c| c.running).count();
    gantry.kill();
    eprintln!("killed with {sandboxes} sandboxes and {running} running containers");
    assert!(running < PODS, "killed in the middle of starting the pods");

    let restarted = Instant::now();
    let gantry = cluster::start_node(&env, &cluster);
    for name in &names {
        eventually(&format!("{name} Running after the restart"), &gantry, || async {
            (phase(&pods, name).await? == "Running").then_some(())
        })
        .await;
    }
    figure(CASE, restarted.elapsed());
    // Live sandboxes only: a RunPodSandbox cut off by the kill can leave a sandbox that never
    // became ready (containerd keeps it NotReady). Like upstream's kubelet, the new agent then
    // creates the next attempt, and garbage collection removes the dead one (pod::gc). A second
    // *ready* sandbox would be a duplicate, and so would a second container: a container whose
    // create or start the kill cut off never ran, and the new agent removes it before it starts
    // the next attempt (`plan::compute`).
    let mut sandboxes_per_pod: BTreeMap<String, usize> = BTreeMap::new();
    let mut dead_leftovers = 0;
    for (_, pod, ready) in env.sandboxes().await {
        if ready {
            *sandboxes_per_pod.entry(pod).or_default() += 1;
        } else {
            dead_leftovers += 1;
        }
    }
    eprintln!("sandboxes left NotReady by the kill: {dead_leftovers}");
    let mut containers_per_pod: BTreeMap<String, usize> = BTreeMap::new();
    for c in env.containers().await {
        *containers_per_pod.entry(c.pod).or_default() += 1;
    }
    for name in &names {
        assert_eq!(sandboxes_per_pod.get(name), Some(&1), "{name}: one ready sandbox: {sandboxes_per_pod:?}");
        assert_eq!(containers_per_pod.get(name), Some(&1), "{name}: one container: {containers_per_pod:?}");
    }
    cluster.cleanup(&env.node).await;
}

/// Case d, second half: SIGKILL in the middle of a pod's termination (30 s grace, the process
/// ignores SIGTERM). The new agent lets the original grace period run out, it does not start
/// a new one.
#[tokio::test]
async fn agent_killed_while_a_pod_terminates() {
    const CASE: &str = "kill-9-mid-termination-grace-30s";
    const GRACE: Duration = Duration::from_secs(30);
    const KILLED_AFTER: Duration = Duration::from_secs(10);
    let Some((env, cluster)) = cluster::setup().await else { return };
    let (proxy, mut gantry) = node_behind_proxy(&env, &cluster).await;
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let mut pod = bound_pod(&env.node, "slowstop", "trap '' TERM; while true; do sleep 1; done", "");
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(GRACE.as_secs() as i64);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("slowstop Running", &gantry, || async { (phase(&pods, "slowstop").await? == "Running").then_some(()) })
        .await;

    let deleted = Instant::now();
    pods.delete("slowstop", &Default::default()).await.unwrap();
    eventually("the agent stopping the container", &gantry, || async {
        (!proxy.calls_of("StopContainer").is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep_until((deleted + KILLED_AFTER).into()).await;
    assert_eq!(env.running("slowstop").await.len(), 1, "still in its grace period");
    gantry.kill();

    let gantry = node_behind_proxy_again(&env, &cluster, &proxy);
    let stopped = eventually("the container stopped", &gantry, || async {
        env.running("slowstop").await.is_empty().then(|| deleted.elapsed())
    })
    .await;
    figure(CASE, stopped);
    // A new grace period would end at KILLED_AFTER + GRACE (40 s) at the earliest; the slack
    // below that is for the restarted agent's start-up on a loaded machine.
    assert!(
        stopped >= GRACE - Duration::from_secs(1) && stopped < KILLED_AFTER + GRACE - Duration::from_secs(2),
        "stopped {stopped:?} after the deletion: the original {GRACE:?} grace period, not a new one from the restart"
    );
    eventually("the pod gone from the API", &gantry, || async {
        pods.get_opt("slowstop").await.ok()?.is_none().then_some(())
    })
    .await;
    cluster.cleanup(&env.node).await;
}

/// Case c: containerd restarted (SIGTERM, then started on the same directories) under 30
/// running pods. No container is restarted, and afterwards a deletion and a new pod both
/// complete within 15 s.
#[tokio::test]
async fn containerd_restarted_under_running_pods() {
    const CASE: &str = "containerd-restart-under-30-pods";
    const PODS: usize = 30;
    let Some((mut env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let names: Vec<String> = (0..PODS).map(|i| format!("steady-{i}")).collect();
    for name in &names {
        pods.create(&PostParams::default(), &bound_pod(&env.node, name, "sleep 3600", "")).await.unwrap();
    }
    for name in &names {
        eventually(&format!("{name} Running"), &gantry, || async {
            (phase(&pods, name).await? == "Running").then_some(())
        })
        .await;
    }
    let before = running_containers(&env).await;
    assert_eq!(before.len(), PODS);

    let down = env.ctd.restart().await.unwrap();
    eprintln!("containerd was down for {down:?}");
    let back = Instant::now();
    pods.delete(&names[0], &Default::default()).await.unwrap();
    pods.create(&PostParams::default(), &bound_pod(&env.node, "after", "sleep 3600", "")).await.unwrap();
    loop {
        let gone = pods.get_opt(&names[0]).await.unwrap().is_none();
        if gone && phase(&pods, "after").await.as_deref() == Some("Running") {
            break;
        }
        assert!(
            back.elapsed() < CATCH_UP,
            "deletion and new pod not done {CATCH_UP:?} after containerd came back\n{}",
            common::tail(&gantry.log(), 80)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    figure(CASE, back.elapsed());

    let after = running_containers(&env).await;
    for name in &names[1..] {
        assert_eq!(after.get(name), before.get(name), "{name}: the same container still runs");
        assert_eq!(restarts(&pods, name).await, 0, "{name}: no restart reported");
    }
    assert!(!after.contains_key(&names[0]), "the deleted pod's container is gone");
    cluster.cleanup(&env.node).await;
}

/// A tmpfs mounted on a directory for the test's lifetime (unmounted, lazily, on drop).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount a tmpfs on {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }

    /// Writes zeros to `name` until the file system is full.
    fn fill(&self, name: &str) {
        use std::io::Write;
        let mut file = std::fs::File::create(self.0.join(name)).unwrap();
        let block = vec![0u8; 64 * 1024];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("filling {}: {e}", self.0.display()),
            }
        }
        let _ = file.sync_all();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Case f: the root dir's file system (a small tmpfs) is full. Writing the status file fails
/// with a logged error (once, then at a backoff's pace), the pods keep running, the API still
/// gets their statuses, nothing panics; once there is room the file catches up by itself.
#[tokio::test]
async fn root_dir_disk_full() {
    const CASE: &str = "root-dir-disk-full-status-file-catches-up";
    let Some((env, cluster)) = cluster::setup().await else { return };
    let disk = Tmpfs::mount(&env.root, "16m");
    // A full node file system is disk pressure, for which a kubelet evicts pods: thresholds
    // for memory only (the listed ones replace the defaults), so that this case sees the
    // failing writes rather than evictions.
    configure(&env, "evictionHard: {memory.available: 1Mi}");
    let mut gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let signal = host_dir(&env, "signal");
    let steady = ["steady-0", "steady-1"];
    for name in steady {
        pods.create(&PostParams::default(), &bound_pod(&env.node, name, "sleep 3600", "")).await.unwrap();
    }
    pods.create(&PostParams::default(), &finisher(&env.node, &signal)).await.unwrap();
    for name in steady.iter().chain(&["finisher"]) {
        eventually(&format!("{name} Running in the status file"), &gantry, || async {
            (gantry.phase(name)? == "Running").then_some(())
        })
        .await;
    }
    let containers = running_containers(&env).await;

    disk.fill("filler");
    std::fs::write(signal.join("done"), "").unwrap();
    eventually("the API gets the finisher's Succeeded", &gantry, || async {
        (phase(&pods, "finisher").await? == "Succeeded").then_some(())
    })
    .await;
    eventually("a logged error for the status file", &gantry, || async {
        let log = gantry.log();
        (log.contains("cannot write pod status file") && log.contains("No space left on device")).then_some(())
    })
    .await;
    assert_eq!(gantry.phase("finisher").as_deref(), Some("Running"), "the file could not be updated");

    std::fs::remove_file(disk.0.join("filler")).unwrap();
    let room = Instant::now();
    loop {
        if gantry.phase("finisher").as_deref() == Some("Succeeded") {
            break;
        }
        assert!(room.elapsed() < CATCH_UP, "the status file did not catch up\n{}", common::tail(&gantry.log(), 60));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    figure(CASE, room.elapsed());

    let log = gantry.log();
    let failures = log.matches("cannot write pod status file").count();
    assert!(failures <= 8, "the failure is logged at a backoff's pace, not per change: {failures} lines");
    assert!(!log.contains("panicked"), "no panic:\n{}", common::tail(&log, 60));
    assert!(gantry.try_exit().is_none(), "the agent runs on");
    for name in steady {
        assert_eq!(running_containers(&env).await.get(name), containers.get(name), "{name} runs on");
        assert_eq!(restarts(&pods, name).await, 0);
    }
    cluster.cleanup(&env.node).await;
    drop(gantry);
    drop(disk);
}

/// Pods of `app` that count for its budget: Running, not being deleted.
async fn healthy(pods: &Api<Pod>, app: &str) -> usize {
    let list = pods.list(&kube::api::ListParams::default().labels(&format!("app={app}"))).await.unwrap();
    let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none() && running(p)).count()
}

async fn set_min_available(pdbs: &Api<PodDisruptionBudget>, app: &str, min: usize) {
    let patch = Patch::Merge(json!({"spec": {"minAvailable": min}}));
    pdbs.patch(app, &PatchParams::default(), &patch).await.unwrap();
}

/// Case e: the maintenance controller killed (SIGKILL) three times in a row in the middle of a
/// drain, each time just after an eviction, while the evicted pod is still terminating. Each
/// new controller resumes the drain; no pod is evicted twice (eviction requests counted by the
/// test API server) and the PodDisruptionBudget is never violated (watched throughout).
#[tokio::test]
async fn maintenance_controller_killed_mid_drain_three_times() {
    const CASE: &str = "maintenance-controller-killed-3x-mid-drain-resume";
    const PODS: usize = 4;
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let client = cluster.admin().await;
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("the node to register", &gantry, || async { nodes.get_opt(&env.node).await.ok().flatten() }).await;
    install_crd(&client).await;
    // Another schedulable node, so the safety check does not refuse the maintenance.
    let spare = cluster.unique_node_name("spare");
    let _ = nodes
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": spare}})).unwrap())
        .await;

    let app = format!("web-{}", env.node);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let names: Vec<String> = (0..PODS).map(|i| format!("web-{i}")).collect();
    for name in &names {
        // Ignores SIGTERM: an evicted pod terminates for its whole grace period.
        let mut pod = bound_pod(&env.node, name, "trap '' TERM; while true; do sleep 1; done", "");
        pod.metadata.labels = Some([("app".to_string(), app.clone())].into());
        pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(3);
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for name in &names {
        eventually(&format!("{name} Running"), &gantry, || async {
            (phase(&pods, name).await? == "Running").then_some(())
        })
        .await;
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let pdb = json!({"metadata": {"name": app}, "spec": {"minAvailable": PODS - 1, "selector": {"matchLabels": {"app": app}}}});
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
    eventually("the PDB to allow one disruption", &gantry, || async {
        (pdbs.get(&app).await.ok()?.status?.disruptions_allowed == 1).then_some(())
    })
    .await;

    // The budget watch: healthy pods never fall below minAvailable. (The pods are read before
    // the budget, which the test only ever lowers, so a lowering in between cannot fail it.)
    let watch = {
        let (pods, pdbs, app) = (pods.clone(), pdbs.clone(), app.clone());
        tokio::spawn(async move {
            loop {
                let healthy = healthy(&pods, &app).await as i64;
                let Ok(Some(pdb)) = pdbs.get_opt(&app).await else { return };
                let min = pdb.spec.and_then(|s| s.min_available).map_or(0, |m| match m {
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => i64::from(n),
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(_) => 0,
                });
                assert!(healthy >= min, "PodDisruptionBudget violated: {healthy} healthy pods, minAvailable {min}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let name = format!("maint-{}", env.node);
    let mut maintenance: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "maintenance.gantry.dev/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [env.node]}
            ]}]},
            "stage": "Drain",
        },
    }))
    .unwrap();
    // The pods are bare (no controller): only the opt-in lets the drain evict them.
    maintenance.spec.evict_bare_pods = true;
    maintenances.create(&PostParams::default(), &maintenance).await.unwrap();

    let dir = env.ctd.dir();
    let terminating = |n: usize| {
        let pods = pods.clone();
        let names = names.clone();
        async move {
            let mut count = 0;
            for name in &names {
                match pods.get_opt(name).await.ok()? {
                    Some(p) if p.metadata.deletion_timestamp.is_none() => {}
                    _ => count += 1,
                }
            }
            (count >= n).then_some(count)
        }
    };
    let mut resume_times = Vec::new();
    for round in 1..=3 {
        let started = Instant::now();
        let mut controller = Controller::start(&cluster, &dir);
        let evicted = eventually(&format!("eviction {round}"), &gantry, || terminating(round)).await;
        resume_times.push(started.elapsed());
        assert_eq!(evicted, round, "the budget allows one eviction per round");
        // Killed while the evicted pod still terminates (3 s grace, SIGTERM ignored).
        controller.kill();
        set_min_available(&pdbs, &app, PODS - 1 - round).await;
    }
    let started = Instant::now();
    let controller = Controller::start(&cluster, &dir);
    eventually("the drain to finish", &gantry, || async {
        let status = maintenances.get(&name).await.ok()?.status?;
        let drained = status.conditions.iter().any(|c| c.type_ == CONDITION_DRAINED && c.status == "True");
        (drained && terminating(PODS).await.is_some()).then_some(())
    })
    .await;
    resume_times.push(started.elapsed());
    let slowest = resume_times.iter().max().copied().unwrap_or_default();
    figure(CASE, slowest);
    eprintln!("controller start to its first eviction, per round: {resume_times:?}");
    for name in &names {
        eventually(&format!("{name} gone"), &gantry, || async {
            pods.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await;
    }
    drop(controller);
    watch.abort();
    match watch.await {
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        _ => {}
    }

    match &cluster {
        Cluster::Test(server) => {
            let evictions = server.evictions();
            assert!(evictions.iter().all(|e| !e.terminating), "no eviction of a terminating pod: {evictions:#?}");
            for pod in &names {
                let accepted = evictions.iter().filter(|e| &e.name == pod && (200..300).contains(&e.code)).count();
                assert_eq!(accepted, 1, "{pod} evicted exactly once: {evictions:#?}");
            }
        }
        Cluster::Real(_) => eprintln!("{CASE}: eviction requests are counted on the test API server only"),
    }
    let _ = maintenances.delete(&name, &DeleteParams::default()).await;
    let _ = pdbs.delete(&app, &DeleteParams::default()).await;
    let _ = nodes.delete(&spare, &DeleteParams::default()).await;
    cluster.cleanup(&env.node).await;
}
