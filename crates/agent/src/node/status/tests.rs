//! Tests of the pure node status core: no I/O, time passed in.

use std::collections::BTreeMap;

use super::*;
use gantry_config::Taint as TaintSpec;

const GI: u64 = 1 << 30;

fn facts() -> MachineFacts {
    MachineFacts {
        machine_id: "m-1".into(),
        system_uuid: "uuid-1".into(),
        boot_id: "boot-1".into(),
        kernel_version: "6.1.0-18-amd64".into(),
        os_image: "Debian GNU/Linux 12 (bookworm)".into(),
        operating_system: "linux".into(),
        architecture: "amd64".into(),
        num_cpus: 4,
        memory_bytes: 16 * GI,
        ephemeral_storage_bytes: 100 * GI,
        hugepages: vec![],
    }
}

fn settings() -> Settings {
    Settings { node_name: "n1".into(), hostname: "n1".into(), ..Settings::default() }
}

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).unwrap()
}

fn addresses() -> Vec<NodeAddress> {
    vec![
        NodeAddress { type_: "InternalIP".into(), address: "192.0.2.2".into() },
        NodeAddress { type_: "Hostname".into(), address: "n1".into() },
    ]
}

fn inputs<'a>(s: &'a Settings, f: &'a MachineFacts, now: Timestamp) -> NodeInputs<'a> {
    NodeInputs {
        settings: s,
        facts: f,
        runtime_name: "containerd",
        runtime_version: Some("1.6.20~ds1"),
        runtime_errors: vec![],
        shutting_down: false,
        pressure: Pressure::default(),
        addresses: Ok(addresses()),
        images: None,
        devices: Default::default(),
        volumes_in_use: None,
        runtime_handlers: vec![],
        now,
    }
}

fn condition<'a>(status: &'a NodeStatus, type_: &str) -> &'a NodeCondition {
    status.conditions.as_ref().unwrap().iter().find(|c| c.type_ == type_).unwrap()
}

fn q(m: &Option<BTreeMap<String, Quantity>>, k: &str) -> String {
    m.as_ref().unwrap()[k].0.clone()
}

// ---- versions ------------------------------------------------------------

#[test]
fn runtime_version_is_parsed_like_upstream() {
    assert_eq!(container_runtime_version("containerd", Some("1.6.20~ds1")), "containerd://1.6.20");
    assert_eq!(container_runtime_version("containerd", Some("v1.7.13")), "containerd://1.7.13");
    assert_eq!(container_runtime_version("cri-o", Some("1.30.0-rc.1+abc")), "cri-o://1.30.0-rc.1+abc");
    assert_eq!(container_runtime_version("containerd", Some("2.0")), "containerd://2.0");
    assert_eq!(container_runtime_version("containerd", Some("2.0.0-beta.01")), "containerd://2.0.0");
    assert_eq!(container_runtime_version("containerd", Some("garbage")), "containerd://Unknown");
    assert_eq!(container_runtime_version("containerd", Some("1")), "containerd://Unknown");
    assert_eq!(container_runtime_version("containerd", None), "containerd://Unknown");
}

#[test]
fn kubelet_version_is_one_constant() {
    assert!(KUBELET_VERSION.starts_with("v1.34.0-gantry."), "{KUBELET_VERSION}");
    assert_eq!(parse_runtime_version(KUBELET_VERSION).unwrap(), &KUBELET_VERSION[1..], "valid semver");
}

// ---- registration ---------------------------------------------------------

#[test]
fn initial_node_labels_taints_and_annotation() {
    let mut s = settings();
    s.node_labels = BTreeMap::from([
        ("node.kubernetes.io/exclude-from-external-load-balancers".to_string(), "true".to_string()),
        ("kubernetes.io/hostname".to_string(), "custom".to_string()),
    ]);
    s.register_with_taints = vec![
        TaintSpec { key: "dedicated".into(), value: "infra".into(), effect: "NoSchedule".into() },
        TaintSpec { key: "example.com/x".into(), value: String::new(), effect: "NoExecute".into() },
    ];
    let f = facts();
    let (node, _) = initial_node(&inputs(&s, &f, t(0)));
    assert_eq!(node.metadata.name.as_deref(), Some("n1"));
    let labels = node.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    assert_eq!(labels["beta.kubernetes.io/os"], "linux");
    assert_eq!(labels["beta.kubernetes.io/arch"], "amd64");
    assert_eq!(labels["kubernetes.io/hostname"], "custom", "--node-labels override the defaults");
    assert_eq!(labels["node.kubernetes.io/exclude-from-external-load-balancers"], "true");
    assert_eq!(node.metadata.annotations.as_ref().unwrap()[CMAD_ANNOTATION], "true");
    let taints = node.spec.as_ref().unwrap().taints.as_ref().unwrap();
    assert_eq!(
        (taints[0].key.as_str(), taints[0].value.as_deref(), taints[0].effect.as_str()),
        ("dedicated", Some("infra"), "NoSchedule")
    );
    assert_eq!(taints[1].value, None);
    assert!(node.status.as_ref().unwrap().conditions.is_some());

    let (plain, _) = initial_node(&inputs(&settings(), &f, t(0)));
    assert_eq!(plain.metadata.labels.as_ref().unwrap()["kubernetes.io/hostname"], "n1");
    assert_eq!(plain.spec.as_ref().unwrap().taints, None);
}

#[test]
fn registration_reconciles_only_owned_labels_and_the_annotation() {
    let f = facts();
    let (initial, _) = initial_node(&inputs(&settings(), &f, t(0)));
    let mut existing = initial.clone();
    assert_eq!(registration_patch(&existing, &initial), None, "nothing to do");

    existing.metadata.labels.as_mut().unwrap().insert("kubernetes.io/arch".into(), "arm64".into());
    existing.metadata.labels.as_mut().unwrap().insert("team".into(), "a".into());
    existing.metadata.annotations = Some(BTreeMap::from([("other".to_string(), "x".to_string())]));
    existing.spec.as_mut().unwrap().taints =
        Some(vec![Taint { key: "k".into(), effect: "NoSchedule".into(), ..Default::default() }]);
    let patch = registration_patch(&existing, &initial).unwrap();
    assert_eq!(
        patch,
        json!({"metadata": {"labels": {"kubernetes.io/arch": "amd64"}, "annotations": {CMAD_ANNOTATION: "true"}}})
    );
}

// ---- capacity and allocatable ---------------------------------------------

#[test]
fn capacity_and_default_allocatable() {
    let (s, f) = (settings(), facts());
    let (status, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    assert_eq!(q(&status.capacity, "cpu"), "4");
    assert_eq!(q(&status.capacity, "memory"), "16Gi");
    assert_eq!(q(&status.capacity, "ephemeral-storage"), "100Gi");
    assert_eq!(q(&status.capacity, "pods"), "110");
    assert_eq!(q(&status.allocatable, "cpu"), "4");
    // 16Gi − 100Mi (memory.available).
    assert_eq!(q(&status.allocatable, "memory"), "16284Mi");
    // 100Gi − 100Gi × float32(0.1), truncated, as upstream.
    let storage = 100 * GI as i128;
    let expected = storage - (storage as f64 * f64::from(0.1f32)) as i128;
    assert_eq!(q(&status.allocatable, "ephemeral-storage"), quantity::format_binary_bytes(expected));
    assert_eq!(q(&status.allocatable, "pods"), "110");
}

#[test]
fn hugepages_are_reported_per_size_and_taken_from_allocatable_memory() {
    let s = settings();
    let mut f = facts();
    f.hugepages = vec![(2 << 20, 512 << 20), (1 << 30, 0)];
    let (status, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    assert_eq!(q(&status.capacity, "hugepages-2Mi"), "512Mi");
    assert_eq!(q(&status.capacity, "hugepages-1Gi"), "0");
    assert_eq!(q(&status.allocatable, "hugepages-2Mi"), "512Mi");
    assert_eq!(q(&status.allocatable, "hugepages-1Gi"), "0");
    assert_eq!(q(&status.capacity, "memory"), "16Gi");
    // 16Gi − 100Mi (memory.available) − 512Mi of huge pages.
    assert_eq!(q(&status.allocatable, "memory"), "15772Mi");
}

#[test]
fn allocatable_subtracts_reservations_and_clamps_at_zero() {
    let mut s = settings();
    s.kube_reserved =
        BTreeMap::from([("cpu".to_string(), "500m".to_string()), ("memory".to_string(), "1Gi".to_string())]);
    s.system_reserved =
        BTreeMap::from([("cpu".to_string(), "250m".to_string()), ("ephemeral-storage".to_string(), "1Gi".to_string())]);
    s.eviction_hard = BTreeMap::from([("memory.available".to_string(), "1Gi".to_string())]);
    let f = facts();
    let a = allocatable(&s, capacity(&s, &f));
    assert_eq!(a.cpu_milli, 3250);
    assert_eq!(a.memory, 14 * GI as i128);
    assert_eq!(a.ephemeral_storage, 99 * GI as i128, "no nodefs threshold given");
    let (status, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    assert_eq!(q(&status.allocatable, "cpu"), "3250m");
    assert_eq!(q(&status.allocatable, "memory"), "14Gi");

    s.kube_reserved.insert("memory".into(), "64Gi".into());
    s.kube_reserved.insert("cpu".into(), "16".into());
    let a = allocatable(&s, capacity(&s, &f));
    assert_eq!((a.memory, a.cpu_milli), (0, 0));
}

#[test]
fn kubepods_gets_capacity_minus_reservations_without_eviction() {
    let mut s = settings();
    s.kube_reserved =
        BTreeMap::from([("cpu".to_string(), "500m".to_string()), ("memory".to_string(), "1Gi".to_string())]);
    s.eviction_hard = BTreeMap::from([("memory.available".to_string(), "1Gi".to_string())]);
    let limits = pods_cgroup_limits(&s, capacity(&s, &facts())).unwrap();
    assert_eq!(limits.cpu_shares, 3584, "3.5 CPUs");
    assert_eq!(limits.memory_limit, 15 * GI as i64, "16Gi − 1Gi; evictionHard is not subtracted");
    assert_eq!((limits.cpu_quota, limits.pids_limit), (0, 0));
    s.enforce_pods_allocatable = false;
    assert_eq!(pods_cgroup_limits(&s, capacity(&s, &facts())), None, "enforceNodeAllocatable: none");
}

#[test]
fn pods_per_core_caps_max_pods() {
    let mut s = settings();
    s.pods_per_core = 10;
    assert_eq!(capacity(&s, &facts()).pods, 40);
    s.pods_per_core = 100;
    assert_eq!(capacity(&s, &facts()).pods, 110);
    s.max_pods = 20;
    s.pods_per_core = 0;
    assert_eq!(capacity(&s, &facts()).pods, 20);
}

#[test]
fn foreign_resources_are_kept_and_not_sent() {
    let (s, f) = (settings(), facts());
    let prev = NodeStatus {
        capacity: Some(BTreeMap::from([("example.com/gpu".to_string(), Quantity("2".into()))])),
        ..Default::default()
    };
    let (status, _) = compute_status(&prev, &inputs(&s, &f, t(0)));
    assert_eq!(q(&status.capacity, "example.com/gpu"), "2");
    let patch = status_patch(&prev, &status);
    assert!(patch["status"]["capacity"].get("example.com/gpu").is_none(), "{patch}");
    assert_eq!(patch["status"]["capacity"]["cpu"], "4");
}

// ---- nodeInfo, KEP-4004 ------------------------------------------------------

#[test]
fn node_info_fields() {
    let (s, f) = (settings(), facts());
    let (status, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let info = status.node_info.as_ref().unwrap();
    assert_eq!(info.machine_id, "m-1");
    assert_eq!(info.system_uuid, "uuid-1");
    assert_eq!(info.boot_id, "boot-1");
    assert_eq!(info.kernel_version, "6.1.0-18-amd64");
    assert_eq!(info.os_image, "Debian GNU/Linux 12 (bookworm)");
    assert_eq!(info.operating_system, "linux");
    assert_eq!(info.architecture, "amd64");
    assert_eq!(info.container_runtime_version, "containerd://1.6.20");
    assert_eq!(info.kubelet_version, KUBELET_VERSION);
    assert_eq!(info.kube_proxy_version, "", "DisableNodeKubeProxyVersion is on by default");
    assert_eq!(status.daemon_endpoints.as_ref().unwrap().kubelet_endpoint.as_ref().unwrap().port, 10250);
}

#[test]
fn kube_proxy_version_with_the_gate_disabled() {
    let mut s = settings();
    s.feature_gates.set("DisableNodeKubeProxyVersion", false).unwrap();
    let f = facts();
    let (status, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    assert_eq!(status.node_info.as_ref().unwrap().kube_proxy_version, KUBELET_VERSION);
}

#[test]
fn kube_proxy_version_set_by_an_older_agent_is_cleared() {
    let (s, f) = (settings(), facts());
    let (mut prev, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    prev.node_info.as_mut().unwrap().kube_proxy_version = "v1.28.3".into();
    let (status, _) = compute_status(&prev, &inputs(&s, &f, t(10)));
    assert_eq!(status.node_info.as_ref().unwrap().kube_proxy_version, "");
    assert!(status_changed(&prev, &status));
    let patch = status_patch(&prev, &status);
    assert_eq!(patch["status"]["nodeInfo"]["kubeProxyVersion"], "", "the patch must clear it: {patch}");
}

#[test]
fn rebooted_event_when_the_boot_id_changed() {
    let (s, f) = (settings(), facts());
    let (prev, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let rebooted = MachineFacts { boot_id: "boot-2".into(), ..facts() };
    let (status, events) = compute_status(&prev, &inputs(&s, &rebooted, t(10)));
    assert_eq!(
        events,
        vec![NodeEvent {
            type_: EventType::Warning,
            reason: "Rebooted".into(),
            message: "Node n1 has been rebooted, boot id: boot-2".into()
        }]
    );
    assert_eq!(status.node_info.as_ref().unwrap().boot_id, "boot-2");
    // Not on a fresh node.
    let (_, events) = compute_status(&NodeStatus::default(), &inputs(&s, &rebooted, t(0)));
    assert!(!events.iter().any(|e| e.reason == "Rebooted"));
}

// ---- conditions ----------------------------------------------------------------

#[test]
fn a_new_node_has_all_conditions_in_upstream_order() {
    let (s, f) = (settings(), facts());
    let (status, events) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let types: Vec<&str> = status.conditions.as_ref().unwrap().iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, OWNED_CONDITIONS);
    let mem = condition(&status, "MemoryPressure");
    assert_eq!(
        (mem.status.as_str(), mem.reason.as_deref(), mem.message.as_deref()),
        ("False", Some("KubeletHasSufficientMemory"), Some("kubelet has sufficient memory available"))
    );
    let disk = condition(&status, "DiskPressure");
    assert_eq!(
        (disk.reason.as_deref(), disk.message.as_deref()),
        (Some("KubeletHasNoDiskPressure"), Some("kubelet has no disk pressure"))
    );
    let pid = condition(&status, "PIDPressure");
    assert_eq!(
        (pid.reason.as_deref(), pid.message.as_deref()),
        (Some("KubeletHasSufficientPID"), Some("kubelet has sufficient PID available"))
    );
    let ready = condition(&status, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref(), ready.message.as_deref()),
        ("True", Some("KubeletReady"), Some("kubelet is posting ready status"))
    );
    assert_eq!(ready.last_transition_time, Some(Time(t(0))));
    assert_eq!(ready.last_heartbeat_time, Some(Time(t(0))));
    let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, vec!["NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID"]);
    assert_eq!(events[0].message, "Node n1 status is now: NodeHasSufficientMemory");
}

#[test]
fn not_ready_with_the_runtime_errors_and_transitions_only_on_flips() {
    let (s, f) = (settings(), facts());
    let (ready, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));

    // Heartbeat moves, transition time does not.
    let (same, events) = compute_status(&ready, &inputs(&s, &f, t(10)));
    assert!(events.is_empty());
    let c = condition(&same, "Ready");
    assert_eq!((c.last_heartbeat_time.clone(), c.last_transition_time.clone()), (Some(Time(t(10))), Some(Time(t(0)))));
    assert_eq!(condition(&same, "MemoryPressure").last_transition_time, Some(Time(t(0))));
    assert_eq!(condition(&same, "MemoryPressure").last_heartbeat_time, Some(Time(t(10))));

    let network = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";
    let mut i = inputs(&s, &f, t(20));
    i.runtime_errors = vec![network.to_string()];
    let (not_ready, events) = compute_status(&same, &i);
    let c = condition(&not_ready, "Ready");
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
        ("False", Some("KubeletNotReady"), Some(network))
    );
    assert_eq!(c.last_transition_time, Some(Time(t(20))));
    assert_eq!(
        events,
        vec![NodeEvent {
            type_: EventType::Normal,
            reason: "NodeNotReady".into(),
            message: "Node n1 status is now: NodeNotReady".into()
        }]
    );

    // Two errors aggregate as upstream does.
    let mut i = inputs(&s, &f, t(30));
    i.runtime_errors = vec!["container runtime is down".into(), network.to_string()];
    let (still, events) = compute_status(&not_ready, &i);
    assert!(events.is_empty());
    let c = condition(&still, "Ready");
    assert_eq!(c.message.as_deref().unwrap(), format!("[container runtime is down, {network}]"));
    assert_eq!(c.last_transition_time, Some(Time(t(20))));

    let (back, events) = compute_status(&still, &inputs(&s, &f, t(40)));
    assert_eq!(condition(&back, "Ready").status, "True");
    assert_eq!(condition(&back, "Ready").last_transition_time, Some(Time(t(40))));
    assert_eq!(events[0].reason, "NodeReady");
}

#[test]
fn not_ready_while_the_node_shuts_down() {
    let (s, f) = (settings(), facts());
    let (ready, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let mut i = inputs(&s, &f, t(10));
    i.shutting_down = true;
    let (down, events) = compute_status(&ready, &i);
    let c = condition(&down, "Ready");
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
        ("False", Some("KubeletNotReady"), Some("node is shutting down"))
    );
    assert_eq!(events[0].reason, "NodeNotReady");
    // After the runtime's errors, as upstream lists them.
    i.runtime_errors = vec!["container runtime is down".into()];
    let (both, _) = compute_status(&down, &i);
    assert_eq!(
        condition(&both, "Ready").message.as_deref(),
        Some("[container runtime is down, node is shutting down]")
    );
}

#[test]
fn pressure_transitions() {
    let (s, f) = (settings(), facts());
    let (calm, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let mut i = inputs(&s, &f, t(10));
    i.pressure = Pressure { memory: true, disk: true, pid: true };
    let (pressed, events) = compute_status(&calm, &i);
    let mem = condition(&pressed, "MemoryPressure");
    assert_eq!(
        (mem.status.as_str(), mem.reason.as_deref(), mem.message.as_deref()),
        ("True", Some("KubeletHasInsufficientMemory"), Some("kubelet has insufficient memory available"))
    );
    assert_eq!(condition(&pressed, "DiskPressure").reason.as_deref(), Some("KubeletHasDiskPressure"));
    assert_eq!(condition(&pressed, "PIDPressure").message.as_deref(), Some("kubelet has insufficient PID available"));
    let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, vec!["NodeHasInsufficientMemory", "NodeHasDiskPressure", "NodeHasInsufficientPID"]);
    assert_eq!(condition(&pressed, "Ready").status, "True", "pressure does not make the node NotReady");
}

fn foreign(type_: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some("MaintenanceStarted".into()),
        message: Some("set by the maintenance controller".into()),
        last_heartbeat_time: Some(Time(t(-100))),
        last_transition_time: Some(Time(t(-100))),
    }
}

#[test]
fn foreign_conditions_survive_and_are_never_sent() {
    let (s, f) = (settings(), facts());
    let (mut prev, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let conditions = prev.conditions.as_mut().unwrap();
    conditions.insert(1, foreign("MaintenanceInProgress"));
    conditions.push(foreign("DrainInProgress"));
    conditions.push(foreign("Drained"));

    let mut i = inputs(&s, &f, t(10));
    i.runtime_errors = vec!["container runtime is down".into()];
    let (status, _) = compute_status(&prev, &i);
    let types: Vec<&str> = status.conditions.as_ref().unwrap().iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        vec![
            "MemoryPressure",
            "MaintenanceInProgress",
            "DiskPressure",
            "PIDPressure",
            "Ready",
            "DrainInProgress",
            "Drained"
        ]
    );
    for ty in ["MaintenanceInProgress", "DrainInProgress", "Drained"] {
        assert_eq!(condition(&status, ty), &foreign(ty), "{ty} untouched");
    }
    let patch = status_patch(&prev, &status);
    let sent: Vec<&str> =
        patch["status"]["conditions"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(sent, OWNED_CONDITIONS, "only owned conditions go out, merged by type");
    assert!(patch["status"].get("addresses").is_none(), "unchanged addresses are not sent");
    assert!(patch.get("metadata").is_none() && patch.get("spec").is_none());
}

// ---- reporting -------------------------------------------------------------------

#[test]
fn heartbeat_only_changes_wait_for_the_report_frequency() {
    let (s, f) = (settings(), facts());
    let (reported, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let (next, _) = compute_status(&reported, &inputs(&s, &f, t(10)));
    assert_ne!(reported, next, "heartbeat times moved");
    assert!(!status_changed(&reported, &next));
    let five_minutes = std::time::Duration::from_secs(300);
    assert!(!should_report(false, Some(t(0)), t(10), five_minutes));
    assert!(!should_report(false, Some(t(0)), t(299), five_minutes));
    assert!(should_report(false, Some(t(0)), t(300), five_minutes));
    assert!(should_report(true, Some(t(0)), t(10), five_minutes), "a real change goes out at once");
    assert!(should_report(false, None, t(10), five_minutes), "first pass, or after a failure");
}

#[test]
fn changes_that_matter() {
    let (s, f) = (settings(), facts());
    let (reported, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let mut i = inputs(&s, &f, t(10));
    i.runtime_version = Some("1.7.0");
    let (upgraded, _) = compute_status(&reported, &i);
    assert!(status_changed(&reported, &upgraded));

    let mut i = inputs(&s, &f, t(10));
    i.addresses = Ok(vec![NodeAddress { type_: "InternalIP".into(), address: "192.0.2.9".into() }]);
    let (moved, _) = compute_status(&reported, &i);
    assert!(status_changed(&reported, &moved));
    let patch = status_patch(&reported, &moved);
    assert_eq!(
        patch["status"]["addresses"],
        json!([{"type": "InternalIP", "address": "192.0.2.9"}, {"$patch": "replace"}])
    );

    // Unknown addresses keep the previous ones.
    let mut i = inputs(&s, &f, t(10));
    i.addresses = Err(crate::node::addresses::AddressError::NoneFound {
        node: "n1".into(),
        why: crate::node::addresses::NoneFound::NoRoute,
    });
    let (kept, _) = compute_status(&reported, &i);
    assert_eq!(kept.addresses, reported.addresses);
}

#[test]
fn first_addresses_are_sent_without_replace() {
    let (s, f) = (settings(), facts());
    let (status, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let patch = status_patch(&NodeStatus::default(), &status);
    assert_eq!(
        patch["status"]["addresses"],
        json!([{"type": "InternalIP", "address": "192.0.2.2"}, {"type": "Hostname", "address": "n1"}])
    );
}

#[test]
fn quantities_compare_by_value() {
    let (s, f) = (settings(), facts());
    let (reported, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    // The API server may print the same amounts differently.
    let mut server = reported.clone();
    server.capacity.as_mut().unwrap().insert("memory".into(), Quantity((16 * GI).to_string()));
    server.capacity.as_mut().unwrap().insert("cpu".into(), Quantity("4000m".into()));
    let (next, _) = compute_status(&server, &inputs(&s, &f, t(10)));
    assert!(!status_changed(&server, &next));
}

#[test]
fn daemon_endpoint_follows_the_port() {
    let s = Settings { port: 11250, ..settings() };
    let f = facts();
    let (status, _) = compute_status(&NodeStatus::default(), &inputs(&s, &f, t(0)));
    let patch = status_patch(&NodeStatus::default(), &status);
    assert_eq!(patch["status"]["daemonEndpoints"], json!({"kubeletEndpoint": {"Port": 11250}}));
}

#[test]
fn images_are_reported_and_kept_when_they_cannot_be_listed() {
    let (s, f) = (settings(), facts());
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let image = k8s_openapi::api::core::v1::ContainerImage { names: Some(vec!["a:v1".into()]), size_bytes: Some(7) };
    let listed = NodeInputs { images: Some(vec![image.clone()]), ..inputs(&s, &f, now) };
    let (status, _) = compute_status(&NodeStatus::default(), &listed);
    assert_eq!(status.images, Some(vec![image.clone()]));
    let (again, _) = compute_status(&status, &inputs(&s, &f, now));
    assert_eq!(again.images, Some(vec![image]));
}

#[test]
fn object_ttl_from_the_annotation() {
    let node = |v: &str| Node {
        metadata: ObjectMeta {
            annotations: Some([(OBJECT_TTL_ANNOTATION.to_string(), v.to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(object_ttl(&node("15")), Some(std::time::Duration::from_secs(15)));
    assert_eq!(object_ttl(&node("0")), Some(std::time::Duration::ZERO));
    assert_eq!(object_ttl(&node("1m")), None);
    assert_eq!(object_ttl(&Node::default()), None);
}

#[test]
fn device_plugin_resources_are_reported_and_patched_only_when_they_change() {
    use gantry_plugins::devices::{Amounts, Capacity};
    let (s, f) = (settings(), facts());
    let mut i = inputs(&s, &f, t(0));
    i.devices = Capacity {
        resources: BTreeMap::from([("example.com/gpu".to_string(), Amounts { capacity: 3, allocatable: 2 })]),
        removed: ["example.com/old".to_string()].into(),
    };
    // Someone else's extended resource on the Node.
    let previous = NodeStatus {
        capacity: Some(BTreeMap::from([("example.com/dongle".to_string(), Quantity("4".into()))])),
        ..NodeStatus::default()
    };
    let (status, _) = compute_status(&previous, &i);
    assert_eq!(q(&status.capacity, "example.com/gpu"), "3");
    assert_eq!(q(&status.allocatable, "example.com/gpu"), "2");
    assert_eq!(q(&status.capacity, "example.com/old"), "0", "a removed device resource stays, at 0");
    assert_eq!(q(&status.allocatable, "example.com/old"), "0");
    let patch = status_patch(&previous, &status);
    assert_eq!(patch["status"]["capacity"]["example.com/gpu"], "3");
    assert_eq!(patch["status"]["allocatable"]["example.com/gpu"], "2");
    assert!(patch["status"]["capacity"].get("example.com/dongle").is_none(), "not ours, not touched");
    // Unchanged device resources are not sent again.
    let patch = status_patch(&status, &compute_status(&status, &i).0);
    assert!(patch["status"]["capacity"].get("example.com/gpu").is_none());
}

#[test]
fn runtime_handlers_are_reported_only_when_the_runtime_lists_them() {
    let (s, f) = (settings(), facts());
    let mut i = inputs(&s, &f, t(0));
    let (none, _) = compute_status(&NodeStatus::default(), &i);
    assert_eq!(none.runtime_handlers, None, "containerd before 2.0 lists none");
    assert!(status_patch(&NodeStatus::default(), &none)["status"].get("runtimeHandlers").is_none());
    i.runtime_handlers = serde_json::from_value(json!([
        {"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": false}},
        {"name": "kata", "features": {"recursiveReadOnlyMounts": false, "userNamespaces": true}}
    ]))
    .unwrap();
    let (listed, _) = compute_status(&none, &i);
    assert!(status_changed(&none, &listed));
    let patch = status_patch(&none, &listed);
    assert_eq!(
        patch["status"]["runtimeHandlers"][0],
        json!({"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": false}})
    );
    assert_eq!(patch["status"]["runtimeHandlers"].as_array().map(Vec::len), Some(2));
    i.runtime_handlers.clear();
    let (gone, _) = compute_status(&listed, &i);
    assert_eq!(status_patch(&listed, &gone)["status"]["runtimeHandlers"], Value::Null);
}

#[test]
fn volumes_in_use_are_reported_replaced_and_removed() {
    let (s, f) = (settings(), facts());
    let mut i = inputs(&s, &f, t(0));
    let (untouched, _) = compute_status(&NodeStatus::default(), &i);
    assert_eq!(untouched.volumes_in_use, None);
    assert!(status_patch(&NodeStatus::default(), &untouched)["status"].get("volumesInUse").is_none());
    i.volumes_in_use = Some(vec!["kubernetes.io/csi/d^h".into()]);
    let (in_use, _) = compute_status(&NodeStatus::default(), &i);
    assert_eq!(in_use.volumes_in_use.as_deref(), Some(&["kubernetes.io/csi/d^h".to_string()][..]));
    assert!(status_changed(&untouched, &in_use));
    assert_eq!(status_patch(&untouched, &in_use)["status"]["volumesInUse"], json!(["kubernetes.io/csi/d^h"]));
    i.volumes_in_use = Some(vec![]);
    let (none, _) = compute_status(&in_use, &i);
    assert_eq!(none.volumes_in_use, None);
    assert_eq!(status_patch(&in_use, &none)["status"]["volumesInUse"], Value::Null);
}
