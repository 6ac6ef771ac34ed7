//! The pure core of the node side: the Node to register and the status to
//! report, computed from the machine facts, the runtime, the settings, the
//! previous Node and the current time. No I/O.
//!
//! The agent owns only part of the Node: the labels it sets by default, the
//! attach-detach annotation, and in the status capacity/allocatable of cpu,
//! memory, ephemeral-storage and pods, addresses, nodeInfo,
//! daemonEndpoints and the conditions `MemoryPressure`, `DiskPressure`,
//! `PIDPressure` and `Ready`. Everything else (conditions other controllers
//! add, extended resources, ...) is carried over untouched and never sent
//! back: status patches are strategic merge patches listing only owned
//! fields, so conditions merge by type.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeRuntimeHandler, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::machine::MachineFacts;
use super::runtime_state::aggregate;
use super::{CMAD_ANNOTATION, KUBELET_VERSION};
use gantry_config::{Gate, Settings};
use gantry_pod::resources::{self, CgroupValues};
use gantry_vocab::quantity;

/// The conditions the agent owns, in the order upstream sets them.
pub const OWNED_CONDITIONS: [&str; 4] = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"];

/// Capacity/allocatable resources the agent owns.
pub const OWNED_RESOURCES: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pods"];

/// The default labels upstream reconciles on an existing Node.
const DEFAULT_LABELS: [&str; 12] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "node.kubernetes.io/windows-build",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

pub use crate::events::{EventType, NodeEvent};

fn status_is_now(node: &str, reason: &str) -> NodeEvent {
    NodeEvent {
        type_: EventType::Normal,
        reason: reason.to_string(),
        message: format!("Node {node} status is now: {reason}"),
    }
}

/// Resource pressure as the eviction manager judges it.
pub use gantry_pod::eviction::Pressure;

/// Everything the status depends on besides the previous Node.
#[derive(Clone, Debug)]
pub struct NodeInputs<'a> {
    pub settings: &'a Settings,
    pub facts: &'a MachineFacts,
    /// CRI `RuntimeName` (from the start-up `Version`).
    pub runtime_name: &'a str,
    /// CRI `RuntimeVersion` of this pass; `None` when `Version` failed.
    pub runtime_version: Option<&'a str>,
    /// Why the runtime is not ready (empty when it is).
    pub runtime_errors: Vec<String>,
    /// The node shuts down (graceful node shutdown): the Node is not ready.
    pub shutting_down: bool,
    pub pressure: Pressure,
    /// The addresses, or why they could not be determined (then the previous
    /// ones are kept).
    pub addresses: Result<Vec<NodeAddress>, super::addresses::AddressError>,
    /// `status.images`; `None` when the images could not be listed (the previous ones are kept).
    pub images: Option<Vec<k8s_openapi::api::core::v1::ContainerImage>>,
    /// The device plugins' resources (extended resources).
    pub devices: gantry_plugins::devices::Capacity,
    /// `status.volumesInUse` (upstream's unique volume names, sorted); `None` when the node
    /// serves no CSI volumes (the field is left as it is).
    pub volumes_in_use: Option<Vec<String>>,
    /// `status.runtimeHandlers`: the runtime's handlers and their features (CRI `Status`).
    pub runtime_handlers: Vec<NodeRuntimeHandler>,
    pub now: Timestamp,
}

/// Upstream parses the runtime version (semantic, else generic) and prints
/// it back, which drops a leading "v" and, for generic versions, anything
/// after the numbers: `1.6.20~ds1` → `1.6.20`. `None` when unparsable.
pub fn parse_runtime_version(raw: &str) -> Option<String> {
    let s = raw.trim();
    let s = s.strip_prefix('v').unwrap_or(s);
    let num_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (numbers, extra) = s.split_at(num_end);
    // The numeric part is `[0-9]+(\.[0-9]+)*`; a trailing '.' belongs to the extra part.
    let (numbers, extra) = match numbers.strip_suffix('.') {
        Some(n) => (n, &s[n.len()..]),
        None => (numbers, extra),
    };
    let comps: Vec<&str> = numbers.split('.').collect();
    if comps.iter().any(|c| c.is_empty()) {
        return None;
    }
    let leading_zero = |c: &str| c.len() > 1 && c.starts_with('0');
    let values: Vec<u64> = comps.iter().map(|c| c.parse().ok()).collect::<Option<_>>()?;
    let joined = values.iter().map(u64::to_string).collect::<Vec<_>>().join(".");

    // Semantic: exactly three components without leading zeros, and an
    // extra part of `-pre.release` and/or `+build.meta`.
    if comps.len() == 3 && !comps.iter().any(|c| leading_zero(c)) {
        let extra_t = extra.trim_end();
        let (pre, build) = match extra_t.split_once('+') {
            Some((p, b)) => (p, Some(b)),
            None => (extra_t, None),
        };
        let ident_ok = |s: &str| {
            !s.is_empty()
                && s.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        };
        let pre_ok = pre.is_empty()
            || pre.strip_prefix('-').is_some_and(|p| {
                ident_ok(p) && !p.split('.').any(|c| c.bytes().all(|b| b.is_ascii_digit()) && leading_zero(c))
            });
        let build_ok = build.is_none_or(ident_ok);
        if pre_ok && build_ok {
            return Some(format!("{joined}{pre}{}", build.map(|b| format!("+{b}")).unwrap_or_default()));
        }
    }
    // Generic: at least two components, the first without a leading zero.
    if comps.len() >= 2 && !leading_zero(comps[0]) {
        return Some(joined);
    }
    None
}

/// `<runtime>://<version>`, or `<runtime>://Unknown`.
pub fn container_runtime_version(name: &str, version: Option<&str>) -> String {
    let v = version.and_then(parse_runtime_version).unwrap_or_else(|| "Unknown".to_string());
    format!("{name}://{v}")
}

/// The labels the agent sets on registration: defaults, then `--node-labels`.
pub fn node_labels(settings: &Settings, facts: &MachineFacts) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), settings.hostname.clone()),
        ("kubernetes.io/os".to_string(), facts.operating_system.clone()),
        ("kubernetes.io/arch".to_string(), facts.architecture.clone()),
        ("beta.kubernetes.io/os".to_string(), facts.operating_system.clone()),
        ("beta.kubernetes.io/arch".to_string(), facts.architecture.clone()),
    ]);
    for (k, v) in &settings.node_labels {
        labels.insert(k.clone(), v.clone());
    }
    labels
}

fn quantities(pairs: [(&str, String); 4]) -> BTreeMap<String, Quantity> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), Quantity(v))).collect()
}

/// cpu (milli), memory, ephemeral-storage (bytes) and pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    pub cpu_milli: i128,
    pub memory: i128,
    pub ephemeral_storage: i128,
    pub pods: i128,
}

impl Resources {
    fn to_map(self) -> BTreeMap<String, Quantity> {
        quantities([
            ("cpu", quantity::format_decimal_milli(self.cpu_milli)),
            ("memory", quantity::format_binary_bytes(self.memory)),
            ("ephemeral-storage", quantity::format_binary_bytes(self.ephemeral_storage)),
            ("pods", quantity::format_decimal_units(self.pods)),
        ])
    }
}

/// Node capacity (upstream `MachineInfo` setter).
pub fn capacity(settings: &Settings, facts: &MachineFacts) -> Resources {
    let max_pods = i128::from(settings.max_pods);
    let pods = if settings.pods_per_core > 0 {
        max_pods.min(i128::from(facts.num_cpus) * i128::from(settings.pods_per_core))
    } else {
        max_pods
    };
    Resources {
        cpu_milli: i128::from(facts.num_cpus) * 1000,
        memory: i128::from(facts.memory_bytes),
        ephemeral_storage: i128::from(facts.ephemeral_storage_bytes),
        pods,
    }
}

/// `hugepages-<page size>` → bytes pre-allocated, for each page size the machine offers
/// (`hugepages-2Mi`, `hugepages-1Gi`; 0 when none are allocated), as upstream reports them.
pub fn hugepages(facts: &MachineFacts) -> BTreeMap<String, i128> {
    let name = |size: u64| format!("hugepages-{}", quantity::format_binary_bytes(i128::from(size)));
    facts.hugepages.iter().map(|&(size, bytes)| (name(size), i128::from(bytes))).collect()
}

/// A hard eviction threshold's amount for a resource of `capacity`.
pub(crate) fn threshold_amount(value: &str, capacity: i128) -> i128 {
    if value.ends_with('%') {
        // Upstream: float32 fraction times the capacity, truncated; 0% and
        // 100% are ignored.
        if value == "0%" || value == "100%" {
            return 0;
        }
        let fraction = quantity::parse_percentage(value).unwrap_or(0.0);
        return (capacity as f64 * f64::from(fraction)) as i128;
    }
    quantity::parse_units(value).unwrap_or(0)
}

/// kube-reserved + system-reserved of one resource (milli-units for CPU).
fn reserved(settings: &Settings, resource: &str, milli: bool) -> i128 {
    [&settings.kube_reserved, &settings.system_reserved]
        .iter()
        .filter_map(|m| m.get(resource))
        .map(|v| if milli { quantity::parse_milli(v) } else { quantity::parse_units(v) }.unwrap_or(0))
        .sum()
}

/// The `kubepods` cgroup's limits under `enforceNodeAllocatable: [pods]` (upstream's node
/// allocatable enforcement): CPU shares from capacity − reservations, and memory capacity −
/// reservations; unlike the reported allocatable, eviction thresholds are not subtracted.
pub fn pods_cgroup_limits(settings: &Settings, cap: Resources) -> Option<CgroupValues> {
    if !settings.enforce_pods_allocatable {
        return None;
    }
    let cpu = (cap.cpu_milli - reserved(settings, "cpu", true)).max(0);
    let memory = (cap.memory - reserved(settings, "memory", false)).max(0);
    Some(CgroupValues { cpu_shares: resources::shares(cpu), memory_limit: memory as i64, ..Default::default() })
}

/// Allocatable = capacity − kube-reserved − system-reserved − hard eviction
/// thresholds, never below zero.
pub fn allocatable(settings: &Settings, cap: Resources) -> Resources {
    let reserved = |resource: &str, milli: bool| reserved(settings, resource, milli);
    let eviction =
        |signal: &str, capacity: i128| settings.eviction_hard.get(signal).map_or(0, |v| threshold_amount(v, capacity));
    Resources {
        cpu_milli: (cap.cpu_milli - reserved("cpu", true)).max(0),
        memory: (cap.memory - reserved("memory", false) - eviction("memory.available", cap.memory)).max(0),
        ephemeral_storage: (cap.ephemeral_storage
            - reserved("ephemeral-storage", false)
            - eviction("nodefs.available", cap.ephemeral_storage))
        .max(0),
        pods: cap.pods,
    }
}

fn time(t: Timestamp) -> Time {
    // The API keeps condition times in whole seconds.
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// upstream `VersionInfo` + `GoRuntime` + `MachineInfo` identity fields.
pub fn node_info(inputs: &NodeInputs<'_>, previous: Option<&NodeSystemInfo>) -> NodeSystemInfo {
    let facts = inputs.facts;
    // KEP-4004: with DisableNodeKubeProxyVersion the field is left empty,
    // which also clears a value an older agent had set.
    let kube_proxy_version = if inputs.settings.feature_gates.enabled(Gate::DisableNodeKubeProxyVersion) {
        String::new()
    } else {
        KUBELET_VERSION.to_string()
    };
    NodeSystemInfo {
        architecture: facts.architecture.clone(),
        boot_id: facts.boot_id.clone(),
        container_runtime_version: container_runtime_version(inputs.runtime_name, inputs.runtime_version),
        kernel_version: facts.kernel_version.clone(),
        kube_proxy_version,
        kubelet_version: KUBELET_VERSION.to_string(),
        machine_id: facts.machine_id.clone(),
        operating_system: facts.operating_system.clone(),
        os_image: facts.os_image.clone(),
        swap: previous.and_then(|p| p.swap.clone()),
        system_uuid: facts.system_uuid.clone(),
    }
}

struct PressureCondition {
    type_: &'static str,
    true_reason: &'static str,
    true_message: &'static str,
    true_event: &'static str,
    false_reason: &'static str,
    false_message: &'static str,
    false_event: &'static str,
}

const MEMORY_PRESSURE: PressureCondition = PressureCondition {
    type_: "MemoryPressure",
    true_reason: "KubeletHasInsufficientMemory",
    true_message: "kubelet has insufficient memory available",
    true_event: "NodeHasInsufficientMemory",
    false_reason: "KubeletHasSufficientMemory",
    false_message: "kubelet has sufficient memory available",
    false_event: "NodeHasSufficientMemory",
};

const DISK_PRESSURE: PressureCondition = PressureCondition {
    type_: "DiskPressure",
    true_reason: "KubeletHasDiskPressure",
    true_message: "kubelet has disk pressure",
    true_event: "NodeHasDiskPressure",
    false_reason: "KubeletHasNoDiskPressure",
    false_message: "kubelet has no disk pressure",
    false_event: "NodeHasNoDiskPressure",
};

const PID_PRESSURE: PressureCondition = PressureCondition {
    type_: "PIDPressure",
    true_reason: "KubeletHasInsufficientPID",
    true_message: "kubelet has insufficient PID available",
    true_event: "NodeHasInsufficientPID",
    false_reason: "KubeletHasSufficientPID",
    false_message: "kubelet has sufficient PID available",
    false_event: "NodeHasSufficientPID",
};

/// Upstream's pressure setters: a new condition starts Unknown, reason and
/// message change only with the status, the heartbeat every pass.
fn set_pressure(
    conditions: &mut Vec<NodeCondition>,
    def: &PressureCondition,
    pressure: bool,
    node: &str,
    now: Timestamp,
    events: &mut Vec<NodeEvent>,
) {
    let i = match conditions.iter().position(|c| c.type_ == def.type_) {
        Some(i) => i,
        None => {
            conditions.push(NodeCondition {
                type_: def.type_.to_string(),
                status: "Unknown".into(),
                ..Default::default()
            });
            conditions.len() - 1
        }
    };
    let c = &mut conditions[i];
    c.last_heartbeat_time = Some(time(now));
    let (status, reason, message, event) = if pressure {
        ("True", def.true_reason, def.true_message, def.true_event)
    } else {
        ("False", def.false_reason, def.false_message, def.false_event)
    };
    if c.status != status {
        c.status = status.to_string();
        c.reason = Some(reason.to_string());
        c.message = Some(message.to_string());
        c.last_transition_time = Some(time(now));
        events.push(status_is_now(node, event));
    }
}

/// Upstream's `ReadyCondition` setter; `errors`: the runtime's, then the shutdown manager's.
fn set_ready(
    conditions: &mut Vec<NodeCondition>,
    capacity: &BTreeMap<String, Quantity>,
    errors: &[String],
    node: &str,
    now: Timestamp,
    events: &mut Vec<NodeEvent>,
) {
    let mut errs = errors.to_vec();
    let missing: Vec<&str> =
        ["cpu", "memory", "pods", "ephemeral-storage"].into_iter().filter(|r| !capacity.contains_key(*r)).collect();
    if !missing.is_empty() {
        errs.push(format!("Missing node capacity for resources: {}", missing.join(", ")));
    }
    let mut new = match aggregate(&errs) {
        None => NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            message: Some("kubelet is posting ready status".into()),
            last_heartbeat_time: Some(time(now)),
            last_transition_time: None,
        },
        Some(message) => NodeCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some("KubeletNotReady".into()),
            message: Some(message),
            last_heartbeat_time: Some(time(now)),
            last_transition_time: None,
        },
    };
    match conditions.iter_mut().find(|c| c.type_ == "Ready") {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            } else {
                new.last_transition_time = Some(time(now));
                let reason = if new.status == "True" { "NodeReady" } else { "NodeNotReady" };
                events.push(status_is_now(node, reason));
            }
            *existing = new;
        }
        None => {
            new.last_transition_time = Some(time(now));
            conditions.push(new);
        }
    }
}

/// The status to report, from the previous one (as read from the API
/// server) and the inputs, plus the events the change calls for.
pub fn compute_status(previous: &NodeStatus, inputs: &NodeInputs<'_>) -> (NodeStatus, Vec<NodeEvent>) {
    let node = inputs.settings.node_name.as_str();
    let mut status = previous.clone();
    let mut events = Vec::new();

    if let Ok(addresses) = &inputs.addresses {
        status.addresses = Some(addresses.clone());
    }
    if let Some(images) = &inputs.images {
        status.images = Some(images.clone());
    }

    let cap = capacity(inputs.settings, inputs.facts);
    let mut alloc = allocatable(inputs.settings, cap);
    let hugepages = hugepages(inputs.facts);
    // Pre-allocated huge pages are not available as ordinary memory (upstream's setter).
    alloc.memory = (alloc.memory - hugepages.values().sum::<i128>()).max(0);
    let hugepages: BTreeMap<String, Quantity> =
        hugepages.into_iter().map(|(name, bytes)| (name, Quantity(quantity::format_binary_bytes(bytes)))).collect();
    status.capacity.get_or_insert_with(BTreeMap::new).extend(cap.to_map().into_iter().chain(hugepages.clone()));
    status.allocatable.get_or_insert_with(BTreeMap::new).extend(alloc.to_map().into_iter().chain(hugepages));
    set_device_resources(&mut status, &inputs.devices);
    if let Some(in_use) = &inputs.volumes_in_use {
        status.volumes_in_use = (!in_use.is_empty()).then(|| in_use.clone());
    }
    status.runtime_handlers = (!inputs.runtime_handlers.is_empty()).then(|| inputs.runtime_handlers.clone());

    let previous_boot = previous.node_info.as_ref().map(|i| i.boot_id.as_str()).unwrap_or_default();
    if !previous_boot.is_empty() && previous_boot != inputs.facts.boot_id {
        events.push(NodeEvent {
            type_: EventType::Warning,
            reason: "Rebooted".into(),
            message: format!("Node {node} has been rebooted, boot id: {}", inputs.facts.boot_id),
        });
    }
    status.node_info = Some(node_info(inputs, previous.node_info.as_ref()));
    status.daemon_endpoints =
        Some(NodeDaemonEndpoints { kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(inputs.settings.port) }) });

    let conditions = status.conditions.get_or_insert_with(Vec::new);
    set_pressure(conditions, &MEMORY_PRESSURE, inputs.pressure.memory, node, inputs.now, &mut events);
    set_pressure(conditions, &DISK_PRESSURE, inputs.pressure.disk, node, inputs.now, &mut events);
    set_pressure(conditions, &PID_PRESSURE, inputs.pressure.pid, node, inputs.now, &mut events);
    let capacity_now = status.capacity.clone().unwrap_or_default();
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let mut errors = inputs.runtime_errors.clone();
    if inputs.shutting_down {
        errors.push(gantry_pod::shutdown::NODE_NOT_READY_MESSAGE.to_string());
    }
    set_ready(conditions, &capacity_now, &errors, node, inputs.now, &mut events);
    (status, events)
}

/// The device plugins' resources (upstream's `MachineInfo` setter): capacity counts every
/// device, allocatable the healthy ones; a resource whose plugin is gone for good stays at 0
/// rather than disappearing, so that it is still told from a cluster-level extended resource.
fn set_device_resources(status: &mut NodeStatus, devices: &gantry_plugins::devices::Capacity) {
    let count = |n: i64| Quantity(n.to_string());
    let capacity = status.capacity.get_or_insert_with(BTreeMap::new);
    for (name, a) in &devices.resources {
        capacity.insert(name.clone(), count(a.capacity));
    }
    for name in &devices.removed {
        capacity.insert(name.clone(), count(0));
    }
    let allocatable = status.allocatable.get_or_insert_with(BTreeMap::new);
    for (name, a) in &devices.resources {
        allocatable.insert(name.clone(), count(a.allocatable));
    }
    for name in &devices.removed {
        allocatable.insert(name.clone(), count(0));
    }
}

/// The Node to create on registration (upstream `initialNode`), and the
/// events of its first status.
pub fn initial_node(inputs: &NodeInputs<'_>) -> (Node, Vec<NodeEvent>) {
    let settings = inputs.settings;
    let (status, events) = compute_status(&NodeStatus::default(), inputs);
    let taints: Vec<Taint> = settings
        .register_with_taints
        .iter()
        .map(|t| Taint {
            key: t.key.clone(),
            value: (!t.value.is_empty()).then(|| t.value.clone()),
            effect: t.effect.clone(),
            time_added: None,
        })
        .collect();
    let node = Node {
        metadata: ObjectMeta {
            name: Some(settings.node_name.clone()),
            labels: Some(node_labels(settings, inputs.facts)),
            annotations: Some(BTreeMap::from([(CMAD_ANNOTATION.to_string(), "true".to_string())])),
            ..Default::default()
        },
        spec: Some(NodeSpec { taints: (!taints.is_empty()).then_some(taints), ..Default::default() }),
        status: Some(status),
    };
    (node, events)
}

/// What registration changes on a Node that already exists (upstream
/// `reconcileCMADAnnotationWithExistingNode` and `updateDefaultLabels`), as a
/// merge patch of its metadata; `None` when nothing needs to change. Taints
/// and other labels are left alone (NodeRestriction forbids a node to
/// change its taints).
/// Upstream's `ObjectTTLAnnotationKey`, set by the TTL controller for the kubelet's caches.
pub const OBJECT_TTL_ANNOTATION: &str = "node.alpha.kubernetes.io/ttl";

/// The object cache TTL the Node's annotation asks for (whole seconds, as upstream parses it;
/// anything else is ignored).
pub fn object_ttl(node: &Node) -> Option<std::time::Duration> {
    let value = node.metadata.annotations.as_ref()?.get(OBJECT_TTL_ANNOTATION)?;
    value.parse::<u64>().ok().map(std::time::Duration::from_secs)
}

pub fn registration_patch(existing: &Node, initial: &Node) -> Option<Value> {
    let empty = BTreeMap::new();
    let have = existing.metadata.labels.as_ref().unwrap_or(&empty);
    let want = initial.metadata.labels.as_ref().unwrap_or(&empty);
    let mut labels = serde_json::Map::new();
    for key in DEFAULT_LABELS {
        let Some(value) = want.get(key) else { continue };
        if value.is_empty() {
            if have.contains_key(key) {
                labels.insert(key.to_string(), Value::Null);
            }
        } else if have.get(key) != Some(value) {
            labels.insert(key.to_string(), Value::String(value.clone()));
        }
    }
    let mut metadata = serde_json::Map::new();
    if !labels.is_empty() {
        metadata.insert("labels".into(), Value::Object(labels));
    }
    let existing_cmad = existing.metadata.annotations.as_ref().and_then(|a| a.get(CMAD_ANNOTATION));
    if existing_cmad.map(String::as_str) != Some("true") {
        metadata.insert("annotations".into(), json!({ CMAD_ANNOTATION: "true" }));
    }
    (!metadata.is_empty()).then(|| json!({ "metadata": metadata }))
}

/// Quantities compared by value (the API server may print them
/// differently), falling back to the text.
fn same_quantities(a: Option<&BTreeMap<String, Quantity>>, b: Option<&BTreeMap<String, Quantity>>) -> bool {
    let empty = BTreeMap::new();
    let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
    a.len() == b.len()
        && a.iter().all(|(k, qa)| {
            b.get(k).is_some_and(|qb| match (quantity::parse_milli(&qa.0), quantity::parse_milli(&qb.0)) {
                (Ok(x), Ok(y)) => x == y,
                _ => qa.0 == qb.0,
            })
        })
}

/// Upstream `nodeStatusHasChanged`: anything but the conditions' heartbeat
/// times.
pub fn status_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s.capacity = None;
        s.allocatable = None;
        s
    };
    !same_quantities(old.capacity.as_ref(), new.capacity.as_ref())
        || !same_quantities(old.allocatable.as_ref(), new.allocatable.as_ref())
        || strip(old) != strip(new)
}

/// Whether this pass must PATCH: the status changed, the report frequency
/// passed since the last report, or a report is owed (first pass, or the
/// last attempt failed).
pub fn should_report(
    changed: bool,
    last_report: Option<Timestamp>,
    now: Timestamp,
    report_frequency: std::time::Duration,
) -> bool {
    let Some(last) = last_report else { return true };
    let frequency = SignedDuration::try_from(report_frequency).unwrap_or(SignedDuration::MAX);
    changed || now.duration_since(last) >= frequency
}

/// The strategic merge patch for `nodes/<name>/status` that turns `old`
/// into `new` for the fields the agent owns: owned conditions merge by type
/// (others are untouched), owned resources merge by key, addresses are
/// replaced as a whole when they changed (their merge key is wrong upstream,
/// so upstream sends `$patch: replace` too).
pub fn status_patch(old: &NodeStatus, new: &NodeStatus) -> Value {
    // The agent's own resources, and extended resources that changed (the device plugins'):
    // one someone else set is left as it is.
    let owned_resources = |old: &Option<BTreeMap<String, Quantity>>, new: &Option<BTreeMap<String, Quantity>>| {
        let mut out = serde_json::Map::new();
        for r in OWNED_RESOURCES {
            if let Some(q) = new.as_ref().and_then(|m| m.get(r)) {
                out.insert(r.to_string(), Value::String(q.0.clone()));
            }
        }
        for (r, q) in new.iter().flatten() {
            let changed = old.as_ref().and_then(|m| m.get(r)) != Some(q);
            if changed && gantry_plugins::devices::is_extended_resource_name(r) {
                out.insert(r.clone(), Value::String(q.0.clone()));
            }
        }
        Value::Object(out)
    };
    let conditions: Vec<Value> = new
        .conditions
        .iter()
        .flatten()
        .filter(|c| OWNED_CONDITIONS.contains(&c.type_.as_str()))
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .collect();
    let mut status = serde_json::Map::new();
    status.insert("capacity".into(), owned_resources(&old.capacity, &new.capacity));
    status.insert("allocatable".into(), owned_resources(&old.allocatable, &new.allocatable));
    status.insert("conditions".into(), Value::Array(conditions));
    if let Some(info) = &new.node_info {
        status.insert("nodeInfo".into(), serde_json::to_value(info).unwrap_or(Value::Null));
    }
    if let Some(endpoints) = &new.daemon_endpoints {
        status.insert("daemonEndpoints".into(), serde_json::to_value(endpoints).unwrap_or(Value::Null));
    }
    if old.volumes_in_use != new.volumes_in_use {
        // A plain list: replaced as a whole, removed when empty.
        let list = new.volumes_in_use.as_ref().map(|v| json!(v)).unwrap_or(Value::Null);
        status.insert("volumesInUse".into(), list);
    }
    if old.runtime_handlers != new.runtime_handlers {
        // An atomic list: replaced as a whole, removed when empty.
        let list = new.runtime_handlers.as_ref().map(|h| json!(h)).unwrap_or(Value::Null);
        status.insert("runtimeHandlers".into(), list);
    }
    let old_addresses = old.addresses.as_deref().unwrap_or_default();
    let new_addresses = new.addresses.as_deref().unwrap_or_default();
    if old_addresses != new_addresses {
        let mut list: Vec<Value> =
            new_addresses.iter().map(|a| serde_json::to_value(a).unwrap_or(Value::Null)).collect();
        if !old_addresses.is_empty() {
            list.push(json!({ "$patch": "replace" }));
        }
        status.insert("addresses".into(), Value::Array(list));
    }
    json!({ "status": status })
}

#[cfg(test)]
mod tests;
