//! Kubelet configuration: command-line flags, the `--config` file and
//! feature gates, resolved into one [`Settings`].
//!
//! Precedence is the Go kubelet's: built-in defaults < config file <
//! command-line flags, where only flags actually given on the command line
//! override the file. Feature gates merge gate by gate (a gate set with
//! `--feature-gates` overrides the same gate in `featureGates`; other gates
//! from the file stay). As upstream's defaulting does, a zero value in the
//! file (`syncFrequency: 0s`, `maxPods: 0`, `containerRuntimeEndpoint: ""`)
//! means "use the default".
//!
//! * [`load`] parses argv, reads the `--config` file and the hostname.
//! * [`resolve`] is the pure core, for tests and for a binary that parsed
//!   [`Flags`] itself.

mod cluster;
mod duration;
mod error;
mod eviction;
mod file;
mod flags;
mod gates;
mod images;
mod logs;
mod objects;
mod pods;
mod server;
mod shutdown;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

pub use cluster::{
    DEFAULT_EVICTION_HARD, KUBELET_LABEL_NAMESPACES, KUBELET_LABELS, SettingError, Taint, is_kubelet_label,
    is_kubernetes_label,
};

pub use duration::{DurationError, GoDuration, format_std};
pub use error::{ConfigError, Input, Problem};
pub use eviction::{EvictionSettings, parse_grace as parse_eviction_grace};
pub use file::{API_VERSION, IMPLEMENTED_FIELDS, KIND};
pub use flags::{
    CompatFlags, DOCKERSHIM_FLAGS, FlagValueError, Flags, UPSTREAM_BOOL_FLAGS, UPSTREAM_VALUE_FLAGS, parse_header_list,
};
pub use gates::{FeatureGates, Gate, GateError, UPSTREAM_ONLY_GATES, parse_gate_list, parse_go_bool};
pub use images::ImageSettings;
pub use logs::LogSettings;
pub use objects::ChangeDetection;
pub use pods::{CGROUP_MOUNT, CgroupDriver, Hierarchy, PodSettings, cgroup_hierarchy};
pub use server::{AuthorizationMode, SELF_SIGNED_CERT, SELF_SIGNED_KEY, ServerSettings, TlsVersion, UnknownName};
pub use shutdown::{PriorityGrace, ShutdownSettings};

pub const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";
pub const DEFAULT_POD_LOGS_DIR: &str = "/var/log/pods";
pub const DEFAULT_CONTAINER_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
pub const DEFAULT_FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
pub const DEFAULT_HTTP_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
pub const DEFAULT_SYNC_FREQUENCY: Duration = Duration::from_secs(60);
pub const DEFAULT_RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
pub const DEFAULT_MAX_PODS: u32 = 110;
pub const DEFAULT_OOM_SCORE_ADJ: i32 = -999;
pub const DEFAULT_KUBE_API_QPS: i32 = 50;
pub const DEFAULT_KUBE_API_BURST: i32 = 100;
pub const DEFAULT_EVENT_RECORD_QPS: i32 = 50;
pub const DEFAULT_EVENT_BURST: i32 = 100;
pub const DEFAULT_NODE_STATUS_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
pub const DEFAULT_NODE_STATUS_REPORT_FREQUENCY: Duration = Duration::from_secs(300);
pub const DEFAULT_NODE_LEASE_DURATION_SECONDS: u32 = 40;
pub const DEFAULT_PORT: u16 = 10250;

/// The deprecation warning to log when RunOnce mode is used (with the
/// LegacyNodeRunOnceMode gate enabled).
pub const RUNONCE_DEPRECATION: &str = "RunOnce mode is deprecated (KEP-4580) and will be removed in a future release; \
     run Gantry in standalone mode (without --kubeconfig, with --pod-manifest-path) instead";

/// The effective configuration.
///
/// `Debug` and `Display` mask the values of `static_pod_url_header` (and
/// any password in `static_pod_url`), so logging a `Settings` does not leak
/// credentials.
#[derive(Clone, PartialEq)]
pub struct Settings {
    /// `--hostname-override`, else the machine hostname; trimmed, lowercased.
    pub node_name: String,
    /// Same value as `node_name`, kept separately for later use.
    pub hostname: String,
    /// `--root-dir`, default /var/lib/kubelet.
    pub root_dir: PathBuf,
    /// `podLogsDir`, default /var/log/pods.
    pub pod_logs_dir: PathBuf,
    /// `--pod-manifest-path` / `staticPodPath`.
    pub static_pod_path: Option<PathBuf>,
    /// `--manifest-url` / `staticPodURL`.
    pub static_pod_url: Option<String>,
    /// `--manifest-url-header` / `staticPodURLHeader`: (name, value) pairs;
    /// values of a repeated name stay in the order given, names in order of
    /// first appearance. Given on the command line, replaces the file's.
    pub static_pod_url_header: Vec<(String, String)>,
    /// `fileCheckFrequency` / `--file-check-frequency`, default 20s.
    pub file_check_frequency: Duration,
    /// `httpCheckFrequency` / `--http-check-frequency`, default 20s.
    pub http_check_frequency: Duration,
    /// `syncFrequency` / `--sync-frequency`, default 1m.
    pub sync_frequency: Duration,
    /// `configMapAndSecretChangeDetectionStrategy`, default Watch.
    pub change_detection: ChangeDetection,
    /// `--container-runtime-endpoint` / `containerRuntimeEndpoint`.
    pub container_runtime_endpoint: String,
    /// `--image-service-endpoint` / `imageServiceEndpoint`; None = same as
    /// the runtime endpoint.
    pub image_service_endpoint: Option<String>,
    /// `runtimeRequestTimeout` / `--runtime-request-timeout`, default 2m.
    pub runtime_request_timeout: Duration,
    /// `--kubeconfig`; None = standalone mode.
    pub kubeconfig: Option<PathBuf>,
    /// `--bootstrap-kubeconfig`: TLS bootstrap credentials for `kubeconfig`.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `--rotate-certificates` / `rotateCertificates`: renew the client certificate through the
    /// API before it expires. Default false, true with a config file (as kubeadm writes it).
    pub rotate_certificates: bool,
    /// `--runonce` / `runOnce` (only ever true with LegacyNodeRunOnceMode).
    pub run_once: bool,
    pub feature_gates: FeatureGates,
    /// `-v` / `logging.verbosity`, default 0.
    pub verbosity: u8,
    /// `maxPods` / `--max-pods`, default 110.
    pub max_pods: u32,
    /// `oomScoreAdj` / `--oom-score-adj`, default -999: the agent's own `oom_score_adj`, in
    /// [-1000, 1000].
    pub oom_score_adj: i32,
    /// What `--config` pointed at.
    pub config_file: Option<PathBuf>,

    // ---- cluster mode -------------------------------------------------
    /// `--node-ip`: at most one address per family; empty = detect. An
    /// unspecified address (`0.0.0.0`, `::`) means "detect, preferring this
    /// family".
    pub node_ips: Vec<IpAddr>,
    /// `--node-labels`, validated as upstream does.
    pub node_labels: BTreeMap<String, String>,
    /// `--register-node` / `registerNode`, default true.
    pub register_node: bool,
    /// `--register-with-taints` / `registerWithTaints`.
    pub register_with_taints: Vec<Taint>,
    /// `--kube-api-qps` / `kubeAPIQPS`, default 50 (0 = client default 5).
    pub kube_api_qps: i32,
    /// `--kube-api-burst` / `kubeAPIBurst`, default 100 (0 = client default 10).
    pub kube_api_burst: i32,
    /// `--event-qps` / `eventRecordQPS`, default 50: events have a client and token bucket of
    /// their own, so a burst of them does not hold up pod status writes.
    pub event_record_qps: i32,
    /// `--event-burst` / `eventBurst`, default 100.
    pub event_burst: i32,
    /// `--node-status-update-frequency` / `nodeStatusUpdateFrequency`, default 10s.
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency`, default 5m, or `nodeStatusUpdateFrequency`
    /// when only that was set in the config file (upstream defaulting).
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds`, default 40.
    pub node_lease_duration_seconds: u32,
    /// `--kube-reserved` / `kubeReserved` (validated quantities).
    pub kube_reserved: BTreeMap<String, String>,
    /// `--system-reserved` / `systemReserved` (validated quantities).
    pub system_reserved: BTreeMap<String, String>,
    /// `--enforce-node-allocatable` / `enforceNodeAllocatable`: whether the `kubepods` cgroup
    /// gets the node's allocatable as its limits (`pods`, the default; `none` turns it off).
    pub enforce_pods_allocatable: bool,
    /// `kube-reserved[-compressible]` in `enforceNodeAllocatable`: `kubeReservedCgroup` gets
    /// `kubeReserved` as its limits.
    pub enforce_kube_reserved: ReservedLimits,
    /// `system-reserved[-compressible]`: `systemReservedCgroup` gets `systemReserved`.
    pub enforce_system_reserved: ReservedLimits,
    /// `--kube-reserved-cgroup` / `kubeReservedCgroup`: an existing cgroup.
    pub kube_reserved_cgroup: String,
    /// `--system-reserved-cgroup` / `systemReservedCgroup`: an existing cgroup.
    pub system_reserved_cgroup: String,
    /// `--eviction-hard` / `evictionHard`: signal → threshold (`100Mi`,
    /// `10%`); upstream's Linux defaults unless given.
    pub eviction_hard: BTreeMap<String, String>,
    /// `--port` / `port`, default 10250 (reported as the kubelet endpoint).
    pub port: u16,
    /// `--pods-per-core` / `podsPerCore`, default 0 (no per-core limit).
    pub pods_per_core: u32,
    /// Image garbage collection.
    pub images: ImageSettings,
    /// Pod cgroups, DNS and security.
    pub pods: PodSettings,
    /// Container log rotation.
    pub logs: LogSettings,
    /// The node API server (address, TLS, authentication, authorization).
    pub server: ServerSettings,
    /// Graceful node shutdown.
    pub shutdown: ShutdownSettings,
    /// Node-pressure eviction (beyond `eviction_hard`).
    pub eviction: EvictionSettings,
}

/// The default `evictionHard` map.
pub fn default_eviction_hard() -> BTreeMap<String, String> {
    DEFAULT_EVICTION_HARD.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

impl Default for Settings {
    /// Upstream defaults, with an empty node name.
    fn default() -> Self {
        Settings {
            node_name: String::new(),
            hostname: String::new(),
            root_dir: PathBuf::from(DEFAULT_ROOT_DIR),
            pod_logs_dir: PathBuf::from(DEFAULT_POD_LOGS_DIR),
            static_pod_path: None,
            static_pod_url: None,
            static_pod_url_header: Vec::new(),
            file_check_frequency: DEFAULT_FILE_CHECK_FREQUENCY,
            http_check_frequency: DEFAULT_HTTP_CHECK_FREQUENCY,
            sync_frequency: DEFAULT_SYNC_FREQUENCY,
            change_detection: ChangeDetection::default(),
            container_runtime_endpoint: DEFAULT_CONTAINER_RUNTIME_ENDPOINT.to_string(),
            image_service_endpoint: None,
            runtime_request_timeout: DEFAULT_RUNTIME_REQUEST_TIMEOUT,
            kubeconfig: None,
            bootstrap_kubeconfig: None,
            rotate_certificates: false,
            run_once: false,
            feature_gates: FeatureGates::default(),
            verbosity: 0,
            max_pods: DEFAULT_MAX_PODS,
            oom_score_adj: DEFAULT_OOM_SCORE_ADJ,
            config_file: None,
            node_ips: Vec::new(),
            node_labels: BTreeMap::new(),
            register_node: true,
            register_with_taints: Vec::new(),
            kube_api_qps: DEFAULT_KUBE_API_QPS,
            kube_api_burst: DEFAULT_KUBE_API_BURST,
            event_record_qps: DEFAULT_EVENT_RECORD_QPS,
            event_burst: DEFAULT_EVENT_BURST,
            node_status_update_frequency: DEFAULT_NODE_STATUS_UPDATE_FREQUENCY,
            node_status_report_frequency: DEFAULT_NODE_STATUS_REPORT_FREQUENCY,
            node_lease_duration_seconds: DEFAULT_NODE_LEASE_DURATION_SECONDS,
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            enforce_pods_allocatable: true,
            enforce_kube_reserved: ReservedLimits::Off,
            enforce_system_reserved: ReservedLimits::Off,
            kube_reserved_cgroup: String::new(),
            system_reserved_cgroup: String::new(),
            eviction_hard: default_eviction_hard(),
            port: DEFAULT_PORT,
            pods_per_core: 0,
            images: ImageSettings::default(),
            pods: PodSettings::default(),
            logs: LogSettings::default(),
            server: ServerSettings::default(),
            shutdown: ShutdownSettings::default(),
            eviction: EvictionSettings::default(),
        }
    }
}

impl Settings {
    /// The effective configuration on one line, for the startup log, with
    /// manifest-URL header values shown as `<masked>` (as upstream does) and
    /// a password in the manifest URL masked.
    pub fn redacted_summary(&self) -> String {
        let opt_path =
            |p: &Option<PathBuf>| p.as_ref().map_or_else(|| "<none>".to_string(), |p| p.display().to_string());
        let headers = if self.static_pod_url_header.is_empty() {
            "{}".to_string()
        } else {
            let mut names: Vec<&str> = Vec::new();
            for (name, _) in &self.static_pod_url_header {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
            let parts: Vec<String> = names
                .iter()
                .map(|name| {
                    let n = self.static_pod_url_header.iter().filter(|(k, _)| k == name).count();
                    format!("{name}:[{}]", vec!["<masked>"; n].join(","))
                })
                .collect();
            format!("{{{}}}", parts.join(","))
        };
        format!(
            "nodeName={} hostname={} rootDir={} podLogsDir={} kubeconfig={} bootstrapKubeconfig={} rotateCertificates={} config={} staticPodPath={} staticPodURL={} \
             staticPodURLHeader={} fileCheckFrequency={} httpCheckFrequency={} syncFrequency={} \
             containerRuntimeEndpoint={} imageServiceEndpoint={} runtimeRequestTimeout={} runOnce={} maxPods={} \
             verbosity={} featureGates={} nodeIP={} nodeLabels={} registerNode={} registerWithTaints={} \
             kubeAPIQPS={} kubeAPIBurst={} nodeStatusUpdateFrequency={} nodeStatusReportFrequency={} \
             nodeLeaseDuration={}s kubeReserved={} systemReserved={} evictionHard={} port={} podsPerCore={} {}",
            self.node_name,
            self.hostname,
            self.root_dir.display(),
            self.pod_logs_dir.display(),
            opt_path(&self.kubeconfig),
            opt_path(&self.bootstrap_kubeconfig),
            self.rotate_certificates,
            opt_path(&self.config_file),
            opt_path(&self.static_pod_path),
            self.static_pod_url.as_deref().map_or_else(|| "<none>".to_string(), mask_url_password),
            headers,
            duration::format_std(self.file_check_frequency),
            duration::format_std(self.http_check_frequency),
            duration::format_std(self.sync_frequency),
            self.container_runtime_endpoint,
            self.image_service_endpoint.as_deref().unwrap_or("<same as runtime>"),
            duration::format_std(self.runtime_request_timeout),
            self.run_once,
            self.max_pods,
            self.verbosity,
            self.feature_gates,
            if self.node_ips.is_empty() {
                "<detect>".to_string()
            } else {
                self.node_ips.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(",")
            },
            map_summary(&self.node_labels, "="),
            self.register_node,
            self.register_with_taints.iter().map(Taint::to_string).collect::<Vec<_>>().join(","),
            self.kube_api_qps,
            self.kube_api_burst,
            duration::format_std(self.node_status_update_frequency),
            duration::format_std(self.node_status_report_frequency),
            self.node_lease_duration_seconds,
            map_summary(&self.kube_reserved, "="),
            map_summary(&self.system_reserved, "="),
            map_summary(&self.eviction_hard, "<"),
            self.port,
            self.pods_per_core,
            self.server.summary(),
        )
    }

    /// The image service endpoint in effect (the runtime's when unset).
    pub fn effective_image_service_endpoint(&self) -> &str {
        self.image_service_endpoint.as_deref().unwrap_or(&self.container_runtime_endpoint)
    }

    /// True without `--kubeconfig`.
    pub fn standalone(&self) -> bool {
        self.kubeconfig.is_none()
    }
}

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted_summary())
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masked: Vec<(&str, &str)> =
            self.static_pod_url_header.iter().map(|(k, _)| (k.as_str(), "<masked>")).collect();
        f.debug_struct("Settings")
            .field("node_name", &self.node_name)
            .field("hostname", &self.hostname)
            .field("root_dir", &self.root_dir)
            .field("pod_logs_dir", &self.pod_logs_dir)
            .field("static_pod_path", &self.static_pod_path)
            .field("static_pod_url", &self.static_pod_url.as_deref().map(mask_url_password))
            .field("static_pod_url_header", &masked)
            .field("file_check_frequency", &self.file_check_frequency)
            .field("http_check_frequency", &self.http_check_frequency)
            .field("sync_frequency", &self.sync_frequency)
            .field("change_detection", &self.change_detection)
            .field("container_runtime_endpoint", &self.container_runtime_endpoint)
            .field("image_service_endpoint", &self.image_service_endpoint)
            .field("runtime_request_timeout", &self.runtime_request_timeout)
            .field("kubeconfig", &self.kubeconfig)
            .field("bootstrap_kubeconfig", &self.bootstrap_kubeconfig)
            .field("rotate_certificates", &self.rotate_certificates)
            .field("run_once", &self.run_once)
            .field("feature_gates", &self.feature_gates)
            .field("verbosity", &self.verbosity)
            .field("max_pods", &self.max_pods)
            .field("oom_score_adj", &self.oom_score_adj)
            .field("config_file", &self.config_file)
            .field("node_ips", &self.node_ips)
            .field("node_labels", &self.node_labels)
            .field("register_node", &self.register_node)
            .field("register_with_taints", &self.register_with_taints)
            .field("kube_api_qps", &self.kube_api_qps)
            .field("kube_api_burst", &self.kube_api_burst)
            .field("event_record_qps", &self.event_record_qps)
            .field("event_burst", &self.event_burst)
            .field("node_status_update_frequency", &self.node_status_update_frequency)
            .field("node_status_report_frequency", &self.node_status_report_frequency)
            .field("node_lease_duration_seconds", &self.node_lease_duration_seconds)
            .field("kube_reserved", &self.kube_reserved)
            .field("system_reserved", &self.system_reserved)
            .field("eviction_hard", &self.eviction_hard)
            .field("port", &self.port)
            .field("pods_per_core", &self.pods_per_core)
            .field("images", &self.images)
            .field("logs", &self.logs)
            .field("pods", &self.pods)
            .field("server", &self.server)
            .field("eviction", &self.eviction)
            .finish()
    }
}

/// `{a=1,b=2}` for the startup summary.
fn map_summary(map: &BTreeMap<String, String>, separator: &str) -> String {
    let parts: Vec<String> = map.iter().map(|(k, v)| format!("{k}{separator}{v}")).collect();
    format!("{{{}}}", parts.join(","))
}

/// `http://user:secret@host/x` → `http://user:<masked>@host/x`.
fn mask_url_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let authority_start = scheme_end + 3;
    let rest = &url[authority_start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_string();
    };
    format!("{}{}:<masked>{}", &url[..authority_start], &userinfo[..colon], &url[authority_start + at..])
}

/// Parses `args` (argv without the program name), reads the `--config` file
/// if one is given and the machine's hostname, and resolves the settings.
pub fn load<S: AsRef<str>>(args: &[S]) -> Result<Settings, ConfigError> {
    let flags = Flags::parse_args(args)?;
    // Report dockershim flags before touching the file system.
    if let Some(flag) = flags.compat.dockershim.first() {
        return Err(flags::dockershim_error(flag));
    }
    let content = match &flags.config {
        Some(path) if !path.as_os_str().is_empty() => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::ReadConfigFile { path: path.clone(), source })?;
            Some((path.clone(), text))
        }
        _ => None,
    };
    let hostname = machine_hostname();
    resolve(flags, content.as_ref().map(|(p, t)| (p.clone(), t.as_str())), &hostname)
}

/// The machine's hostname from /proc/sys/kernel/hostname, else
/// /etc/hostname; empty when neither is readable.
pub fn machine_hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_default()
}

/// Resolves flags, the config file's `(path, content)` and the machine
/// hostname into [`Settings`], applying defaults < file < given flags, and
/// validating the result. Logs (with `tracing::warn!`) the settings that are
/// accepted but not implemented yet.
pub fn resolve(flags: Flags, file: Option<(PathBuf, &str)>, machine_hostname: &str) -> Result<Settings, ConfigError> {
    if let Some(flag) = flags.compat.dockershim.first() {
        return Err(flags::dockershim_error(flag));
    }
    if !flags.compat.unimplemented.is_empty() {
        tracing::warn!(
            flags = %flags.compat.unimplemented.join(", "),
            "these kubelet flags are accepted but not implemented yet by Gantry; they have no effect"
        );
    }

    let mut s = Settings {
        config_file: file.as_ref().map(|(p, _)| p.clone()).or_else(|| flags.config.clone()),
        // Without a config file upstream keeps its legacy (open) server defaults.
        server: if file.is_some() { ServerSettings::default() } else { ServerSettings::legacy() },
        ..Settings::default()
    };
    // Who asked for RunOnce, for the error message.
    let mut run_once_source: Option<String> = None;

    if let Some((path, text)) = file {
        let parsed = file::parse(&path, text)?;
        if !parsed.unimplemented.is_empty() {
            tracing::warn!(
                config = %path.display(),
                fields = %parsed.unimplemented.join(", "),
                "these KubeletConfiguration fields are accepted but not implemented yet by Gantry; they have no effect"
            );
        }
        apply_file(&mut s, &parsed, &mut run_once_source)?;
    }
    apply_flags(&mut s, &flags, &mut run_once_source)?;

    let without_effect = s.feature_gates.without_effect();
    if !without_effect.is_empty() {
        tracing::warn!(
            gates = %without_effect.join(", "),
            "these feature gates are accepted for compatibility with the Go kubelet but have no effect in Gantry"
        );
    }

    s.pods.memory_qos = s.feature_gates.enabled(Gate::MemoryQoS);
    if s.run_once && !s.feature_gates.enabled(Gate::LegacyNodeRunOnceMode) {
        return Err(ConfigError::RunOnceDeprecated {
            set_by: run_once_source.unwrap_or_else(|| "runOnce".to_string()),
        });
    }

    let name = match flags.hostname_override.as_deref().map(normalize_hostname) {
        Some(n) if !n.is_empty() => n,
        _ => normalize_hostname(machine_hostname),
    };
    if name.is_empty() {
        return Err(ConfigError::NoHostname);
    }
    s.node_name = name.clone();
    s.hostname = name;
    Ok(s)
}

fn normalize_hostname(h: &str) -> String {
    h.trim().to_lowercase()
}

fn apply_file(
    s: &mut Settings,
    parsed: &file::ParsedFile,
    run_once_source: &mut Option<String>,
) -> Result<(), ConfigError> {
    let c = &parsed.config;
    let input = Input::ConfigFile(parsed.path.clone());
    let invalid = |field: &str, problem: Problem| ConfigError::InvalidValue {
        input: input.clone(),
        field: field.to_string(),
        problem: Box::new(problem),
    };

    if let Some(p) = c.static_pod_path.as_deref().filter(|p| !p.is_empty()) {
        s.static_pod_path = Some(PathBuf::from(p));
    }
    if let Some(u) = c.static_pod_url.as_deref().filter(|u| !u.is_empty()) {
        s.static_pod_url = Some(u.to_string());
    }
    if let Some(h) = &c.static_pod_url_header {
        let pairs = h.pairs();
        for (name, value) in &pairs {
            check_header(name, value).map_err(|e| invalid(&format!("staticPodURLHeader.{name}"), e.into()))?;
        }
        s.static_pod_url_header = pairs;
    }

    let durations: [(&str, &Option<GoDuration>, &mut Duration); 4] = [
        ("syncFrequency", &c.sync_frequency, &mut s.sync_frequency),
        ("fileCheckFrequency", &c.file_check_frequency, &mut s.file_check_frequency),
        ("httpCheckFrequency", &c.http_check_frequency, &mut s.http_check_frequency),
        ("runtimeRequestTimeout", &c.runtime_request_timeout, &mut s.runtime_request_timeout),
    ];
    for (field, value, target) in durations {
        match value {
            // Zero means "default", as upstream's defaulting does.
            Some(d) if d.is_zero() => {}
            Some(d) => {
                *target =
                    d.to_std().ok_or_else(|| invalid(field, format!("{d} must be a positive duration").into()))?;
            }
            None => {}
        }
    }

    if let Some(v) = c.config_map_and_secret_change_detection_strategy.as_deref().filter(|v| !v.is_empty()) {
        s.change_detection = ChangeDetection::parse(v).ok_or_else(|| {
            invalid(
                "configMapAndSecretChangeDetectionStrategy",
                format!("unsupported value {v:?}: must be one of Get, Cache, Watch").into(),
            )
        })?;
    }
    if let Some(e) = c.container_runtime_endpoint.as_deref().filter(|e| !e.is_empty()) {
        check_endpoint(e).map_err(|e| invalid("containerRuntimeEndpoint", e.into()))?;
        s.container_runtime_endpoint = e.to_string();
    }
    if let Some(e) = c.image_service_endpoint.as_deref().filter(|e| !e.is_empty()) {
        check_endpoint(e).map_err(|e| invalid("imageServiceEndpoint", e.into()))?;
        s.image_service_endpoint = Some(e.to_string());
    }
    if let Some(dir) = c.pod_logs_dir.as_deref().filter(|d| !d.is_empty()) {
        check_pod_logs_dir(dir).map_err(|e| invalid("podLogsDir", e.into()))?;
        s.pod_logs_dir = PathBuf::from(dir);
    }
    if let Some(gates) = &c.feature_gates {
        for (name, enabled) in gates {
            s.feature_gates.set(name, *enabled).map_err(|_| ConfigError::UnknownFeatureGate {
                input: input.clone(),
                field: format!("featureGates.{name}"),
                gate: name.clone(),
            })?;
        }
    }
    if let Some(run_once) = c.run_once {
        s.run_once = run_once;
        if run_once {
            *run_once_source = Some(format!("runOnce: true in config file {}", parsed.path.display()));
        }
    }
    match c.max_pods {
        Some(n) if n < 0 => {
            return Err(invalid("maxPods", format!("{n} must not be a negative number").into()));
        }
        Some(0) | None => {}
        Some(n) => s.max_pods = n as u32,
    }
    if let Some(n) = c.oom_score_adj {
        s.oom_score_adj = check_oom_score_adj(n).map_err(|e| invalid("oomScoreAdj", e))?;
    }
    if let Some(v) = c.logging.as_ref().and_then(|l| l.verbosity) {
        s.verbosity = u8::try_from(v).map_err(|_| {
            invalid("logging.verbosity", format!("{v} is too large; verbosity levels go up to 255").into())
        })?;
    }
    s.images.apply_file(c, &invalid)?;
    s.pods.apply_file(c, &invalid)?;
    s.logs.apply_file(c, &invalid)?;
    s.server.apply_file(c, &invalid)?;
    s.shutdown.apply_file(c, &s.feature_gates, &invalid)?;
    s.eviction.apply_file(c, &invalid)?;
    apply_file_cluster(s, c, &invalid)
}

/// The cluster-mode fields of the config file, with upstream's defaulting
/// (zero means default) and validation messages.
fn apply_file_cluster(
    s: &mut Settings,
    c: &file::KubeletConfiguration,
    invalid: &dyn Fn(&str, Problem) -> ConfigError,
) -> Result<(), ConfigError> {
    if let Some(register) = c.register_node {
        s.register_node = register;
    }
    // A config file turns rotation on unless it says otherwise (kubeadm writes it true).
    s.rotate_certificates = c.rotate_certificates.unwrap_or(true);
    if let Some(taints) = &c.register_with_taints {
        let mut out = Vec::with_capacity(taints.len());
        for (i, t) in taints.iter().enumerate() {
            if t.time_added.is_some() {
                return Err(invalid(
                    &format!("registerWithTaints[{i}].timeAdded"),
                    Problem::Rule("timeAdded must not be set on a taint to register with".to_string()),
                ));
            }
            let taint = cluster::check_taint(
                t.key.as_deref().unwrap_or_default(),
                t.value.as_deref().unwrap_or_default(),
                t.effect.as_deref().unwrap_or_default(),
            )
            .map_err(|e| invalid(&format!("registerWithTaints[{i}]"), e.into()))?;
            out.push(taint);
        }
        s.register_with_taints = out;
    }
    if let Some(qps) = c.kube_api_qps {
        if qps < 0 {
            return Err(invalid(
                "kubeAPIQPS",
                format!("invalid configuration: kubeAPIQPS (--kube-api-qps) {qps} must not be a negative number")
                    .into(),
            ));
        }
        s.kube_api_qps = qps;
    }
    match c.kube_api_burst {
        Some(b) if b < 0 => {
            return Err(invalid(
                "kubeAPIBurst",
                format!("invalid configuration: kubeAPIBurst (--kube-api-burst) {b} must not be a negative number")
                    .into(),
            ));
        }
        Some(0) | None => {}
        Some(b) => s.kube_api_burst = b,
    }
    if let Some(qps) = c.event_record_qps {
        s.event_record_qps = non_negative(invalid, "eventRecordQPS", "eventRecordQPS (--event-qps)", qps)?;
    }
    if let Some(burst) = c.event_burst {
        s.event_burst = non_negative(invalid, "eventBurst", "eventBurst (--event-burst)", burst)?;
    }
    let positive = |field: &str, d: &GoDuration| -> Result<Duration, ConfigError> {
        d.to_std()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| invalid(field, format!("{d} must be a positive duration").into()))
    };
    let update = c.node_status_update_frequency.filter(|d| !d.is_zero());
    if let Some(d) = &update {
        s.node_status_update_frequency = positive("nodeStatusUpdateFrequency", d)?;
    }
    match c.node_status_report_frequency.filter(|d| !d.is_zero()) {
        Some(d) => s.node_status_report_frequency = positive("nodeStatusReportFrequency", &d)?,
        // Upstream: for backward compatibility the report frequency follows an
        // explicitly set update frequency.
        None if update.is_some() => s.node_status_report_frequency = s.node_status_update_frequency,
        None => {}
    }
    match c.node_lease_duration_seconds {
        Some(n) if n < 0 => {
            return Err(invalid(
                "nodeLeaseDurationSeconds",
                Problem::Rule("invalid configuration: nodeLeaseDurationSeconds must be greater than 0".to_string()),
            ));
        }
        Some(0) | None => {}
        Some(n) => s.node_lease_duration_seconds = n as u32,
    }
    for (field, value, target) in [
        ("kubeReserved", &c.kube_reserved, &mut s.kube_reserved),
        ("systemReserved", &c.system_reserved, &mut s.system_reserved),
    ] {
        if let Some(map) = value {
            cluster::check_reserved(map).map_err(|e| invalid(field, e.into()))?;
            *target = map.clone();
        }
    }
    if let Some(list) = &c.enforce_node_allocatable {
        set_enforcement(s, enforce_pods("enforceNodeAllocatable", list, &invalid)?);
    }
    if let Some(c) = &c.kube_reserved_cgroup {
        s.kube_reserved_cgroup = c.clone();
    }
    if let Some(c) = &c.system_reserved_cgroup {
        s.system_reserved_cgroup = c.clone();
    }
    if let Some(map) = &c.eviction_hard {
        cluster::check_eviction(map).map_err(|e| invalid("evictionHard", e.into()))?;
        s.eviction_hard = map.clone();
    }
    match c.port {
        Some(0) | None => {}
        Some(p) => s.port = check_port(p).map_err(|e| invalid("port", e.into()))?,
    }
    match c.pods_per_core {
        Some(n) if n < 0 => {
            return Err(invalid(
                "podsPerCore",
                format!("invalid configuration: podsPerCore (--pods-per-core) {n} must not be a negative number")
                    .into(),
            ));
        }
        Some(n) => s.pods_per_core = n as u32,
        None => {}
    }
    Ok(())
}

/// Why a single setting's value is invalid (ports, headers, endpoints, paths); the caller
/// names the flag or field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("invalid configuration: port (--port) {0} must be between 1 and 65535, inclusive")]
    Port(i32),
    #[error("a header name must not be empty")]
    EmptyHeaderName,
    #[error("header name {name:?} contains {bad:?}, which is not allowed in an HTTP header name")]
    HeaderNameChar { name: String, bad: char },
    #[error("the value of header {0:?} contains a line break or NUL")]
    HeaderValueBreak(String),
    #[error(
        "{0:?} is not a valid unix socket endpoint; use an absolute path, e.g. {DEFAULT_CONTAINER_RUNTIME_ENDPOINT}"
    )]
    RelativeUnixEndpoint(String),
    #[error("{0:?} is not a CRI endpoint; use unix:///path/to/runtime.sock, e.g. {DEFAULT_CONTAINER_RUNTIME_ENDPOINT}")]
    NotAnEndpoint(String),
    #[error("{0:?} must contain ASCII characters only")]
    NotAscii(String),
    #[error("{0:?} must be an absolute path")]
    NotAbsolute(String),
    #[error("{dir:?} must be a normalized path (did you mean {clean:?}?)")]
    NotNormalized { dir: String, clean: String },
}

/// A rate or burst that must not be negative, refused with upstream's message.
fn non_negative(
    invalid: &dyn Fn(&str, Problem) -> ConfigError,
    field: &str,
    name: &str,
    value: i32,
) -> Result<i32, ConfigError> {
    if value < 0 {
        return Err(invalid(
            field,
            format!("invalid configuration: {name} {value} must not be a negative number").into(),
        ));
    }
    Ok(value)
}

fn check_port(p: i32) -> Result<u16, ValueError> {
    u16::try_from(p).ok().filter(|p| *p > 0).ok_or(ValueError::Port(p))
}

/// The range the kernel takes for `oom_score_adj`, which upstream's validation checks.
fn check_oom_score_adj(n: i32) -> Result<i32, Problem> {
    if (-1000..=1000).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} must be between -1000 and 1000, inclusive").into())
    }
}

fn apply_flags(s: &mut Settings, f: &Flags, run_once_source: &mut Option<String>) -> Result<(), ConfigError> {
    let invalid = |flag: &str, problem: Problem| ConfigError::InvalidValue {
        input: Input::CommandLine,
        field: flag.to_string(),
        problem: Box::new(problem),
    };

    if let Some(p) = &f.pod_manifest_path {
        // Given but empty clears the file's setting, as in Go.
        s.static_pod_path = (!p.is_empty()).then(|| PathBuf::from(p));
    }
    if let Some(u) = &f.manifest_url {
        s.static_pod_url = (!u.is_empty()).then(|| u.clone());
    }
    if !f.manifest_url_header.is_empty() {
        // Given on the command line, the headers replace the file's.
        let mut pairs = Vec::new();
        for value in &f.manifest_url_header {
            pairs.extend(parse_header_list(value).map_err(|e| invalid("--manifest-url-header", e.into()))?);
        }
        for (name, value) in &pairs {
            check_header(name, value).map_err(|e| invalid("--manifest-url-header", e.into()))?;
        }
        s.static_pod_url_header = group_by_name(pairs);
    }

    let durations: [(&str, Option<GoDuration>, &mut Duration); 4] = [
        ("--sync-frequency", f.sync_frequency, &mut s.sync_frequency),
        ("--file-check-frequency", f.file_check_frequency, &mut s.file_check_frequency),
        ("--http-check-frequency", f.http_check_frequency, &mut s.http_check_frequency),
        ("--runtime-request-timeout", f.runtime_request_timeout, &mut s.runtime_request_timeout),
    ];
    for (flag, value, target) in durations {
        if let Some(d) = value {
            match d.to_std() {
                Some(std) if !std.is_zero() => *target = std,
                _ => return Err(invalid(flag, format!("{d} must be greater than zero").into())),
            }
        }
    }

    if let Some(e) = &f.container_runtime_endpoint {
        if e.is_empty() {
            return Err(invalid(
                "--container-runtime-endpoint",
                format!("the endpoint must not be empty (the default is {DEFAULT_CONTAINER_RUNTIME_ENDPOINT})").into(),
            ));
        }
        check_endpoint(e).map_err(|e| invalid("--container-runtime-endpoint", e.into()))?;
        s.container_runtime_endpoint = e.clone();
    }
    if let Some(e) = &f.image_service_endpoint {
        if e.is_empty() {
            s.image_service_endpoint = None;
        } else {
            check_endpoint(e).map_err(|e| invalid("--image-service-endpoint", e.into()))?;
            s.image_service_endpoint = Some(e.clone());
        }
    }
    if let Some(dir) = &f.root_dir {
        if dir.as_os_str().is_empty() {
            return Err(invalid(
                "--root-dir",
                format!("the directory must not be empty (the default is {DEFAULT_ROOT_DIR})").into(),
            ));
        }
        s.root_dir = dir.clone();
    }
    if let Some(k) = &f.kubeconfig {
        s.kubeconfig = (!k.as_os_str().is_empty()).then(|| k.clone());
    }
    if let Some(k) = &f.bootstrap_kubeconfig {
        s.bootstrap_kubeconfig = (!k.as_os_str().is_empty()).then(|| k.clone());
    }
    if s.bootstrap_kubeconfig.is_some() && s.kubeconfig.is_none() {
        return Err(invalid(
            "--bootstrap-kubeconfig",
            Problem::Rule(
                "needs --kubeconfig: the path where the kubeconfig with the bootstrapped client certificate is written"
                    .to_string(),
            ),
        ));
    }

    for value in &f.feature_gates {
        let pairs = parse_gate_list(value).map_err(|problem| ConfigError::InvalidFeatureGate {
            input: Input::CommandLine,
            field: "--feature-gates".to_string(),
            problem,
        })?;
        for (name, enabled) in pairs {
            s.feature_gates.set(&name, enabled).map_err(|_| ConfigError::UnknownFeatureGate {
                input: Input::CommandLine,
                field: "--feature-gates".to_string(),
                gate: name.clone(),
            })?;
        }
    }

    if let Some(run_once) = f.runonce {
        s.run_once = run_once;
        *run_once_source = run_once.then(|| "--runonce".to_string());
    }
    if let Some(n) = f.max_pods {
        s.max_pods =
            u32::try_from(n).map_err(|_| invalid("--max-pods", format!("{n} must not be a negative number").into()))?;
    }
    if let Some(n) = f.oom_score_adj {
        s.oom_score_adj = check_oom_score_adj(n).map_err(|e| invalid("--oom-score-adj", e))?;
    }
    if let Some(v) = f.verbosity {
        s.verbosity = v;
    }
    s.images.apply_flags(f, &invalid)?;
    s.pods.apply_flags(f, &invalid)?;
    s.logs.apply_flags(f, &invalid)?;
    s.server.apply_flags(f, &invalid)?;
    apply_flags_cluster(s, f, &invalid)?;
    check_reserved_cgroups(s, &invalid)
}

/// Upstream's validation: enforcing a reservation needs the cgroup it goes to.
fn check_reserved_cgroups(s: &Settings, invalid: &dyn Fn(&str, Problem) -> ConfigError) -> Result<(), ConfigError> {
    for (enforced, cgroup, field, flag, key) in [
        (
            s.enforce_system_reserved,
            &s.system_reserved_cgroup,
            "systemReservedCgroup",
            "--system-reserved-cgroup",
            "system-reserved",
        ),
        (
            s.enforce_kube_reserved,
            &s.kube_reserved_cgroup,
            "kubeReservedCgroup",
            "--kube-reserved-cgroup",
            "kube-reserved",
        ),
    ] {
        if enforced != ReservedLimits::Off && cgroup.is_empty() {
            return Err(invalid(
                field,
                Problem::Rule(format!(
                    "invalid configuration: {field} ({flag}) must be specified when {key:?} contained in enforceNodeAllocatable (--enforce-node-allocatable)"
                )),
            ));
        }
    }
    Ok(())
}

/// Which limits of a reservation `enforceNodeAllocatable` enforces on its cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReservedLimits {
    #[default]
    Off,
    /// `kube-reserved`/`system-reserved`: CPU, memory and PIDs.
    All,
    /// `…-compressible`: CPU only.
    CpuOnly,
}

/// What `enforceNodeAllocatable` lists: pods, kube-reserved, system-reserved.
struct Enforcement(bool, ReservedLimits, ReservedLimits);

fn set_enforcement(s: &mut Settings, Enforcement(pods, kube, system): Enforcement) {
    s.enforce_pods_allocatable = pods;
    s.enforce_kube_reserved = kube;
    s.enforce_system_reserved = system;
}

fn apply_flags_cluster(
    s: &mut Settings,
    f: &Flags,
    invalid: &dyn Fn(&str, Problem) -> ConfigError,
) -> Result<(), ConfigError> {
    if let Some(value) = &f.node_ip {
        let (ips, ignored) = cluster::parse_node_ips(value)
            .map_err(|e| invalid("--node-ip", format!("bad --node-ip {value:?}: {e}").into()))?;
        if !ignored.is_empty() {
            tracing::warn!(ips = ?ignored, "could not parse some node IP(s) given with --node-ip, ignoring them");
        }
        s.node_ips = ips;
    }
    if !f.node_labels.is_empty() {
        let mut labels = BTreeMap::new();
        for value in &f.node_labels {
            labels.extend(cluster::parse_key_value_list(value, '=').map_err(|e| invalid("--node-labels", e.into()))?);
        }
        cluster::validate_node_labels(&labels).map_err(|e| invalid("--node-labels", e.into()))?;
        s.node_labels = labels;
    }
    if let Some(rotate) = f.rotate_certificates {
        s.rotate_certificates = rotate;
    }
    if let Some(register) = f.register_node {
        s.register_node = register;
    }
    // Each --register-with-taints replaces the list, as upstream.
    if let Some(value) = f.register_with_taints.last() {
        s.register_with_taints =
            cluster::parse_taints(value).map_err(|e| invalid("--register-with-taints", e.into()))?;
    }
    if let Some(qps) = f.kube_api_qps {
        if qps < 0 {
            return Err(invalid(
                "--kube-api-qps",
                format!("invalid configuration: kubeAPIQPS (--kube-api-qps) {qps} must not be a negative number")
                    .into(),
            ));
        }
        s.kube_api_qps = qps;
    }
    if let Some(burst) = f.kube_api_burst {
        if burst < 0 {
            return Err(invalid(
                "--kube-api-burst",
                format!("invalid configuration: kubeAPIBurst (--kube-api-burst) {burst} must not be a negative number")
                    .into(),
            ));
        }
        s.kube_api_burst = burst;
    }
    if let Some(qps) = f.event_qps {
        s.event_record_qps = non_negative(invalid, "--event-qps", "eventRecordQPS (--event-qps)", qps)?;
    }
    if let Some(burst) = f.event_burst {
        s.event_burst = non_negative(invalid, "--event-burst", "eventBurst (--event-burst)", burst)?;
    }
    if let Some(d) = f.node_status_update_frequency {
        s.node_status_update_frequency = d.to_std().filter(|d| !d.is_zero()).ok_or_else(|| {
            invalid("--node-status-update-frequency", format!("{d} must be greater than zero").into())
        })?;
    }
    if let Some(list) = &f.enforce_node_allocatable {
        let values: Vec<String> = list.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect();
        set_enforcement(s, enforce_pods("--enforce-node-allocatable", &values, &invalid)?);
    }
    if let Some(c) = &f.kube_reserved_cgroup {
        s.kube_reserved_cgroup = c.clone();
    }
    if let Some(c) = &f.system_reserved_cgroup {
        s.system_reserved_cgroup = c.clone();
    }
    for (flag, values, target) in [
        ("--kube-reserved", &f.kube_reserved, &mut s.kube_reserved),
        ("--system-reserved", &f.system_reserved, &mut s.system_reserved),
    ] {
        if !values.is_empty() {
            let mut map = BTreeMap::new();
            for value in values {
                map.extend(cluster::parse_key_value_list(value, '=').map_err(|e| invalid(flag, e.into()))?);
            }
            cluster::check_reserved(&map).map_err(|e| invalid(flag, e.into()))?;
            *target = map;
        }
    }
    if !f.eviction_hard.is_empty() {
        let mut map = BTreeMap::new();
        for value in &f.eviction_hard {
            map.extend(cluster::parse_key_value_list(value, '<').map_err(|e| invalid("--eviction-hard", e.into()))?);
        }
        cluster::check_eviction(&map).map_err(|e| invalid("--eviction-hard", e.into()))?;
        s.eviction_hard = map;
    }
    s.eviction.apply_flags(f, &invalid)?;
    if let Some(p) = f.port {
        s.port = check_port(p).map_err(|e| invalid("--port", e.into()))?;
    }
    if let Some(n) = f.pods_per_core {
        s.pods_per_core = u32::try_from(n).map_err(|_| {
            invalid(
                "--pods-per-core",
                format!("invalid configuration: podsPerCore (--pods-per-core) {n} must not be a negative number")
                    .into(),
            )
        })?;
    }
    Ok(())
}

/// Orders pairs by name of first appearance, keeping each name's values in
/// the order given (upstream keeps a map of name → list).
fn group_by_name(pairs: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut names: Vec<String> = Vec::new();
    for (k, _) in &pairs {
        if !names.contains(k) {
            names.push(k.clone());
        }
    }
    names.iter().flat_map(|n| pairs.iter().filter(move |(k, _)| k == n).cloned()).collect()
}

/// An HTTP header name must be a token; a value must not break the request.
fn check_header(name: &str, value: &str) -> Result<(), ValueError> {
    const TOKEN_SPECIALS: &str = "!#$%&'*+-.^_`|~";
    if name.is_empty() {
        return Err(ValueError::EmptyHeaderName);
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || TOKEN_SPECIALS.contains(*c))) {
        return Err(ValueError::HeaderNameChar { name: name.to_string(), bad });
    }
    if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
        return Err(ValueError::HeaderValueBreak(name.to_string()));
    }
    Ok(())
}

/// A CRI endpoint: `unix://` with an absolute path, a plain absolute socket
/// path (upstream treats it as unix://), or `tcp://`/`npipe://` (Windows).
fn check_endpoint(e: &str) -> Result<(), ValueError> {
    if let Some(path) = e.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(ValueError::RelativeUnixEndpoint(e.to_string()));
        }
        return Ok(());
    }
    if e.starts_with('/') || e.starts_with("tcp://") || e.starts_with("npipe://") {
        return Ok(());
    }
    Err(ValueError::NotAnEndpoint(e.to_string()))
}

/// Upstream: absolute, normalised (as Go's filepath.Clean), ASCII only.
fn check_pod_logs_dir(dir: &str) -> Result<(), ValueError> {
    if !dir.is_ascii() {
        return Err(ValueError::NotAscii(dir.to_string()));
    }
    if !dir.starts_with('/') {
        return Err(ValueError::NotAbsolute(dir.to_string()));
    }
    let clean = clean_path(dir);
    if clean != dir {
        return Err(ValueError::NotNormalized { dir: dir.to_string(), clean });
    }
    Ok(())
}

/// Go's `filepath.Clean` for absolute paths.
fn clean_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in Path::new(p).components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                parts.pop();
            }
            Component::Normal(s) => parts.push(s.to_str().unwrap_or_default()),
        }
    }
    format!("/{}", parts.join("/"))
}

/// `enforceNodeAllocatable`: whether `pods` is enforced. Upstream's other levels
/// (`system-reserved`, `kube-reserved` and their `-compressible` forms) need the reserved
/// cgroups Gantry does not manage yet, so they are refused rather than ignored; an empty list
/// is the same as `none`.
fn enforce_pods(
    field: &str,
    values: &[String],
    invalid: &dyn Fn(&str, Problem) -> ConfigError,
) -> Result<Enforcement, ConfigError> {
    if values.iter().any(|v| v == "none") && values.len() > 1 {
        return Err(invalid(field, "may not contain additional enforcements when 'none' is specified".into()));
    }
    let mut out = Enforcement(false, ReservedLimits::Off, ReservedLimits::Off);
    for v in values {
        match v.as_str() {
            "none" => {}
            "pods" => out.0 = true,
            "kube-reserved" => out.1 = ReservedLimits::All,
            "system-reserved" => out.2 = ReservedLimits::All,
            // Upstream: the compressible variant cannot be combined with the full one.
            "kube-reserved-compressible" | "system-reserved-compressible" => {
                let full = v.trim_end_matches("-compressible");
                if values.iter().any(|x| x == full) {
                    return Err(invalid(field, format!("{full:?} and {v:?} cannot be specified together").into()));
                }
                if full == "kube-reserved" {
                    out.1 = ReservedLimits::CpuOnly;
                } else {
                    out.2 = ReservedLimits::CpuOnly;
                }
            }
            other => {
                return Err(invalid(
                    field,
                    format!(
                        "invalid option {other:?}: use \"pods\", \"system-reserved\", \"kube-reserved\" or \"none\""
                    )
                    .into(),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
