//! Benchmark, cluster mode at density: what one node costs its machine and the API server.
//! Through the in-process test API server with a real containerd whose state is on disk (as on
//! real nodes, not tmpfs; in an ext4 filesystem with a journal, see [`Disk`]), for each pod
//! count it runs two cases, each with a fresh agent and API server: pods with no API objects,
//! and pods that each mount a distinct ConfigMap, a distinct Secret and the default
//! service-account volume. It prints:
//! - the makespan (first create → last pod Running) next to the raw CRI floor, the best of
//!   sequential and 8-way parallel raw CRI for the same number of pods on the same containerd,
//!   and next to 8-way parallel raw CRI of pods configured as a kubelet configures the case's
//!   pods (with the objects case's ConfigMap, Secret and token volumes for that case); in
//!   several rounds, each makespan against the mean of the floors measured right before and
//!   right after it, and the median of the rounds' ratios;
//! - where that time went: how busy the machine's cores were and which commands used them,
//!   during the floor and the makespan, when the runtime created the sandboxes and started the
//!   containers, and when the pods were first, half and all seen Running;
//! - the agent's RSS (anon and file), threads, and CPU over the steady-state window;
//! - API requests per minute over that window by verb and resource, counted by the server,
//!   and the watches open at its end; beside them what the Go kubelet's design implies;
//! - the Events created over that window, by reason.
//!
//! Each timed phase (floor or makespan) starts once the machine is idle, so that none shares
//! the cores with what the one before left running.
//!
//! Asserts nothing. `cargo bench -p gantry --bench density` (as root).
//! `GANTRY_BENCH_DENSITY_PODS`: pod counts (`110,250`); `GANTRY_BENCH_CASES`: `none,objects`;
//! `GANTRY_BENCH_ROUNDS`: floors and makespans per case (3); `GANTRY_BENCH_STEADY_SECS`: the
//! steady-state window (60); `GANTRY_BENCH_FLOOR_WORKERS`: the raw floor's numbers of
//! concurrent workers (`8`; e.g. `2,4,8,16`); `GANTRY_BENCH_DISK=root`: containerd's state on
//! the root filesystem instead; `GANTRY_BENCH_BIN`: another gantry binary to measure;
//! `GANTRY_BENCH_ARGS`: more flags for it (e.g. eviction thresholds this machine's disk does
//! not meet).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gantry_test_apiserver::{TestApiServer, User};
use gantry_testkit::{
    BUSYBOX_IMAGE, Containerd, ContainerdOptions, Shape, raw_start_pods, raw_start_pods_parallel,
    raw_start_shaped_pods_parallel,
};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const NODE: &str = "density-node";
const FLOOR_WORKERS: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    /// Pods with no ConfigMap, Secret or service-account volume.
    None,
    /// Each pod mounts its own ConfigMap and Secret, and the default service-account volume.
    Objects,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::None => "none",
            Case::Objects => "objects",
        }
    }
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    let value = std::env::var(name).unwrap_or_else(|_| default.to_string());
    value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}

#[tokio::main]
async fn main() {
    if let Some(reason) = gantry_testkit::prereq::missing_prerequisite() {
        gantry_testkit::prereq::skip_or_panic(&reason);
        return;
    }
    let counts: Vec<usize> =
        env_list("GANTRY_BENCH_DENSITY_PODS", "110,250").iter().filter_map(|c| c.parse().ok()).collect();
    let cases: Vec<Case> = env_list("GANTRY_BENCH_CASES", "none,objects")
        .iter()
        .filter_map(|c| match c.as_str() {
            "none" => Some(Case::None),
            "objects" => Some(Case::Objects),
            _ => None,
        })
        .collect();
    let env_number =
        |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let steady = Duration::from_secs(env_number("GANTRY_BENCH_STEADY_SECS", 60).max(10));
    let rounds = env_number("GANTRY_BENCH_ROUNDS", 3).max(1) as usize;
    let disk = Disk::new(std::env::var("GANTRY_BENCH_DISK").as_deref() != Ok("root"));
    let ctd = Containerd::start_with(ContainerdOptions { dir: Some(disk.dir.clone()), image_cache: None })
        .await
        .expect("containerd starts");
    for &count in &counts {
        let sequential = raw_sequential(&ctd, count).await;
        for &case in &cases {
            run_case(&ctd, count, case, sequential, rounds, steady).await;
        }
    }
    drop(ctd);
    drop(disk);
}

/// Where containerd's state and the agent's directories live: on disk, as on a real node, in an
/// ext4 filesystem with a journal as real nodes' are (mounted from an image file below
/// `/var/tmp`). This machine's root filesystem has no journal, and without one ext4 passes over
/// every inode freed in the last minute when it allocates one (`recently_deleted`), so each
/// timed phase paid, unevenly, for the files the phase before it removed. `journal: false`, or
/// when the filesystem cannot be made: a directory on the root filesystem.
struct Disk {
    dir: PathBuf,
    image: Option<PathBuf>,
}

impl Disk {
    fn new(journal: bool) -> Disk {
        let dir = PathBuf::from(format!("/var/tmp/gantry-density-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("bench directory");
        let image = dir.with_extension("img");
        let run = |program: &str, args: &[&std::ffi::OsStr]| {
            std::process::Command::new(program).args(args).status().is_ok_and(|s| s.success())
        };
        let mounted = journal
            && std::fs::File::create(&image).and_then(|f| f.set_len(DISK_BYTES)).is_ok()
            && run("mkfs.ext4", &["-q".as_ref(), "-F".as_ref(), image.as_os_str()])
            && run("mount", &["-o".as_ref(), "loop".as_ref(), image.as_os_str(), dir.as_os_str()]);
        println!(
            "density: containerd's state and the agent's directories on {}",
            if mounted { "an ext4 filesystem with a journal" } else { "the root filesystem" }
        );
        if !mounted {
            let _ = std::fs::remove_file(&image);
        }
        Disk { dir, image: mounted.then_some(image) }
    }
}

/// The bench's filesystem image: room for 250 pods' containerd state many times over (it is
/// sparse, so only what is written takes space).
const DISK_BYTES: u64 = 16 << 30;

impl Drop for Disk {
    fn drop(&mut self) {
        if let Some(image) = &self.image {
            // Dropping the containerd unmounts everything below its directory, this mount
            // too, unless it failed first; a loop mount detaches its device when unmounted.
            let _ = std::process::Command::new("umount").arg(&self.dir).stderr(std::process::Stdio::null()).status();
            let _ = std::fs::remove_file(image);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Raw CRI pods started one after another, once per pod count: 8 workers beat it by far.
async fn raw_sequential(ctd: &Containerd, count: usize) -> Duration {
    let client = ctd.runtime_client().await;
    idle_machine(&format!("pods={count} raw_sequential")).await;
    let busy = machine_ticks();
    let sequential = raw_start_pods(ctd, count).await.expect("raw pods");
    let sequential_busy = busy_cores(busy, sequential);
    gantry_testkit::cri::remove_sandboxes(&client, &[gantry_testkit::raw::RAW_LABEL]).await.expect("cleanup");
    println!("density: pods={count} raw_sequential={:.3}s (machine {sequential_busy})", sequential.as_secs_f64());
    sequential
}

/// The floor of one round: the best of `sequential` and bounded-parallel raw CRI for `count`
/// pods, with as many concurrent workers as each of `GANTRY_BENCH_FLOOR_WORKERS` says (8 by
/// default); then pods shaped as a kubelet configures `case`'s pods.
async fn raw_floor(ctd: &Containerd, count: usize, case: Case, sequential: Duration, label: &str) -> Floor {
    let client = ctd.runtime_client().await;
    let mut line = format!("density: {label}");
    let mut best = sequential;
    for workers in env_list("GANTRY_BENCH_FLOOR_WORKERS", &FLOOR_WORKERS.to_string()) {
        let Ok(workers) = workers.parse::<usize>() else { continue };
        idle_machine(&format!("{label} raw_parallel{workers}")).await;
        let (busy, commands) = (machine_ticks(), cpu_by_process());
        let parallel = raw_start_pods_parallel(ctd, count, workers).await.expect("raw pods");
        let parallel_busy = busy_cores(busy, parallel);
        println!("density: {label} raw_parallel{workers} cpu by command: {}", top_commands(&commands));
        gantry_testkit::cri::remove_sandboxes(&client, &[gantry_testkit::raw::RAW_LABEL]).await.expect("cleanup");
        line += &format!(" raw_parallel{workers}={:.3}s (machine {parallel_busy})", parallel.as_secs_f64());
        best = best.min(parallel);
    }
    println!("{line}");
    // The same floor again with pods configured as a kubelet configures them (cgroup parent,
    // DNS, mounts of /etc/hosts and the termination message file, service variables, and the
    // objects case's ConfigMap, Secret and token volumes): the runtime does more for each, so
    // the makespan is also given against it.
    let (shape, name) = match case {
        Case::None => (Shape::Kubelet, "kubelet_shaped"),
        Case::Objects => (Shape::KubeletWithObjects, "kubelet_shaped_objects"),
    };
    idle_machine(&format!("{label} raw_parallel{FLOOR_WORKERS}_{name}")).await;
    let (busy, commands) = (machine_ticks(), cpu_by_process());
    let shaped = raw_start_shaped_pods_parallel(ctd, count, FLOOR_WORKERS, shape).await.expect("raw pods");
    println!("density: {label} raw_parallel{FLOOR_WORKERS}_{name} cpu by command: {}", top_commands(&commands));
    println!(
        "density: {label} raw_parallel{FLOOR_WORKERS}_{name}={:.3}s (machine {}); {:.2}× the minimal floor",
        shaped.as_secs_f64(),
        busy_cores(busy, shaped),
        shaped.as_secs_f64() / best.as_secs_f64()
    );
    gantry_testkit::cri::remove_sandboxes(&client, &[gantry_testkit::raw::RAW_LABEL]).await.expect("cleanup");
    gantry_testkit::remove_raw_files(ctd).expect("raw pods' files removed");
    Floor { best, shaped }
}

/// The raw CRI floor of one round: the best of minimal pods started sequentially or by
/// workers, and pods shaped as a kubelet configures the case's pods, started by
/// [`FLOOR_WORKERS`] workers.
#[derive(Clone, Copy)]
struct Floor {
    best: Duration,
    shaped: Duration,
}

/// Starts an API server and an agent, then measures `rounds` makespans of the case's pods
/// (deleting them between rounds), each between two floors: the runtime's speed drifts by more
/// than the margins measured here, so each makespan is set against the mean of the floors
/// measured right before and right after it (a drift that is steady over a round cancels), and
/// the median of the rounds is the figure. The steady state follows the last makespan, before
/// the last floor.
async fn run_case(ctd: &Containerd, count: usize, case: Case, sequential: Duration, rounds: usize, steady: Duration) {
    let label = format!("pods={count} case={}", case.name());
    let server = TestApiServer::start().await;
    let admin = server.client(&User::Admin).await;
    let dir = ctd.dir().join(format!("density-{count}-{}", case.name()));
    std::fs::create_dir_all(&dir).unwrap();
    if case == Case::Objects {
        create_objects(&admin, count).await;
    }
    let mut args = common::cluster_node_args(ctd, &server, &dir, NODE);
    args.push(format!("--cgroup-root={}", ctd.cgroup_root()));
    args.extend(std::env::var("GANTRY_BENCH_ARGS").unwrap_or_default().split_whitespace().map(String::from));
    let mut agent = common::spawn(&dir, "gantry.log", &args);
    common::wait_for_node(&admin, NODE).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut before = raw_floor(ctd, count, case, sequential, &format!("{label} round=1")).await;
    let mut ratios = Ratios::default();
    for round in 1..=rounds {
        let label = format!("{label} round={round}");
        let makespan = makespan(ctd, &server, &pods, agent.id(), count, case, &label).await;
        if round == rounds {
            steady_state(&server, &Api::all(admin.clone()), agent.id(), &label, steady).await;
        }
        delete_all(&pods).await;
        sandboxes_gone(ctd).await;
        let after = raw_floor(ctd, count, case, sequential, &format!("{label} after")).await;
        ratios.push(&label, makespan, before, after);
        before = after;
    }
    ratios.print(&label, rounds);
    let _ = agent.kill();
    let _ = agent.wait();
}

/// The rounds' makespans against their floors: the mean of the floors before and after, and
/// the floor before alone (comparable with figures measured that way); each against the
/// minimal and the kubelet-shaped floor.
#[derive(Default)]
struct Ratios {
    before: Vec<f64>,
    bracketed: Vec<f64>,
    shaped_before: Vec<f64>,
    shaped_bracketed: Vec<f64>,
}

impl Ratios {
    fn push(&mut self, label: &str, makespan: Duration, before: Floor, after: Floor) {
        let mean = |a: Duration, b: Duration| (a + b) / 2;
        let (best, shaped) = (mean(before.best, after.best), mean(before.shaped, after.shaped));
        let ratio = makespan.div_duration_f64(best);
        let ratio_shaped = makespan.div_duration_f64(shaped);
        println!(
            "density: {label} makespan={:.3}s raw_floor={:.3}s (before {:.3}s, after {:.3}s) ratio={ratio:.2} \
             kubelet_shaped_floor={:.3}s (before {:.3}s, after {:.3}s) ratio_shaped={ratio_shaped:.2}",
            makespan.as_secs_f64(),
            best.as_secs_f64(),
            before.best.as_secs_f64(),
            after.best.as_secs_f64(),
            shaped.as_secs_f64(),
            before.shaped.as_secs_f64(),
            after.shaped.as_secs_f64(),
        );
        self.bracketed.push(ratio);
        self.shaped_bracketed.push(ratio_shaped);
        self.before.push(makespan.div_duration_f64(before.best));
        self.shaped_before.push(makespan.div_duration_f64(before.shaped));
    }

    fn print(&self, label: &str, rounds: usize) {
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            let middle = (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0;
            format!("{middle:.2} ({})", v.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", "))
        };
        println!(
            "density: {label} makespan over {rounds} rounds: ratio median {}; ratio_shaped median {}; against the \
             floor before only: ratio median {}, ratio_shaped median {}",
            median(&self.bracketed),
            median(&self.shaped_bracketed),
            median(&self.before),
            median(&self.shaped_before),
        );
    }
}

/// Creates the case's pods once the machine is idle and returns the time until the last one
/// ran, printing where that time went.
async fn makespan(
    ctd: &Containerd,
    server: &TestApiServer,
    pods: &Api<Pod>,
    agent: u32,
    count: usize,
    case: Case,
    label: &str,
) -> Duration {
    idle_machine(label).await;
    let (ticks, requests) = ((cpu_ticks(agent), cpu_ticks(std::process::id())), server.requests());
    let (busy, commands) = (machine_ticks(), cpu_by_process());
    let wall_start = std::time::SystemTime::now();
    let makespan = create_and_wait(pods, count, case, label).await;
    println!("density: {label} runtime timeline: {}", runtime_timeline(ctd, wall_start).await);
    let makespan_busy = busy_cores(busy, makespan);
    println!("density: {label} makespan cpu by command: {}", top_commands(&commands));
    // The agent's writes meanwhile: its status patches share the kubeAPIQPS token bucket.
    let during = server.requests().since(&requests);
    let writes: Vec<String> = [("patch", "pods/status"), ("create", "events"), ("patch", "events")]
        .iter()
        .map(|(verb, resource)| format!("{verb} {resource} {}", during.total(verb, resource)))
        .collect();
    println!("density: {label} api requests during the makespan: {}", writes.join(", "));
    // Where the 2 cores went meanwhile: the raw floor has neither an agent nor an API server
    // (in this process, with the bench's own client) beside containerd.
    let (agent_cpu, server_cpu) = (cpu_ticks(agent) - ticks.0, cpu_ticks(std::process::id()) - ticks.1);
    println!(
        "density: {label} cpu_agent={:.1}s cpu_apiserver_and_bench={:.1}s machine: {makespan_busy}",
        agent_cpu as f64 / 100.0,
        server_cpu as f64 / 100.0
    );
    makespan
}

async fn create_objects(admin: &Client, count: usize) {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    for i in 0..count {
        let cm = json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "1"}});
        cms.create(&PostParams::default(), &serde_json::from_value(cm).unwrap()).await.unwrap();
        let s = json!({"metadata": {"name": format!("s-{i}")}, "stringData": {"k": "1"}});
        secrets.create(&PostParams::default(), &serde_json::from_value(s).unwrap()).await.unwrap();
    }
}

fn pod(i: usize, case: Case) -> Pod {
    let mut spec = json!({
        "nodeName": NODE,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}]
    });
    match case {
        Case::None => spec["automountServiceAccountToken"] = json!(false),
        Case::Objects => {
            spec["volumes"] = json!([
                {"name": "cfg", "configMap": {"name": format!("cm-{i}")}},
                {"name": "sec", "secret": {"secretName": format!("s-{i}")}}
            ]);
            spec["containers"][0]["volumeMounts"] =
                json!([{"name": "cfg", "mountPath": "/cfg"}, {"name": "sec", "mountPath": "/sec"}]);
        }
    }
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("d-{i}")}, "spec": spec}),
    )
    .unwrap()
}

/// Creates the pods and returns the time from the first create to the last pod Running.
async fn create_and_wait(pods: &Api<Pod>, count: usize, case: Case, label: &str) -> Duration {
    let mut stream = pods.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let start = Instant::now();
    for i in 0..count {
        pods.create(&PostParams::default(), &pod(i, case)).await.unwrap();
    }
    let created = start.elapsed();
    let mut running: HashMap<String, Duration> = HashMap::new();
    let deadline = start + Duration::from_secs(900);
    while running.len() < count {
        assert!(Instant::now() < deadline, "only {} of {count} pods ran", running.len());
        let next = tokio::time::timeout(Duration::from_secs(30), stream.next()).await;
        let Ok(Some(Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)))) = next else {
            if let Ok(None) = next {
                stream = pods.watch(&WatchParams::default(), "0").await.unwrap().boxed();
            }
            continue;
        };
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            running.entry(p.name_any()).or_insert_with(|| start.elapsed());
        }
    }
    let mut times: Vec<Duration> = running.into_values().collect();
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize].as_secs_f64();
    println!(
        "density: {label} all created after {:.2}s; Running seen first {:.2}s, median {:.2}s, last {:.2}s",
        created.as_secs_f64(),
        at(0.0),
        at(0.5),
        at(1.0)
    );
    times.last().copied().unwrap_or_default()
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r.to_string()).unwrap_or_default();
    let f: Vec<u64> = rest.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

/// When the runtime created the sandboxes and started the containers, in seconds after
/// `start`: what of the makespan the runtime's work took, and what came after it (reporting).
async fn runtime_timeline(ctd: &Containerd, start: std::time::SystemTime) -> String {
    use gantry_cri::api;
    let mut client = ctd.runtime_client().await;
    let since = |ns: i64| {
        let at = std::time::UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64);
        at.duration_since(start).map_or(0.0, |d| d.as_secs_f64())
    };
    let sandboxes = client.list_pod_sandbox(api::ListPodSandboxRequest::default()).await.unwrap().into_inner().items;
    let mut created: Vec<f64> = sandboxes.iter().map(|s| since(s.created_at)).collect();
    let containers = client.list_containers(api::ListContainersRequest::default()).await.unwrap().into_inner();
    let mut started = Vec::new();
    for c in containers.containers {
        let request = api::ContainerStatusRequest { container_id: c.id, verbose: false };
        let status = client.container_status(request).await.unwrap().into_inner().status.unwrap_or_default();
        started.push(since(status.started_at));
    }
    created.sort_by(f64::total_cmp);
    started.sort_by(f64::total_cmp);
    let at = |v: &[f64], q: f64| v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    format!(
        "sandboxes created {:.2}s..{:.2}s (median {:.2}s), containers started {:.2}s..{:.2}s (median {:.2}s)",
        at(&created, 0.0),
        at(&created, 1.0),
        at(&created, 0.5),
        at(&started, 0.0),
        at(&started, 1.0),
        at(&started, 0.5)
    )
}

/// Waits (up to a minute) until the machine is idle, so that no timed phase shares the cores
/// with what the one before left running: containerd still removing the last phase's
/// sandboxes, or the agent still starting up.
async fn idle_machine(label: &str) {
    const WINDOW: Duration = Duration::from_millis(500);
    let start = Instant::now();
    loop {
        let before = machine_ticks().0;
        tokio::time::sleep(WINDOW).await;
        let busy = (machine_ticks().0 - before) as f64 / 100.0 / WINDOW.as_secs_f64();
        if busy < IDLE_CORES || start.elapsed() > Duration::from_secs(60) {
            println!(
                "density: {label} starts after {:.1}s of waiting for an idle machine (busy {busy:.2} cores)",
                start.elapsed().as_secs_f64()
            );
            return;
        }
    }
}

/// Below this many busy cores the machine counts as idle.
const IDLE_CORES: f64 = 0.15;

/// The machine's busy CPU time (all but idle and iowait) and its iowait, in clock ticks.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu = stat.lines().next().unwrap_or_default();
    let f: Vec<u64> = cpu.split_whitespace().skip(1).map(|v| v.parse().unwrap_or(0)).collect();
    let busy = f.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, v)| v).sum();
    (busy, f.get(4).copied().unwrap_or(0))
}

/// How many cores were busy, and waiting for I/O, on average since `before` over `elapsed`:
/// whether a phase was bound by the CPU (the 2 cores of this machine), by the disk, or waited.
fn busy_cores(before: (u64, u64), elapsed: Duration) -> String {
    let now = machine_ticks();
    let per_core = |ticks: u64| ticks as f64 / 100.0 / elapsed.as_secs_f64();
    format!("busy {:.2} cores, iowait {:.2}", per_core(now.0 - before.0), per_core(now.1 - before.1))
}

/// CPU ticks of every process (its own and its reaped children's) by pid, with its command.
/// Init is left out: it reaps every orphan (containerd's shims among them).
fn cpu_by_process() -> HashMap<u32, (String, u64)> {
    let mut by = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()).filter(|&p| p != 1) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let f: Vec<u64> = stat[close + 1..].split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
        let ticks: u64 = f.get(11..15).map_or(0, |t| t.iter().sum());
        // Kernel workers rename themselves after their current work queue.
        let command = stat[open + 1..close].split('/').next().unwrap_or_default().to_string();
        by.insert(pid, (command, ticks));
    }
    by
}

/// The commands whose processes used the most CPU since `before`, in seconds.
fn top_commands(before: &HashMap<u32, (String, u64)>) -> String {
    let mut by: HashMap<String, u64> = HashMap::new();
    for (pid, (command, ticks)) in cpu_by_process() {
        let was = before.get(&pid).map_or(0, |b| b.1);
        *by.entry(command).or_insert(0) += ticks.saturating_sub(was);
    }
    let mut used: Vec<(String, u64)> = by.into_iter().filter(|(_, t)| *t > 0).collect();
    used.sort_by_key(|u| std::cmp::Reverse(u.1));
    used.iter().take(8).map(|(c, t)| format!("{c} {:.1}s", *t as f64 / 100.0)).collect::<Vec<_>>().join(", ")
}

/// The names of the Events that exist now.
async fn event_names(events: &Api<Event>) -> HashSet<String> {
    let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.iter().map(ResourceExt::name_any).collect()
}

/// The Events created since `before` (their names), by reason, with one message each.
async fn new_events(events: &Api<Event>, before: &HashSet<String>) -> BTreeMap<String, (usize, String)> {
    let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    let mut by_reason: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for e in list.iter().filter(|e| !before.contains(&e.name_any())) {
        let entry = by_reason.entry(e.reason.clone().unwrap_or_default()).or_default();
        entry.0 += 1;
        entry.1 = e.message.clone().unwrap_or_default();
    }
    by_reason
}

/// Waits until start-up work is over: at least 10 s, and until no Event has been created for
/// 10 s (the recorder's rate limits release start-up Events for a while after the pods run), at
/// most 3 minutes. Returns the Events that exist then.
async fn settle(events: &Api<Event>, label: &str) -> HashSet<String> {
    let start = Instant::now();
    let mut names = event_names(events).await;
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(10) && start.elapsed() < Duration::from_secs(180) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = event_names(events).await;
        if now != names {
            names = now;
            quiet_since = Instant::now();
        }
    }
    println!("density: {label} steady window starts after {:.0}s of settling", start.elapsed().as_secs_f64());
    names
}

/// CPU, memory, API requests and new Events over the steady-state window.
async fn steady_state(server: &TestApiServer, events: &Api<Event>, pid: u32, label: &str, window: Duration) {
    let events_before = settle(events, label).await;
    let (before, ticks) = (server.requests(), cpu_ticks(pid));
    tokio::time::sleep(window).await;
    let cpu = (cpu_ticks(pid) - ticks) as f64 / 100.0 / window.as_secs_f64();
    let counted = server.requests().since(&before);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> f64 {
        let value = status.lines().find_map(|l| l.strip_prefix(name));
        value.and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
    };
    let mib = |name: &str| field(name) / 1024.0;
    println!(
        "density: {label} rss={:.1}MiB (anon {:.1}, file {:.1}) threads={} cpu={cpu:.4}cores (over {}s of steady state)",
        mib("VmRSS:"),
        mib("RssAnon:"),
        mib("RssFile:"),
        field("Threads:"),
        window.as_secs(),
    );
    let per_min = |n: u64| n as f64 * 60.0 / window.as_secs_f64();
    let by = counted.by_verb_and_resource();
    for ((verb, resource), n) in &by {
        println!("density: {label} api {verb} {resource} {:.1}/min", per_min(*n));
    }
    let total: u64 = by.values().sum();
    println!("density: {label} api total {:.1}/min", per_min(total));
    let referenced = ["configmaps", "secrets"].iter().map(|r| counted.total("get", r)).sum::<u64>();
    let leases = counted.total("update", "leases") + counted.total("patch", "leases");
    let status_patches = counted.total("patch", "nodes/status") + counted.total("update", "nodes/status");
    println!(
        "density: {label} vs Go kubelet design: lease renewals {:.1}/min (Go: 6), node status patches {:.1}/min \
         (Go: at most 6), GETs of pod-referenced ConfigMaps/Secrets {:.1}/min (Go: 0)",
        per_min(leases),
        per_min(status_patches),
        per_min(referenced),
    );
    let mut open: BTreeMap<String, usize> = BTreeMap::new();
    for w in server.open_watches() {
        *open.entry(w.resource).or_insert(0) += 1;
    }
    println!("density: {label} open watches {open:?}");
    for (reason, (n, message)) in new_events(events, &events_before).await {
        println!("density: {label} events created {reason}: {n} (e.g. {message:?})");
    }
}

async fn delete_all(pods: &Api<Pod>) {
    let _ = pods.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    let deadline = Instant::now() + Duration::from_secs(300);
    while pods.list(&ListParams::default()).await.map(|l| l.items.len()).unwrap_or(1) > 0 {
        assert!(Instant::now() < deadline, "pods never went away");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the agent has removed the deleted pods' sandboxes from the runtime, so that the
/// next round starts on the same runtime state as the first.
async fn sandboxes_gone(ctd: &Containerd) {
    let mut client = ctd.runtime_client().await;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let request = gantry_cri::api::ListPodSandboxRequest::default();
        let left = client.list_pod_sandbox(request).await.map(|r| r.into_inner().items.len()).unwrap_or(1);
        if left == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{left} sandboxes of deleted pods were never removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
