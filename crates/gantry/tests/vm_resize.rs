//! End-to-end, in-place pod resize on cgroup v2 (the systemd VM of `scripts/vm`), on both
//! cgroup drivers. The host runs the test API server; the guest's Gantry joins it in cluster
//! mode over the VM's only network path (qemu's restricted user network, one forward to the
//! server's port). The host patches the `resize` subresource as `kubectl patch --subresource
//! resize` does and asserts on the API status and on the guest's cgroup v2 files (`cpu.max`,
//! `memory.max` of the pod and container cgroups; with the systemd driver also the pod slice's
//! `CPUQuotaPerSecUSec` and `MemoryMax` as systemd holds them), which the guest script
//! `vm/resize.sh` samples into the 9p share.
//!
//! Needs root and the VM image (`scripts/vm build`, which `scripts/test` runs); otherwise the
//! test prints SKIPPED, and fails under `CI=true`.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use gantry_test_apiserver::{TestApiServer, User};
use gantry_testkit::vm::{self, Forward};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use vm_cluster::{GUEST_API, NODE, STEP, guest_kubeconfig, stripped_gantry, until};

#[path = "common/vm_cluster.rs"]
mod vm_cluster;

/// The longest the whole boot may take (TCG emulation on a loaded machine is slow).
const VM_TIMEOUT: Duration = Duration::from_secs(1200);
fn status_of(pod: &Pod) -> Option<ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|s| s.name == "app").cloned()
}

fn resize_in_progress(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "PodResizeInProgress" || c.type_ == "PodResizePending"))
}

/// The reported `resources.limits` of the container: (cpu, memory).
fn reported_limits(pod: &Pod) -> Option<(String, String)> {
    let limits = status_of(pod)?.resources?.limits?;
    Some((limits.get("cpu")?.0.clone(), limits.get("memory")?.0.clone()))
}

/// The guest's latest sample of one case's cgroups: {(cgroup, file): value}.
fn cgroups(share: &Path, case: &str) -> HashMap<(String, String), String> {
    let text = std::fs::read_to_string(share.join(format!("results/{case}/cgroups"))).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ' ');
            Some(((parts.next()?.to_string(), parts.next()?.to_string()), parts.next()?.trim().to_string()))
        })
        .collect()
}

/// The burstable pod's cgroup and its container's, as each driver names them.
fn cgroup_paths(driver: &str, uid: &str, container_id: &str) -> (String, String) {
    if driver == "systemd" {
        let uid = uid.replace('-', "_");
        let pod = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice");
        let container = format!("{pod}/cri-containerd-{container_id}.scope");
        (pod, container)
    } else {
        let pod = format!("/kubepods/burstable/pod{uid}");
        let container = format!("{pod}/{container_id}");
        (pod, container)
    }
}

/// Waits until the guest saw the CPU limit (`cpu_millis`) and `memory_max` in `cpu.max` and
/// `memory.max` of both the pod's and the container's cgroup (the pod has this one container,
/// so its limits are the same), and with the systemd driver in the pod slice's properties too,
/// since systemd would restore its own values over files written behind its back.
async fn cgroups_show(share: &Path, driver: &str, paths: &(String, String), cpu_millis: u32, memory_max: u64) {
    let want = (format!("{} 100000", cpu_millis * 100), memory_max.to_string());
    let want_slice = (Some(format!("{cpu_millis}ms")), Some(memory_max.to_string()));
    let mut seen = HashMap::new();
    let (pod, container) = paths;
    let slice = format!("unit:{}", pod.rsplit('/').next().unwrap());
    let found = tokio::time::timeout(STEP, async {
        loop {
            seen = cgroups(share, driver);
            let get = |path: &String, file: &str| seen.get(&(path.clone(), file.to_string())).cloned();
            let of = |path| Some((get(path, "cpu.max")?, get(path, "memory.max")?));
            let unit = (get(&slice, "CPUQuotaPerSecUSec"), get(&slice, "MemoryMax"));
            let slice_ok = driver != "systemd" || unit == want_slice;
            if of(pod).as_ref() == Some(&want) && of(container).as_ref() == Some(&want) && slice_ok {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(found.is_ok(), "{driver}: {paths:?} never showed {want:?}; last sample: {seen:#?}");
}

/// One driver: a pod's CPU and memory limits up, then down, in place, in the API status and in
/// the kernel's cgroup v2 files.
async fn resize_case(pods: &Api<Pod>, share: &Path, driver: &str) {
    let ready = share.join(format!("results/{driver}/ready"));
    until(&format!("the guest's Gantry on the {driver} driver"), || async { ready.exists().then_some(()) }).await;
    let name = format!("resize-{driver}");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": NODE, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "automountServiceAccountToken": false,
                 "containers": [{"name": "app", "image": gantry_testkit::BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                   "limits": {"cpu": "200m", "memory": "128Mi"}}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = until(&format!("{name} running"), || async {
        let pod = pods.get(&name).await.ok()?;
        status_of(&pod)?.state?.running.is_some().then_some(pod)
    })
    .await;
    let container_id = status_of(&running).and_then(|s| s.container_id).unwrap();
    let id = container_id.trim_start_matches("containerd://").to_string();
    let paths = cgroup_paths(driver, running.metadata.uid.as_deref().unwrap(), &id);
    cgroups_show(share, driver, &paths, 200, 128 << 20).await;

    for (cpu, memory, cpu_millis, memory_max) in [("400m", "256Mi", 400, 256 << 20), ("100m", "96Mi", 100, 96 << 20)] {
        let patch =
            json!({"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": cpu, "memory": memory}}}]}});
        pods.patch_resize(&name, &PatchParams::default(), &Patch::Strategic(patch)).await.unwrap();
        let pod = until(&format!("{name}: limits {cpu}/{memory} reported"), || async {
            let pod = pods.get(&name).await.ok()?;
            let done = reported_limits(&pod)? == (cpu.to_string(), memory.to_string()) && !resize_in_progress(&pod);
            done.then_some(pod)
        })
        .await;
        let status = status_of(&pod).unwrap();
        assert_eq!(
            (status.restart_count, status.container_id.as_deref()),
            (0, Some(container_id.as_str())),
            "{driver}: resized in place to {cpu}/{memory}"
        );
        cgroups_show(share, driver, &paths, cpu_millis, memory_max).await;
    }

    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    until(&format!("{name} gone"), || async { pods.get_opt(&name).await.ok()?.is_none().then_some(()) }).await;
    std::fs::write(share.join(format!("results/{driver}/done")), "").unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn resize_in_place_on_cgroup_v2_with_both_drivers() {
    let server = TestApiServer::start().await;
    let port: u16 = server.url().rsplit_once(':').unwrap().1.parse().unwrap();
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm");
    let files = |dir: &Path| vec![stripped_gantry(dir), guest_kubeconfig(&server, dir)];
    let forward = Forward { guest: GUEST_API, host_port: port };
    let Some(running) = vm::start_for_test("vm_resize", &here.join("resize.sh"), files, VM_TIMEOUT, Some(forward))
    else {
        return;
    };
    let share = running.share();
    let vm = tokio::task::spawn_blocking(move || vm::finish_for_test(running));

    let pods: Api<Pod> = Api::namespaced(server.client(&User::Admin).await, "default");
    let cases = tokio::spawn({
        let share = share.clone();
        async move {
            for driver in ["cgroupfs", "systemd"] {
                resize_case(&pods, &share, driver).await;
            }
        }
    })
    .await;
    if cases.is_err() {
        // The guest waits for each case's end; let it power off now.
        let _ = std::fs::write(share.join("results/abort"), "");
    }
    let run = vm.await.unwrap();
    if let Err(failed) = cases {
        eprintln!("{}", run.report());
        for driver in ["cgroupfs", "systemd"] {
            eprintln!("--- {driver}/gantry.log (tail) ---\n{}", tail(&run.read(&format!("{driver}/gantry.log")), 60));
        }
        std::panic::resume_unwind(failed.into_panic());
    }
    assert_eq!(run.exit, 0, "the guest script failed\n{}", run.report());
    assert_eq!(run.read("cgroup-fs").trim(), "cgroup2fs", "the guest runs cgroup v2");
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
