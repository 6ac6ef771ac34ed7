//! Benchmark, cluster mode: pods created through the API server (the in-process test server)
//! for a `gantry kubelet --kubeconfig` node on a real containerd. Reports create→Running
//! latency (p50, p99, makespan; observed via watch) for 1 and then N pods, delete→gone for a
//! pod with a 2 s grace period whose process ignores SIGTERM, the raw CRI floor for the same
//! pods in the same run, and the agent's memory and CPU with the pods running. Prints
//! figures; asserts nothing.
//!
//! `cargo bench -p gantry --bench api_pods` (as root). `GANTRY_BENCH_PODS` sets N (30);
//! `GANTRY_BENCH_STEADY_SECS` how long the pods run before memory is read (10; 330 takes it
//! past the 5-minute node status report and image GC passes).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gantry_test_apiserver::{TestApiServer, User};
use gantry_testkit::{BUSYBOX_IMAGE, Containerd, raw_start_pods};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};

const NODE: &str = "bench-node";

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("GANTRY_BENCH_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let Some(ctd) = Containerd::start_or_skip().await else { return };
    let server = TestApiServer::start().await;
    let dir = ctd.dir().join("api-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let mut agent = common::spawn(&dir, "gantry.log", &common::cluster_node_args(&ctd, &server, &dir, NODE));
    let admin = server.client(&User::Admin).await;
    common::wait_for_node(&admin, NODE).await;
    let pods: Api<Pod> = Api::namespaced(admin, "default");

    for (round, count) in [1, n].into_iter().enumerate() {
        let latencies = create_and_wait(&pods, round, count).await;
        let floor = raw_floor(&ctd, count).await;
        report(count, &latencies, floor);
        if round == 1 {
            resources(agent.id(), count).await;
        }
        delete_all(&pods, &latencies).await;
    }
    let gone = delete_latency(&pods).await;
    println!("api_pods: delete_to_gone={:.3}s (grace 2s, SIGTERM ignored; target grace+0.3s)", gone.as_secs_f64());
    let _ = agent.kill();
    let _ = agent.wait();
}

fn pod(name: &str, command: &str, grace: i64) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", command]}]
        }
    }))
    .unwrap()
}

/// Creates `count` pods and returns each one's create→Running latency, from a watch.
async fn create_and_wait(pods: &Api<Pod>, round: usize, count: usize) -> HashMap<String, Duration> {
    let names: Vec<String> = (0..count).map(|i| format!("bench-{round}-{i}")).collect();
    let mut stream = pods.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let mut created = HashMap::new();
    for name in &names {
        created.insert(name.clone(), Instant::now());
        pods.create(&PostParams::default(), &pod(name, "sleep 3600", 30)).await.unwrap();
    }
    let mut latencies = HashMap::new();
    while latencies.len() < count {
        let Some(Ok(WatchEvent::Added(p) | WatchEvent::Modified(p))) = stream.next().await else { continue };
        let name = p.name_any();
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if running && let Some(start) = created.get(&name) {
            latencies.entry(name).or_insert_with(|| start.elapsed());
        }
    }
    latencies
}

async fn raw_floor(ctd: &Containerd, count: usize) -> Duration {
    let elapsed = raw_start_pods(ctd, count).await.expect("raw pods");
    let client = ctd.runtime_client().await;
    gantry_testkit::cri::remove_sandboxes(&client, &[gantry_testkit::raw::RAW_LABEL]).await.expect("cleanup");
    elapsed
}

fn report(count: usize, latencies: &HashMap<String, Duration>, floor: Duration) {
    let mut sorted: Vec<Duration> = latencies.values().copied().collect();
    sorted.sort();
    let pct = |p: f64| sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1];
    let makespan = *sorted.last().unwrap();
    println!(
        "api_pods: pods={count} p50={:.3}s p99={:.3}s makespan={:.3}s raw_floor={:.3}s ratio={:.2}",
        pct(0.5).as_secs_f64(),
        pct(0.99).as_secs_f64(),
        makespan.as_secs_f64(),
        floor.as_secs_f64(),
        makespan.as_secs_f64() / floor.as_secs_f64()
    );
}

async fn delete_all(pods: &Api<Pod>, latencies: &HashMap<String, Duration>) {
    for name in latencies.keys() {
        let _ = pods.delete(name, &DeleteParams::default().grace_period(2)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while pods.list(&Default::default()).await.map(|l| l.items.len()).unwrap_or(1) > 0 {
        assert!(Instant::now() < deadline, "pods never went away");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Delete→gone for a pod whose process ignores SIGTERM, with a 2 s grace period.
async fn delete_latency(pods: &Api<Pod>) -> Duration {
    pods.create(&PostParams::default(), &pod("stubborn", "trap '' TERM; while true; do sleep 1; done", 2))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let running = pods.get("stubborn").await.ok().and_then(|p| p.status?.phase) == Some("Running".into());
        if running {
            break;
        }
        assert!(Instant::now() < deadline, "stubborn pod never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = Instant::now();
    pods.delete("stubborn", &DeleteParams::default()).await.unwrap();
    while pods.get_opt("stubborn").await.ok().flatten().is_some() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

async fn resources(pid: u32, pods: usize) {
    let ticks = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let rest = stat.rsplit_once(')').map(|(_, r)| r.to_string()).unwrap_or_default();
        let f: Vec<u64> = rest.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
        f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
    };
    let steady: u64 = std::env::var("GANTRY_BENCH_STEADY_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(10).max(10);
    let window = Duration::from_secs(10);
    // The CPU window is the last 10 s of the steady state.
    tokio::time::sleep(Duration::from_secs(steady) - window).await;
    let before = ticks(pid);
    tokio::time::sleep(window).await;
    let cpu = (ticks(pid) - before) as f64 / 100.0 / window.as_secs_f64();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let mib = |name: &str| field(name) / 1024.0;
    // Anonymous memory is what the agent allocates; file-backed is the binary's touched pages.
    println!(
        "api_pods: pods={pods} gantry_rss={:.1}MiB (anon {:.1}, file {:.1}) threads={} gantry_cpu={cpu:.4}cores \
         (over {window:?}, after {steady}s of steady state)",
        mib("VmRSS:"),
        mib("RssAnon:"),
        mib("RssFile:"),
        field("Threads:"),
    );
}
