//! End-to-end: `gantry kubelet` in standalone mode running static pods on a real containerd.

mod common;

use common::{Env, eventually, pod_yaml, static_name};

#[tokio::test]
async fn static_pod_runs_logs_and_stops_gracefully_when_its_manifest_goes() {
    let Some(env) = Env::start().await else { return };
    let out = env.ctd.dir().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let extra = format!(
        "  terminationGracePeriodSeconds: 20\n  volumes:\n  - name: out\n    hostPath:\n      path: {}\n",
        out.display()
    );
    let yaml = pod_yaml(
        "web",
        "trap 'echo graceful > /out/stopped; exit 0' TERM; echo hello from web; while true; do sleep 1; done",
        &extra,
    )
    .replace("    command:", "    volumeMounts:\n    - name: out\n      mountPath: /out\n    command:");
    env.write_manifest("web.yaml", &yaml);
    let gantry = env.kubelet(&[]);
    let name = static_name("web");

    let pod =
        eventually("web Running in the status file", &gantry, || async { gantry.pod_in_phase(&name, "Running") }).await;
    let uid = pod.metadata.uid.clone().unwrap();
    assert_eq!(uid.len(), 32, "static pod UID is a content hash");
    let annotations = pod.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["kubernetes.io/config.source"], "file");
    assert_eq!(annotations["kubernetes.io/config.hash"], uid);
    assert!(annotations.contains_key("kubernetes.io/config.seen"));
    let status = pod.status.unwrap();
    let ip: std::net::Ipv4Addr = status.pod_ip.as_deref().expect("pod IP from CNI").parse().unwrap();
    assert!(env.ctd.network().contains(ip), "{ip} is in the test's pod subnet");
    let cs = &status.container_statuses.unwrap()[0];
    assert!(cs.ready);
    assert!(cs.container_id.as_deref().unwrap().starts_with("containerd://"));
    assert_eq!(env.running(&name).await.len(), 1);

    let log = env.pod_logs.join(format!("default_{name}_{uid}/main/0.log"));
    let line = eventually("the container's CRI log", &gantry, || async {
        std::fs::read_to_string(&log).ok().filter(|l| l.contains("hello from web"))
    })
    .await;
    // CRI log format: <RFC3339Nano timestamp> <stream> <P|F> <message>
    let fields: Vec<&str> = line.lines().next().unwrap().splitn(4, ' ').collect();
    assert_eq!(&fields[1..], ["stdout", "F", "hello from web"]);

    env.remove_manifest("web.yaml");
    eventually("the pod's sandbox removed", &gantry, || async { env.sandboxes().await.is_empty().then_some(()) }).await;
    assert_eq!(std::fs::read_to_string(out.join("stopped")).unwrap().trim(), "graceful", "SIGTERM handler ran");
    eventually("the pod gone from the status file", &gantry, || async { gantry.pod(&name).is_none().then_some(()) })
        .await;
    assert!(!log.exists(), "pod log directory removed with the pod");
}

#[tokio::test]
async fn restart_policies_and_crash_loop_backoff() {
    let Some(env) = Env::start().await else { return };
    env.write_manifest("always.yaml", &pod_yaml("always", "echo run; exit 3", ""));
    env.write_manifest("onfailure.yaml", &pod_yaml("onfailure", "exit 0", "  restartPolicy: OnFailure\n"));
    env.write_manifest("never.yaml", &pod_yaml("never", "exit 7", "  restartPolicy: Never\n"));
    let gantry = env.kubelet(&[]);

    // Always: restarted at once the first time, then held back by the crash-loop backoff.
    let always = static_name("always");
    let cs = eventually("always restarted and in CrashLoopBackOff", &gantry, || async {
        let cs = gantry.pod(&always)?.status?.container_statuses?.pop()?;
        let waiting = cs.state.as_ref()?.waiting.as_ref()?.reason.clone()?;
        (cs.restart_count >= 1 && waiting == "CrashLoopBackOff").then_some(cs)
    })
    .await;
    let last = cs.last_state.unwrap().terminated.unwrap();
    assert_eq!(last.exit_code, 3);
    let message = cs.state.unwrap().waiting.unwrap().message.unwrap();
    assert!(message.starts_with("back-off 10s restarting failed container=main pod="), "{message}");
    assert!(gantry.log().contains("Back-off restarting failed container main"), "BackOff event logged");

    let onfailure = static_name("onfailure");
    eventually("onfailure Succeeded", &gantry, || async { (gantry.phase(&onfailure)? == "Succeeded").then_some(()) })
        .await;
    let never = static_name("never");
    eventually("never Failed", &gantry, || async { (gantry.phase(&never)? == "Failed").then_some(()) }).await;
    let never_status = gantry.pod(&never).unwrap().status.unwrap().container_statuses.unwrap().pop().unwrap();
    assert_eq!(never_status.restart_count, 0);
    assert_eq!(never_status.state.unwrap().terminated.unwrap().exit_code, 7);
    let ready_sandboxes: Vec<_> = env.sandboxes().await.into_iter().filter(|s| s.2).map(|s| s.1).collect();
    assert!(!ready_sandboxes.contains(&never), "a finished pod's sandbox is stopped: {ready_sandboxes:?}");
    assert!(!ready_sandboxes.contains(&onfailure), "a finished pod's sandbox is stopped: {ready_sandboxes:?}");
    let attempts: Vec<u32> =
        env.containers().await.into_iter().filter(|c| c.pod == onfailure).map(|c| c.attempt).collect();
    assert_eq!(attempts, [0], "OnFailure does not restart a container that succeeded");
}

#[tokio::test]
async fn init_containers_run_in_order_before_the_app() {
    let Some(env) = Env::start().await else { return };
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: inits
spec:
  volumes:
  - name: work
    emptyDir: {{}}
  initContainers:
  - name: first
    image: {image}
    command: ["sh", "-c", "echo one >> /work/order"]
    volumeMounts: [{{name: work, mountPath: /work}}]
  - name: second
    image: {image}
    command: ["sh", "-c", "echo two >> /work/order"]
    volumeMounts: [{{name: work, mountPath: /work}}]
  containers:
  - name: app
    image: {image}
    command: ["sh", "-c", "cat /work/order; sleep 3600"]
    volumeMounts: [{{name: work, mountPath: /work}}]
"#,
        image = gantry_testkit::BUSYBOX_IMAGE
    );
    env.write_manifest("inits.yaml", &yaml);
    let gantry = env.kubelet(&[]);
    let name = static_name("inits");
    let pod = eventually("inits Running", &gantry, || async { gantry.pod_in_phase(&name, "Running") }).await;
    let status = pod.status.unwrap();
    let inits = status.init_container_statuses.unwrap();
    assert!(
        inits
            .iter()
            .all(|s| s.state.as_ref().unwrap().terminated.as_ref().unwrap().reason.as_deref() == Some("Completed"))
    );
    let uid = pod.metadata.uid.unwrap();
    let log = env.pod_logs.join(format!("default_{name}_{uid}/app/0.log"));
    let text = eventually("app output", &gantry, || async {
        std::fs::read_to_string(&log).ok().filter(|t| t.contains("two"))
    })
    .await;
    let words: Vec<&str> = text.lines().map(|l| l.rsplit(' ').next().unwrap()).collect();
    assert_eq!(words, ["one", "two"]);
}

#[tokio::test]
async fn changed_manifest_replaces_the_pod_and_bad_manifests_hurt_nobody() {
    let Some(env) = Env::start().await else { return };
    env.write_manifest("app.yaml", &pod_yaml("app", "sleep 3600", ""));
    env.write_manifest("broken.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: broken\nspec:\n  containers:\n  - name: c\n    image: 42\n    ports: nope\n");
    env.write_manifest("dup.yaml", &pod_yaml("app", "sleep 1", ""));
    let gantry = env.kubelet(&[]);
    let name = static_name("app");
    let first = eventually("app running", &gantry, || async { env.running(&name).await.pop() }).await;
    let log = eventually("errors for the bad manifests logged", &gantry, || async {
        let log = gantry.log();
        (log.contains("broken.yaml") && log.contains("dup.yaml")).then_some(log)
    })
    .await;
    assert!(log.contains("spec.containers[0].ports"), "error names the field:\n{}", common::tail(&log, 30));
    assert!(log.contains("already defines"), "duplicate reported:\n{}", common::tail(&log, 30));
    assert_eq!(env.sandboxes().await.len(), 1, "neither bad manifest produced a pod");

    env.write_manifest("app.yaml", &pod_yaml("app", "sleep 3601", ""));
    let second = eventually("app replaced", &gantry, || async {
        env.running(&name).await.pop().filter(|c| c.pod_uid != first.pod_uid)
    })
    .await;
    assert_ne!(second.id, first.id);
    eventually("old incarnation removed", &gantry, || async {
        let sandboxes = env.sandboxes().await;
        (sandboxes.len() == 1).then_some(())
    })
    .await;
}

#[tokio::test]
async fn restart_keeps_running_containers_and_cleans_up_vanished_pods() {
    let Some(env) = Env::start().await else { return };
    env.write_manifest("keep.yaml", &pod_yaml("keep", "sleep 3600", ""));
    env.write_manifest("gone.yaml", &pod_yaml("gone", "sleep 3600", "  terminationGracePeriodSeconds: 2\n"));
    let mut gantry = env.kubelet(&[]);
    let (keep, gone) = (static_name("keep"), static_name("gone"));
    eventually("both running", &gantry, || async {
        (env.running(&keep).await.len() == 1 && env.running(&gone).await.len() == 1).then_some(())
    })
    .await;
    let before = env.running(&keep).await;

    gantry.kill();
    env.remove_manifest("gone.yaml");
    assert_eq!(env.running(&keep).await, before, "pods keep running while the agent is down");

    let gantry = env.kubelet(&[]);
    eventually("vanished pod cleaned up", &gantry, || async {
        env.sandboxes().await.iter().all(|s| s.1 != gone).then_some(())
    })
    .await;
    eventually("status file rewritten", &gantry, || async { gantry.pod_in_phase(&keep, "Running") }).await;
    assert_eq!(env.running(&keep).await, before, "same container IDs after the restart");
    assert_eq!(env.containers().await.iter().filter(|c| c.pod == keep).count(), 1, "nothing duplicated");
}

#[tokio::test]
async fn manifest_url_with_headers() {
    let Some(env) = Env::start().await else { return };
    let body = pod_yaml("fromurl", "sleep 3600", "");
    let server = common_http::serve(body, ("X-Token", "secret"));
    let url = format!("--manifest-url=http://{}/pod.yaml", server);
    let gantry = env.kubelet(&[&url, "--manifest-url-header=X-Token:secret", "--http-check-frequency=1s"]);
    let name = static_name("fromurl");
    let pod = eventually("pod from URL running", &gantry, || async { gantry.pod_in_phase(&name, "Running") }).await;
    assert_eq!(pod.metadata.annotations.unwrap()["kubernetes.io/config.source"], "http");
    assert!(!gantry.log().contains("secret"), "header values are masked in logs");
}

mod common_http {
    //! A one-route HTTP server on loopback that checks a header.
    use std::io::{BufRead, BufReader, Write};
    use std::net::{SocketAddr, TcpListener};

    pub fn serve(body: String, (header, value): (&'static str, &'static str)) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut authorized = false;
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    if line.to_ascii_lowercase().starts_with(&format!("{}: {}", header.to_ascii_lowercase(), value)) {
                        authorized = true;
                    }
                    line.clear();
                }
                let (status, payload) = if authorized { ("200 OK", body.as_str()) } else { ("403 Forbidden", "") };
                let mut stream = stream;
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
                    payload.len()
                );
            }
        });
        addr
    }
}

#[tokio::test]
async fn host_network_pods_share_the_node_network() {
    let Some(env) = Env::start().await else { return };
    env.write_manifest(
        "host.yaml",
        &pod_yaml("host", "readlink /proc/self/ns/net; sleep 3600", "  hostNetwork: true\n"),
    );
    let gantry = env.kubelet(&[]);
    let name = static_name("host");
    let pod = eventually("host-network pod Running", &gantry, || async { gantry.pod_in_phase(&name, "Running") }).await;
    let uid = pod.metadata.uid.unwrap();
    let log = env.pod_logs.join(format!("default_{name}_{uid}/main/0.log"));
    let host_netns = std::fs::read_link("/proc/self/ns/net").unwrap().display().to_string();
    let line = eventually("the pod's network namespace printed", &gantry, || async {
        std::fs::read_to_string(&log).ok().filter(|text| text.contains("net:["))
    })
    .await;
    assert!(line.trim_end().ends_with(&host_netns), "pod netns {line:?}, host netns {host_netns}");
}

#[tokio::test]
async fn dead_containers_are_garbage_collected_keeping_the_newest() {
    let Some(env) = Env::start().await else { return };
    env.write_manifest("crash.yaml", &pod_yaml("crash", "exit 1", ""));
    let gantry = env.kubelet(&[]);
    let name = static_name("crash");
    // Restarts happen at once, then after 10 s and 20 s; the collector runs every minute.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(150);
    loop {
        let containers: Vec<_> = env.containers().await.into_iter().filter(|c| c.pod == name).collect();
        let newest = containers.iter().map(|c| c.attempt).max().unwrap_or(0);
        if newest >= 2 && containers.len() == 1 {
            assert_eq!(containers[0].attempt, newest, "the newest instance is kept");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "old instances never collected: {containers:?}\n{}",
            common::tail(&gantry.log(), 40)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn separate_image_endpoint_is_validated() {
    let Some(env) = Env::start().await else { return };
    // A bare path is accepted (deprecated form) and may differ from the runtime endpoint.
    let bare = env.ctd.socket_path().display().to_string();
    env.write_manifest("img.yaml", &pod_yaml("img", "sleep 3600", ""));
    let gantry = env.kubelet(&[&format!("--image-service-endpoint={bare}")]);
    eventually("pod Running with the separate image endpoint", &gantry, || async {
        gantry.pod_in_phase(&static_name("img"), "Running")
    })
    .await;
    assert!(gantry.log().contains("deprecated"), "bare path warned about:\n{}", common::tail(&gantry.log(), 20));
    drop(gantry);

    let missing = env.ctd.dir().join("no-image.sock");
    let mut gantry = env.kubelet(&[&format!("--image-service-endpoint=unix://{}", missing.display())]);
    let deadline = std::time::Instant::now() + common::DEADLINE;
    let status = loop {
        if let Some(status) = gantry.try_exit() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "agent did not exit on a missing image endpoint");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(!status.success());
    let log = gantry.log();
    assert!(
        log.contains(&missing.display().to_string()) && log.contains("is the runtime running?"),
        "{}",
        common::tail(&log, 10)
    );
}

/// `enforceNodeAllocatable: [pods, kube-reserved]` sets kubeReserved as the limits of the
/// existing kubeReservedCgroup, as upstream's `enforceExistingCgroup`; a missing
/// systemReservedCgroup stops the agent with upstream's message.
#[tokio::test]
async fn reserved_cgroups_get_their_reservations_as_limits() {
    let Some(env) = Env::start().await else { return };
    if !std::path::Path::new("/sys/fs/cgroup/memory").is_dir() {
        return; // The host suite covers cgroup v1; the VM suite covers v2.
    }
    let cgroup = format!("{}/kube-reserved", env.ctd.cgroup_root());
    let dir = |controller: &str| std::path::Path::new("/sys/fs/cgroup").join(controller).join(&cgroup[1..]);
    for controller in ["cpu", "memory", "pids"] {
        std::fs::create_dir_all(dir(controller)).unwrap();
    }
    let flags = [
        "--enforce-node-allocatable=pods,kube-reserved".to_string(),
        format!("--kube-reserved-cgroup={cgroup}"),
        "--kube-reserved=cpu=200m,memory=128Mi,pid=500".to_string(),
    ];
    let gantry = env.kubelet(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let read = |controller: &str, file: &str| {
        std::fs::read_to_string(dir(controller).join(file)).map(|v| v.trim().to_string()).unwrap_or_default()
    };
    eventually("kubeReserved on its cgroup", &gantry, || async {
        (read("memory", "memory.limit_in_bytes") == (128u64 << 20).to_string()).then_some(())
    })
    .await;
    assert_eq!(read("cpu", "cpu.shares"), "204", "200m");
    assert_eq!(read("pids", "pids.max"), "500");
    assert!(gantry.log().contains(&format!("Updated limits on kube reserved cgroup {cgroup}")), "{}", gantry.log());
    drop(gantry);

    let missing = format!("{}/no-such-cgroup", env.ctd.cgroup_root());
    let flags = [
        "--enforce-node-allocatable=pods,system-reserved".to_string(),
        format!("--system-reserved-cgroup={missing}"),
        "--system-reserved=memory=64Mi".to_string(),
    ];
    let mut gantry = env.kubelet(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let deadline = std::time::Instant::now() + common::DEADLINE;
    let status = loop {
        if let Some(status) = gantry.try_exit() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the agent did not stop on a missing systemReservedCgroup");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(!status.success());
    let expected = format!(
        "Failed to enforce System Reserved Cgroup Limits on {missing:?}: cgroup {missing:?} has some missing paths"
    );
    assert!(gantry.log().contains(&expected), "{}", common::tail(&gantry.log(), 20));
}

/// The agent sets its own `oom_score_adj` at start (`oomScoreAdj`, -999 by default, as
/// upstream), so that the OOM killer picks the pods' processes before it; `--oom-score-adj`
/// sets another value. Lowering the score takes CAP_SYS_RESOURCE: where the agent lacks it (as
/// in some containers), it logs upstream's message and goes on, as upstream does. (The VM tests
/// check -999 on a host that has it.)
#[tokio::test]
async fn the_agent_sets_its_own_oom_score_adj() {
    let Some(env) = Env::start().await else { return };
    let score =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).ok()?.trim().parse::<i32>().ok();
    let inherited = score(std::process::id()).unwrap();
    assert!(inherited < 500, "the test runs at {inherited}; the agent must raise its score to show the flag works");

    // Raising needs no privilege.
    let mut gantry = env.kubelet(&["--oom-score-adj=500"]);
    let pid = gantry.pid();
    eventually("the agent's oom_score_adj 500", &gantry, || async { (score(pid)? == 500).then_some(()) }).await;
    gantry.kill();

    let mut gantry = env.kubelet(&[]);
    let pid = gantry.pid();
    if may_lower_oom_score() {
        eventually("the agent's oom_score_adj -999", &gantry, || async { (score(pid)? == -999).then_some(()) }).await;
    } else {
        eventually("the agent ready after it could not lower its score", &gantry, || async {
            let log = gantry.log();
            (log.contains("Failed to ApplyOOMScoreAdj oom_score_adj=-999") && log.contains("node agent ready"))
                .then_some(())
        })
        .await;
        assert_eq!(score(pid), Some(inherited), "the score is left as it was");
    }
    gantry.kill();
}

/// Whether this process (and so the agent it starts) has CAP_SYS_RESOURCE.
fn may_lower_oom_score() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let effective = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim();
    u64::from_str_radix(effective, 16).unwrap() & (1 << CAP_SYS_RESOURCE) != 0
}
