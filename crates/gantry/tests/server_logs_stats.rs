//! End-to-end: the node API's logs, stats and metrics (issue 7, part 2) against a real
//! containerd: `/containerLogs` with every query parameter, follow across a log rotation,
//! `previous`, the 400/404 cases; `/stats/summary` with a memory hog; `/metrics/resource`,
//! `/metrics` and `/metrics/probes`. Most tests run the agent standalone (static pods), so they
//! run the same way when `GANTRY_E2E_KUBECONFIG` points at a real cluster; one joins the
//! cluster (the test API server, or the real one) for API pods and API request metrics.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::node_api::{Identity, NodeApi};
use common::{DEADLINE, Env, Gantry, eventually, pod_yaml, static_name};

/// A node agent serving the node API (AlwaysAllow, client certificates) with `extra` flags;
/// `config` is appended to the agent's config file.
async fn start(pods: &[(&str, String)], config: &str, extra: &[&str]) -> Option<(Env, NodeApi, Gantry, Identity)> {
    let env = Env::start().await?;
    if !config.is_empty() {
        let mut yaml = std::fs::read_to_string(&env.config).unwrap();
        yaml.push_str(config);
        std::fs::write(&env.config, yaml).unwrap();
    }
    for (file, yaml) in pods {
        env.write_manifest(file, yaml);
    }
    let api = NodeApi::new(&env.ctd.dir());
    let mut flags = vec!["--authorization-mode=AlwaysAllow"];
    flags.extend_from_slice(extra);
    let gantry = api.start_agent(&env, &flags).await;
    let alice = api.ca.client("alice", &["dev"]);
    Some((env, api, gantry, alice))
}

/// GET `path` with `query`: (status, body).
async fn get(api: &NodeApi, who: &Identity, path: &str, query: &[(&str, &str)]) -> (u16, String) {
    let resp = api.client(Some(who)).get(api.url(path)).query(query).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

fn logs_path(pod: &str, container: &str) -> String {
    format!("/containerLogs/default/{}/{container}", static_name(pod))
}

/// The numbers of `tick-N` lines, in order.
fn ticks(text: &str) -> Vec<u64> {
    text.lines().filter_map(|l| l.strip_prefix("tick-")?.parse().ok()).collect()
}

/// The content of raw CRI log lines.
fn container_lines(raw: &str) -> String {
    raw.lines().filter_map(|l| l.splitn(4, ' ').nth(3)).map(|l| format!("{l}\n")).collect()
}

fn assert_contiguous(ns: &[u64], what: &str) {
    assert!(!ns.is_empty(), "{what}: no ticks");
    for w in ns.windows(2) {
        assert_eq!(w[1], w[0] + 1, "{what}: a line was lost or repeated around tick-{}: {ns:?}", w[0]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn container_logs_with_every_query_parameter() {
    let printer = pod_yaml("printer", "for i in 1 2 3 4 5; do echo line-$i; done; echo oops >&2; sleep 3600", "");
    let Some((_env, api, gantry, alice)) = start(&[("printer.yaml", printer)], "", &[]).await else { return };
    let path = logs_path("printer", "main");
    let all = eventually("the printer's log", &gantry, || async {
        let (code, body) = get(&api, &alice, &path, &[]).await;
        (code == 200 && body.contains("oops")).then_some(body)
    })
    .await;
    // containerd copies stdout and stderr separately, so where `oops` lands among the stdout
    // lines varies; the expectations below follow the order the log file has.
    let lines: Vec<&str> = all.lines().collect();
    let stdout: Vec<&str> = lines.iter().copied().filter(|l| *l != "oops").collect();
    assert_eq!(stdout, ["line-1", "line-2", "line-3", "line-4", "line-5"], "{all:?}");
    assert_eq!(lines.len(), 6, "{all:?}");
    let last_two = format!("{}\n{}\n", lines[4], lines[5]);

    assert_eq!(get(&api, &alice, &path, &[("tailLines", "2")]).await, (200, last_two));
    assert_eq!(get(&api, &alice, &path, &[("tailLines", "0")]).await, (200, String::new()));
    assert_eq!(get(&api, &alice, &path, &[("limitBytes", "9")]).await, (200, all[..9].to_string()));
    assert_eq!(get(&api, &alice, &path, &[("sinceSeconds", "3600")]).await, (200, all.clone()));
    assert_eq!(get(&api, &alice, &path, &[("sinceTime", "2999-01-01T00:00:00Z")]).await, (200, String::new()));
    assert_eq!(get(&api, &alice, &path, &[("sinceTime", "2000-01-01T00:00:00Z")]).await, (200, all.clone()));
    let (code, stamped) = get(&api, &alice, &path, &[("timestamps", "true"), ("tailLines", "1")]).await;
    assert_eq!(code, 200);
    let (stamp, line) = stamped.trim_end().split_once(' ').unwrap();
    assert_eq!(line, lines[5]);
    assert!(
        stamp.parse::<k8s_openapi::jiff::Timestamp>().is_ok() && stamp.len() == 30,
        "RFC 3339 with nanoseconds: {stamp}"
    );

    // Bad parameters: 400 naming the parameter.
    for (query, param) in [
        (vec![("tailLines", "-1")], "tailLines"),
        (vec![("sinceTime", "garbage")], "sinceTime"),
        (vec![("limitBytes", "0")], "limitBytes"),
        (vec![("sinceSeconds", "10"), ("sinceTime", "2024-01-01T00:00:00Z")], "sinceTime"),
    ] {
        let (code, body) = get(&api, &alice, &path, &query).await;
        assert_eq!(code, 400, "{query:?}: {body}");
        assert!(body.contains(param), "{query:?}: {body}");
    }
    // Unknown pod or container: 404 with a message.
    let (code, body) = get(&api, &alice, "/containerLogs/default/nosuchpod/main", &[]).await;
    assert_eq!((code, body.as_str()), (404, "pod \"nosuchpod\" does not exist"));
    let (code, body) = get(&api, &alice, &logs_path("printer", "nope"), &[]).await;
    assert_eq!(code, 404);
    assert!(body.contains("container \"nope\" not found"), "{body}");
    // No previous instance yet.
    let (code, body) = get(&api, &alice, &path, &[("previous", "true")]).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("previous terminated container \"main\""), "{body}");

    // follow: the stream stays open after the existing lines; dropping it ends the reader.
    let mut resp = api.client(Some(&alice)).get(api.url(&path)).query(&[("follow", "true")]).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut seen = Vec::new();
    while String::from_utf8_lossy(&seen).lines().count() < lines.len() {
        let chunk = tokio::time::timeout(DEADLINE, resp.chunk()).await.expect("follow output").unwrap().unwrap();
        seen.extend_from_slice(&chunk);
    }
    assert_eq!(String::from_utf8_lossy(&seen), all);
    let more = tokio::time::timeout(Duration::from_millis(1500), resp.chunk()).await;
    assert!(more.is_err(), "a followed log of a running container does not end: {more:?}");
    drop(resp);
}

#[tokio::test(flavor = "multi_thread")]
async fn follow_continues_across_log_rotation() {
    // About 1.4 KiB/s of log: with a 2Ki limit checked every 3 s it rotates every few seconds.
    let ticker = pod_yaml(
        "ticker",
        "i=0; while true; do i=$((i+1)); echo tick-$i; if [ $((i % 30)) = 0 ]; then sleep 1; fi; done",
        "",
    );
    let Some((env, api, gantry, alice)) = start(
        &[("ticker.yaml", ticker)],
        "containerLogMonitorInterval: 3s\n",
        &["--container-log-max-size=2Ki", "--container-log-max-files=3"],
    )
    .await
    else {
        return;
    };
    let path = logs_path("ticker", "main");
    eventually("the ticker's log", &gantry, || async {
        let (code, body) = get(&api, &alice, &path, &[]).await;
        (code == 200 && body.contains("tick-1\n")).then_some(())
    })
    .await;
    let collected = Arc::new(Mutex::new(String::new()));
    let resp = api.client(Some(&alice)).get(api.url(&path)).query(&[("follow", "true")]).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let sink = collected.clone();
    let reader = tokio::spawn(async move {
        let mut resp = resp;
        while let Ok(Some(chunk)) = resp.chunk().await {
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk));
        }
    });

    // Two rotations, then lines from the newest file must reach the follower.
    let dir = std::fs::read_dir(&env.pod_logs)
        .unwrap()
        .flatten()
        .find(|d| d.file_name().to_string_lossy().starts_with(&format!("default_{}_", static_name("ticker"))))
        .unwrap()
        .path()
        .join("main");
    let first_of_current = eventually("two log rotations", &gantry, || async {
        let rotated = std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("0.log."))
            .count();
        if rotated < 2 {
            return None;
        }
        let current = std::fs::read_to_string(dir.join("0.log")).ok()?;
        let first = current.lines().next()?.splitn(4, ' ').nth(3)?.strip_prefix("tick-")?.parse::<u64>().ok()?;
        Some(first)
    })
    .await;
    let followed = eventually("the follower to read past the rotation", &gantry, || async {
        let text = collected.lock().unwrap().clone();
        ticks(&text).last().is_some_and(|n| *n > first_of_current + 5).then_some(text)
    })
    .await;
    let ns = ticks(&followed);
    assert_eq!(ns[0], 1, "follow starts with the whole log");
    assert_contiguous(&ns, "follow across rotation");
    reader.abort();

    // A plain read afterwards joins the rotated (and compressed) files with the current one.
    let (code, body) = get(&api, &alice, &path, &[]).await;
    assert_eq!(code, 200);
    assert_contiguous(&ticks(&body), "read of rotated files");
    let compressed =
        std::fs::read_dir(&dir).unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".gz"));
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert!(files <= 3 + 1, "containerLogMaxFiles=3 (plus a rotation in progress): {files} files");
    if compressed {
        // The oldest rotation is gzipped; the read still starts at the first kept line, which
        // is older than everything in the uncompressed files.
        let oldest_plain = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("0.log.") && !n.ends_with(".gz")
            })
            .filter_map(|e| ticks(&container_lines(&std::fs::read_to_string(e.path()).ok()?)).first().copied())
            .min();
        if let Some(first_plain) = oldest_plain {
            assert!(ticks(&body)[0] < first_plain, "lines from the .gz rotation come first");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn previous_instance_logs_after_a_restart() {
    // The first instance prints instance-1 and fails; the second prints instance-2 and stays.
    let cmd = "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo instance-$n; \
               if [ $n -ge 2 ]; then sleep 3600; fi; exit 1";
    let volumes = "  volumes:\n  - name: data\n    emptyDir: {}\n";
    let yaml = pod_yaml("restarter", cmd, volumes) + "    volumeMounts:\n    - name: data\n      mountPath: /data\n";
    let Some((env, api, gantry, alice)) = start(&[("restarter.yaml", yaml)], "", &[]).await else { return };
    let path = logs_path("restarter", "main");
    eventually("the second instance", &gantry, || async {
        let (code, body) = get(&api, &alice, &path, &[]).await;
        (code == 200 && body == "instance-2\n").then_some(())
    })
    .await;
    // The previous instance is the status's lastState.terminated, as upstream finds it.
    eventually("lastState.terminated in the status", &gantry, || async {
        let statuses = gantry.pod(&static_name("restarter"))?.status?.container_statuses?;
        statuses.first()?.last_state.as_ref()?.terminated.as_ref()?.container_id.as_ref().map(|_| ())
    })
    .await;
    assert_eq!(get(&api, &alice, &path, &[("previous", "true")]).await, (200, "instance-1\n".into()));

    // The pod's log directory removed: upstream's runtime still names the log path, and
    // resolving it fails with a 400 naming the first missing part.
    let dir = std::fs::read_dir(&env.pod_logs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("default_restarter"))
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let (code, body) = get(&api, &alice, &path, &[("previous", "true")]).await;
    assert_eq!(code, 400, "{body}");
    let log = dir.join("main/0.log");
    assert_eq!(
        body,
        format!(
            "failed to try resolving symlinks in path {:?}: lstat {}: no such file or directory",
            log.display().to_string(),
            dir.display()
        )
    );
}

fn find_pod<'a>(summary: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    summary["pods"].as_array()?.iter().find(|p| p["podRef"]["name"] == static_name(name))
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.split(' ').next()?.parse().ok())
}

const HOG_MIB: u64 = 40;

#[tokio::test(flavor = "multi_thread")]
async fn stats_summary_and_metrics_show_what_pods_do() {
    // 40 MiB written to the pod's /dev/shm (tmpfs, charged to the container): working set.
    // And 2 MiB in an emptyDir: the pod's volume stats and its ephemeral storage.
    let hog = pod_yaml(
        "hog",
        &format!(
            "dd if=/dev/zero of=/dev/shm/hog bs=1M count={HOG_MIB} && dd if=/dev/zero of=/data/f bs=1M count=2 && \
             touch /tmp/ready && sleep 3600"
        ),
        "  volumes:\n  - name: data\n    emptyDir: {}\n",
    ) + "    readinessProbe:\n      exec:\n        command: [\"cat\", \"/tmp/ready\"]\n      periodSeconds: 1\n"
        + "    volumeMounts:\n    - name: data\n      mountPath: /data\n";
    let Some(env) = Env::start().await else { return };
    env.write_manifest("hog.yaml", &hog);
    let api = NodeApi::new(&env.ctd.dir());
    // The agent moves itself into kubeletCgroups; --runtime-cgroups names the runtime's
    // cgroup (here kubepods, whose 40 MiB hog tells it apart from containerd's own cgroup).
    let kubelet_cgroup = format!("{}/gantry-kubelet", env.ctd.cgroup_root());
    let kubelet_flag = format!("--kubelet-cgroups={kubelet_cgroup}");
    let runtime_flag = format!("--runtime-cgroups={}/kubepods", env.ctd.cgroup_root());
    // The volumes measured every second (upstream's default is a minute).
    let flags = ["--authorization-mode=AlwaysAllow", &kubelet_flag, &runtime_flag, "--volume-stats-agg-period=1s"];
    let gantry = api.start_agent(&env, &flags).await;
    let alice = api.ca.client("alice", &["dev"]);
    // Ready once both writes are done: the emptyDir's 2 MiB come after the 40 MiB the
    // summary's own wait below sees, so without this the volume figures race the second dd.
    eventually("pod hog ready (both writes done)", &gantry, || async {
        let pod = gantry.pod_in_phase(&static_name("hog"), "Running")?;
        let conditions = pod.status?.conditions?;
        conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True").then_some(())
    })
    .await;
    eventually("the agent in its kubeletCgroups (memory hierarchy)", &gantry, || async {
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", gantry.pid())).ok()?;
        let memory = own.lines().find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory")))?;
        memory.ends_with(&format!(":{kubelet_cgroup}")).then_some(())
    })
    .await;

    let min = HOG_MIB * 1024 * 1024;
    let summary = eventually("the hog's memory in /stats/summary", &gantry, || async {
        let (code, body) = get(&api, &alice, "/stats/summary", &[]).await;
        assert_eq!(code, 200, "{body}");
        let s: serde_json::Value = serde_json::from_str(&body).unwrap();
        let ws = find_pod(&s, "hog")?["containers"][0]["memory"]["workingSetBytes"].as_u64()?;
        // The volume as measured after the pod's write (in the background, every second).
        let volume = find_pod(&s, "hog")?["volume"][0]["usedBytes"].as_u64()?;
        // usageNanoCores needs a second sample.
        (ws >= min && volume >= 2 << 20 && s["node"]["cpu"]["usageNanoCores"].is_u64()).then_some(s)
    })
    .await;
    let node = &summary["node"];
    assert_eq!(node["nodeName"], common::NODE);
    assert!(node["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0);
    assert!(node["memory"]["workingSetBytes"].as_u64().unwrap() > min);
    assert!(node["memory"]["availableBytes"].as_u64().unwrap() > 0);
    assert!(node["fs"]["capacityBytes"].as_u64().unwrap() > 0);
    // containerd refreshes its image filesystem usage every few seconds; it may still be 0.
    assert!(node["runtime"]["imageFs"]["usedBytes"].is_u64());
    assert!(node["runtime"]["imageFs"]["capacityBytes"].as_u64().unwrap() > 0);
    assert!(!node["network"]["interfaces"].as_array().unwrap().is_empty());
    let pod = find_pod(&summary, "hog").unwrap();
    assert_eq!(pod["podRef"]["namespace"], "default");
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "main");
    assert!(c["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0);
    assert!(c["rootfs"]["capacityBytes"].as_u64().unwrap() > 0);
    assert!(c["logs"]["usedBytes"].is_u64());
    // Swap and IO of the container itself, from its own cgroup (v1: the swap part of memsw,
    // no pressure), as upstream's CRI stats provider fills them.
    assert!(c["swap"]["swapUsageBytes"].is_u64(), "{c}");
    assert!(c["io"]["time"].is_string(), "{c}");
    assert!(c["memory"]["workingSetBytes"].as_u64().unwrap() >= min, "{c}");
    assert!(pod["memory"]["workingSetBytes"].as_u64().unwrap() >= min);
    assert_eq!(pod["network"]["name"], "eth0", "the sandbox's network namespace: {pod}");
    // containerd 1.6 has no sandbox stats: the pod cgroup's own files (pause, sh, sleep).
    assert!(pod["process_stats"]["process_count"].as_u64().unwrap_or(0) >= 2, "{pod}");
    assert!(pod["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0, "{pod}");
    let volume = &pod["volume"][0];
    assert_eq!(volume["name"], "data", "{pod}");
    assert!(volume["usedBytes"].as_u64().unwrap() >= 2 << 20, "{volume}");
    assert!(volume["capacityBytes"].as_u64().unwrap() > 0 && volume["inodesUsed"].as_u64().unwrap() >= 1);
    assert!(pod["ephemeral-storage"]["usedBytes"].as_u64().unwrap() >= 2 << 20, "the emptyDir counts: {pod}");

    // The system containers: the agent, the runtime (the test's own containerd) and kubepods.
    let system = |name: &str| {
        node["systemContainers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("system container {name} missing: {}", node["systemContainers"]))
    };
    for name in ["kubelet", "runtime", "pods"] {
        let c = system(name);
        assert!(c["memory"]["workingSetBytes"].as_u64().unwrap() > 0, "{c}");
        assert!(c["cpu"]["usageCoreNanoSeconds"].is_u64(), "{c}");
        assert!(!c["startTime"].as_str().unwrap().is_empty(), "{c}");
    }
    assert!(system("pods")["memory"]["workingSetBytes"].as_u64().unwrap() >= min, "the hog is in kubepods");
    assert!(system("runtime")["memory"]["workingSetBytes"].as_u64().unwrap() >= min, "--runtime-cgroups is read");
    assert!(node["systemContainers"].as_array().unwrap().iter().all(|c| c["name"] != "misc"), "no systemCgroups");
    let rlimit = &node["rlimit"];
    assert!(rlimit["maxpid"].as_i64().unwrap() > 0 && rlimit["curproc"].as_i64().unwrap() > 1, "{rlimit}");
    assert!(node["swap"]["swapUsageBytes"].is_u64() && node["swap"]["swapAvailableBytes"].is_u64(), "{node}");
    // PSI where the kernel offers it, on cgroup v2 only (as upstream).
    let cgroup_v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    if cgroup_v2 && std::path::Path::new("/proc/pressure/io").exists() {
        assert!(node["io"]["psi"]["some"]["total"].is_u64(), "{node}");
        assert!(node["memory"]["psi"]["full"]["avg10"].is_f64(), "{node}");
        assert!(node["cpu"]["psi"]["some"]["avg60"].is_f64(), "{node}");
    } else if !cgroup_v2 {
        assert!(node["cpu"].get("psi").is_none() && node["memory"].get("psi").is_none(), "no PSI on v1: {node}");
    }

    let (_, body) = get(&api, &alice, "/stats/summary", &[("only_cpu_and_memory", "true")]).await;
    let s: serde_json::Value = serde_json::from_str(&body).unwrap();
    let pod = find_pod(&s, "hog").unwrap();
    assert!(pod["memory"]["workingSetBytes"].as_u64().unwrap() >= min);
    assert!(pod.get("network").is_none() && pod.get("ephemeral-storage").is_none(), "{pod}");
    assert!(pod["containers"][0].get("rootfs").is_none() && s["node"].get("fs").is_none());

    // /metrics/resource, as metrics-server reads it.
    let (code, text) = get(&api, &alice, "/metrics/resource", &[]).await;
    assert_eq!(code, 200);
    let labels = format!("{{container=\"main\",namespace=\"default\",pod=\"{}\"}}", static_name("hog"));
    assert!(metric(&text, &format!("container_memory_working_set_bytes{labels}")).unwrap() >= min as f64, "{text}");
    assert!(metric(&text, &format!("container_cpu_usage_seconds_total{labels}")).unwrap() > 0.0, "{text}");
    let start = metric(&text, &format!("container_start_time_seconds{labels}")).unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().as_second() as f64;
    assert!(start > now - 600.0 && start <= now + 1.0, "start time {start} vs now {now}");
    let pod_labels = format!("{{namespace=\"default\",pod=\"{}\"}}", static_name("hog"));
    assert!(metric(&text, &format!("pod_memory_working_set_bytes{pod_labels}")).unwrap() >= min as f64);
    assert!(metric(&text, "node_cpu_usage_seconds_total").unwrap() > 0.0);
    assert!(metric(&text, "node_memory_working_set_bytes").unwrap() > min as f64);
    assert_eq!(metric(&text, "scrape_error"), Some(0.0));

    // /metrics: the agent's own.
    let (code, text) = get(&api, &alice, "/metrics", &[]).await;
    assert_eq!(code, 200);
    assert_eq!(metric(&text, "kubelet_running_pods"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "kubelet_running_containers{container_state=\"running\"}"), Some(1.0), "{text}");
    assert!(metric(&text, "kubelet_runtime_operations_total{operation_type=\"list_containers\"}").unwrap() > 0.0);
    assert!(metric(&text, "kubelet_runtime_operations_total{operation_type=\"run_pod_sandbox\"}").unwrap() >= 1.0);
    assert_eq!(metric(&text, "kubelet_pod_start_duration_seconds_count"), Some(1.0), "{text}");

    // /metrics/probes: the readiness probe's successes.
    let series = format!(
        "prober_probe_total{{probe_type=\"Readiness\",result=\"successful\",container=\"main\",pod=\"{}\",namespace=\"default\",pod_uid=\"",
        static_name("hog")
    );
    eventually("a successful readiness probe counted", &gantry, || async {
        let (_, text) = get(&api, &alice, "/metrics/probes", &[]).await;
        let line = text.lines().find(|l| l.starts_with(&series))?;
        let n: f64 = line.rsplit(' ').next()?.parse().ok()?;
        (n >= 1.0).then_some(())
    })
    .await;
}

/// The cost of one `/stats/summary` scrape with 30 pods: CPU time of the agent process
/// (utime+stime from /proc) and its RSS, printed for the report.
#[tokio::test(flavor = "multi_thread")]
async fn stats_summary_cost_for_30_pods() {
    if std::env::var_os("GANTRY_MEASURE").is_none() {
        println!("SKIPPED: set GANTRY_MEASURE=1 to measure the /stats/summary cost");
        return;
    }
    let pods: Vec<(String, String)> =
        (0..30).map(|i| (format!("p{i}.yaml"), pod_yaml(&format!("p{i}"), "sleep 3600", ""))).collect();
    let refs: Vec<(&str, String)> = pods.iter().map(|(f, y)| (f.as_str(), y.clone())).collect();
    let Some((_env, api, gantry, alice)) = start(&refs, "", &[]).await else { return };
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let (_, body) = get(&api, &alice, "/stats/summary", &[]).await;
        let s: serde_json::Value = serde_json::from_str(&body).unwrap();
        if s["pods"].as_array().map_or(0, Vec::len) == 30 {
            break;
        }
        assert!(Instant::now() < deadline, "30 pods did not start");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let pid = gantry.pid();
    let cpu = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        (f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) * 10 // ms (USER_HZ 100)
    };
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().to_string()
    };
    let n = 20;
    let (cpu0, rss0, t0) = (cpu(), rss(), Instant::now());
    for _ in 0..n {
        let (code, _) = get(&api, &alice, "/stats/summary", &[]).await;
        assert_eq!(code, 200);
    }
    let (cpu1, rss1) = (cpu(), rss());
    println!(
        "MEASURED /stats/summary with 30 pods: {:.1} ms agent CPU per scrape, {:.1} ms wall per scrape, RSS {rss0} -> {rss1}",
        (cpu1 - cpu0) as f64 / n as f64,
        t0.elapsed().as_secs_f64() * 1000.0 / n as f64
    );
    // Where the time goes: the runtime's share, per CRI operation.
    let (_, metrics) = get(&api, &alice, "/metrics", &[]).await;
    for line in metrics.lines().filter(|l| l.starts_with("kubelet_runtime_operations_duration_seconds_sum")) {
        println!("MEASURED {line}");
    }
}

/// Cluster mode: the logs of a pod from the API server, and the agent's API request counts.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_pod_logs_and_api_request_metrics() {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::Api;
    use kube::api::PostParams;

    let Some((env, cluster)) = common::cluster::setup().await else { return };
    let api = NodeApi::new(&env.ctd.dir());
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let mut flags = api.flags();
    flags.push(format!("--kubeconfig={}", kubeconfig.display()));
    flags.push("--authorization-mode=AlwaysAllow".into());
    flags.push("--volume-stats-agg-period=1s".into());
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let gantry = env.kubelet(&refs);
    let alice = api.ca.client("alice", &["dev"]);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    // A 64 KiB configMap volume (ephemeral storage) and the service-account token's projected
    // volume (tmpfs: listed, not counted), for the pod's volume stats.
    let config_maps: Api<ConfigMap> = Api::namespaced(admin, "default");
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some("talker".into()), ..Default::default() },
        data: Some([("blob".to_string(), "x".repeat(64 << 10))].into()),
        ..Default::default()
    };
    config_maps.create(&PostParams::default(), &cm).await.unwrap();
    let spec = format!(
        "  nodeName: {}\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - name: cm\n    configMap: {{name: talker}}\n",
        env.node
    );
    let pod: Pod = serde_yaml_ng::from_str(&pod_yaml("talker", "echo hello-api; sleep 3600", &spec)).unwrap();
    let uid = pods.create(&PostParams::default(), &pod).await.unwrap().metadata.uid.unwrap();

    let logs = eventually("the API pod's log through the node API", &gantry, || async {
        // The server starts after the agent joined the cluster: connection refused until then.
        let resp = api.client(Some(&alice)).get(api.url("/containerLogs/default/talker/main")).send().await.ok()?;
        let (code, body) = (resp.status().as_u16(), resp.text().await.ok()?);
        (code == 200 && !body.is_empty()).then_some(body)
    })
    .await;
    assert_eq!(logs, "hello-api\n");

    // The Node was registered (POST 201) and its status / lease kept fresh through the client.
    let (code, text) = get(&api, &alice, "/metrics", &[]).await;
    assert_eq!(code, 200);
    let counted = |code: &str, method: &str| -> f64 {
        let prefix = format!("rest_client_requests_total{{code=\"{code}\",method=\"{method}\",host=\"");
        text.lines().filter(|l| l.starts_with(&prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
    };
    assert!(counted("201", "POST") >= 1.0, "{text}");
    assert!(counted("200", "GET") >= 1.0, "{text}");

    // pods[].volume lists both volumes (once measured, in the background); ephemeral-storage
    // adds the configMap, not the token.
    let pod = eventually("the pod's volumes measured", &gantry, || async {
        let (code, body) = get(&api, &alice, "/stats/summary", &[]).await;
        assert_eq!(code, 200, "{body}");
        let summary: serde_json::Value = serde_json::from_str(&body).unwrap();
        let pod = summary["pods"].as_array()?.iter().find(|p| p["podRef"]["name"] == "talker")?.clone();
        (pod["volume"].as_array()?.len() == 2).then_some(pod)
    })
    .await;
    let volume = |prefix: &str| {
        pod["volume"].as_array().unwrap().iter().find(|v| v["name"].as_str().unwrap().starts_with(prefix)).cloned()
    };
    let cm_used = volume("cm").unwrap_or_else(|| panic!("{pod}"))["usedBytes"].as_u64().unwrap();
    assert!(cm_used >= 64 << 10, "{pod}");
    let token_used = volume("kube-api-access-").unwrap_or_else(|| panic!("{pod}"))["usedBytes"].as_u64().unwrap();
    assert!(token_used > 0, "{pod}");
    let containers: u64 = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["rootfs"]["usedBytes"].as_u64().unwrap() + c["logs"]["usedBytes"].as_u64().unwrap())
        .sum();
    let etc_hosts = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(env.root.join("pods").join(&uid).join("etc-hosts")).unwrap().blocks() * 512
    };
    assert_eq!(
        pod["ephemeral-storage"]["usedBytes"].as_u64().unwrap(),
        containers + cm_used + etc_hosts,
        "writable layers, logs, the configMap and /etc/hosts: {pod}"
    );
    let _ = pods.delete("talker", &Default::default()).await;
    let _ = config_maps.delete("talker", &Default::default()).await;
    cluster.cleanup(&env.node).await;
}
