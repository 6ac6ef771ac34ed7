//! End-to-end graceful node shutdown on a real systemd host (the VM of `scripts/vm`, cgroup v2),
//! once per cgroup driver (systemd, then cgroupfs: the poweroff ends the boot, so each driver
//! has its own, one at a time): the guest's Gantry joins the host test's API server (over the
//! VM's one forward, as in `vm_resize.rs`) with `shutdownGracePeriod: 45s` and
//! `shutdownGracePeriodCriticalPods: 33s`, the host creates three pods whose SIGTERM handlers
//! write the guest's uptime to the 9p share, and the guest script `vm/shutdown.sh` runs
//! `systemctl poweroff`. The host then checks, from the share and the API server:
//! - logind's `InhibitDelayMaxSec` (5 s by default) was raised to 45 s by upstream's drop-in (the
//!   critical window is long because, under software emulation, a pod's sandbox takes 10-16 s
//!   to stop after its container exited, and its final status comes after that);
//! - the regular pods got SIGTERM first, the critical one (system-node-critical) only once the
//!   regular group was done, and the regular pod that ignores SIGTERM was killed at the end of
//!   its group's 12 s window, not at its own 60 s;
//! - the pods ended `Failed` with reason `Terminated`, upstream's message and the
//!   `DisruptionTarget` condition; the Node went from Ready to not ready with "node is shutting
//!   down", and the `NodeShutdown` event was recorded; upstream's state file and shutdown
//!   metrics have the shutdown's start and end;
//! - on the way, that the containers' cgroups, where the driver puts them, have
//!   `memory.oom.group` 1 (cgroup v2 without `singleProcessOOMKill`, on either driver), and
//!   that Gantry set its own `oom_score_adj` to -999 (`oomScoreAdj`'s default).
//!
//! Nothing of the shutdown differs by driver upstream: the shutdown manager speaks to logind and
//! stops pods through the runtime whichever driver made their cgroups.
//!
//! Needs root and the VM image (`scripts/vm build`, which `scripts/test` runs); otherwise the
//! tests print SKIPPED, and fail under `CI=true`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_test_apiserver::{TestApiServer, User};
use gantry_testkit::vm::{self, Forward};
use k8s_openapi::api::core::v1::{Event, Node, NodeCondition, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use vm_cluster::{GUEST_API, NODE, guest_kubeconfig, stripped_gantry, until};

#[path = "common/vm_cluster.rs"]
mod vm_cluster;

/// The longest the whole boot may take (TCG emulation on a loaded machine is slow).
const VM_TIMEOUT: Duration = Duration::from_secs(900);
/// The regular pods' window: shutdownGracePeriod - shutdownGracePeriodCriticalPods.
const REGULAR_WINDOW: f64 = 12.0;
/// Slack for TCG emulation on a loaded machine.
const SLACK: f64 = 8.0;
const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

/// A pod whose handler writes "<uptime> <name> term" on SIGTERM and, unless `stubborn`,
/// "<uptime> <name> exit" 3 s later as it exits; a stubborn one keeps running until killed,
/// appending its uptime to `<name>-alive` every 0.2 s, so the last line says when it died.
fn pod(name: &str, critical: bool, stubborn: bool) -> Pod {
    // No single quotes in here: the handler goes into trap '...'.
    let stamp = |what: &str| format!("read up rest </proc/uptime; echo \"$up {name} {what}\" >>/results/signals");
    let on_term =
        if stubborn { stamp("term") } else { format!("{}; sleep 3; {}; exit 0", stamp("term"), stamp("exit")) };
    let beat = if stubborn {
        format!("read up rest </proc/uptime; echo $up >>/results/{name}-alive; ")
    } else {
        String::new()
    };
    let script = format!("trap '{on_term}' TERM; {}; while :; do {beat}sleep 0.2; done", stamp("start"));
    let mut spec = json!({
        "nodeName": NODE, "hostNetwork": true, "terminationGracePeriodSeconds": 60,
        "automountServiceAccountToken": false,
        "containers": [{"name": "app", "image": gantry_testkit::BUSYBOX_IMAGE, "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "results", "mountPath": "/results"}]}],
        "volumes": [{"name": "results", "hostPath": {"path": "/mnt/host/results", "type": "Directory"}}]
    });
    if critical {
        spec["priorityClassName"] = json!("system-node-critical");
    }
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}))
        .unwrap()
}

/// "<uptime> <name> <what>" lines → {(name, what): uptime}.
fn signals(text: &str) -> HashMap<(String, String), f64> {
    text.lines()
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            let t = p.next()?.parse().ok()?;
            Some(((p.next()?.to_string(), p.next()?.to_string()), t))
        })
        .collect()
}

fn running(pod: &Pod) -> bool {
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    statuses.is_some_and(|s| s.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some())))
}

/// The cgroup driver of one boot: Gantry's `cgroupDriver`, containerd's `SystemdCgroup` to match.
#[derive(Debug, Clone, Copy)]
enum Driver {
    Systemd,
    Cgroupfs,
}

impl Driver {
    fn name(self) -> &'static str {
        match self {
            Driver::Systemd => "systemd",
            Driver::Cgroupfs => "cgroupfs",
        }
    }

    /// Where the driver puts a BestEffort pod's container, below /sys/fs/cgroup.
    fn container_cgroup(self, pod_uid: &str, container_id: &str) -> String {
        match self {
            Driver::Systemd => {
                let uid = pod_uid.replace('-', "_");
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/\
                     cri-containerd-{container_id}.scope"
                )
            }
            Driver::Cgroupfs => format!("/kubepods/besteffort/pod{pod_uid}/{container_id}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn graceful_node_shutdown_stops_regular_then_critical_pods_systemd_driver() {
    graceful_node_shutdown(Driver::Systemd).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn graceful_node_shutdown_stops_regular_then_critical_pods_cgroupfs_driver() {
    graceful_node_shutdown(Driver::Cgroupfs).await;
}

/// One VM at a time: two emulated guests on the machine's cores would stretch the windows the
/// test measures.
static ONE_VM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn graceful_node_shutdown(driver: Driver) {
    let _one_vm = ONE_VM.lock().await;
    let server = TestApiServer::start().await;
    let port: u16 = server.url().rsplit_once(':').unwrap().1.parse().unwrap();
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm");
    let files = |dir: &Path| {
        let choice = dir.join("driver");
        std::fs::write(&choice, driver.name()).unwrap();
        vec![stripped_gantry(dir), guest_kubeconfig(&server, dir), choice]
    };
    let forward = Forward { guest: GUEST_API, host_port: port };
    let test = format!("vm_shutdown_{}", driver.name());
    let Some(vm_run) = vm::start_for_test(&test, &here.join("shutdown.sh"), files, VM_TIMEOUT, Some(forward)) else {
        return;
    };
    let share = vm_run.share();
    let vm = tokio::task::spawn_blocking(move || vm::finish_for_test(vm_run));

    let admin = server.client(&User::Admin).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let names = ["regular", "stubborn", "critical"];
    let container_ids = Arc::new(Mutex::new(Vec::new()));
    let started = tokio::spawn({
        let (share, pods, container_ids) = (share.clone(), pods.clone(), container_ids.clone());
        async move {
            let lock_held = share.join("results/ready");
            until("the guest's Gantry holding its inhibitor lock", || async { lock_held.exists().then_some(()) }).await;
            for (name, critical, stubborn) in
                [("regular", false, false), ("stubborn", false, true), ("critical", true, false)]
            {
                pods.create(&PostParams::default(), &pod(name, critical, stubborn)).await.unwrap();
            }
            for name in names {
                let pod = until(&format!("{name} running"), || async {
                    let pod = pods.get(name).await.ok()?;
                    running(&pod).then_some(pod)
                })
                .await;
                let uid = pod.metadata.uid.clone().unwrap();
                let id = pod.status.and_then(|s| s.container_statuses?.pop()?.container_id).unwrap();
                container_ids.lock().unwrap().push((uid, id.trim_start_matches("containerd://").to_string()));
            }
            let nodes: Api<Node> = Api::all(pods.into_client());
            until("the node Ready", || async { (ready(&nodes.get(NODE).await.ok()?)?.status == "True").then_some(()) })
                .await;
            std::fs::write(share.join("results/go"), "").unwrap();
        }
    })
    .await;
    if started.is_err() {
        let _ = std::fs::write(share.join("results/abort"), "");
    }
    let run = vm.await.unwrap();
    let report = || format!("{}\n--- gantry.log (tail) ---\n{}", run.report(), tail(&run.read("gantry.log"), 80));
    if let Err(failed) = started {
        eprintln!("{}", report());
        std::panic::resume_unwind(failed.into_panic());
    }
    assert_eq!(run.exit, 0, "the guest script failed\n{}", report());
    assert_eq!(run.read("cgroup-fs").trim(), "cgroup2fs", "the guest runs cgroup v2");
    eprintln!(
        "VM shutdown test ({} driver): guest booted in {:?} s, whole run {:.1} s",
        driver.name(),
        run.boot_seconds(),
        run.elapsed.as_secs_f64()
    );

    // logind's delay was too short (5 s) for 45 s, so Gantry wrote upstream's drop-in.
    assert_eq!(run.read("inhibit-delay-before").trim(), "t 5000000", "logind's default InhibitDelayMaxSec");
    assert_eq!(run.read("inhibit-delay-after").trim(), "t 45000000", "raised to shutdownGracePeriod\n{}", report());
    assert_eq!(run.read("logind-drop-in"), "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=45\n");
    let inhibitors = run.read("inhibitors");
    assert!(
        inhibitors.contains("kubelet") && inhibitors.contains("Kubelet needs time to handle node shutdown"),
        "{inhibitors}"
    );

    // Gantry lowered its own score at start (oomScoreAdj's default), as upstream's kubelet does.
    assert_eq!(run.read("gantry-oom-score-adj").trim(), "-999", "Gantry's own oom_score_adj");

    // cgroup v2 without singleProcessOOMKill: the OOM killer stops a whole container. The
    // containers' cgroups are where this driver puts them.
    let oom_group = run.read("oom-group");
    for (uid, id) in container_ids.lock().unwrap().iter() {
        let file = format!("/sys/fs/cgroup{}/memory.oom.group", driver.container_cgroup(uid, id));
        let line = oom_group.lines().find(|l| l.split(' ').next() == Some(file.as_str()));
        assert_eq!(line.and_then(|l| l.rsplit(' ').next()), Some("1"), "{file}:\n{oom_group}");
    }

    // The order and the deadlines, in guest uptime seconds.
    let s = signals(&run.read("signals"));
    let at = |name: &str, what: &str| {
        *s.get(&(name.to_string(), what.to_string()))
            .unwrap_or_else(|| panic!("no {name} {what} in the signals file: {s:?}\n{}", report()))
    };
    let clocks: Vec<f64> = run.read("poweroff-at").split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let [poweroff, wall_at_poweroff] = clocks[..] else { panic!("the guest recorded when it powered off: {clocks:?}") };
    // Gantry's record of the shutdown (upstream's state file): its start is when logind's
    // signal reached it, in guest uptime through the wall clock read at the poweroff.
    let state: serde_json::Value = serde_json::from_str(&run.read("graceful_node_shutdown_state"))
        .unwrap_or_else(|e| panic!("graceful_node_shutdown_state: {e}\n{}", report()));
    let start: k8s_openapi::jiff::Timestamp = state["startTime"].as_str().unwrap().parse().unwrap();
    let end: k8s_openapi::jiff::Timestamp = state["endTime"].as_str().unwrap().parse().unwrap();
    let detected = poweroff + (start.as_nanosecond() as f64 / 1e9 - wall_at_poweroff);
    assert!(
        detected > poweroff - 0.5 && detected - poweroff < 2.0 * SLACK,
        "logind's PrepareForShutdown reached Gantry at {detected:.2}, poweroff at {poweroff} (systemd itself took up \
         to 6.4 s to send it under TCG on a loaded machine)"
    );
    let regular = at("regular", "term");
    assert!(
        regular >= detected && regular - detected < SLACK,
        "regular pods stop at once: {s:?}, shutdown detected at {detected:.2}"
    );
    assert!((at("stubborn", "term") - regular).abs() < SLACK, "the regular group stops together: {s:?}");
    assert!(at("regular", "exit") >= regular + 3.0, "{s:?}");
    let critical = at("critical", "term");
    assert!(
        critical >= at("regular", "exit") && critical >= detected + REGULAR_WINDOW,
        "the critical pod stops only once the regular group is done (the stubborn pod killed at the end of the \
         12 s window, which began after the shutdown was detected): {s:?}, detected at {detected:.2}"
    );
    let after_stubborn = critical - at("stubborn", "term");
    eprintln!(
        "VM shutdown test ({} driver): regular SIGTERM {:.1} s after the shutdown was detected, critical SIGTERM \
         {after_stubborn:.1} s after the stubborn pod's (window {REGULAR_WINDOW} s)",
        driver.name(),
        regular - detected
    );
    assert!(
        after_stubborn < REGULAR_WINDOW + SLACK,
        "the critical group starts at the end of the regular group's window, without waiting longer for it: \
         {after_stubborn:.1} s after the stubborn pod's SIGTERM: {s:?}\n{}",
        report()
    );
    let alive = run.read("stubborn-alive");
    let died: f64 = alive.lines().rev().find_map(|l| l.trim().parse().ok()).expect("the stubborn pod's heartbeat");
    let grace = died - at("stubborn", "term");
    assert!(
        (REGULAR_WINDOW - 2.0..REGULAR_WINDOW + SLACK).contains(&grace),
        "the stubborn pod's grace is the group's 12 s, not its own 60 s: killed {grace:.1} s after SIGTERM: {s:?}"
    );
    assert!(at("critical", "exit") >= critical + 3.0, "the critical pod had its handler's time: {s:?}");

    // The final statuses as the API server has them.
    for name in names {
        let pod = pods.get(name).await.unwrap();
        let status = pod.status.unwrap();
        assert_eq!(
            (status.phase.as_deref(), status.reason.as_deref(), status.message.as_deref()),
            (Some("Failed"), Some("Terminated"), Some(MESSAGE)),
            "{name}\n{}",
            report()
        );
        let conditions = status.conditions.unwrap_or_default();
        let target = conditions.iter().find(|c| c.type_ == "DisruptionTarget").expect("a DisruptionTarget condition");
        assert_eq!(
            (target.status.as_str(), target.reason.as_deref(), target.message.as_deref()),
            ("True", Some("TerminationByKubelet"), Some(MESSAGE)),
            "{name}"
        );
    }
    // Upstream's state file under the root directory (copied once more when the shutdown
    // stopped the guest's script, after Gantry had released its lock: with the end), and the
    // shutdown start metric (copied while the shutdown ran).
    assert!(start.as_second() > 1_700_000_000, "{state}");
    let took = end.duration_since(start).as_secs_f64();
    assert!(took > 3.0 && took <= 45.0 + SLACK, "the pods' stop took {took} s, within shutdownGracePeriod: {state}");
    let metrics = run.read("shutdown-metrics");
    let value = |name: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_default();
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    let metric_start = value("kubelet_graceful_shutdown_start_time_seconds");
    assert!((metric_start - start.as_nanosecond() as f64 / 1e9).abs() < 0.001, "{metrics} vs {state}");
    assert!(value("kubelet_graceful_shutdown_end_time_seconds") >= 0.0, "{metrics}");

    let ready = ready(&Api::<Node>::all(admin.clone()).get(NODE).await.unwrap()).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref(), ready.message.as_deref()),
        ("False", Some("KubeletNotReady"), Some("node is shutting down"))
    );
    let events = Api::<Event>::namespaced(admin, "default").list(&ListParams::default()).await.unwrap();
    assert!(
        events.items.iter().any(|e| e.reason.as_deref() == Some("NodeShutdown")
            && e.message.as_deref() == Some("Shutdown manager detected shutdown event")),
        "the NodeShutdown event"
    );
}

fn ready(node: &Node) -> Option<NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").cloned()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
