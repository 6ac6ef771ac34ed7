//! Node-pressure eviction, the pure part (upstream's eviction manager, `pkg/kubelet/eviction`):
//! thresholds (`evictionHard`, `evictionSoft` with their grace periods, `evictionMinimumReclaim`),
//! which are met by the node's observed signals, for how long, the node conditions they make
//! (held for `evictionPressureTransitionPeriod`), the pods ranked for eviction, local storage
//! limits (emptyDir `sizeLimit`, `ephemeral-storage` limits), and the evicted pod's status and
//! message in upstream's words.
//!
//! The I/O side (stats, reclaim, the stop itself) is `gantry-agent`'s eviction manager; it
//! calls [`Manager::synchronize`] every monitoring interval with fresh observations.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use gantry_vocab::{keys, quantity, spec};

#[cfg(test)]
mod tests;

/// Upstream's `evictionMonitoringPeriod`: how often the manager looks.
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// Upstream's default `evictionPressureTransitionPeriod`.
pub const DEFAULT_TRANSITION_PERIOD: Duration = Duration::from_secs(300);
/// The grace a pod gets when a hard threshold or a local storage limit evicts it
/// (upstream's `immediateEvictionGracePeriodSeconds`).
pub const IMMEDIATE_GRACE_SECONDS: i64 = 1;
/// The pod status reason and event reason of an evicted pod.
pub const REASON: &str = "Evicted";
/// The Node event recorded when a threshold makes the manager reclaim.
pub const THRESHOLD_MET_EVENT: &str = "EvictionThresholdMet";
/// The `Evicted` event's annotations of a pressure eviction (upstream's keys): the containers
/// using more than their request, their usage, and the resource the node lacked.
pub const OFFENDING_CONTAINERS: &str = "offending_containers";
pub const OFFENDING_CONTAINERS_USAGE: &str = "offending_containers_usage";
pub const STARVED_RESOURCE: &str = "starved_resource";
/// Upstream's `scheduling.SystemCriticalPriority`.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// An eviction signal Gantry observes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 7] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The name in the configuration (`memory.available`).
    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The resource a pod eviction reclaims for this signal (upstream's `signalToResource`).
    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => Resource::EphemeralStorage,
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    fn is_memory(self) -> bool {
        self.resource() == Resource::Memory
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a pod eviction frees, by upstream's resource name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        })
    }
}

/// A threshold's value: an absolute quantity, or a fraction of the capacity.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// The quantity as written (printed canonically in messages) and its amount.
    Quantity { text: String, amount: i128 },
    /// `10%` is 0.1, a float32 as upstream.
    Percentage(f32),
}

impl Value {
    /// `100Mi`, `10%`; an invalid value names itself.
    pub fn parse(text: &str) -> Result<Value, ThresholdError> {
        let bad = || ThresholdError::Value(text.to_string());
        if text.ends_with('%') {
            let p = quantity::parse_percentage(text).map_err(|_| bad())?;
            return if (0.0..=1.0).contains(&p) { Ok(Value::Percentage(p)) } else { Err(bad()) };
        }
        let amount = quantity::parse_units(text).map_err(|_| bad())?;
        Ok(Value::Quantity { text: text.to_string(), amount })
    }

    /// The amount for a resource of `capacity` (upstream's `GetThresholdQuantity`: the
    /// float32 fraction times the capacity, truncated).
    pub fn amount(&self, capacity: i128) -> i128 {
        match self {
            Value::Quantity { amount, .. } => *amount,
            Value::Percentage(p) => (capacity as f64 * f64::from(*p)) as i128,
        }
    }

    /// The amount as upstream prints it in an eviction message.
    fn display(&self, capacity: i128) -> String {
        match self {
            Value::Quantity { text, .. } => canonical(text),
            Value::Percentage(_) => quantity::format_binary_bytes(self.amount(capacity)),
        }
    }
}

/// A configured threshold is not valid; the caller names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    #[error("unsupported eviction signal {0}")]
    Signal(String),
    #[error("invalid eviction threshold value {0:?}")]
    Value(String),
    #[error("grace period must be specified for the soft eviction threshold {0}")]
    MissingGrace(String),
    #[error("invalid grace period for {signal}: {value:?}")]
    Grace { signal: String, value: String },
}

/// One threshold: met when the signal's available amount is below its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: Value,
    /// Zero for a hard threshold; a soft one must be met this long before it evicts.
    pub grace: Duration,
    pub min_reclaim: Option<Value>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace.is_zero()
    }
}

/// The thresholds from the configuration maps (signal → value), as upstream's
/// `ParseThresholdConfig`: every soft threshold needs a grace period, and the minimum reclaim
/// applies to the hard and soft thresholds of its signal. `parse_duration` reads a grace
/// period (Go syntax); signals Gantry does not observe (`containerfs.*`) are left out, as
/// upstream derives them from nodefs/imagefs.
pub fn thresholds(
    hard: &BTreeMap<String, String>,
    soft: &BTreeMap<String, String>,
    soft_grace: &BTreeMap<String, String>,
    min_reclaim: &BTreeMap<String, String>,
    parse_duration: impl Fn(&str) -> Option<Duration>,
) -> Result<Vec<Threshold>, ThresholdError> {
    let signal = |name: &str| match Signal::parse(name) {
        Some(s) => Ok(Some(s)),
        None if name.starts_with("containerfs.") => Ok(None),
        None => Err(ThresholdError::Signal(name.to_string())),
    };
    let mut reclaim = BTreeMap::new();
    for (name, value) in min_reclaim {
        if let Some(s) = signal(name)? {
            reclaim.insert(s, Value::parse(value)?);
        }
    }
    let mut out = Vec::new();
    for (name, value) in hard {
        if let Some(s) = signal(name)? {
            // Upstream ignores a 0% or 100% threshold (it can never or always be met).
            if value == "0%" || value == "100%" {
                continue;
            }
            out.push(Threshold {
                signal: s,
                value: Value::parse(value)?,
                grace: Duration::ZERO,
                min_reclaim: reclaim.get(&s).cloned(),
            });
        }
    }
    for (name, value) in soft {
        let Some(s) = signal(name)? else { continue };
        let grace_text = soft_grace.get(name).ok_or_else(|| ThresholdError::MissingGrace(name.clone()))?;
        let grace = parse_duration(grace_text)
            .ok_or_else(|| ThresholdError::Grace { signal: name.clone(), value: grace_text.clone() })?;
        out.push(Threshold { signal: s, value: Value::parse(value)?, grace, min_reclaim: reclaim.get(&s).cloned() });
    }
    for name in soft_grace.keys() {
        signal(name)?;
    }
    Ok(out)
}

/// One signal as observed: what is available of how much, and when the stats were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i128,
    pub capacity: i128,
    pub time: Timestamp,
}

pub type Observations = BTreeMap<Signal, Observation>;

/// The node conditions pressure sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

impl Pressure {
    fn of(thresholds: &[Threshold]) -> Pressure {
        let mut p = Pressure::default();
        for t in thresholds {
            match t.signal.resource() {
                Resource::Memory => p.memory = true,
                Resource::EphemeralStorage | Resource::Inodes => p.disk = true,
                Resource::Pids => p.pid = true,
            }
        }
        p
    }

    pub fn any(self) -> bool {
        self.memory || self.disk || self.pid
    }

    /// The condition names, as upstream lists them in its admission message.
    pub fn names(self) -> Vec<&'static str> {
        [(self.memory, "MemoryPressure"), (self.disk, "DiskPressure"), (self.pid, "PIDPressure")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect()
    }
}

/// The thresholds met by `observations`; with `enforce_min_reclaim`, a threshold counts as
/// met until the available amount is above its value plus its minimum reclaim.
pub fn met(thresholds: &[Threshold], observations: &Observations, enforce_min_reclaim: bool) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = observations.get(&t.signal) else { return false };
            let mut amount = t.value.amount(o.capacity);
            if enforce_min_reclaim && let Some(r) = &t.min_reclaim {
                amount += r.amount(o.capacity);
            }
            amount > o.available
        })
        .cloned()
        .collect()
}

/// The manager's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub thresholds: Vec<Threshold>,
    /// `evictionMaxPodGracePeriod`: the grace of a pod evicted for a soft threshold.
    pub max_pod_grace_seconds: i64,
    /// `evictionPressureTransitionPeriod`.
    pub transition_period: Duration,
    /// `localStorageCapacityIsolation`: enforce ephemeral-storage limits and emptyDir sizes.
    pub local_storage_isolation: bool,
}

/// What the manager remembers between passes.
#[derive(Debug, Clone, Default)]
pub struct Manager {
    /// Thresholds met (grace included) and not yet resolved with their minimum reclaim.
    thresholds_met: Vec<Threshold>,
    /// When each currently met threshold was first seen met.
    first_observed: Vec<(Threshold, Timestamp)>,
    memory_seen: Option<Timestamp>,
    disk_seen: Option<Timestamp>,
    pid_seen: Option<Timestamp>,
    last_observations: Observations,
    pressure: Pressure,
}

/// The outcome of one pass over the thresholds.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    /// The node conditions, held for the transition period.
    pub pressure: Pressure,
    /// The threshold to reclaim for, when one is met past its grace with fresh stats:
    /// memory first, as upstream's `byEvictionPriority`.
    pub reclaim: Option<Threshold>,
    /// Every threshold driving eviction (for the message's threshold and available amount).
    pub thresholds: Vec<Threshold>,
}

impl Manager {
    /// The conditions of the last pass.
    pub fn pressure(&self) -> Pressure {
        self.pressure
    }

    /// One pass of upstream's `synchronize` over the thresholds.
    pub fn synchronize(&mut self, config: &Config, observations: &Observations, now: Timestamp) -> Pass {
        let mut current = met(&config.thresholds, observations, false);
        for t in met(&self.thresholds_met, observations, true) {
            if !current.contains(&t) {
                current.push(t);
            }
        }
        self.first_observed = current
            .iter()
            .map(|t| {
                let since = self.first_observed.iter().find(|(seen, _)| seen == t).map_or(now, |(_, at)| *at);
                (t.clone(), since)
            })
            .collect();
        let observed = Pressure::of(&current);
        let hold = |seen: &mut Option<Timestamp>, on: bool| {
            if on {
                *seen = Some(now);
            }
            seen.is_some_and(|t| now.duration_since(t) < jiff_duration(config.transition_period))
        };
        self.pressure = Pressure {
            memory: hold(&mut self.memory_seen, observed.memory),
            disk: hold(&mut self.disk_seen, observed.disk),
            pid: hold(&mut self.pid_seen, observed.pid),
        };
        let past_grace: Vec<Threshold> = self
            .first_observed
            .iter()
            .filter(|(t, since)| now.duration_since(*since) >= jiff_duration(t.grace))
            .map(|(t, _)| t.clone())
            .collect();
        self.thresholds_met = past_grace.clone();
        // Only stats newer than the last pass's drive an eviction: the last eviction's effect
        // must show before the next one.
        let fresh: Vec<Threshold> = past_grace
            .into_iter()
            .filter(|t| {
                let last = self.last_observations.get(&t.signal).map(|o| o.time);
                last.is_none() || observations.get(&t.signal).map(|o| o.time) != last
            })
            .collect();
        self.last_observations = observations.clone();
        let reclaim = fresh.iter().find(|t| t.signal.is_memory()).or(fresh.first()).cloned();
        Pass { pressure: self.pressure, reclaim, thresholds: fresh }
    }
}

fn jiff_duration(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

/// Whether reclaiming node-level resources was enough: after it, no threshold is met even
/// counting its minimum reclaim (upstream's `reclaimNodeLevelResources`).
pub fn reclaimed_enough(config: &Config, observations: &Observations) -> bool {
    met(&config.thresholds, observations, true).is_empty()
}

/// Whether node-level reclaim (unused images and dead containers) can help this signal.
pub fn reclaims_images_and_containers(signal: Signal) -> bool {
    matches!(
        signal,
        Signal::NodeFsAvailable | Signal::NodeFsInodesFree | Signal::ImageFsAvailable | Signal::ImageFsInodesFree
    )
}

/// One container's usage, from the node's stats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerUsage {
    pub name: String,
    pub memory_working_set: Option<u64>,
    pub rootfs_bytes: Option<u64>,
    pub rootfs_inodes: Option<u64>,
    pub logs_bytes: Option<u64>,
    pub logs_inodes: Option<u64>,
}

/// One volume's usage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeUsage {
    pub name: String,
    pub bytes: Option<u64>,
    pub inodes: Option<u64>,
}

/// One pod's usage, from the node's stats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodUsage {
    pub containers: Vec<ContainerUsage>,
    pub volumes: Vec<VolumeUsage>,
    /// The pod's whole ephemeral storage (containers, logs, local volumes, etc-hosts).
    pub ephemeral_bytes: Option<u64>,
    pub processes: Option<u64>,
}

/// Pod usage by UID; a pod without stats is missing.
pub type Usage = BTreeMap<String, PodUsage>;

/// Static, mirror and system-critical pods are never evicted (upstream's `IsCriticalPod`).
pub fn is_critical(pod: &Pod) -> bool {
    !keys::is_api_pod(pod) || keys::is_mirror(pod) || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn container_quantity(c: &Container, list: &str, resource: &str) -> Option<i128> {
    let r = c.resources.as_ref()?;
    let map = if list == "limits" { r.limits.as_ref() } else { r.requests.as_ref() };
    map?.get(resource).and_then(|q| quantity::parse_units(&q.0).ok())
}

/// A container's request of `resource`, defaulting to its limit as API defaulting does.
fn container_request(c: &Container, resource: &str) -> i128 {
    container_quantity(c, "requests", resource).or_else(|| container_quantity(c, "limits", resource)).unwrap_or(0)
}

/// The pod's request of `resource` (upstream's `PodRequests`): the regular containers and
/// sidecars together, or the largest init container with the sidecars started before it,
/// whichever is larger; plus the pod overhead.
fn pod_request(pod: &Pod, resource: &str) -> i128 {
    let mut sidecars = 0;
    let mut init_peak = 0;
    for c in spec::init_containers(pod) {
        let request = container_request(c, resource);
        if spec::is_sidecar(c) {
            sidecars += request;
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(sidecars + request);
        }
    }
    let regular: i128 = spec::containers(pod).iter().map(|c| container_request(c, resource)).sum::<i128>() + sidecars;
    let overhead = pod
        .spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .and_then(|o| o.get(resource))
        .and_then(|q| quantity::parse_units(&q.0).ok())
        .unwrap_or(0);
    regular.max(init_peak) + overhead
}

/// Which file systems a disk signal measures of a pod (upstream's `fsStatsType`): without a
/// dedicated image file system, nodefs counts everything; with one, nodefs counts logs and
/// local volumes and imagefs the writable layers.
fn measures(signal: Signal, dedicated_imagefs: bool) -> (bool, bool) {
    let image = matches!(signal, Signal::ImageFsAvailable | Signal::ImageFsInodesFree);
    match (dedicated_imagefs, image) {
        (false, _) => (true, true),
        (true, true) => (true, false),
        (true, false) => (false, true),
    }
}

/// Local ephemeral volumes count toward disk usage: emptyDir not in memory, configMap,
/// downwardAPI, gitRepo (upstream's `localEphemeralVolumeNames`).
fn local_volumes(pod: &Pod) -> Vec<&str> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
    volumes
        .iter()
        .filter(|v| {
            v.empty_dir.as_ref().is_some_and(|e| e.medium.as_deref() != Some("Memory"))
                || v.config_map.is_some()
                || v.downward_api.is_some()
                || v.git_repo.is_some()
        })
        .map(|v| v.name.as_str())
        .collect()
}

/// The pod's disk usage as a disk signal measures it, in bytes or inodes.
fn disk_usage(pod: &Pod, usage: &PodUsage, signal: Signal, dedicated_imagefs: bool) -> i128 {
    let (rootfs, logs_and_volumes) = measures(signal, dedicated_imagefs);
    let inodes = signal.resource() == Resource::Inodes;
    let pick = |bytes: Option<u64>, count: Option<u64>| i128::from(if inodes { count } else { bytes }.unwrap_or(0));
    let mut total = 0;
    for c in &usage.containers {
        if rootfs {
            total += pick(c.rootfs_bytes, c.rootfs_inodes);
        }
        if logs_and_volumes {
            total += pick(c.logs_bytes, c.logs_inodes);
        }
    }
    if logs_and_volumes {
        let local = local_volumes(pod);
        total += usage
            .volumes
            .iter()
            .filter(|v| local.contains(&v.name.as_str()))
            .map(|v| pick(v.bytes, v.inodes))
            .sum::<i128>();
    }
    total
}

fn memory_usage(usage: &PodUsage) -> i128 {
    usage.containers.iter().map(|c| i128::from(c.memory_working_set.unwrap_or(0))).sum()
}

/// The active pods in the order upstream evicts them for `signal`:
/// - memory: usage above the pod's memory request first, then lower priority, then larger
///   usage minus request;
/// - disk: the same keys against the ephemeral-storage request and the local storage the
///   signal measures (inodes for the inode signals, where requests do not apply);
/// - PIDs: lower priority, then more processes.
///
/// Pods without stats come first, as upstream's comparators put them.
pub fn rank<'a>(pods: &[&'a Pod], usage: &Usage, signal: Signal, dedicated_imagefs: bool) -> Vec<&'a Pod> {
    // (no stats, exceeds request, priority, amount over request) per pod; sorted ascending
    // with the "first" values small.
    let key = |pod: &Pod| -> (bool, bool, i32, i128) {
        let Some(u) = usage.get(spec::uid(pod)) else { return (false, false, priority(pod), 0) };
        let (used, request) = match signal.resource() {
            Resource::Memory => (memory_usage(u), pod_request(pod, "memory")),
            Resource::EphemeralStorage => {
                (disk_usage(pod, u, signal, dedicated_imagefs), pod_request(pod, "ephemeral-storage"))
            }
            Resource::Inodes => (disk_usage(pod, u, signal, dedicated_imagefs), 0),
            Resource::Pids => (i128::from(u.processes.unwrap_or(0)), 0),
        };
        let exceeds = signal.resource() != Resource::Pids && used > request;
        (true, !exceeds, priority(pod), -(used - request))
    };
    let mut ranked: Vec<&Pod> = pods.to_vec();
    ranked.sort_by_key(|p| key(p));
    ranked
}

/// A pod to evict, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub uid: String,
    /// `namespace/name`, for logs.
    pub name: String,
    pub grace_seconds: i64,
    /// The pod status message, event message and condition message.
    pub message: String,
    /// Whether the pod gets the `DisruptionTarget` condition (pressure evictions; upstream's
    /// local storage evictions set none).
    pub disruption_target: bool,
    /// The signal (or local storage limit) that evicted it, for logs and metrics.
    pub signal: String,
    /// The `Evicted` event's annotations ([`OFFENDING_CONTAINERS`] …; none for local storage
    /// evictions, as upstream).
    pub annotations: BTreeMap<String, String>,
}

/// Go's canonical form of a quantity as written in a spec (`0.5Gi` prints as `512Mi`).
fn canonical(text: &str) -> String {
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].iter().any(|s| text.ends_with(s));
    match quantity::parse_milli(text) {
        Ok(milli) if binary && milli % 1000 == 0 => quantity::format_binary_bytes(milli / 1000),
        Ok(milli) => quantity::format_decimal_milli(milli),
        Err(_) => text.to_string(),
    }
}

/// A container's request as upstream prints it (the limit when only that is set, as API
/// defaulting makes it the request; `0` when neither is).
fn request_text(c: &Container, resource: &str) -> String {
    fn get<'a>(map: Option<&'a BTreeMap<String, Quantity>>, resource: &str) -> Option<&'a Quantity> {
        map?.get(resource)
    }
    let r = c.resources.as_ref();
    let q =
        get(r.and_then(|r| r.requests.as_ref()), resource).or_else(|| get(r.and_then(|r| r.limits.as_ref()), resource));
    q.map_or_else(|| "0".to_string(), |q| canonical(&q.0))
}

/// Upstream's eviction message for a pressure eviction: the resource, the threshold and
/// what was available, and every container using more than its request; with the event's
/// annotations naming those containers, their usage and the resource (none when the pod's
/// usage is unknown, as upstream).
pub fn message(
    resource: Resource,
    pod: &Pod,
    usage: Option<&PodUsage>,
    pass: &Pass,
    observations: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut message = format!("The node was low on resource: {resource}. ");
    let met = pass.thresholds.iter().find(|t| t.signal.resource() == resource);
    if let Some(t) = met
        && let Some(o) = observations.get(&t.signal)
    {
        let available = quantity::format_binary_bytes(o.available);
        message += &format!("Threshold quantity: {}, available: {available}. ", t.value.display(o.capacity));
    }
    let Some(usage) = usage else { return (message, BTreeMap::new()) };
    let (mut offending, mut offending_usage) = (Vec::new(), Vec::new());
    for stats in &usage.containers {
        let Some(c) = spec::containers(pod).iter().find(|c| c.name == stats.name) else { continue };
        let (used, request) = match resource {
            Resource::EphemeralStorage => match (stats.rootfs_bytes, stats.logs_bytes) {
                (Some(root), Some(logs)) => (i128::from(root + logs), "ephemeral-storage"),
                _ => continue,
            },
            Resource::Memory => match stats.memory_working_set {
                Some(ws) => (i128::from(ws), "memory"),
                None => continue,
            },
            _ => continue,
        };
        if used > container_request(c, request) {
            let used = quantity::format_binary_bytes(used);
            message += &format!(
                "Container {} was using {used}, request is {}, has larger consumption of {resource}. ",
                c.name,
                request_text(c, request),
            );
            offending.push(c.name.as_str());
            offending_usage.push(used);
        }
    }
    let annotations = [
        (OFFENDING_CONTAINERS, offending.join(",")),
        (OFFENDING_CONTAINERS_USAGE, offending_usage.join(",")),
        (STARVED_RESOURCE, resource.to_string()),
    ];
    (message, annotations.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// The pod to evict for a pressure pass, if any: the first non-critical pod in rank order.
/// Soft thresholds give `evictionMaxPodGracePeriod`, hard ones upstream's immediate grace.
pub fn choose(
    config: &Config,
    pass: &Pass,
    pods: &[&Pod],
    usage: &Usage,
    observations: &Observations,
    dedicated_imagefs: bool,
) -> Option<Eviction> {
    let threshold = pass.reclaim.as_ref()?;
    let grace_seconds = if threshold.is_hard() { IMMEDIATE_GRACE_SECONDS } else { config.max_pod_grace_seconds };
    let resource = threshold.signal.resource();
    let pod = rank(pods, usage, threshold.signal, dedicated_imagefs).into_iter().find(|p| !is_critical(p))?;
    let (message, annotations) = message(resource, pod, usage.get(spec::uid(pod)), pass, observations);
    Some(Eviction {
        uid: spec::uid(pod).to_string(),
        name: spec::full_name(pod),
        grace_seconds,
        message,
        disruption_target: true,
        signal: threshold.signal.name().to_string(),
        annotations,
    })
}

/// Whether [`local_storage`] can find the pod over a limit: a pod that is not critical with an
/// emptyDir `sizeLimit` or a container with an `ephemeral-storage` limit. Only these pods'
/// usage needs reading when no threshold is met.
pub fn has_local_storage_limit(pod: &Pod) -> bool {
    let size_limit = || {
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
        volumes.iter().any(|v| v.empty_dir.as_ref().is_some_and(|e| e.size_limit.is_some()))
    };
    let ephemeral_limit = || {
        let all = spec::containers(pod).iter().chain(spec::init_containers(pod));
        all.clone().any(|c| container_quantity(c, "limits", "ephemeral-storage").is_some())
    };
    !is_critical(pod) && (size_limit() || ephemeral_limit())
}

/// Pods over their local storage limits, regardless of node pressure (upstream's
/// `localStorageEviction`): an emptyDir over its `sizeLimit`, the pod over the sum of its
/// containers' `ephemeral-storage` limits, a container over its own limit (logs, plus the
/// writable layer without a dedicated image file system). Critical pods are skipped.
pub fn local_storage(pods: &[&Pod], usage: &Usage, dedicated_imagefs: bool) -> Vec<Eviction> {
    pods.iter()
        .filter(|p| !is_critical(p))
        .filter_map(|pod| {
            let u = usage.get(spec::uid(pod))?;
            let (message, signal) = empty_dir_over(pod, u)
                .map(|m| (m, "emptydirfs.limit"))
                .or_else(|| pod_over(pod, u).map(|m| (m, "ephemeralpodfs.limit")))
                .or_else(|| container_over(pod, u, dedicated_imagefs).map(|m| (m, "ephemeralcontainerfs.limit")))?;
            Some(Eviction {
                uid: spec::uid(pod).to_string(),
                name: spec::full_name(pod),
                grace_seconds: IMMEDIATE_GRACE_SECONDS,
                message,
                disruption_target: false,
                signal: signal.to_string(),
                annotations: BTreeMap::new(),
            })
        })
        .collect()
}

fn empty_dir_over(pod: &Pod, usage: &PodUsage) -> Option<String> {
    let volumes = pod.spec.as_ref()?.volumes.as_deref()?;
    volumes.iter().find_map(|v| {
        let limit = v.empty_dir.as_ref()?.size_limit.as_ref()?;
        let amount = quantity::parse_units(&limit.0).ok().filter(|a| *a > 0)?;
        let used = usage.volumes.iter().find(|u| u.name == v.name)?.bytes?;
        (i128::from(used) > amount)
            .then(|| format!("Usage of EmptyDir volume {:?} exceeds the limit {:?}. ", v.name, canonical(&limit.0)))
    })
}

fn pod_over(pod: &Pod, usage: &PodUsage) -> Option<String> {
    let all = spec::containers(pod).iter().chain(spec::init_containers(pod));
    if !all.clone().any(|c| container_quantity(c, "limits", "ephemeral-storage").is_some()) {
        return None;
    }
    // Upstream's PodLimits: the regular containers and sidecars summed, or the largest
    // init container with the sidecars before it.
    let limit = |c: &Container| container_quantity(c, "limits", "ephemeral-storage").unwrap_or(0);
    let mut sidecars = 0;
    let mut init_peak = 0;
    for c in spec::init_containers(pod) {
        if spec::is_sidecar(c) {
            sidecars += limit(c);
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(sidecars + limit(c));
        }
    }
    let total = (spec::containers(pod).iter().map(limit).sum::<i128>() + sidecars).max(init_peak);
    let used = i128::from(usage.ephemeral_bytes.unwrap_or(0));
    (used > total).then(|| {
        format!(
            "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
            quantity::format_binary_bytes(total)
        )
    })
}

fn container_over(pod: &Pod, usage: &PodUsage, dedicated_imagefs: bool) -> Option<String> {
    usage.containers.iter().find_map(|stats| {
        let c = spec::containers(pod).iter().find(|c| c.name == stats.name)?;
        let text = c.resources.as_ref()?.limits.as_ref()?.get("ephemeral-storage")?;
        let limit = quantity::parse_units(&text.0).ok().filter(|l| *l != 0)?;
        let mut used = stats.logs_bytes.unwrap_or(0);
        if !dedicated_imagefs {
            used += stats.rootfs_bytes.unwrap_or(0);
        }
        (i128::from(used) > limit).then(|| {
            format!("Container {} exceeded its local ephemeral storage limit {:?}. ", c.name, canonical(&text.0))
        })
    })
}

/// The status of an evicted pod: `Failed` (unless it had already `Succeeded`), reason
/// `Evicted` with the message, and for pressure evictions the `DisruptionTarget` condition
/// (reason `TerminationByKubelet`).
pub fn evicted_status(
    mut status: PodStatus,
    generation: Option<i64>,
    message: &str,
    disruption_target: bool,
    now: Time,
) -> PodStatus {
    if status.phase.as_deref() != Some("Succeeded") {
        status.phase = Some("Failed".into());
    }
    status.reason = Some(REASON.into());
    status.message = Some(message.into());
    if disruption_target {
        set_disruption_target(&mut status, generation, message, now);
    }
    status
}

/// Sets `DisruptionTarget=True` (reason `TerminationByKubelet`) with `message`; the
/// transition time moves only with the status, as upstream's `UpdatePodCondition`.
pub fn set_disruption_target(status: &mut PodStatus, generation: Option<i64>, message: &str, now: Time) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let condition = PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some("TerminationByKubelet".into()),
        message: Some(message.into()),
        observed_generation: generation,
        last_transition_time: Some(now),
        last_probe_time: None,
    };
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(c) if c.status == condition.status => {
            let since = c.last_transition_time.take();
            *c = PodCondition { last_transition_time: since, ..condition };
        }
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
}

/// Admission under pressure (upstream's eviction admit handler): with memory pressure alone
/// only BestEffort pods are refused, unless they tolerate the memory-pressure taint; any other
/// pressure refuses every pod. Critical pods are always admitted. `Some` is the refusal
/// message (reason [`REASON`]), in upstream's words.
pub fn refuse_admission(pressure: Pressure, pod: &Pod) -> Option<String> {
    if !pressure.any() || is_critical(pod) {
        return None;
    }
    if pressure == (Pressure { memory: true, ..Pressure::default() }) {
        let best_effort = crate::qos::class(pod) == crate::qos::QosClass::BestEffort;
        if !best_effort || tolerates_memory_pressure(pod) {
            return None;
        }
    }
    Some(format!("The node had condition: [{}]. ", pressure.names().join(" ")))
}

/// Whether a toleration matches the `node.kubernetes.io/memory-pressure:NoSchedule` taint.
fn tolerates_memory_pressure(pod: &Pod) -> bool {
    const KEY: &str = "node.kubernetes.io/memory-pressure";
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
    tolerations.iter().any(|t| {
        let effect = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "NoSchedule");
        let key = t.key.as_deref().unwrap_or_default();
        let matches = match t.operator.as_deref() {
            Some("Exists") => key.is_empty() || key == KEY,
            _ => key == KEY && t.value.as_deref().unwrap_or_default().is_empty(),
        };
        effect && matches
    })
}
