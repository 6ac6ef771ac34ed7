//! The agent's own Prometheus metrics (`/metrics`) and the prober's (`/metrics/probes`), with
//! upstream names and labels. One [`Metrics`] belongs to one node (the `Node` creates it and
//! hands an `Arc` to the agent, the CRI client's observer, the API client and the server), so
//! two nodes in one process count separately; the HTTP handlers encode on demand.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabels {
    pub container_state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub probe_type: String,
    pub result: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    pub eviction_signal: String,
}

/// A counter shown under its own name. prometheus-client appends `_total` to every counter
/// (the OpenMetrics rule), but upstream names a few counters without it, as the Prometheus
/// text format allows (`kubelet_evictions`): this one's samples are written the way a gauge's
/// are, bare, under a `counter` TYPE line, which is what Go's client prints for them.
#[derive(Clone, Debug, Default)]
pub struct UnsuffixedCounter(Counter);

impl UnsuffixedCounter {
    pub fn inc(&self) -> u64 {
        self.0.inc()
    }

    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

impl TypedMetric for UnsuffixedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for UnsuffixedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabels {
    pub namespace: String,
    pub persistentvolumeclaim: String,
}

/// What the node measured of one claim's volume (`None`: not reported by its plugin).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeFigures {
    pub capacity_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes_used: Option<u64>,
}

/// Upstream's `kubelet_volume_stats_*` gauges, in [`VolumeFigures`]' order.
const VOLUME_STATS: [(&str, &str); 6] = [
    ("kubelet_volume_stats_capacity_bytes", "[ALPHA] Capacity in bytes of the volume"),
    ("kubelet_volume_stats_available_bytes", "[ALPHA] Number of available bytes in the volume"),
    ("kubelet_volume_stats_used_bytes", "[ALPHA] Number of used bytes in the volume"),
    ("kubelet_volume_stats_inodes", "[ALPHA] Maximum number of inodes in the volume"),
    ("kubelet_volume_stats_inodes_free", "[ALPHA] Number of free inodes in the volume"),
    ("kubelet_volume_stats_inodes_used", "[ALPHA] Number of used inodes in the volume"),
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub code: String,
    pub method: String,
    pub host: String,
}

/// Upstream's pod start duration buckets (seconds).
const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0,
    600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

pub struct Metrics {
    registry: Registry,
    probe_registry: Registry,
    pub running_pods: Gauge,
    pub running_containers: Family<ContainerStateLabels, Gauge>,
    pub pod_start_duration: Histogram,
    pub runtime_operations: Family<OperationLabels, Counter>,
    pub runtime_operation_errors: Family<OperationLabels, Counter>,
    pub runtime_operation_duration: Family<OperationLabels, Histogram>,
    pub rest_client_requests: Family<RequestLabels, Counter>,
    pub probes: Family<ProbeLabels, Counter>,
    /// The last graceful node shutdown's start and end (seconds since the epoch; 0: none).
    pub graceful_shutdown_start_time: Gauge<f64, AtomicU64>,
    pub graceful_shutdown_end_time: Gauge<f64, AtomicU64>,
    /// Device plugin registrations by resource.
    pub device_plugin_registrations: Family<ResourceLabels, Counter>,
    /// How long device plugins take to answer `Allocate`, by resource.
    pub device_plugin_alloc_duration: Family<ResourceLabels, Histogram>,
    /// Pods evicted by the eviction manager, by signal (or local storage limit).
    pub evictions: Family<EvictionLabels, UnsuffixedCounter>,
    /// The claims' volumes as last measured, one family per `VOLUME_STATS` entry.
    volume_stats: [Family<VolumeLabels, Gauge>; 6],
}

/// Prometheus' default buckets (Go's `prometheus.DefBuckets`), which upstream's device plugin
/// allocation histogram uses.
const DEFAULT_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let running_pods = Gauge::default();
        registry.register(
            "kubelet_running_pods",
            "[ALPHA] Number of pods that have a running pod sandbox",
            running_pods.clone(),
        );
        let running_containers = Family::<ContainerStateLabels, Gauge>::default();
        registry.register(
            "kubelet_running_containers",
            "[ALPHA] Number of containers currently running",
            running_containers.clone(),
        );
        let pod_start_duration = Histogram::new(POD_START_BUCKETS);
        registry.register(
            "kubelet_pod_start_duration_seconds",
            "[ALPHA] Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            pod_start_duration.clone(),
        );
        // The registry appends `_total` to counters.
        let runtime_operations = Family::<OperationLabels, Counter>::default();
        registry.register(
            "kubelet_runtime_operations",
            "[ALPHA] Cumulative number of runtime operations by operation type.",
            runtime_operations.clone(),
        );
        let runtime_operation_errors = Family::<OperationLabels, Counter>::default();
        registry.register(
            "kubelet_runtime_operations_errors",
            "[ALPHA] Cumulative number of runtime operation errors by operation type.",
            runtime_operation_errors.clone(),
        );
        let runtime_operation_duration = Family::<OperationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.5, 14))
        });
        registry.register(
            "kubelet_runtime_operations_duration_seconds",
            "[ALPHA] Duration in seconds of runtime operations. Broken down by operation type.",
            runtime_operation_duration.clone(),
        );
        let rest_client_requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "rest_client_requests",
            "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
            rest_client_requests.clone(),
        );
        let graceful_shutdown_start_time = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "kubelet_graceful_shutdown_start_time_seconds",
            "[ALPHA] Last graceful shutdown start time since unix epoch in seconds",
            graceful_shutdown_start_time.clone(),
        );
        let graceful_shutdown_end_time = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "kubelet_graceful_shutdown_end_time_seconds",
            "[ALPHA] Last graceful shutdown end time since unix epoch in seconds",
            graceful_shutdown_end_time.clone(),
        );
        let device_plugin_registrations = Family::<ResourceLabels, Counter>::default();
        registry.register(
            "kubelet_device_plugin_registration",
            "[ALPHA] Cumulative number of device plugin registrations. Broken down by resource name.",
            device_plugin_registrations.clone(),
        );
        let device_plugin_alloc_duration =
            Family::<ResourceLabels, Histogram>::new_with_constructor(|| Histogram::new(DEFAULT_BUCKETS));
        registry.register(
            "kubelet_device_plugin_alloc_duration_seconds",
            "[ALPHA] Duration in seconds to serve a device plugin Allocation request. Broken down by resource name.",
            device_plugin_alloc_duration.clone(),
        );
        let evictions = Family::<EvictionLabels, UnsuffixedCounter>::default();
        registry.register(
            "kubelet_evictions",
            "[ALPHA] Cumulative number of pod evictions by eviction signal",
            evictions.clone(),
        );
        let volume_stats: [Family<VolumeLabels, Gauge>; 6] = Default::default();
        for ((name, help), family) in VOLUME_STATS.iter().zip(&volume_stats) {
            registry.register(*name, *help, family.clone());
        }
        let mut probe_registry = Registry::default();
        let probes = Family::<ProbeLabels, Counter>::default();
        probe_registry.register(
            "prober_probe",
            "[ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.",
            probes.clone(),
        );
        Metrics {
            registry,
            probe_registry,
            running_pods,
            running_containers,
            pod_start_duration,
            runtime_operations,
            runtime_operation_errors,
            runtime_operation_duration,
            rest_client_requests,
            probes,
            graceful_shutdown_start_time,
            graceful_shutdown_end_time,
            device_plugin_registrations,
            device_plugin_alloc_duration,
            evictions,
            volume_stats,
        }
    }

    /// `/metrics` in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// `/metrics/probes`.
    pub fn encode_probes(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.probe_registry).expect("writing to a String cannot fail");
        out
    }
}

impl Metrics {
    /// A CRI call observer that records into these metrics.
    pub fn cri_observer(self: &Arc<Self>) -> gantry_cri::CallObserver {
        let metrics = self.clone();
        Arc::new(move |op, elapsed, ok| metrics.record_cri_call(op, elapsed, ok))
    }

    fn record_cri_call(&self, op: &'static str, elapsed: Duration, ok: bool) {
        let labels = OperationLabels { operation_type: operation_type(op) };
        self.runtime_operations.get_or_create(&labels).inc();
        self.runtime_operation_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
        if !ok {
            self.runtime_operation_errors.get_or_create(&labels).inc();
        }
    }
}

/// Upstream's operation types are the snake_case RPC names (`list_containers`).
pub fn operation_type(rpc: &str) -> String {
    let mut out = String::with_capacity(rpc.len() + 4);
    for (i, ch) in rpc.chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out
}

/// Counts one probe run (`probe_type` Liveness/Readiness/Startup, `result`
/// successful/failed/unknown).
pub fn record_probe(
    m: &Metrics,
    probe_type: &str,
    result: &str,
    container: &str,
    pod: &str,
    namespace: &str,
    pod_uid: &str,
) {
    m.probes
        .get_or_create(&ProbeLabels {
            probe_type: probe_type.into(),
            result: result.into(),
            container: container.into(),
            pod: pod.into(),
            namespace: namespace.into(),
            pod_uid: pod_uid.into(),
        })
        .inc();
}

/// Sets the running pod and container gauges from the runtime's current lists.
pub fn set_running(m: &Metrics, pods: i64, containers_by_state: &[(&str, i64)]) {
    m.running_pods.set(pods);
    for (state, n) in containers_by_state {
        m.running_containers.get_or_create(&ContainerStateLabels { container_state: state.to_string() }).set(*n);
    }
}

/// Replaces the `kubelet_volume_stats_*` samples with the claims measured now (a claim no pod
/// on the node mounts any more disappears, as from upstream's collector).
pub fn set_volume_stats(m: &Metrics, claims: &[(VolumeLabels, VolumeFigures)]) {
    for family in &m.volume_stats {
        family.clear();
    }
    for (labels, f) in claims {
        let values = [f.capacity_bytes, f.available_bytes, f.used_bytes, f.inodes, f.inodes_free, f.inodes_used];
        for (family, value) in m.volume_stats.iter().zip(values) {
            if let Some(v) = value {
                family.get_or_create(labels).set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_as_upstream() {
        assert_eq!(operation_type("ListContainers"), "list_containers");
        assert_eq!(operation_type("Version"), "version");
        let m = Arc::new(Metrics::new());
        (m.cri_observer())("ListPodSandbox", Duration::from_millis(3), false);
        record_probe(&m, "Readiness", "successful", "app", "web", "default", "u1");
        set_running(&m, 2, &[("running", 3), ("exited", 1)]);
        let text = m.encode();
        assert!(text.contains("kubelet_runtime_operations_total{operation_type=\"list_pod_sandbox\"} 1"), "{text}");
        assert!(
            text.contains("kubelet_runtime_operations_errors_total{operation_type=\"list_pod_sandbox\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.005\",operation_type=\"list_pod_sandbox\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("kubelet_running_pods 2"), "{text}");
        assert!(text.contains("kubelet_running_containers{container_state=\"running\"} 3"), "{text}");
        assert!(text.contains("# TYPE kubelet_pod_start_duration_seconds histogram"), "{text}");
        let probes = m.encode_probes();
        assert!(
            probes.contains("prober_probe_total{probe_type=\"Readiness\",result=\"successful\",container=\"app\",pod=\"web\",namespace=\"default\",pod_uid=\"u1\"} 1"),
            "{probes}"
        );
    }

    #[test]
    fn device_plugin_metrics_as_upstream() {
        let m = Metrics::new();
        let gpu = ResourceLabels { resource_name: "example.com/gpu".into() };
        m.device_plugin_registrations.get_or_create(&gpu).inc();
        m.device_plugin_alloc_duration.get_or_create(&gpu).observe(0.02);
        let text = m.encode();
        assert!(
            text.contains("kubelet_device_plugin_registration_total{resource_name=\"example.com/gpu\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "kubelet_device_plugin_alloc_duration_seconds_bucket{le=\"0.025\",resource_name=\"example.com/gpu\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn evictions_under_upstreams_exact_name() {
        let m = Metrics::new();
        assert!(!m.encode().contains("kubelet_evictions"), "no sample, no metric (as Go's empty vector)");
        let memory = EvictionLabels { eviction_signal: "memory.available".into() };
        m.evictions.get_or_create(&memory).inc();
        m.evictions.get_or_create(&memory).inc();
        let text = m.encode();
        assert!(text.contains("# TYPE kubelet_evictions counter\n"), "{text}");
        assert!(text.contains("\nkubelet_evictions{eviction_signal=\"memory.available\"} 2\n"), "{text}");
        assert!(!text.contains("kubelet_evictions_total"), "{text}");
    }

    #[test]
    fn two_nodes_count_separately() {
        let (a, b) = (Arc::new(Metrics::new()), Arc::new(Metrics::new()));
        (a.cri_observer())("Version", Duration::from_millis(1), true);
        set_running(&a, 5, &[]);
        assert!(a.encode().contains("kubelet_runtime_operations_total{operation_type=\"version\"} 1"));
        assert!(a.encode().contains("kubelet_running_pods 5"));
        let other = b.encode();
        assert!(!other.contains("operation_type=\"version\""), "{other}");
        assert!(other.contains("kubelet_running_pods 0"), "{other}");
    }

    #[test]
    fn volume_stats_replace_the_last_measure() {
        let m = Metrics::new();
        let claim = |name: &str| VolumeLabels { namespace: "default".into(), persistentvolumeclaim: name.into() };
        let figures = VolumeFigures { capacity_bytes: Some(100), used_bytes: Some(40), ..Default::default() };
        set_volume_stats(&m, &[(claim("data"), figures)]);
        let text = m.encode();
        let data = r#"{namespace="default",persistentvolumeclaim="data"}"#;
        assert!(text.contains(&format!("kubelet_volume_stats_capacity_bytes{data} 100\n")), "{text}");
        assert!(text.contains(&format!("kubelet_volume_stats_used_bytes{data} 40\n")), "{text}");
        assert!(!text.contains(&format!("kubelet_volume_stats_inodes{data}")), "not reported, not shown: {text}");
        set_volume_stats(&m, &[(claim("other"), figures)]);
        let text = m.encode();
        assert!(!text.contains(data), "a claim no longer mounted is gone: {text}");
        assert!(text.contains(r#"persistentvolumeclaim="other""#), "{text}");
    }
}
