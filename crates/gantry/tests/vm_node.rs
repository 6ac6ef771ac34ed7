//! End-to-end on a real systemd host: a Debian 12 VM with systemd as PID 1 on the unified cgroup
//! v2 hierarchy, Debian's containerd and runc, and the real Gantry binary (`scripts/vm`,
//! `gantry_testkit::vm`). One boot runs every case: the guest script `vm/node.sh` drives Gantry
//! with static pods on both cgroup drivers and records what it saw; the tests here assert on it.
//!
//! Needs root and the VM image (`scripts/vm build`, which `scripts/test` runs); otherwise the
//! tests print SKIPPED, and fail under `CI=true`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use gantry_testkit::vm::{self, VmRun};

/// The longest the whole boot may take (TCG emulation on a loaded machine is slow).
const VM_TIMEOUT: Duration = Duration::from_secs(900);

/// The one boot all tests share; `None` when the VM cannot run here.
fn vm() -> Option<&'static VmRun> {
    static RUN: OnceLock<Option<VmRun>> = OnceLock::new();
    RUN.get_or_init(|| {
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm");
        vm::boot_for_test(
            "vm_node",
            &here.join("node.sh"),
            |dir| vec![stripped_gantry(dir), here.join("pods")],
            VM_TIMEOUT,
        )
    })
    .as_ref()
}

/// The debug binary without its debug info (a sixth of the size), for a quicker trip over 9p.
fn stripped_gantry(dir: &Path) -> PathBuf {
    let full = PathBuf::from(env!("CARGO_BIN_EXE_gantry"));
    let out = dir.join("gantry");
    let stripped = std::process::Command::new("strip").arg("--strip-debug").arg("-o").arg(&out).arg(&full).status();
    if stripped.is_ok_and(|s| s.success()) { out } else { full }
}

/// The run, which must have completed its script.
fn completed() -> Option<&'static VmRun> {
    let run = vm()?;
    assert_eq!(run.exit, 0, "the guest script failed\n{}", run.report());
    Some(run)
}

/// `<cgroup> <file> <value>` lines of a cgroup dump → {(cgroup, file): value}.
fn cgroups(run: &VmRun, name: &str) -> HashMap<(String, String), String> {
    run.read(name)
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ' ');
            let (cgroup, file, value) = (parts.next()?, parts.next()?, parts.next().unwrap_or_default());
            Some(((cgroup.to_string(), file.to_string()), value.trim().to_string()))
        })
        .collect()
}

/// The static pods' UIDs by pod name (`guaranteed`, …), from their log directories
/// (`<namespace>_<pod>_<uid>`), which exist once the containers ran.
fn uids(run: &VmRun, case: &str) -> HashMap<String, String> {
    run.read(&format!("{case}/container-output"))
        .lines()
        .filter_map(|l| {
            let dir = l.split(' ').next()?.strip_prefix("default_")?;
            let (pod, uid) = dir.rsplit_once('_')?;
            Some((pod.trim_end_matches("-vm-node").to_string(), uid.to_string()))
        })
        .collect()
}

/// What the pod's container printed about its own cgroup: {file: value}.
fn container_view(run: &VmRun, case: &str, pod: &str) -> HashMap<String, String> {
    let prefix = format!("default_{pod}-vm-node_");
    run.read(&format!("{case}/container-output"))
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix)?.split_once(' ')?.1.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// The pod cgroups of one case, by pod name, with the path its QoS class puts it at.
fn pod_cgroups(run: &VmRun, case: &str, path: impl Fn(&str, &str) -> String) -> HashMap<String, String> {
    let uids = uids(run, case);
    assert_eq!(uids.len(), 3, "all three pods ran\n{}", run.report());
    uids.iter().map(|(name, uid)| (name.clone(), path(name, uid))).collect()
}

/// Upstream's values for the three pods, the same on both drivers: `cpu.weight` from the
/// kubelet's linear formula (500m → 512 shares → 20, 100m → 102 → 4, BestEffort → 1).
fn assert_pod_limits(run: &VmRun, case: &str, paths: &HashMap<String, String>) {
    let seen = cgroups(run, &format!("{case}/cgroups-running"));
    let file = |pod: &str, f: &str| {
        let key = (paths[pod].clone(), f.to_string());
        seen.get(&key)
            .cloned()
            .unwrap_or_else(|| panic!("{key:?} missing\n{}", run.read(&format!("{case}/cgroups-running"))))
    };
    let expected = [
        (
            "guaranteed",
            [("cpu.weight", "20"), ("cpu.max", "50000 100000"), ("memory.max", "67108864"), ("pids.max", "100")],
        ),
        (
            "burstable",
            [("cpu.weight", "4"), ("cpu.max", "max 100000"), ("memory.max", "67108864"), ("pids.max", "100")],
        ),
        ("besteffort", [("cpu.weight", "1"), ("cpu.max", "max 100000"), ("memory.max", "max"), ("pids.max", "100")]),
    ];
    for (pod, files) in expected {
        for (f, value) in files {
            assert_eq!(file(pod, f), value, "{case}: {f} of the {pod} pod's cgroup {}", paths[pod]);
        }
    }
    // Inside, each container sees its own limits (runc converts shares to weight itself).
    let g = container_view(run, case, "guaranteed");
    assert_eq!((g["cpu.max"].as_str(), g["memory.max"].as_str()), ("50000 100000", "67108864"), "{case}: {g:?}");
    let b = container_view(run, case, "burstable");
    assert_eq!((b["cpu.max"].as_str(), b["memory.max"].as_str()), ("max 100000", "67108864"), "{case}: {b:?}");
    let be = container_view(run, case, "besteffort");
    assert_eq!(be["memory.max"], "max", "{case}: {be:?}");
}

/// After the pods were deleted (and the orphan's clean-up ran), no pod cgroup is left.
fn assert_pod_cgroups_gone(run: &VmRun, case: &str) {
    let after = run.read(&format!("{case}/cgroups-deleted"));
    assert!(!after.is_empty(), "{case}: the QoS cgroups stay\n{}", run.report());
    let left: Vec<&str> = after.lines().filter(|l| l.contains("/pod") || l.contains("-pod")).collect();
    assert!(
        left.is_empty(),
        "{case}: pod cgroups left after delete: {left:?}\n{}",
        run.read(&format!("{case}/gantry.log"))
    );
}

#[test]
fn the_guest_runs_cgroup_v2() {
    let Some(run) = completed() else { return };
    assert_eq!(run.read("cgroup-fs").trim(), "cgroup2fs");
}

#[test]
fn cgroupfs_driver_pod_and_qos_cgroups_carry_the_limits() {
    let Some(run) = completed() else { return };
    let paths = pod_cgroups(run, "cgroupfs", |name, uid| match name {
        "guaranteed" => format!("/kubepods/pod{uid}"),
        qos => format!("/kubepods/{qos}/pod{uid}"),
    });
    assert_pod_limits(run, "cgroupfs", &paths);
    let seen = cgroups(run, "cgroupfs/cgroups-running");
    let weight = seen.get(&("/kubepods/besteffort".into(), "cpu.weight".into()));
    assert_eq!(weight.map(String::as_str), Some("1"), "the besteffort level has the minimum weight");
    let weight = seen.get(&("/kubepods/burstable".into(), "cpu.weight".into()));
    assert_eq!(weight.map(String::as_str), Some("4"), "the burstable level: its one pod's 100m (102 shares)");
}

/// `kubepods` carries the node's allocatable: 2 CPUs − 500m systemReserved → 1536 shares →
/// weight 59; memory − 256Mi kubeReserved.
fn assert_kubepods_allocatable(run: &VmRun, case: &str, kubepods: &str) {
    assert_eq!(run.read("cpus").trim(), "2", "the VM has 2 CPUs");
    let memory: i64 = run.read("memory-bytes").trim().parse().unwrap();
    let seen = cgroups(run, &format!("{case}/cgroups-running"));
    let file = |f: &str| seen.get(&(kubepods.to_string(), f.to_string())).cloned().unwrap_or_default();
    assert_eq!(file("cpu.weight"), "59", "{case}");
    assert_eq!(file("memory.max"), (memory - (256 << 20)).to_string(), "{case}");
}

#[test]
fn cgroupfs_driver_kubepods_carries_allocatable() {
    let Some(run) = completed() else { return };
    assert_kubepods_allocatable(run, "cgroupfs", "/kubepods");
}

#[test]
fn systemd_driver_kubepods_slice_carries_allocatable() {
    let Some(run) = completed() else { return };
    assert_kubepods_allocatable(run, "systemd", "/kubepods.slice");
}

#[test]
fn cgroupfs_driver_pod_cgroups_and_orphans_are_removed() {
    let Some(run) = completed() else { return };
    assert_pod_cgroups_gone(run, "cgroupfs");
    assert!(
        run.read("cgroupfs/gantry.log").contains("removed orphaned pod cgroup"),
        "the orphan was removed by the clean-up\n{}",
        run.read("cgroupfs/gantry.log")
    );
}

/// `kubepods-<qos>-pod<uid with underscores>.slice` below its parents.
fn slice_path(name: &str, uid: &str) -> String {
    let uid = uid.replace('-', "_");
    match name {
        "guaranteed" => format!("/kubepods.slice/kubepods-pod{uid}.slice"),
        qos => format!("/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice"),
    }
}

#[test]
fn systemd_driver_slices_carry_the_limits() {
    let Some(run) = completed() else { return };
    let paths = pod_cgroups(run, "systemd", slice_path);
    assert_pod_limits(run, "systemd", &paths);
    let seen = cgroups(run, "systemd/cgroups-running");
    let weight = seen.get(&("/kubepods.slice/kubepods-burstable.slice".into(), "cpu.weight".into()));
    assert_eq!(weight.map(String::as_str), Some("4"), "the burstable slice: its one pod's 100m (102 shares)");
    // systemd itself holds the values: they survive a daemon-reload and show in its units.
    let slices = run.read("systemd/slices-running");
    let guaranteed = slices
        .lines()
        .find(|l| {
            l.starts_with(&format!("kubepods-pod{}.slice ", uids(run, "systemd")["guaranteed"].replace('-', "_")))
        })
        .unwrap_or_else(|| panic!("no guaranteed pod slice unit\n{slices}"));
    for property in ["CPUWeight=20", "CPUQuotaPerSecUSec=500ms", "MemoryMax=67108864", "TasksMax=100"] {
        assert!(guaranteed.split_whitespace().any(|p| p == property), "{property} in {guaranteed}");
    }
}

#[test]
fn systemd_driver_slices_and_orphans_are_removed() {
    let Some(run) = completed() else { return };
    assert_pod_cgroups_gone(run, "systemd");
    let units = run.read("systemd/units-deleted");
    assert!(!units.contains("-pod"), "pod slice units left: {units}");
    assert!(run.read("systemd/gantry.log").contains("removed orphaned pod cgroup"));
}

#[test]
fn driver_mismatch_names_both_settings() {
    let Some(run) = completed() else { return };
    let log = run.read("mismatch/gantry.log");
    let line = log.lines().find(|l| l.contains("SystemdCgroup")).unwrap_or_else(|| panic!("no mismatch error\n{log}"));
    assert!(line.contains("cgroupDriver") && line.contains("cgroupfs"), "{line}");
    // The other way round: containerd on cgroupfs takes the systemd parent as a path.
    let log = run.read("mismatch-systemd/gantry.log");
    let line = log.lines().find(|l| l.contains("SystemdCgroup")).unwrap_or_else(|| panic!("no mismatch error\n{log}"));
    assert!(line.contains("cgroupDriver is \"systemd\"") && line.contains("SystemdCgroup = false"), "{line}");
}

/// A series' value in Prometheus text.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.split(' ').next()?.parse().ok())
}

/// The 24 MiB the guaranteed pod keeps in /dev/shm.
const HOG: u64 = 24 << 20;

/// `/stats/summary` and `/metrics/resource` on cgroup v2, read from Gantry's read-only port in
/// the guest while the pods ran: the guaranteed pod's working set holds its 24 MiB and agrees
/// with its pod cgroup's own `memory.current` − `inactive_file` read right after; CPU time is
/// there and no more than the cgroup's `usage_usec`; the node comes from the v2 root, the
/// system containers from their cgroups.
fn assert_stats(run: &VmRun, case: &str, pod_cgroup: &str) {
    let text = run.read(&format!("{case}/summary.json"));
    let summary: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{case}: summary {e}: {text}\n{}", run.report()));
    let pod = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == "guaranteed-vm-node")
        .unwrap_or_else(|| panic!("{case}: no guaranteed pod in {text}"));
    let ws = pod["memory"]["workingSetBytes"].as_u64().unwrap();
    assert!(ws >= HOG, "{case}: pod working set {ws} holds the 24 MiB: {pod}");
    let container = &pod["containers"][0];
    assert!(container["memory"]["workingSetBytes"].as_u64().unwrap() >= HOG, "{case}: {container}");
    assert!(pod["process_stats"]["process_count"].as_u64().unwrap() >= 2, "{case}: pause and sleep: {pod}");
    assert_eq!(pod["memory"]["availableBytes"].as_u64().unwrap(), (64 << 20) - ws, "{case}: limit − working set");

    // The pod cgroup's files, read just after the summary.
    let line = run
        .read(&format!("{case}/pod-cgroup-stats"))
        .lines()
        .find(|l| l.starts_with(&format!("{pod_cgroup} ")))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{case}: {pod_cgroup} not in {}", run.read(&format!("{case}/pod-cgroup-stats"))));
    let n: Vec<u64> = line.split_whitespace().skip(1).map(|v| v.parse().unwrap()).collect();
    let (own_ws, usage_usec) = (n[0] - n[1], n[2]);
    assert!(ws.abs_diff(own_ws) < 4 << 20, "{case}: summary {ws} vs the cgroup's {own_ws} ({line})");
    let cpu = pod["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap();
    assert!(cpu > 0 && cpu <= usage_usec * 1000, "{case}: pod CPU {cpu} ns vs the cgroup's {usage_usec} µs");
    assert!(pod["cpu"]["usageNanoCores"].is_u64(), "{case}: a rate from the two scrapes: {pod}");

    let node = &summary["node"];
    assert!(node["memory"]["workingSetBytes"].as_u64().unwrap() > ws, "{case}: {node}");
    assert!(node["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > cpu, "{case}: {node}");
    let system = |name: &str| {
        node["systemContainers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{case}: system container {name} missing: {}", node["systemContainers"]))
    };
    assert!(system("pods")["memory"]["workingSetBytes"].as_u64().unwrap() >= HOG, "{case}: kubepods");
    for name in ["kubelet", "runtime"] {
        let c = system(name);
        assert!(c["memory"]["workingSetBytes"].as_u64().unwrap() > 0, "{case}: {c}");
        assert!(c["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0, "{case}: {c}");
    }
    // PSI, which the guest's kernel offers, for the node and from the pod cgroup's files.
    assert!(node["io"]["psi"]["some"]["total"].is_u64(), "{case}: {node}");
    assert!(pod["memory"]["psi"]["full"]["avg10"].is_f64(), "{case}: {pod}");
    // And the container's own, from its cgroup below the pod's (named by the runtime: the ID
    // on cgroupfs, a cri-containerd-<ID>.scope on systemd), with its swap and IO.
    for resource in ["cpu", "memory", "io"] {
        assert!(container[resource]["psi"]["some"]["total"].is_u64(), "{case}: container {resource} psi: {container}");
    }
    assert!(container["swap"]["swapUsageBytes"].is_u64(), "{case}: {container}");
    let children = run.read(&format!("{case}/container-cgroups"));
    let own: Vec<&str> = children.lines().filter_map(|l| l.strip_prefix(&format!("{pod_cgroup} "))).collect();
    let is_id = |s: &str| s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit());
    let named = |c: &str| match case {
        "systemd" => c.strip_prefix("cri-containerd-").and_then(|c| c.strip_suffix(".scope")).is_some_and(is_id),
        _ => is_id(c),
    };
    assert!(own.len() == 2 && own.iter().all(|c| named(c)), "{case}: pause and main below {pod_cgroup}: {children}");
    assert!(node["rlimit"]["maxpid"].as_i64().unwrap() > 0, "{case}: {node}");

    let metrics = run.read(&format!("{case}/metrics-resource.txt"));
    let labels = "{namespace=\"default\",pod=\"guaranteed-vm-node\"}";
    let pod_ws = metric(&metrics, &format!("pod_memory_working_set_bytes{labels}")).unwrap_or_default();
    assert!(pod_ws >= HOG as f64, "{case}: {metrics}");
    let c_labels = "{container=\"main\",namespace=\"default\",pod=\"guaranteed-vm-node\"}";
    let c_cpu = metric(&metrics, &format!("container_cpu_usage_seconds_total{c_labels}")).unwrap_or_default();
    assert!(c_cpu > 0.0, "{case}: {metrics}");
    assert!(metric(&metrics, "node_memory_working_set_bytes").unwrap_or_default() > pod_ws, "{case}");
}

/// The system containers on cgroupfs: the agent moved itself into kubeletCgroups, a process
/// left in the root cgroup went to systemCgroups, and the summary reads both and the runtime's
/// --runtime-cgroups.
#[test]
fn system_containers_kubelet_system_and_runtime_cgroups() {
    let Some(run) = completed() else { return };
    assert_eq!(run.read("cgroupfs/gantry-cgroup").trim(), "0::/gantry-kubelet", "{}", run.read("cgroupfs/gantry.log"));
    assert_eq!(run.read("cgroupfs/stray-cgroup").trim(), "0::/gantry-system", "{}", run.read("cgroupfs/gantry.log"));
    let summary: serde_json::Value = serde_json::from_str(&run.read("cgroupfs/summary.json")).unwrap();
    let names: Vec<&str> =
        summary["node"]["systemContainers"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    for name in ["kubelet", "runtime", "misc", "pods"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
}

/// enforceNodeAllocatable [pods, kube-reserved, system-reserved] on systemd: kube.slice gets
/// kubeReserved's 256Mi as MemoryMax, system.slice systemReserved's 500m as CPUWeight 20.
#[test]
fn systemd_driver_reserved_slices_carry_the_reservations() {
    let Some(run) = completed() else { return };
    let reserved = run.read("systemd/reserved");
    let line = |unit: &str| reserved.lines().find(|l| l.starts_with(unit)).unwrap_or_default().to_string();
    let mib256 = (256u64 << 20).to_string();
    assert_eq!(line("kube.slice"), format!("kube.slice MemoryMax={mib256} {mib256}"), "{reserved}");
    assert_eq!(line("system.slice"), "system.slice CPUWeight=20 20", "{reserved}");
}

/// MemoryQoS (on in the cgroupfs case only): the burstable pod's container gets memory.min
/// from its 32Mi request and memory.high 90% of the way to its 64Mi limit (page-aligned), its
/// pod cgroup and the burstable level its request, kubepods the guaranteed and burstable pods'
/// requests; with the gate off (systemd case) nothing is protected or throttled.
#[test]
fn memory_qos_sets_memory_min_and_high() {
    let Some(run) = completed() else { return };
    let mi: u64 = 1 << 20;
    let high = ((32 * mi) as f64 + (32 * mi) as f64 * 0.9) as u64 / 4096 * 4096;
    let b = container_view(run, "cgroupfs", "burstable");
    assert_eq!(
        (b["memory.min"].as_str(), b["memory.high"].clone()),
        ((32 * mi).to_string().as_str(), high.to_string())
    );
    let seen = cgroups(run, "cgroupfs/cgroups-running");
    let min = |cgroup: String| seen.get(&(cgroup, "memory.min".to_string())).cloned().unwrap_or_default();
    let uid = &uids(run, "cgroupfs")["burstable"];
    assert_eq!(min(format!("/kubepods/burstable/pod{uid}")), (32 * mi).to_string());
    assert_eq!(min("/kubepods/burstable".into()), (32 * mi).to_string(), "the burstable pods' requests");
    assert_eq!(min("/kubepods".into()), (96 * mi).to_string(), "guaranteed 64Mi + burstable 32Mi");
    let off = container_view(run, "systemd", "burstable");
    assert_eq!((off["memory.min"].as_str(), off["memory.high"].as_str()), ("0", "max"), "the gate is off by default");
}

#[test]
fn cgroupfs_driver_stats_read_cgroup_v2() {
    let Some(run) = completed() else { return };
    let uid = &uids(run, "cgroupfs")["guaranteed"];
    assert_stats(run, "cgroupfs", &format!("/kubepods/pod{uid}"));
}

#[test]
fn systemd_driver_stats_read_cgroup_v2() {
    let Some(run) = completed() else { return };
    let uid = &uids(run, "systemd")["guaranteed"];
    assert_stats(run, "systemd", &slice_path("guaranteed", uid));
}
