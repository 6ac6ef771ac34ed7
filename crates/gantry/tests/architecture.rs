//! The layering rules of ARCHITECTURE.md, checked on the sources so that a change breaking one
//! fails the suite instead of waiting for a reviewer:
//! - only `gantry-cri` (the runtime) and `gantry-plugins` (the node plugins) depend on gRPC
//!   (`tonic`, `prost`, `k8s-cri`) or name it in code;
//! - inside every crate, the top-level modules import each other without a cycle (the compiler
//!   already refuses cycles between crates);
//! - every config field listed as implemented is read by the code that claims it;
//! - no crate's library code returns `Result<_, String>` (errors are typed enums);
//! - no error type carries a `reason: String` where a typed cause belongs (see [`TEXT_REASONS`]);
//! - no task or thread is spawned outside a supervisor, an owner that aborts or joins it, or
//!   an `await` in place, except where [`SPAWNS`] says why.
//!
//! The test kit and the test API server are test harness, not layers of the agent, and are
//! left out of the layering checks (the typed-errors check covers them too).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const HARNESS: [&str; 2] = ["testkit", "test-apiserver"];
const GRPC_CRATES: [&str; 4] = ["tonic", "prost", "k8s-cri", "tonic-health"];
/// The crates at gRPC edges: the runtime's (CRI) and the node plugins' (registration, device
/// plugins, pod resources). Both hand the rest of the agent plain values.
const GRPC_EDGES: [&str; 2] = ["cri", "plugins"];

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The workspace's agent crates: folder name and path.
fn layer_crates() -> Vec<(String, PathBuf)> {
    let mut out: Vec<_> = fs::read_dir(crates_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").exists())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .filter(|(name, _)| !HARNESS.contains(&name.as_str()))
        .collect();
    out.sort();
    out
}

/// Dependency names in a Cargo.toml's `[dependencies]` section (not dev- or build-).
fn dependencies(manifest: &str) -> Vec<String> {
    let mut in_deps = false;
    let mut deps = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
        } else if in_deps && let Some((name, _)) = line.split_once('=') {
            let name = name.trim().trim_end_matches(".workspace").to_string();
            if !name.is_empty() && !name.starts_with('#') {
                deps.push(name);
            }
        }
    }
    deps
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

#[test]
fn only_the_grpc_edges_speak_grpc() {
    let mut offenders = Vec::new();
    for (name, path) in layer_crates().into_iter().filter(|(n, _)| !GRPC_EDGES.contains(&n.as_str())) {
        let manifest = fs::read_to_string(path.join("Cargo.toml")).unwrap();
        for dep in dependencies(&manifest).into_iter().filter(|d| GRPC_CRATES.contains(&d.as_str())) {
            offenders.push(format!("crates/{name} depends on {dep}"));
        }
        for file in rust_files(&path.join("src")) {
            let text = fs::read_to_string(&file).unwrap();
            if text.contains("tonic::") || text.contains("k8s_cri::") || text.contains("prost::") {
                offenders.push(format!("{} names a gRPC type", file.display()));
            }
        }
    }
    assert!(offenders.is_empty(), "gRPC belongs to crates/cri and crates/plugins only:\n{}", offenders.join("\n"));
}

/// Top-level module → the crate's other top-level modules it refers to.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules = BTreeMap::new();
    for entry in fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || name == "main" {
            continue;
        }
        let files = if path.is_dir() { rust_files(&path) } else { vec![path.clone()] };
        let top_files: Vec<PathBuf> = vec![path.clone(), path.join("mod.rs")];
        let mut uses = BTreeSet::new();
        for file in files {
            let text = fs::read_to_string(&file).unwrap();
            uses.extend(references(&text, "crate::"));
            if top_files.contains(&file) {
                // In a top-level module's own file, `super::` is the crate root.
                uses.extend(references(&text, "super::"));
            }
        }
        modules.insert(name, uses);
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(m, uses)| (m.clone(), uses.iter().filter(|u| *u != m && names.contains(*u)).cloned().collect()))
        .collect()
}

/// The module names after each `prefix` (`crate::runtime::…` → `runtime`; `crate::{a, b}` → both).
fn references(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices(prefix) {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &text[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(group.split(',').map(|p| ident(p.trim())).filter(|s| !s.is_empty()));
        } else {
            out.insert(ident(rest));
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// A cycle in the graph, as the path of module names that closes it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|p| p == m) {
            let mut cycle = path[start..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let mut cycles = Vec::new();
    for (name, path) in layer_crates() {
        if let Some(cycle) = find_cycle(&module_graph(&path.join("src"))) {
            cycles.push(format!("crates/{name}: {}", cycle.join(" → ")));
        }
    }
    assert!(cycles.is_empty(), "module import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_check_sees_cycles() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(find_cycle(&graph), Some(vec!["a", "b", "c", "a"].into_iter().map(String::from).collect()));
    assert_eq!(
        references("use crate::{agent::Shared, runtime::Driver};\nlet x = crate::node::f();", "crate::"),
        BTreeSet::from(["agent".to_string(), "runtime".to_string(), "node".to_string()])
    );
}

/// Every `KubeletConfiguration` field listed as implemented, the `Settings` member (or method)
/// it resolves to, and the file that reads it. Flags resolve to the same members, so this
/// covers them too. A field whose consumer stops reading it fails the test below; a field
/// added to the implemented list without a row here fails it too.
const CLAIMS: &[(&str, &str, &str)] = &[
    ("apiVersion", "API_VERSION", "crates/config/src/file.rs"),
    ("kind", "KIND", "crates/config/src/file.rs"),
    ("staticPodPath", "static_pod_path", "crates/agent/src/agent/mod.rs"),
    ("staticPodURL", "static_pod_url", "crates/agent/src/agent/mod.rs"),
    ("staticPodURLHeader", "static_pod_url_header", "crates/agent/src/agent/mod.rs"),
    ("fileCheckFrequency", "file_check_frequency", "crates/agent/src/agent/mod.rs"),
    ("httpCheckFrequency", "http_check_frequency", "crates/agent/src/agent/mod.rs"),
    ("syncFrequency", "sync_frequency", "crates/agent/src/agent/worker.rs"),
    ("configMapAndSecretChangeDetectionStrategy", "change_detection", "crates/node/src/lib.rs"),
    ("containerRuntimeEndpoint", "container_runtime_endpoint", "crates/agent/src/agent/mod.rs"),
    ("imageServiceEndpoint", "image_service_endpoint", "crates/agent/src/agent/mod.rs"),
    ("runtimeRequestTimeout", "runtime_request_timeout", "crates/agent/src/agent/mod.rs"),
    ("podLogsDir", "pod_logs_dir", "crates/agent/src/agent/mod.rs"),
    ("featureGates", "feature_gates", "crates/agent/src/node/status.rs"),
    ("runOnce", "run_once", "crates/gantry/src/kubelet.rs"),
    ("maxPods", "max_pods", "crates/agent/src/node/status.rs"),
    ("oomScoreAdj", "oom_score_adj", "crates/gantry/src/kubelet.rs"),
    ("registerNode", "register_node", "crates/agent/src/node/controller.rs"),
    ("rotateCertificates", "rotate_certificates", "crates/agent/src/api/mod.rs"),
    ("registerWithTaints", "register_with_taints", "crates/agent/src/node/status.rs"),
    ("kubeAPIQPS", "kube_api_qps", "crates/agent/src/api/mod.rs"),
    ("kubeAPIBurst", "kube_api_burst", "crates/agent/src/api/mod.rs"),
    ("eventRecordQPS", "event_record_qps", "crates/agent/src/api/mod.rs"),
    ("eventBurst", "event_burst", "crates/agent/src/api/mod.rs"),
    ("nodeStatusUpdateFrequency", "node_status_update_frequency", "crates/agent/src/node/controller.rs"),
    ("nodeStatusReportFrequency", "node_status_report_frequency", "crates/agent/src/node/controller.rs"),
    ("nodeLeaseDurationSeconds", "node_lease_duration_seconds", "crates/agent/src/node/controller.rs"),
    ("kubeReserved", "kube_reserved", "crates/agent/src/node/status.rs"),
    ("systemReserved", "system_reserved", "crates/agent/src/node/status.rs"),
    ("evictionHard", "eviction_hard", "crates/agent/src/eviction.rs"),
    ("evictionSoft", "soft", "crates/agent/src/eviction.rs"),
    ("evictionSoftGracePeriod", "soft_grace_period", "crates/agent/src/eviction.rs"),
    ("evictionMaxPodGracePeriod", "max_pod_grace_period", "crates/agent/src/eviction.rs"),
    ("evictionMinimumReclaim", "minimum_reclaim", "crates/agent/src/eviction.rs"),
    ("evictionPressureTransitionPeriod", "pressure_transition_period", "crates/agent/src/eviction.rs"),
    ("localStorageCapacityIsolation", "local_storage_capacity_isolation", "crates/agent/src/eviction.rs"),
    ("port", "port", "crates/server/src/lib.rs"),
    ("podsPerCore", "pods_per_core", "crates/agent/src/node/status.rs"),
    ("imageGCHighThresholdPercent", "gc_high_threshold_percent", "crates/agent/src/image/collector.rs"),
    ("imageGCLowThresholdPercent", "gc_low_threshold_percent", "crates/agent/src/image/collector.rs"),
    ("imageMinimumGCAge", "minimum_gc_age", "crates/agent/src/image/collector.rs"),
    ("imageMaximumGCAge", "maximum_gc_age", "crates/agent/src/image/collector.rs"),
    ("serializeImagePulls", "parallel_pull_limit", "crates/agent/src/agent/mod.rs"),
    ("maxParallelImagePulls", "parallel_pull_limit", "crates/agent/src/agent/mod.rs"),
    ("cgroupsPerQOS", "cgroups_per_qos", "crates/agent/src/runtime/driver.rs"),
    ("cgroupDriver", "cgroup_driver", "crates/agent/src/runtime/driver.rs"),
    ("cgroupRoot", "cgroup_root", "crates/agent/src/runtime/cgroups.rs"),
    ("podPidsLimit", "pod_pids_limit", "crates/agent/src/runtime/cgroups.rs"),
    ("kubeletCgroups", "kubelet_cgroups", "crates/agent/src/system_containers.rs"),
    ("systemCgroups", "system_cgroups", "crates/agent/src/system_containers.rs"),
    ("failCgroupV1", "fail_cgroup_v1", "crates/agent/src/agent/mod.rs"),
    ("enforceNodeAllocatable", "enforce_pods_allocatable", "crates/agent/src/node/status.rs"),
    ("kubeReservedCgroup", "kube_reserved_cgroup", "crates/agent/src/runtime/driver.rs"),
    ("systemReservedCgroup", "system_reserved_cgroup", "crates/agent/src/runtime/driver.rs"),
    ("memoryThrottlingFactor", "memory_throttling_factor", "crates/agent/src/runtime/driver.rs"),
    ("clusterDNS", "cluster_dns", "crates/agent/src/runtime/dns.rs"),
    ("clusterDomain", "cluster_domain", "crates/agent/src/runtime/dns.rs"),
    ("resolvConf", "resolv_conf", "crates/agent/src/runtime/driver.rs"),
    ("allowedUnsafeSysctls", "allowed_unsafe_sysctls", "crates/agent/src/runtime/driver.rs"),
    ("seccompDefault", "seccomp_default", "crates/agent/src/runtime/driver.rs"),
    ("containerLogMaxSize", "max_size", "crates/logs/src/rotation.rs"),
    ("containerLogMaxFiles", "max_files", "crates/logs/src/rotation.rs"),
    ("containerLogMaxWorkers", "max_workers", "crates/logs/src/rotation.rs"),
    ("containerLogMonitorInterval", "monitor_interval", "crates/logs/src/rotation.rs"),
    ("enableServer", "enabled", "crates/node/src/lib.rs"),
    ("address", "address", "crates/server/src/lib.rs"),
    ("readOnlyPort", "read_only_port", "crates/server/src/lib.rs"),
    ("tlsCertFile", "tls_cert_file", "crates/server/src/tls.rs"),
    ("tlsPrivateKeyFile", "tls_private_key_file", "crates/server/src/tls.rs"),
    ("tlsCipherSuites", "tls_cipher_suites", "crates/server/src/tls.rs"),
    ("tlsMinVersion", "tls_min_version", "crates/server/src/tls.rs"),
    ("serverTLSBootstrap", "server_tls_bootstrap", "crates/node/src/lib.rs"),
    ("volumeStatsAggPeriod", "volume_stats_agg_period", "crates/node/src/lib.rs"),
    ("authentication", "anonymous", "crates/server/src/authn.rs"),
    ("authorization", "authorization_mode", "crates/server/src/authz.rs"),
    ("healthzPort", "healthz_port", "crates/server/src/lib.rs"),
    ("healthzBindAddress", "healthz_bind_address", "crates/server/src/lib.rs"),
    ("enableDebuggingHandlers", "debugging_handlers", "crates/server/src/routes.rs"),
    ("shutdownGracePeriod", "grace_period", "crates/agent/src/shutdown/mod.rs"),
    ("shutdownGracePeriodCriticalPods", "grace_period_critical_pods", "crates/agent/src/shutdown/mod.rs"),
    ("shutdownGracePeriodByPodPriority", "grace_period_by_pod_priority", "crates/agent/src/shutdown/mod.rs"),
    ("singleProcessOOMKill", "single_process_oom_kill", "crates/agent/src/runtime/driver.rs"),
];

#[test]
fn implemented_config_fields_are_read_by_their_consumers() {
    let listed: BTreeSet<&str> = gantry_config::IMPLEMENTED_FIELDS.iter().copied().collect();
    let claimed: BTreeSet<&str> = CLAIMS.iter().map(|(field, _, _)| *field).collect();
    assert_eq!(listed, claimed, "IMPLEMENTED_FIELDS and CLAIMS list the same fields");
    let root = crates_dir().parent().unwrap().to_path_buf();
    let mut unread = Vec::new();
    for (field, member, file) in CLAIMS {
        let text = fs::read_to_string(root.join(file)).unwrap_or_default();
        // Only the code, not its unit tests.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let read = [format!(".{member}"), format!("{member}(")].iter().any(|p| {
            code.match_indices(p.as_str()).any(|(i, _)| {
                let after = code[i + p.len()..].chars().next();
                !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        }) || (*member == "API_VERSION" || *member == "KIND") && code.contains(member);
        if !read {
            unread.push(format!("{field}: {file} does not read {member}"));
        }
    }
    assert!(unread.is_empty(), "fields claimed as implemented but not read:\n{}", unread.join("\n"));
}

/// The non-test code of every crate's `src/` (harness crates included): each file up to its
/// first `#[cfg(test)]`, unit-test files (`tests.rs`, `tests/`) left out.
fn library_code() -> Vec<(String, String)> {
    let root = crates_dir().parent().unwrap().to_path_buf();
    let mut out = Vec::new();
    for entry in fs::read_dir(crates_dir()).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        for file in rust_files(&src) {
            let rel = file.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
            if rel.ends_with("/tests.rs") || rel.contains("/tests/") {
                continue;
            }
            let text = fs::read_to_string(&file).unwrap();
            out.push((rel, text.split("#[cfg(test)]").next().unwrap_or_default().to_string()));
        }
    }
    out.sort();
    out
}

/// How many `Result<…, String>` types the code names (generic arguments matched by brackets,
/// so `Result<Vec<(String, String)>, String>` counts and `Result<String, E>` does not).
fn string_error_results(code: &str) -> usize {
    let flat: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut count = 0;
    for (i, _) in flat.match_indices("Result<") {
        if flat[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let args = &flat[i + "Result<".len()..];
        let (mut depth, mut commas, mut end) = (0i32, Vec::new(), None);
        for (j, c) in args.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' if depth == 0 => {
                    end = Some(j);
                    break;
                }
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => commas.push(j),
                _ => {}
            }
        }
        // A trailing comma (`Result<T, String,>` after rustfmt) ends the list, not an argument.
        let Some(end) = end else { continue };
        let list = args[..end].trim_end().trim_end_matches(',');
        if let Some(comma) = commas.into_iter().rfind(|c| *c < list.len())
            && list[comma + 1..].trim() == "String"
        {
            count += 1;
        }
    }
    count
}

/// Library errors are typed (`thiserror` enums), never `Result<_, String>`: a caller can match
/// on an outcome instead of parsing a message. Private helpers count too; unit tests do not.
#[test]
fn library_errors_are_typed_not_strings() {
    let offenders: Vec<String> = library_code()
        .into_iter()
        .filter_map(|(file, code)| {
            let n = string_error_results(&code);
            (n > 0).then(|| format!("{file}: {n} Result<_, String>"))
        })
        .collect();
    assert!(offenders.is_empty(), "use a thiserror enum, not Result<_, String>:\n{}", offenders.join("\n"));
}

#[test]
fn the_string_error_check_sees_them() {
    assert_eq!(string_error_results("fn f() -> Result<(), String> {}"), 1);
    assert_eq!(string_error_results("fn f() -> Result<Vec<(String, String)>,\n    String,\n> {}"), 1);
    assert_eq!(string_error_results("fn f() -> Result<String, Error> {} fn g() -> io::Result<String> {}"), 0);
    assert_eq!(string_error_results("fn f() -> anyhow::Result<String> {} type MyResult<T> = T;"), 0);
}

/// Every `static` item (`static NAME: …`, at any depth) in library code, as `file: NAME`.
fn statics(file: &str, code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("pub(crate) ").or_else(|| line.strip_prefix("pub ")).unwrap_or(line);
            let name = ident(line.strip_prefix("static ")?);
            (!name.is_empty() && line[7 + name.len()..].trim_start().starts_with(':'))
                .then(|| format!("{file}: {name}"))
        })
        .collect()
}

/// The process-wide statics there are, each with why it may be one. Node state (metrics,
/// caches) belongs to the `Node` that owns it, so that two nodes in one process do not share
/// it; a new static fails the test below until it is listed here with a reason.
const STATICS: &[(&str, &str)] = &[
    // Guard the filesystem, not program state: they only serialise writers of one directory.
    ("crates/agent/src/runtime/atomic_writer.rs: WRITER", "serialises volume directory swaps"),
    ("crates/agent/src/runtime/volumes.rs: ONE_AT_A_TIME", "serialises tmpfs mounts"),
    // Holds configuration only: connection reuse is off, so nothing of one node leaks to another.
    ("crates/agent/src/runtime/handlers.rs: CLIENT", "the probe and hook HTTP client"),
    // Immutable after its first use: the same for every node.
    ("crates/config/src/flags.rs: COMMAND", "the kubelet's clap command, built once"),
    // The process's own state, not a node's: its code pages are paged out once per settle.
    ("crates/gantry/src/code_pages.rs: WARNED", "the page-out failure is warned about once per process"),
    // Test harness.
    ("crates/testkit/src/images.rs: BUILD_LOCK", "serialises test image builds in one process"),
    ("crates/testkit/src/raw.rs: NEXT_POD", "unique pod names in one test process"),
];

#[test]
fn process_wide_statics_are_listed_with_a_reason() {
    let found: BTreeSet<String> = library_code().iter().flat_map(|(file, code)| statics(file, code)).collect();
    let listed: BTreeSet<String> = STATICS.iter().map(|(s, _)| s.to_string()).collect();
    let new: Vec<&String> = found.difference(&listed).collect();
    let gone: Vec<&String> = listed.difference(&found).collect();
    assert!(new.is_empty(), "new process-wide statics (own them in the Node, or list them with a reason): {new:?}");
    assert!(gone.is_empty(), "statics listed in STATICS that no longer exist (remove them from the list): {gone:?}");
}

#[test]
fn the_static_check_sees_them() {
    let code = "static A: Mutex<()> = Mutex::new(());\n    pub static B: LazyLock<X> = x;\nfn f(s: &'static str) {}";
    assert_eq!(statics("f.rs", code), vec!["f.rs: A", "f.rs: B"]);
}

/// How a task or thread can be started without a `JoinSet` or a supervisor (a runtime
/// `Handle`'s `spawn` is not told apart from `JoinSet::spawn` here; none is used).
const SPAWN_CALLS: [&str; 6] =
    ["tokio::spawn(", "task::spawn(", "spawn_local(", "thread::spawn(", "thread::Builder", "spawn_blocking("];

/// Every spawn outside a `JoinSet` in the layers' library code: file, call, how many, and who
/// owns what it starts. Long-running tasks belong to a supervisor (`gantry-supervisor`); a
/// new spawn fails the test below until it is owned or listed here with its owner. The test
/// harness crates are left out: their servers live as long as the test that starts them.
const SPAWNS: &[(&str, &str, usize, &str)] = &[
    (
        "crates/agent/src/node/mod.rs",
        "tokio::spawn(",
        2,
        "registration/status loops and the event writer start before the node's supervisor \
         exists; gantry-node adopts both handles, so they stop with it",
    ),
    (
        "crates/agent/src/agent/prober.rs",
        "tokio::spawn(",
        1,
        "one prober per probed container: Probers keeps the handle and aborts it when the \
         container stops running or the pod worker (and with it Probers) ends",
    ),
    ("crates/agent/src/runtime/driver.rs", "spawn_blocking(", 7, "blocking cgroup and file I/O, awaited in place"),
    ("crates/agent/src/runtime/driver/resize.rs", "spawn_blocking(", 1, "blocking cgroup writes, awaited in place"),
    ("crates/agent/src/runtime/volumes.rs", "spawn_blocking(", 1, "blocking volume writes, awaited in place"),
    ("crates/agent/src/runtime/csi.rs", "spawn_blocking(", 1, "the fsGroup ownership walk, awaited in place"),
    (
        "crates/server/src/stats/volumes.rs",
        "spawn_blocking(",
        1,
        "the walk of a pod's volume directories, awaited in place",
    ),
    (
        "crates/logs/src/rotation.rs",
        "spawn_blocking(",
        2,
        "the sizes of all logs, and the clean-up of rotated logs, awaited in place",
    ),
    ("crates/agent/src/system_containers.rs", "spawn_blocking(", 1, "cgroup writes of one round, awaited in place"),
    ("crates/server/src/stats/http.rs", "spawn_blocking(", 1, "the summary's host file reads, awaited in place"),
    (
        "crates/server/src/logs/service.rs",
        "spawn_blocking(",
        1,
        "the log follower: it writes into the response body's channel and checks it every poll \
         (100 ms), so it ends when the client's request ends",
    ),
];

/// How often each spawn call occurs in `code` (`tokio::task::spawn(` counts as `task::spawn(`).
fn spawn_calls(code: &str) -> Vec<(&'static str, usize)> {
    SPAWN_CALLS.iter().map(|call| (*call, code.matches(call).count())).filter(|(_, n)| *n > 0).collect()
}

#[test]
fn every_spawn_is_owned_or_listed_with_its_owner() {
    let mut found = BTreeMap::new();
    for (file, code) in library_code() {
        if HARNESS.iter().any(|h| file.starts_with(&format!("crates/{h}/"))) {
            continue;
        }
        for (call, n) in spawn_calls(&code) {
            found.insert((file.clone(), call), n);
        }
    }
    let listed: BTreeMap<(String, &str), usize> =
        SPAWNS.iter().map(|(file, call, n, _)| ((file.to_string(), *call), *n)).collect();
    assert_eq!(
        found, listed,
        "spawns (file, call) → count: own a new one (a supervisor, a JoinSet, or an await in place) or list it in \
         SPAWNS with its owner; remove entries that are gone"
    );
}

#[test]
fn the_spawn_check_sees_them() {
    let code = "tokio::spawn(a); std::thread::spawn(b); tokio::task::spawn_blocking(c); set.spawn(d);";
    assert_eq!(spawn_calls(code), vec![("tokio::spawn(", 1), ("thread::spawn(", 1), ("spawn_blocking(", 1)]);
}

/// The `thiserror` types of `code` with `reason: String` fields: type name → how many.
fn text_reasons(code: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (i, _) in code.match_indices("thiserror::Error") {
        let rest = &code[i..];
        let Some(item) = ["enum ", "struct "].iter().filter_map(|k| rest.find(k).map(|at| at + k.len())).min() else {
            continue;
        };
        let name = ident(&rest[item..]);
        let Some(open) = rest[item..].find('{').map(|o| item + o) else { continue };
        let (mut depth, mut end) = (0, rest.len());
        for (j, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + j;
                        break;
                    }
                }
                _ => {}
            }
        }
        let body: String = rest[open..end].split_whitespace().collect::<Vec<_>>().join(" ");
        let n = body.matches("reason: String").count();
        if n > 0 {
            out.insert(name, n);
        }
    }
    out
}

/// Error types whose `reason: String` fields stay text, with why. A caller matches on a typed
/// cause (`#[source]`, or an enum of causes); text is for what someone else wrote.
const TEXT_REASONS: &[(&str, &str, usize, &str)] = &[
    ("crates/agent/src/api/mod.rs", "ApiError", 1, "Server: the API server's own Status reason"),
    (
        "crates/agent/src/api/bootstrap.rs",
        "BootstrapError",
        2,
        "Denied/Failed: the CSR condition's reason, by its approver",
    ),
    (
        "crates/config/src/error.rs",
        "ConfigError",
        3,
        "Syntax, InvalidField, InvalidFlagValue: the decoder's own message (serde_yaml, serde_json, clap)",
    ),
    (
        "crates/agent/src/source/manifest.rs",
        "ManifestError",
        1,
        "not yet typed (issue 14 leftover): manifest validation explanations and decoder messages",
    ),
    (
        "crates/maintenance/src/cli/mod.rs",
        "FlagError",
        1,
        "not yet typed (issue 14 leftover): plugin flag explanations",
    ),
];

#[test]
fn error_types_carry_typed_causes_not_reason_strings() {
    let mut found = BTreeMap::new();
    for (file, code) in library_code() {
        for (name, n) in text_reasons(&code) {
            found.insert((file.clone(), name), n);
        }
    }
    let listed: BTreeMap<(String, String), usize> =
        TEXT_REASONS.iter().map(|(file, name, n, _)| ((file.to_string(), name.to_string()), *n)).collect();
    assert_eq!(
        found, listed,
        "error types with `reason: String` fields (file, type) → count: keep the cause typed (`#[source]` or an enum \
         of causes), or list runtime-supplied text in TEXT_REASONS with why; remove entries that are gone"
    );
}

#[test]
fn the_text_reason_check_sees_them() {
    let code = "#[derive(Debug, thiserror::Error)]\npub enum E {\n    #[error(\"{reason}\")]\n    A { path: P, reason: String },\n    B { inner: X },\n}\nstruct Plain { reason: String }";
    assert_eq!(text_reasons(code), BTreeMap::from([("E".to_string(), 1)]));
}
