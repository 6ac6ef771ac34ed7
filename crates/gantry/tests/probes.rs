//! End-to-end, cluster mode: container lifecycle on the real containerd. Liveness failures
//! restart containers, readiness drives the Ready condition both ways, httpGet/tcpSocket probes
//! reach busybox `httpd` in the pod, postStart/preStop hooks run (preStop before SIGTERM),
//! termination messages reach the terminated state, and service variables reach the env.

mod common;

use std::path::PathBuf;

use common::cluster;
use common::{Env, eventually, static_name};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

/// A pod bound to the node from YAML under `spec:` (two-space indent) whose containers use
/// the busybox image (`IMAGE` in the text is replaced).
fn pod(node: &str, name: &str, spec: &str) -> Pod {
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n  automountServiceAccountToken: false\n{}",
        spec.replace("IMAGE", gantry_testkit::BUSYBOX_IMAGE)
    );
    serde_yaml_ng::from_str(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

/// A host directory for a hostPath volume, fresh per test.
fn host_dir(env: &Env, name: &str) -> PathBuf {
    let dir = env.ctd.dir().join(format!("data-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn status(pods: &Api<Pod>, name: &str, container: &str) -> Option<ContainerStatus> {
    let statuses = pods.get(name).await.ok()?.status?.container_statuses?;
    statuses.into_iter().find(|s| s.name == container)
}

async fn condition(pods: &Api<Pod>, name: &str, type_: &str) -> Option<String> {
    let conditions = pods.get(name).await.ok()?.status?.conditions?;
    conditions.into_iter().find(|c| c.type_ == type_).map(|c| c.status)
}

/// An event about `pod` with `reason` whose note contains `note`.
async fn event(admin: &kube::Client, pod: &str, reason: &str, note: &str) -> Option<Event> {
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let list = events.list(&Default::default()).await.ok()?;
    list.items.into_iter().find(|e| {
        e.reason.as_deref() == Some(reason)
            && e.involved_object.name.as_deref() == Some(pod)
            && e.message.as_deref().unwrap_or_default().contains(note)
    })
}

#[tokio::test]
async fn failing_liveness_probe_restarts_the_container() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let spec = r#"  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
    livenessProbe:
      exec:
        command: ["sh", "-c", "echo sick; exit 1"]
      periodSeconds: 1
      failureThreshold: 2
"#;
    pods.create(&PostParams::default(), &pod(&env.node, "sick", spec)).await.unwrap();
    eventually("a restart counted", &gantry, || async {
        (status(&pods, "sick", "main").await?.restart_count >= 1).then_some(())
    })
    .await;
    let killing = eventually("a Killing event", &gantry, || async {
        event(&admin, "sick", "Killing", "failed liveness probe").await
    })
    .await;
    assert_eq!(killing.message.as_deref(), Some("Container main failed liveness probe, will be restarted"));
    let unhealthy = eventually("an Unhealthy event", &gantry, || async {
        event(&admin, "sick", "Unhealthy", "Liveness probe failed").await
    })
    .await;
    assert_eq!(unhealthy.message.as_deref(), Some("Liveness probe failed: sick\n"));
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn startup_probe_timing_out_kills_the_container() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let spec = r#"  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
    startupProbe:
      exec:
        command: ["sleep", "5"]
      timeoutSeconds: 1
      periodSeconds: 1
      failureThreshold: 1
    readinessProbe:
      exec:
        command: ["true"]
"#;
    pods.create(&PostParams::default(), &pod(&env.node, "slow", spec)).await.unwrap();
    let running = eventually("running, not started", &gantry, || async {
        let s = status(&pods, "slow", "main").await?;
        s.state.as_ref()?.running.as_ref()?;
        Some(s)
    })
    .await;
    assert_eq!((running.started, running.ready), (Some(false), false), "startup gates readiness");
    let unhealthy = eventually("the timeout reported", &gantry, || async {
        event(&admin, "slow", "Unhealthy", "Startup probe failed").await
    })
    .await;
    assert_eq!(unhealthy.message.as_deref(), Some("Startup probe failed: command \"sleep 5\" timed out"));
    eventually("a Killing event", &gantry, || async {
        event(&admin, "slow", "Killing", "Container main failed startup probe, will be restarted").await
    })
    .await;
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn readiness_probe_flips_the_ready_condition_both_ways() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let dir = host_dir(&env, "ready");
    let spec = format!(
        r#"  terminationGracePeriodSeconds: 1
  volumes:
  - name: data
    hostPath:
      path: {}
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
    volumeMounts:
    - name: data
      mountPath: /data
    readinessProbe:
      exec:
        command: ["cat", "/data/ready"]
      periodSeconds: 1
      failureThreshold: 1
"#,
        dir.display()
    );
    pods.create(&PostParams::default(), &pod(&env.node, "flip", &spec)).await.unwrap();
    eventually("running but not ready", &gantry, || async {
        let s = status(&pods, "flip", "main").await?;
        (s.state?.running.is_some() && !s.ready && condition(&pods, "flip", "Ready").await? == "False").then_some(())
    })
    .await;
    let mut total = std::time::Duration::ZERO;
    for (ready, want) in [(true, "True"), (false, "False"), (true, "True")] {
        let flipped = std::time::Instant::now();
        if ready {
            std::fs::write(dir.join("ready"), "yes").unwrap();
        } else {
            std::fs::remove_file(dir.join("ready")).unwrap();
        }
        eventually(&format!("Ready={want}"), &gantry, || async {
            let s = status(&pods, "flip", "main").await?;
            let pod_ready = condition(&pods, "flip", "Ready").await?;
            let containers_ready = condition(&pods, "flip", "ContainersReady").await?;
            (s.ready == ready && pod_ready == want && containers_ready == want).then_some(())
        })
        .await;
        // With periodSeconds 1 this is about a second; the 10 s resync would show here.
        eprintln!("Ready={want} in the API {:?} after the flip", flipped.elapsed());
        total += flipped.elapsed();
    }
    // Waiting for the 10 s resync instead of waking the worker would take ~15 s for three flips.
    assert!(total < std::time::Duration::from_secs(9), "readiness changes reach the API promptly: {total:?}");
    assert_eq!(status(&pods, "flip", "main").await.unwrap().restart_count, 0, "readiness never restarts");
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn http_and_tcp_probes_reach_the_pod() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    // `good` serves on a named port; `bad` answers 404 on the probed path.
    let spec = r#"  terminationGracePeriodSeconds: 1
  containers:
  - name: good
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p 8080 -h /www"]
    ports:
    - name: http
      containerPort: 8080
    startupProbe:
      tcpSocket:
        port: 8080
      periodSeconds: 1
      failureThreshold: 30
    readinessProbe:
      httpGet:
        path: /healthz
        port: http
        httpHeaders:
        - name: X-Probe
          value: gantry
      periodSeconds: 1
  - name: bad
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www && exec httpd -f -p 8081 -h /www"]
    readinessProbe:
      httpGet:
        path: /missing
        port: 8081
      periodSeconds: 1
"#;
    pods.create(&PostParams::default(), &pod(&env.node, "web", spec)).await.unwrap();
    eventually("good started and ready", &gantry, || async {
        let s = status(&pods, "web", "good").await?;
        (s.ready && s.started == Some(true)).then_some(())
    })
    .await;
    eventually("bad reported unhealthy with the status code", &gantry, || async {
        event(&admin, "web", "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 404").await
    })
    .await;
    let bad = status(&pods, "web", "bad").await.unwrap();
    assert!(!bad.ready && bad.started == Some(true), "{bad:?}");
    assert_eq!(condition(&pods, "web", "Ready").await.as_deref(), Some("False"));
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn host_network_probes_reach_the_node() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let port = 20_000 + std::process::id() % 20_000;
    let spec = format!(
        r#"  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p {port} -h /www"]
    readinessProbe:
      httpGet:
        path: /healthz
        port: {port}
      periodSeconds: 1
"#
    );
    pods.create(&PostParams::default(), &pod(&env.node, "hostnet", &spec)).await.unwrap();
    eventually("ready through the node's network", &gantry, || async {
        status(&pods, "hostnet", "main").await?.ready.then_some(())
    })
    .await;
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn post_start_and_pre_stop_hooks_run_around_the_container() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let dir = host_dir(&env, "hooks");
    let spec = format!(
        r#"  terminationGracePeriodSeconds: 10
  volumes:
  - name: data
    hostPath:
      path: {}
  containers:
  - name: main
    image: IMAGE
    command: ["sh", "-c", "trap 'echo term >> /data/order; exit 0' TERM; while true; do sleep 0.2; done"]
    volumeMounts:
    - name: data
      mountPath: /data
    lifecycle:
      postStart:
        exec:
          command: ["sh", "-c", "echo post > /data/post"]
      preStop:
        exec:
          command: ["sh", "-c", "echo prestop >> /data/order"]
"#,
        dir.display()
    );
    pods.create(&PostParams::default(), &pod(&env.node, "hooked", &spec)).await.unwrap();
    eventually("postStart's file", &gantry, || async {
        std::fs::read_to_string(dir.join("post")).ok().filter(|s| s == "post\n")
    })
    .await;
    eventually("running", &gantry, || async { status(&pods, "hooked", "main").await?.state?.running }).await;
    pods.delete("hooked", &DeleteParams::default()).await.unwrap();
    let order = eventually("preStop, then SIGTERM", &gantry, || async {
        std::fs::read_to_string(dir.join("order")).ok().filter(|s| s.lines().count() >= 2)
    })
    .await;
    assert_eq!(order, "prestop\nterm\n");
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn http_pre_stop_hook_reaches_the_container() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let dir = host_dir(&env, "httphook");
    // httpd logs requests to a host file, which outlives the pod.
    let spec = format!(
        r#"  terminationGracePeriodSeconds: 5
  volumes:
  - name: data
    hostPath:
      path: {}
  containers:
  - name: main
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www && exec httpd -f -vv -p 8080 -h /www 2>>/data/httpd.log"]
    volumeMounts:
    - name: data
      mountPath: /data
    ports:
    - name: http
      containerPort: 8080
    readinessProbe:
      tcpSocket:
        port: http
      periodSeconds: 1
    lifecycle:
      preStop:
        httpGet:
          path: /prestop
          port: http
"#,
        dir.display()
    );
    pods.create(&PostParams::default(), &pod(&env.node, "httphook", &spec)).await.unwrap();
    eventually("ready", &gantry, || async { status(&pods, "httphook", "main").await?.ready.then_some(()) }).await;
    pods.delete("httphook", &DeleteParams::default()).await.unwrap();
    eventually("the preStop request in httpd's log", &gantry, || async {
        std::fs::read_to_string(dir.join("httpd.log")).ok()?.contains("url:/prestop").then_some(())
    })
    .await;
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn failing_post_start_hook_kills_the_container() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let spec = r#"  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
    lifecycle:
      postStart:
        exec:
          command: ["sh", "-c", "echo nope; exit 3"]
"#;
    pods.create(&PostParams::default(), &pod(&env.node, "nopost", spec)).await.unwrap();
    let failed = eventually("FailedPostStartHook", &gantry, || async {
        event(&admin, "nopost", "FailedPostStartHook", "").await
    })
    .await;
    assert_eq!(failed.message.as_deref(), Some("PostStartHook failed"), "no details in the event");
    eventually("a Killing event", &gantry, || async {
        event(&admin, "nopost", "Killing", "FailedPostStartHook").await
    })
    .await;
    eventually("the container restarted", &gantry, || async {
        (status(&pods, "nopost", "main").await?.restart_count >= 1).then_some(())
    })
    .await;
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn termination_message_from_the_file_or_the_log() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let spec = r#"  restartPolicy: Never
  containers:
  - name: writer
    image: IMAGE
    command: ["sh", "-c", "printf 'bye now' > /dev/termination-log; exit 3"]
  - name: custom
    image: IMAGE
    command: ["sh", "-c", "echo custom > /tmp/msg"]
    terminationMessagePath: /tmp/msg
  - name: logger
    image: IMAGE
    command: ["sh", "-c", "echo first; echo from-log; exit 1"]
    terminationMessagePolicy: FallbackToLogsOnError
"#;
    pods.create(&PostParams::default(), &pod(&env.node, "bye", spec)).await.unwrap();
    let messages = eventually("all three terminated", &gantry, || async {
        let mut out = Vec::new();
        for name in ["writer", "custom", "logger"] {
            let t = status(&pods, "bye", name).await?.state?.terminated?;
            out.push((t.exit_code, t.message.unwrap_or_default()));
        }
        Some(out)
    })
    .await;
    assert_eq!(
        messages,
        [(3, "bye now".to_string()), (0, "custom\n".to_string()), (1, "first\nfrom-log\n".to_string())]
    );
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn service_variables_are_in_the_environment() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(admin.clone(), "default");
    let svc = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "my-db"},
        "spec": {"ports": [{"name": "sql", "port": 5432}], "selector": {"app": "db"}}
    }))
    .unwrap();
    // A leftover from an interrupted run on a real cluster would make the create fail.
    let _ = services.delete("my-db", &DeleteParams::default()).await;
    let ip = services.create(&PostParams::default(), &svc).await.unwrap().spec.unwrap().cluster_ip.unwrap();
    let master = services.get("kubernetes").await.unwrap().spec.unwrap().cluster_ip.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let spec = r#"  restartPolicy: Never
  containers:
  - name: main
    image: IMAGE
    command: ["sh", "-c", "env | sort > /dev/termination-log"]
    env:
    - name: MY_DB_SERVICE_PORT
      value: overridden
"#;
    pods.create(&PostParams::default(), &pod(&env.node, "envs", spec)).await.unwrap();
    let out = eventually("the environment", &gantry, || async {
        status(&pods, "envs", "main").await?.state?.terminated?.message
    })
    .await;
    for line in [
        format!("MY_DB_SERVICE_HOST={ip}"),
        "MY_DB_SERVICE_PORT=overridden".to_string(),
        "MY_DB_SERVICE_PORT_SQL=5432".to_string(),
        format!("MY_DB_PORT_5432_TCP=tcp://{ip}:5432"),
        format!("KUBERNETES_SERVICE_HOST={master}"),
    ] {
        assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
    }
    let _ = services.delete("my-db", &DeleteParams::default()).await;
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn static_pod_probes_in_standalone_mode() {
    let Some(env) = Env::start().await else { return };
    let yaml = r#"apiVersion: v1
kind: Pod
metadata:
  name: probed
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: IMAGE
    command: ["sh", "-c", "touch /tmp/ready; sleep 3600"]
    readinessProbe:
      exec:
        command: ["cat", "/tmp/ready"]
      periodSeconds: 1
    livenessProbe:
      exec:
        command: ["false"]
      periodSeconds: 1
      failureThreshold: 1
"#;
    env.write_manifest("probed.yaml", &yaml.replace("IMAGE", gantry_testkit::BUSYBOX_IMAGE));
    let gantry = env.kubelet(&[]);
    let name = static_name("probed");
    let restarted = eventually("restarted by the liveness probe", &gantry, || async {
        let statuses = gantry.pod(&name)?.status?.container_statuses?;
        statuses.into_iter().find(|s| s.restart_count >= 1)
    })
    .await;
    assert!(restarted.last_state.and_then(|s| s.terminated).is_some(), "the killed instance is lastState");
    assert!(
        gantry.log().contains("Container main failed liveness probe, will be restarted"),
        "the Killing event is logged"
    );
}
