//! Benchmark: time until N static pods run under `gantry kubelet`, next to the raw CRI floor
//! (the same sandboxes and containers created by a plain sequential loop of CRI calls) on the
//! same containerd, in the same run. Also reports the agent's memory and CPU with the pods
//! running. Prints figures; asserts nothing.
//!
//! `cargo bench -p gantry --bench static_pods` (as root). `GANTRY_BENCH_PODS` sets N (30).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gantry_cri::api::{ContainerFilter, ContainerState, ListContainersRequest};
use gantry_testkit::{BUSYBOX_IMAGE, Containerd, raw_start_pods, remove_all_pods};

const NODE: &str = "bench-node";

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("GANTRY_BENCH_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let Some(ctd) = Containerd::start_or_skip().await else { return };
    for pods in [1, n] {
        let raw_before = raw_floor(&ctd, pods).await;
        let (gantry, status_file) = gantry_run(&ctd, pods).await;
        let raw_after = raw_floor(&ctd, pods).await;
        let floor = (raw_before + raw_after) / 2;
        println!(
            "static_pods: pods={pods} gantry_all_running={:.3}s status_file_all_running={:.3}s raw_floor={:.3}s (runs {:.3}s, {:.3}s) ratio={:.2}",
            gantry.as_secs_f64(),
            status_file.as_secs_f64(),
            floor.as_secs_f64(),
            raw_before.as_secs_f64(),
            raw_after.as_secs_f64(),
            gantry.as_secs_f64() / floor.as_secs_f64()
        );
    }
}

async fn raw_floor(ctd: &Containerd, pods: usize) -> Duration {
    let elapsed = raw_start_pods(ctd, pods).await.expect("raw pods");
    remove_all_pods(ctd).await.expect("cleanup");
    elapsed
}

/// Starts the agent on a folder of `pods` manifests; returns the time until the runtime runs
/// all containers and until the status file says Running for all.
async fn gantry_run(ctd: &Containerd, pods: usize) -> (Duration, Duration) {
    let dir = ctd.dir().join(format!("bench-{pods}"));
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    for i in 0..pods {
        std::fs::write(manifests.join(format!("pod-{i}.yaml")), manifest(i)).unwrap();
    }
    let config = dir.join("config.yaml");
    let config_yaml = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\nenableServer: false\n",
        dir.join("logs").display()
    );
    std::fs::write(&config, config_yaml).unwrap();
    let start = Instant::now();
    let args = [
        "kubelet".to_string(),
        format!("--config={}", config.display()),
        format!("--container-runtime-endpoint={}", ctd.endpoint()),
        format!("--root-dir={}", dir.join("root").display()),
        format!("--pod-manifest-path={}", manifests.display()),
        format!("--hostname-override={NODE}"),
    ];
    let mut child = common::spawn(&dir, "gantry.log", &args);
    let all_running = wait_until(|| async { running_containers(ctd).await >= pods }).await;
    let status_path = dir.join("root/pods.json");
    let status_file = wait_until(|| async { status_running(&status_path) >= pods }).await;
    report_resources(child.id(), pods).await;
    let _ = child.kill();
    let _ = child.wait();
    remove_all_pods(ctd).await.expect("cleanup");
    (all_running - start, status_file - start)
}

fn manifest(i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bench-{i}\nspec:\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    command: [sleep, \"3600\"]\n"
    )
}

async fn wait_until<F, Fut>(mut done: F) -> Instant
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(300);
    while !done().await {
        assert!(Instant::now() < deadline, "benchmark timed out");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Instant::now()
}

async fn running_containers(ctd: &Containerd) -> usize {
    let mut client = ctd.runtime_client().await;
    let filter = ContainerFilter {
        label_selector: HashMap::from([("gantry.dev/node".to_string(), NODE.to_string())]),
        ..Default::default()
    };
    let list = client.list_containers(ListContainersRequest { filter: Some(filter) }).await.unwrap().into_inner();
    list.containers.iter().filter(|c| c.state == ContainerState::ContainerRunning as i32).count()
}

fn status_running(path: &Path) -> usize {
    gantry_agent::status_store::read_pod_list(path)
        .unwrap_or_default()
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

/// Resident memory now, and CPU used over 10 s of steady state.
async fn report_resources(pid: u32, pods: usize) {
    let cpu_before = cpu_ticks(pid);
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let cpu = (cpu_ticks(pid) - cpu_before) as f64 / ticks_per_second() / window.as_secs_f64();
    println!(
        "static_pods: pods={pods} gantry_rss={:.1}MiB gantry_cpu={cpu:.4}cores (steady state, {window:?})",
        rss_kib(pid) as f64 / 1024.0
    );
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12) // utime, stime
}

fn ticks_per_second() -> f64 {
    100.0 // USER_HZ on Linux
}
