//! The `--config` file: a `KubeletConfiguration` (`kubelet.config.k8s.io/v1beta1`)
//! in YAML or JSON.
//!
//! Every upstream v1beta1 field is known (typed after upstream's Go types),
//! so that a config file written for the Go kubelet loads; a field upstream
//! does not have is an error naming its path. Fields Gantry does not act on
//! yet are parsed and validated for shape, then reported by
//! [`ParsedFile::unimplemented`] so the caller can warn about them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::duration::GoDuration;
use super::error::ConfigError;

/// `apiVersion` a kubelet config file must declare.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// `kind` a kubelet config file must declare.
pub const KIND: &str = "KubeletConfiguration";

/// Top-level fields Gantry implements (the rest are accepted and reported).
/// `logging` is partly implemented: only `logging.verbosity` is used.
pub const IMPLEMENTED_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "staticPodPath",
    "staticPodURL",
    "staticPodURLHeader",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "syncFrequency",
    "configMapAndSecretChangeDetectionStrategy",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "runtimeRequestTimeout",
    "podLogsDir",
    "featureGates",
    "runOnce",
    "maxPods",
    "oomScoreAdj",
    "registerNode",
    "rotateCertificates",
    "registerWithTaints",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "eventRecordQPS",
    "eventBurst",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "kubeReserved",
    "systemReserved",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "evictionPressureTransitionPeriod",
    "localStorageCapacityIsolation",
    "port",
    "podsPerCore",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "cgroupsPerQOS",
    "cgroupDriver",
    "cgroupRoot",
    "kubeletCgroups",
    "memoryThrottlingFactor",
    "systemCgroups",
    "podPidsLimit",
    "enforceNodeAllocatable",
    "kubeReservedCgroup",
    "systemReservedCgroup",
    "failCgroupV1",
    "clusterDNS",
    "clusterDomain",
    "resolvConf",
    "allowedUnsafeSysctls",
    "seccompDefault",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "enableServer",
    "address",
    "readOnlyPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsMinVersion",
    "serverTLSBootstrap",
    "authentication",
    "authorization",
    "healthzPort",
    "healthzBindAddress",
    "enableDebuggingHandlers",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "singleProcessOOMKill",
    "volumeStatsAggPeriod",
];

/// A `KubeletConfiguration` (v1beta1) as written in the file. Every field
/// is optional: absent, `null` and (for non-pointer Go fields) zero values
/// mean "use the default", as upstream's defaulting does.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // fields not implemented yet are parsed for validation only
pub struct KubeletConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,

    // ---- implemented -------------------------------------------------
    pub static_pod_path: Option<String>,
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: Option<String>,
    #[serde(rename = "staticPodURLHeader")]
    pub static_pod_url_header: Option<HeaderMap>,
    pub sync_frequency: Option<GoDuration>,
    pub file_check_frequency: Option<GoDuration>,
    pub http_check_frequency: Option<GoDuration>,
    pub container_runtime_endpoint: Option<String>,
    pub image_service_endpoint: Option<String>,
    pub runtime_request_timeout: Option<GoDuration>,
    pub pod_logs_dir: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub run_once: Option<bool>,
    pub max_pods: Option<i32>,
    /// Only `verbosity` is used.
    pub logging: Option<LoggingConfiguration>,
    // Cluster mode (implemented, declared below in upstream order):
    // port, nodeStatusUpdateFrequency, nodeStatusReportFrequency,
    // nodeLeaseDurationSeconds, kubeAPIQPS, kubeAPIBurst, evictionHard,
    // podsPerCore, systemReserved, kubeReserved, registerWithTaints,
    // registerNode.

    // ---- accepted, not implemented yet ---------------------------------
    pub enable_server: Option<bool>,
    pub address: Option<String>,
    pub port: Option<i32>,
    pub read_only_port: Option<i32>,
    pub tls_cert_file: Option<String>,
    pub tls_private_key_file: Option<String>,
    pub tls_cipher_suites: Option<Vec<String>>,
    pub tls_curve_preferences: Option<Vec<i32>>,
    pub tls_min_version: Option<String>,
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: Option<bool>,
    pub authentication: Option<KubeletAuthentication>,
    pub authorization: Option<KubeletAuthorization>,
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: Option<i32>,
    pub registry_burst: Option<i32>,
    pub image_pull_credentials_verification_policy: Option<String>,
    pub preloaded_images_verification_allowlist: Option<Vec<String>>,
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: Option<i32>,
    pub event_burst: Option<i32>,
    pub enable_debugging_handlers: Option<bool>,
    pub enable_contention_profiling: Option<bool>,
    pub healthz_port: Option<i32>,
    pub healthz_bind_address: Option<String>,
    pub oom_score_adj: Option<i32>,
    pub cluster_domain: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub streaming_connection_idle_timeout: Option<GoDuration>,
    pub node_status_update_frequency: Option<GoDuration>,
    pub node_status_report_frequency: Option<GoDuration>,
    pub node_lease_duration_seconds: Option<i32>,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<GoDuration>,
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: Option<GoDuration>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i32>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i32>,
    pub volume_stats_agg_period: Option<GoDuration>,
    pub kubelet_cgroups: Option<String>,
    pub system_cgroups: Option<String>,
    pub cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    pub cgroup_driver: Option<String>,
    #[serde(rename = "cpuManagerPolicy")]
    pub cpu_manager_policy: Option<String>,
    #[serde(rename = "singleProcessOOMKill")]
    pub single_process_oom_kill: Option<bool>,
    #[serde(rename = "cpuManagerPolicyOptions")]
    pub cpu_manager_policy_options: Option<BTreeMap<String, String>>,
    #[serde(rename = "cpuManagerReconcilePeriod")]
    pub cpu_manager_reconcile_period: Option<GoDuration>,
    #[serde(rename = "draManagerReconcilePeriod")]
    pub dra_manager_reconcile_period: Option<GoDuration>,
    pub memory_manager_policy: Option<String>,
    pub topology_manager_policy: Option<String>,
    pub topology_manager_scope: Option<String>,
    pub topology_manager_policy_options: Option<BTreeMap<String, String>>,
    #[serde(rename = "qosReserved")]
    pub qos_reserved: Option<BTreeMap<String, String>>,
    pub hairpin_mode: Option<String>,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    pub pod_pids_limit: Option<i64>,
    #[serde(rename = "resolvConf")]
    pub resolv_conf: Option<String>,
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: Option<GoDuration>,
    pub node_status_max_images: Option<i32>,
    pub max_open_files: Option<i64>,
    pub content_type: Option<String>,
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: Option<i32>,
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: Option<i32>,
    pub serialize_image_pulls: Option<bool>,
    pub max_parallel_image_pulls: Option<i32>,
    pub eviction_hard: Option<BTreeMap<String, String>>,
    pub eviction_soft: Option<BTreeMap<String, String>>,
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    pub eviction_pressure_transition_period: Option<GoDuration>,
    pub eviction_max_pod_grace_period: Option<i32>,
    pub eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    pub merge_default_eviction_settings: Option<bool>,
    pub pods_per_core: Option<i32>,
    pub enable_controller_attach_detach: Option<bool>,
    pub protect_kernel_defaults: Option<bool>,
    #[serde(rename = "makeIPTablesUtilChains")]
    pub make_iptables_util_chains: Option<bool>,
    pub iptables_masquerade_bit: Option<i32>,
    pub iptables_drop_bit: Option<i32>,
    pub fail_swap_on: Option<bool>,
    pub memory_swap: Option<MemorySwapConfiguration>,
    pub container_log_max_size: Option<String>,
    pub container_log_max_files: Option<i32>,
    pub container_log_max_workers: Option<i32>,
    pub container_log_monitor_interval: Option<GoDuration>,
    pub config_map_and_secret_change_detection_strategy: Option<String>,
    pub system_reserved: Option<BTreeMap<String, String>>,
    pub kube_reserved: Option<BTreeMap<String, String>>,
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    pub show_hidden_metrics_for_version: Option<String>,
    pub system_reserved_cgroup: Option<String>,
    pub kube_reserved_cgroup: Option<String>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    pub volume_plugin_dir: Option<String>,
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    pub kernel_memcg_notification: Option<bool>,
    pub enable_system_log_handler: Option<bool>,
    pub enable_system_log_query: Option<bool>,
    pub shutdown_grace_period: Option<GoDuration>,
    pub shutdown_grace_period_critical_pods: Option<GoDuration>,
    pub shutdown_grace_period_by_pod_priority: Option<Vec<ShutdownGracePeriodByPodPriority>>,
    pub crash_loop_back_off: Option<CrashLoopBackOffConfig>,
    pub reserved_memory: Option<Vec<MemoryReservation>>,
    pub enable_profiling_handler: Option<bool>,
    pub enable_debug_flags_handler: Option<bool>,
    pub seccomp_default: Option<bool>,
    pub memory_throttling_factor: Option<f64>,
    pub memory_reservation_policy: Option<String>,
    pub register_with_taints: Option<Vec<Taint>>,
    pub register_node: Option<bool>,
    pub rotate_certificates: Option<bool>,
    pub tracing: Option<TracingConfiguration>,
    pub local_storage_capacity_isolation: Option<bool>,
    pub fail_cgroup_v1: Option<bool>,
    pub user_namespaces: Option<UserNamespaces>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct KubeletAuthentication {
    pub x509: Option<KubeletX509Authentication>,
    pub webhook: Option<KubeletWebhookAuthentication>,
    pub anonymous: Option<KubeletAnonymousAuthentication>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct KubeletX509Authentication {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct KubeletWebhookAuthentication {
    pub enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<GoDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct KubeletAnonymousAuthentication {
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct KubeletAuthorization {
    pub mode: Option<String>,
    pub webhook: Option<KubeletWebhookAuthorization>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct KubeletWebhookAuthorization {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<GoDuration>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<GoDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct MemorySwapConfiguration {
    pub swap_behavior: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct CrashLoopBackOffConfig {
    pub max_container_restart_period: Option<GoDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ShutdownGracePeriodByPodPriority {
    pub priority: Option<i32>,
    pub shutdown_grace_period_seconds: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct MemoryReservation {
    pub numa_node: Option<i32>,
    pub limits: Option<BTreeMap<String, Quantity>>,
}

/// A core/v1 `Taint` in `registerWithTaints`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct Taint {
    pub key: Option<String>,
    pub value: Option<String>,
    pub effect: Option<String>,
    pub time_added: Option<String>,
}

/// component-base `TracingConfiguration`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct TracingConfiguration {
    pub endpoint: Option<String>,
    pub sampling_rate_per_million: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct UserNamespaces {
    pub ids_per_pod: Option<i64>,
}

/// component-base `LoggingConfiguration`. Only `verbosity` is used; the
/// others keep upstream's flexible shapes (`flushFrequency` may be a number
/// of nanoseconds or a duration string).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub struct LoggingConfiguration {
    pub format: Option<String>,
    pub flush_frequency: Option<serde_json::Value>,
    pub verbosity: Option<u32>,
    pub vmodule: Option<serde_json::Value>,
    pub options: Option<serde_json::Value>,
}

/// A resource quantity (`"1Gi"`, `"500m"`, or a bare number).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a resource quantity such as \"1Gi\" or \"500m\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// `staticPodURLHeader`: header name → values, in file order. A name that
/// appears twice has its values appended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderMap(pub Vec<(String, Vec<String>)>);

impl HeaderMap {
    /// Flattens to `(name, value)` pairs, grouped by name in first-seen order.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.0.iter().flat_map(|(k, vs)| vs.iter().map(move |v| (k.clone(), v.clone()))).collect()
    }
}

impl<'de> Deserialize<'de> for HeaderMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = HeaderMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from header name to a list of values")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<HeaderMap, A::Error> {
                let mut out: Vec<(String, Vec<String>)> = Vec::new();
                while let Some((k, vs)) = map.next_entry::<String, Option<Vec<String>>>()? {
                    let vs = vs.unwrap_or_default();
                    match out.iter_mut().find(|(name, _)| *name == k) {
                        Some((_, existing)) => existing.extend(vs),
                        None => out.push((k, vs)),
                    }
                }
                Ok(HeaderMap(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A config file that parsed and passed the shape checks.
#[derive(Debug)]
pub struct ParsedFile {
    pub path: PathBuf,
    pub config: KubeletConfiguration,
    /// Fields present with a non-default value that Gantry does not act on
    /// yet (top-level names, plus `logging.<name>` for logging sub-fields).
    pub unimplemented: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Yaml,
    Json,
}

impl Format {
    fn detect(text: &str) -> Format {
        // JSON documents are YAML too, but the JSON parser gives better
        // positions for them; upstream accepts both.
        if text.trim_start().starts_with('{') { Format::Json } else { Format::Yaml }
    }

    fn name(self) -> &'static str {
        match self {
            Format::Yaml => "YAML",
            Format::Json => "JSON",
        }
    }
}

/// Parses and checks a kubelet config file's text. `path` is used in errors.
pub fn parse(path: &Path, text: &str) -> Result<ParsedFile, ConfigError> {
    let format = Format::detect(text);

    // Pass 1: generic tree, for syntax errors, TypeMeta and the
    // list of fields present.
    let tree: serde_json::Value = match format {
        Format::Json => serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            format: format.name(),
            line: Some(e.line()),
            column: Some(e.column()),
            reason: strip_json_position(&e.to_string()),
        })?,
        Format::Yaml => serde_yaml_ng::from_str(text).map_err(|e| {
            let loc = e.location();
            ConfigError::Syntax {
                path: path.to_path_buf(),
                format: format.name(),
                line: loc.as_ref().map(|l| l.line()),
                column: loc.as_ref().map(|l| l.column()),
                reason: strip_yaml_position(&e.to_string()),
            }
        })?,
    };
    let object = match &tree {
        serde_json::Value::Object(map) => map,
        serde_json::Value::Null => {
            return Err(ConfigError::TypeMeta {
                path: path.to_path_buf(),
                field: "kind",
                problem: format!(
                    "the file is empty; a kubelet config file must start with `apiVersion: {API_VERSION}` and `kind: {KIND}`"
                ),
            });
        }
        other => {
            return Err(ConfigError::Syntax {
                path: path.to_path_buf(),
                format: format.name(),
                line: None,
                column: None,
                reason: format!(
                    "expected a mapping of KubeletConfiguration fields at the top level, found {}",
                    json_kind(other)
                ),
            });
        }
    };
    check_type_meta(path, object)?;

    // Pass 2: strict typed decoding, with the path of the offending field.
    let config: KubeletConfiguration = match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let (line, column) = (e.inner().line(), e.inner().column());
                field_error(
                    path,
                    e.path().to_string(),
                    strip_json_position(&e.inner().to_string()),
                    Some(line),
                    Some(column),
                )
            })?
        }
        Format::Yaml => {
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let loc = e.inner().location();
                field_error(
                    path,
                    e.path().to_string(),
                    strip_yaml_position(&e.inner().to_string()),
                    loc.as_ref().map(|l| l.line()),
                    loc.as_ref().map(|l| l.column()),
                )
            })?
        }
    };

    Ok(ParsedFile { path: path.to_path_buf(), config, unimplemented: unimplemented_fields(object) })
}

fn check_type_meta(path: &Path, object: &serde_json::Map<String, serde_json::Value>) -> Result<(), ConfigError> {
    for (field, expected) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        let problem = match object.get(field) {
            None | Some(serde_json::Value::Null) => {
                format!("the required field `{field}` is missing; add `{field}: {expected}`")
            }
            Some(serde_json::Value::String(s)) if s == expected => continue,
            Some(serde_json::Value::String(s)) => format!(
                "`{field}: {s}` is not supported; Gantry reads `{field}: {expected}` (the Go kubelet's KubeletConfiguration)"
            ),
            Some(other) => format!("`{field}` must be the string `{expected}`, found {}", json_kind(other)),
        };
        return Err(ConfigError::TypeMeta { path: path.to_path_buf(), field, problem });
    }
    Ok(())
}

/// Turns a typed-decoding error into `UnknownField` or `InvalidField`.
fn field_error(
    path: &Path,
    field_path: String,
    reason: String,
    line: Option<usize>,
    column: Option<usize>,
) -> ConfigError {
    // serde's message for deny_unknown_fields is
    // "unknown field `x`, expected one of `a`, `b`, ..." (or "expected `a`"),
    // and the path points at the struct holding it.
    if let Some(rest) = reason.strip_prefix("unknown field `")
        && let Some(end) = rest.find('`')
    {
        let name = &rest[..end];
        // serde_path_to_error already includes the unknown key in the path.
        let full = if field_path.is_empty() || field_path == "." {
            name.to_string()
        } else if field_path == name || field_path.ends_with(&format!(".{name}")) {
            field_path
        } else {
            format!("{field_path}.{name}")
        };
        // "`, expected one of `a`, `b`" → the names are every other piece.
        let suggestion = rest[end..]
            .split('`')
            .skip(2)
            .step_by(2)
            .find(|candidate| candidate.eq_ignore_ascii_case(name))
            .map(str::to_string);
        return ConfigError::UnknownField { path: path.to_path_buf(), field: full, line, column, suggestion };
    }
    ConfigError::InvalidField {
        path: path.to_path_buf(),
        field: if field_path.is_empty() { ".".to_string() } else { field_path },
        line,
        column,
        reason,
    }
}

/// Removes serde_yaml_ng's " at line L column C" (the position is reported
/// separately) and the path prefix it may add (we report the path).
fn strip_yaml_position(msg: &str) -> String {
    let msg = match msg.rfind(" at line ") {
        Some(i) if msg[i + 9..].split(' ').next().is_some_and(|n| n.parse::<usize>().is_ok()) => &msg[..i],
        _ => msg,
    };
    strip_path_prefix(msg).to_string()
}

fn strip_json_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

/// serde_yaml_ng prefixes some messages with "path.to.field: ".
fn strip_path_prefix(msg: &str) -> &str {
    if let Some((head, tail)) = msg.split_once(": ")
        && !head.is_empty()
        && !head.contains(' ')
        && !head.contains('`')
    {
        return tail;
    }
    msg
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

/// Whether a value is what upstream treats as "not set": null, empty,
/// a zero number or duration, or a mapping of such values. `false` counts
/// as set, because several boolean fields default to true.
fn is_unset(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null => true,
        serde_json::Value::Bool(_) => false,
        serde_json::Value::Number(n) => n.as_f64() == Some(0.0),
        serde_json::Value::String(s) => s.is_empty() || GoDuration::parse(s).is_ok_and(GoDuration::is_zero),
        serde_json::Value::Array(a) => a.is_empty(),
        serde_json::Value::Object(o) => o.values().all(is_unset),
    }
}

fn unimplemented_fields(object: &serde_json::Map<String, serde_json::Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (key, value) in object {
        if key == "logging" {
            if let serde_json::Value::Object(logging) = value {
                for (sub, v) in logging {
                    if sub != "verbosity" && !is_unset(v) {
                        out.push(format!("logging.{sub}"));
                    }
                }
            }
            continue;
        }
        if IMPLEMENTED_FIELDS.contains(&key.as_str()) || is_unset(value) {
            continue;
        }
        out.push(key.clone());
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> PathBuf {
        PathBuf::from("/etc/kubernetes/kubelet.yaml")
    }

    fn ok(text: &str) -> ParsedFile {
        parse(&path(), text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn err(text: &str) -> ConfigError {
        parse(&path(), text).expect_err("should fail")
    }

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    /// What `kubeadm` writes to /var/lib/kubelet/config.yaml (v1.33).
    const KUBEADM: &str = r#"apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
cpuManagerReconcilePeriod: 0s
crashLoopBackOff: {}
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
"#;

    #[test]
    fn kubeadm_config_loads_and_reports_unimplemented_fields() {
        let f = ok(KUBEADM);
        assert_eq!(f.config.static_pod_path.as_deref(), Some("/etc/kubernetes/manifests"));
        assert_eq!(f.config.sync_frequency, Some(GoDuration::ZERO));
        assert_eq!(f.config.container_runtime_endpoint.as_deref(), Some(""));
        assert_eq!(f.config.logging.as_ref().and_then(|l| l.verbosity), Some(0));
        assert!(f.unimplemented.is_empty(), "{:?}", f.unimplemented);
        assert_eq!(f.config.rotate_certificates, Some(true));
    }

    #[test]
    fn every_upstream_field_is_accepted() {
        let text = format!(
            "{HEAD}{}",
            r#"enableServer: true
staticPodPath: /etc/kubernetes/manifests
podLogsDir: /var/log/pods
syncFrequency: 1m
fileCheckFrequency: 20s
httpCheckFrequency: 20s
staticPodURL: http://example.com/pods
staticPodURLHeader: {Authorization: [Bearer x]}
address: 0.0.0.0
port: 10250
readOnlyPort: 0
tlsCertFile: /a
tlsPrivateKeyFile: /b
tlsCipherSuites: [TLS_AES_128_GCM_SHA256]
tlsCurvePreferences: [23, 29]
tlsMinVersion: VersionTLS12
rotateCertificates: true
serverTLSBootstrap: true
authentication: {x509: {clientCAFile: /ca}, webhook: {enabled: true, cacheTTL: 2m}, anonymous: {enabled: false}}
authorization: {mode: Webhook, webhook: {cacheAuthorizedTTL: 5m, cacheUnauthorizedTTL: 30s}}
registryPullQPS: 5
registryBurst: 10
imagePullCredentialsVerificationPolicy: NeverVerifyPreloadedImages
preloadedImagesVerificationAllowlist: [registry.k8s.io/pause]
eventRecordQPS: 50
eventBurst: 100
enableDebuggingHandlers: true
enableContentionProfiling: false
healthzPort: 10248
healthzBindAddress: 127.0.0.1
oomScoreAdj: -999
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
streamingConnectionIdleTimeout: 4h
nodeStatusUpdateFrequency: 10s
nodeStatusReportFrequency: 5m
nodeLeaseDurationSeconds: 40
imageMinimumGCAge: 2m
imageMaximumGCAge: 0s
imageGCHighThresholdPercent: 85
imageGCLowThresholdPercent: 80
volumeStatsAggPeriod: 1m
kubeletCgroups: /kubelet
systemCgroups: /system
cgroupRoot: /
cgroupsPerQOS: true
cgroupDriver: systemd
cpuManagerPolicy: none
singleProcessOOMKill: false
cpuManagerPolicyOptions: {full-pcpus-only: "true"}
cpuManagerReconcilePeriod: 10s
draManagerReconcilePeriod: 60s
memoryManagerPolicy: None
topologyManagerPolicy: none
topologyManagerScope: container
topologyManagerPolicyOptions: {prefer-closest-numa-nodes: "true"}
qosReserved: {memory: 50%}
runtimeRequestTimeout: 2m
hairpinMode: promiscuous-bridge
maxPods: 110
podCIDR: 10.0.0.0/24
podPidsLimit: -1
resolvConf: /etc/resolv.conf
runOnce: false
cpuCFSQuota: true
cpuCFSQuotaPeriod: 100ms
nodeStatusMaxImages: 50
maxOpenFiles: 1000000
contentType: application/vnd.kubernetes.protobuf
kubeAPIQPS: 50
kubeAPIBurst: 100
serializeImagePulls: true
maxParallelImagePulls: 1
evictionHard: {memory.available: 100Mi, nodefs.available: 10%}
evictionSoft: {memory.available: 300Mi}
evictionSoftGracePeriod: {memory.available: 30s}
evictionPressureTransitionPeriod: 5m
evictionMaxPodGracePeriod: 0
evictionMinimumReclaim: {imagefs.available: 2Gi}
mergeDefaultEvictionSettings: false
podsPerCore: 0
enableControllerAttachDetach: true
protectKernelDefaults: false
makeIPTablesUtilChains: true
iptablesMasqueradeBit: 14
iptablesDropBit: 15
featureGates: {LegacyNodeRunOnceMode: false}
failSwapOn: true
memorySwap: {swapBehavior: NoSwap}
containerLogMaxSize: 10Mi
containerLogMaxFiles: 5
containerLogMaxWorkers: 1
containerLogMonitorInterval: 10s
configMapAndSecretChangeDetectionStrategy: Watch
systemReserved: {cpu: 200m, memory: 1}
kubeReserved: {cpu: 100m}
reservedSystemCPUs: "0-1"
showHiddenMetricsForVersion: "1.33"
systemReservedCgroup: /system.slice
kubeReservedCgroup: /kube.slice
enforceNodeAllocatable: [pods]
allowedUnsafeSysctls: ["net.*"]
volumePluginDir: /usr/libexec/kubernetes/kubelet-plugins/volume/exec/
providerID: aws:///i-1
kernelMemcgNotification: false
logging: {format: text, flushFrequency: 5s, verbosity: 2, vmodule: [{filePattern: x, verbosity: 3}], options: {json: {infoBufferSize: "0"}}}
enableSystemLogHandler: true
enableSystemLogQuery: false
shutdownGracePeriod: 30s
shutdownGracePeriodCriticalPods: 10s
shutdownGracePeriodByPodPriority: [{priority: 100, shutdownGracePeriodSeconds: 10}]
crashLoopBackOff: {maxContainerRestartPeriod: 100s}
reservedMemory: [{numaNode: 0, limits: {memory: 1Gi, hugepages-2Mi: 0}}]
enableProfilingHandler: true
enableDebugFlagsHandler: true
seccompDefault: false
memoryThrottlingFactor: 0.9
memoryReservationPolicy: None
registerWithTaints: [{key: a, value: b, effect: NoSchedule}]
registerNode: true
tracing: {endpoint: "localhost:4317", samplingRatePerMillion: 100}
localStorageCapacityIsolation: true
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
imageServiceEndpoint: unix:///run/containerd/containerd.sock
failCgroupV1: true
userNamespaces: {idsPerPod: 65536}
"#
        );
        let f = ok(&text);
        assert_eq!(f.config.max_pods, Some(110));
        assert_eq!(f.config.logging.as_ref().and_then(|l| l.verbosity), Some(2));
        assert!(!f.unimplemented.contains(&"address".to_string()));
        assert!(f.unimplemented.contains(&"tlsCurvePreferences".to_string()));
        assert!(f.unimplemented.contains(&"logging.format".to_string()));
        assert!(f.unimplemented.contains(&"enableContentionProfiling".to_string()), "false counts as set");
        assert!(!f.unimplemented.iter().any(|u| IMPLEMENTED_FIELDS.contains(&u.as_str())));
    }

    #[test]
    fn json_config_loads() {
        let f = ok(
            r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","maxPods":20,"staticPodURLHeader":{"B":["1"],"A":["2","3"]}}"#,
        );
        assert_eq!(f.config.max_pods, Some(20));
        assert_eq!(
            f.config.static_pod_url_header.unwrap().pairs(),
            vec![("B".into(), "1".into()), ("A".into(), "2".into()), ("A".into(), "3".into())]
        );
    }

    #[test]
    fn header_map_keeps_file_order() {
        let f = ok(&format!("{HEAD}staticPodURLHeader:\n  Z-Last: [a, b]\n  A-First: [c]\n"));
        assert_eq!(
            f.config.static_pod_url_header.unwrap().pairs(),
            vec![("Z-Last".into(), "a".into()), ("Z-Last".into(), "b".into()), ("A-First".into(), "c".into())]
        );
    }

    #[test]
    fn unknown_top_level_field_is_named() {
        let e = err(&format!("{HEAD}maxPods: 10\nnoSuchField: 1\n"));
        match &e {
            ConfigError::UnknownField { field, line, .. } => {
                assert_eq!(field, "noSuchField");
                assert_eq!(*line, Some(4));
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("/etc/kubernetes/kubelet.yaml"), "{msg}");
        assert!(msg.contains("noSuchField"), "{msg}");
        assert!(msg.contains("line 4"), "{msg}");
        assert!(!msg.contains("expected one of"), "the list of every field is noise: {msg}");
    }

    #[test]
    fn unknown_nested_field_has_full_path_and_case_hint() {
        let e = err(&format!("{HEAD}authentication:\n  x509:\n    clientCaFile: /ca\n"));
        match &e {
            ConfigError::UnknownField { field, suggestion, .. } => {
                assert_eq!(field, "authentication.x509.clientCaFile");
                assert_eq!(suggestion.as_deref(), Some("clientCAFile"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(e.to_string().contains("did you mean `clientCAFile`"), "{e}");
        // Case matters, as in the Go kubelet's strict decoding.
        let e = err(&format!("{HEAD}MaxPods: 3\n"));
        assert!(
            matches!(&e, ConfigError::UnknownField { field, suggestion: Some(s), .. } if field == "MaxPods" && s == "maxPods"),
            "{e:?}"
        );
    }

    #[test]
    fn wrong_type_names_path_and_position() {
        let e = err(&format!("{HEAD}authentication:\n  x509:\n    clientCAFile: [1, 2]\n"));
        match &e {
            ConfigError::InvalidField { field, line, reason, .. } => {
                assert_eq!(field, "authentication.x509.clientCAFile");
                assert_eq!(*line, Some(5));
                assert!(reason.contains("invalid type"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("authentication.x509.clientCAFile") && msg.contains("line 5"), "{msg}");

        let e = err(&format!("{HEAD}syncFrequency: 10\n"));
        assert!(e.to_string().contains("syncFrequency") && e.to_string().contains("missing unit"), "{e}");
        let e = err(&format!("{HEAD}maxPods: lots\n"));
        assert!(matches!(&e, ConfigError::InvalidField { field, .. } if field == "maxPods"), "{e:?}");
        let e = err(&format!("{HEAD}featureGates:\n  Foo: maybe\n"));
        assert!(e.to_string().contains("featureGates.Foo"), "{e}");
    }

    #[test]
    fn json_errors_have_positions() {
        let e =
            err("{\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"kind\":\"KubeletConfiguration\",\n\"bogus\":1}");
        assert!(matches!(&e, ConfigError::UnknownField { field, line: Some(2), .. } if field == "bogus"), "{e:?}");
        let e = err("{\"apiVersion\": ");
        assert!(matches!(&e, ConfigError::Syntax { format: "JSON", line: Some(1), .. }), "{e:?}");
    }

    #[test]
    fn duplicate_field_is_an_error() {
        let e = err(
            "{\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"kind\":\"KubeletConfiguration\",\"maxPods\":1,\"maxPods\":2}",
        );
        assert!(e.to_string().contains("duplicate"), "{e}");
    }

    #[test]
    fn malformed_yaml_names_file_and_line() {
        let e = err(&format!("{HEAD}maxPods: 10\nstaticPodPath: [unclosed\n"));
        match &e {
            ConfigError::Syntax { format, line, .. } => {
                assert_eq!(*format, "YAML");
                assert!(line.is_some_and(|l| l >= 4), "{line:?}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("/etc/kubernetes/kubelet.yaml") && msg.contains("line"), "{msg}");

        let e = err("apiVersion: a\n  bad indentation: here\n");
        assert!(matches!(e, ConfigError::Syntax { line: Some(_), .. }), "{e:?}");
        let e = err("\tapiVersion: x\n");
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
    }

    #[test]
    fn type_meta_is_required_and_checked() {
        let e = err("kind: KubeletConfiguration\nmaxPods: 3\n");
        assert!(matches!(&e, ConfigError::TypeMeta { field: "apiVersion", .. }), "{e:?}");
        assert!(e.to_string().contains("apiVersion: kubelet.config.k8s.io/v1beta1"), "{e}");

        let e = err("apiVersion: kubelet.config.k8s.io/v1beta1\n");
        assert!(matches!(&e, ConfigError::TypeMeta { field: "kind", .. }), "{e:?}");

        let e = err("apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n");
        assert!(matches!(&e, ConfigError::TypeMeta { field: "apiVersion", .. }), "{e:?}");
        assert!(e.to_string().contains("`apiVersion: kubelet.config.k8s.io/v1`"), "{e}");

        let e = err("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: CredentialProviderConfig\n");
        assert!(matches!(&e, ConfigError::TypeMeta { field: "kind", .. }), "{e:?}");

        let e = err("apiVersion: 3\nkind: KubeletConfiguration\n");
        assert!(e.to_string().contains("must be the string"), "{e}");

        let e = err("");
        assert!(matches!(&e, ConfigError::TypeMeta { .. }), "{e:?}");
        assert!(e.to_string().contains("empty"), "{e}");

        let e = err("- a\n- b\n");
        assert!(e.to_string().contains("found a list"), "{e}");
    }

    #[test]
    fn nulls_mean_unset() {
        let f = ok(&format!("{HEAD}maxPods: null\nstaticPodPath: ~\nauthentication: null\n"));
        assert_eq!(f.config.max_pods, None);
        assert_eq!(f.config.static_pod_path, None);
        assert!(f.unimplemented.is_empty());
    }

    #[test]
    fn message_cleanup() {
        assert_eq!(
            strip_yaml_position("invalid type: string \"x\", expected i32 at line 3 column 10"),
            "invalid type: string \"x\", expected i32"
        );
        assert_eq!(strip_yaml_position("maxPods: invalid type: string"), "invalid type: string");
        assert_eq!(strip_yaml_position("unknown field `a`, expected `b`"), "unknown field `a`, expected `b`");
        assert_eq!(strip_json_position("EOF while parsing a value at line 1 column 14"), "EOF while parsing a value");
    }
}
