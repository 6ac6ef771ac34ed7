//! Command-line flags of `gantry kubelet`, with the Go kubelet's names and
//! syntax.
//!
//! Every setting flag is an `Option` (or a `Vec`) so that "given on the
//! command line" can be told apart from "left at its default": only given
//! flags override the config file.
//!
//! Go (pflag) syntax is followed: `--flag value` and `--flag=value`;
//! boolean flags take `--flag`, `--flag=true` or `--flag=false` (never a
//! separate value); `-v 4`, `-v=4`, `-v4`, `--v=4` for verbosity.
//! [`Flags::parse_args`] additionally maps `_` to `-` in flag names, as the
//! Go kubelet's flag normalisation does.
//!
//! [`CompatFlags`] (flattened into [`Flags`], hidden from `--help`) declares
//! the dockershim-era flags, which are refused with a message saying what to
//! use instead, and the other Go-kubelet flags, which are accepted so that an
//! existing command line works, and reported as not implemented yet.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex, PoisonError};

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, ArgAction, ArgMatches, Args, Command, CommandFactory, FromArgMatches, Parser};

use super::duration::{DurationError, GoDuration};
use super::error::ConfigError;
use super::gates::parse_go_bool;

/// Flags of `gantry kubelet` (Go kubelet names).
#[derive(Clone, Debug, Default, PartialEq, Eq, Parser)]
#[command(
    name = "kubelet",
    about = "Gantry node agent: runs the pods assigned to this node (a drop-in for the Go kubelet)",
    disable_version_flag = true
)]
pub struct Flags {
    /// The kubelet config file (KubeletConfiguration, kubelet.config.k8s.io/v1beta1, YAML or JSON). Command-line flags override settings from this file.
    #[arg(long, value_name = "FILE", value_parser = any_path, allow_hyphen_values = true)]
    pub config: Option<PathBuf>,

    /// kubeconfig for the API server. Providing it enables API server mode; omitting it enables standalone mode.
    #[arg(long, value_name = "FILE", value_parser = any_path, allow_hyphen_values = true)]
    pub kubeconfig: Option<PathBuf>,

    /// kubeconfig with a bootstrap token, used to get a client certificate for --kubeconfig (in --cert-dir) when that file is missing or holds no valid certificate.
    #[arg(long, value_name = "FILE", value_parser = any_path, allow_hyphen_values = true)]
    pub bootstrap_kubeconfig: Option<PathBuf>,

    /// Directory of static pod manifests, or a single manifest file. Files starting with dots are ignored. (staticPodPath)
    #[arg(long, value_name = "PATH", allow_hyphen_values = true)]
    pub pod_manifest_path: Option<String>,

    /// URL for additional static pod manifests. (staticPodURL)
    #[arg(long, value_name = "URL", allow_hyphen_values = true)]
    pub manifest_url: Option<String>,

    /// Comma-separated `name:value` HTTP headers for --manifest-url; repeatable, and repeated names are sent in the order given, e.g. --manifest-url-header 'a:hello,b:again' --manifest-url-header 'b:beautiful'. (staticPodURLHeader)
    #[arg(long, value_name = "NAME:VALUE,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub manifest_url_header: Vec<String>,

    /// Endpoint of the CRI runtime service, e.g. unix:///run/containerd/containerd.sock. (containerRuntimeEndpoint)
    #[arg(long, value_name = "ENDPOINT", allow_hyphen_values = true)]
    pub container_runtime_endpoint: Option<String>,

    /// Endpoint of the CRI image service; defaults to --container-runtime-endpoint. (imageServiceEndpoint)
    #[arg(long, value_name = "ENDPOINT", allow_hyphen_values = true)]
    pub image_service_endpoint: Option<String>,

    /// Use this name for the node instead of the machine's hostname.
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    pub hostname_override: Option<String>,

    /// Directory for kubelet files (volume mounts, plugin sockets, ...). [default: /var/lib/kubelet]
    #[arg(long, value_name = "DIR", value_parser = any_path, allow_hyphen_values = true)]
    pub root_dir: Option<PathBuf>,

    /// Feature gates as comma-separated Name=bool pairs, e.g. LegacyNodeRunOnceMode=true; repeatable. Overrides featureGates from the config file gate by gate.
    #[arg(long, value_name = "NAME=BOOL,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub feature_gates: Vec<String>,

    /// Run the static pods once and exit (deprecated, KEP-4580; requires the LegacyNodeRunOnceMode feature gate). (runOnce)
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub runonce: Option<bool>,

    /// Timeout of runtime requests other than pull, logs, exec and attach, e.g. 2m. (runtimeRequestTimeout)
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub runtime_request_timeout: Option<GoDuration>,

    /// Maximum period between syncs of running containers and config, e.g. 1m. (syncFrequency)
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub sync_frequency: Option<GoDuration>,

    /// How often to check static pod files for changes, e.g. 20s. (fileCheckFrequency)
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub file_check_frequency: Option<GoDuration>,

    /// How often to poll --manifest-url, e.g. 20s. (httpCheckFrequency)
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub http_check_frequency: Option<GoDuration>,

    /// Maximum number of pods on this node. (maxPods) [default: 110]
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = go_int32)]
    pub max_pods: Option<i32>,

    /// The oom_score_adj of the agent's own process, in [-1000, 1000]. (oomScoreAdj) [default: -999]
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = go_int32)]
    pub oom_score_adj: Option<i32>,

    /// Log verbosity level (klog style). (logging.verbosity) [default: 0]
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    pub verbosity: Option<u8>,

    /// IP address(es) of the node, comma separated (one IPv4 and/or one IPv6). If unset, the node name as an IP, a DNS lookup of the node name, or the default route's interface is used.
    #[arg(long, value_name = "IP[,IP]", allow_hyphen_values = true)]
    pub node_ip: Option<String>,

    /// Labels to add when registering the node, comma separated `key=value` pairs; repeatable. Labels in the kubernetes.io and k8s.io namespaces must be ones the kubelet may set.
    #[arg(long, value_name = "KEY=VALUE,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub node_labels: Vec<String>,

    /// Register the node with the API server. (registerNode) [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub register_node: Option<bool>,

    /// Request a new client certificate from the API server (a CertificateSigningRequest) before the current one expires, and use it without a restart. (rotateCertificates) [default: false; true with --config]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub rotate_certificates: Option<bool>,

    /// Taints to register the node with, comma separated `key=value:Effect`. (registerWithTaints)
    #[arg(long, value_name = "KEY=VALUE:EFFECT,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub register_with_taints: Vec<String>,

    /// Queries per second to the API server. (kubeAPIQPS) [default: 50]
    #[arg(long, value_name = "QPS", allow_negative_numbers = true, value_parser = go_int32)]
    pub kube_api_qps: Option<i32>,

    /// Burst of queries to the API server. (kubeAPIBurst) [default: 100]
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = go_int32)]
    pub kube_api_burst: Option<i32>,

    /// Event creations per second, on a client of their own. (eventRecordQPS) [default: 50]
    #[arg(long, value_name = "QPS", allow_negative_numbers = true, value_parser = go_int32)]
    pub event_qps: Option<i32>,

    /// Burst of event creations. (eventBurst) [default: 100]
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = go_int32)]
    pub event_burst: Option<i32>,

    /// How often the node status is computed and, when it changed, posted to the API server, e.g. 10s. (nodeStatusUpdateFrequency)
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub node_status_update_frequency: Option<GoDuration>,

    /// Which cgroups get the node allocatable limits: pods or none. (enforceNodeAllocatable) [default: pods]
    #[arg(long, value_name = "LEVEL,...")]
    pub enforce_node_allocatable: Option<String>,

    /// Resources reserved for Kubernetes system daemons, e.g. cpu=200m,memory=500Mi,ephemeral-storage=1Gi,pid=1000; repeatable. (kubeReserved)
    #[arg(long, value_name = "RESOURCE=QUANTITY,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub kube_reserved: Vec<String>,

    /// Resources reserved for non-Kubernetes system daemons, e.g. cpu=200m,memory=500Mi; repeatable. (systemReserved)
    #[arg(long, value_name = "RESOURCE=QUANTITY,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub system_reserved: Vec<String>,

    /// Hard eviction thresholds, e.g. memory.available<1Gi,nodefs.available<10%; repeatable. Replaces the defaults. (evictionHard)
    #[arg(long, value_name = "SIGNAL<QUANTITY,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub eviction_hard: Vec<String>,

    /// Soft eviction thresholds, e.g. memory.available<1.5Gi; repeatable; each needs a grace period. (evictionSoft)
    #[arg(long, value_name = "SIGNAL<QUANTITY,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub eviction_soft: Vec<String>,

    /// How long each soft threshold must be met before it evicts, e.g. memory.available=1m30s; repeatable. (evictionSoftGracePeriod)
    #[arg(long, value_name = "SIGNAL=DURATION,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub eviction_soft_grace_period: Vec<String>,

    /// The longest grace (seconds) a pod evicted for a soft threshold gets. (evictionMaxPodGracePeriod) [default: 0]
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, value_parser = go_int32)]
    pub eviction_max_pod_grace_period: Option<i32>,

    /// How far past a threshold an eviction must bring a signal, e.g. imagefs.available=2Gi; repeatable. (evictionMinimumReclaim)
    #[arg(long, value_name = "SIGNAL=QUANTITY,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub eviction_minimum_reclaim: Vec<String>,

    /// How long a pressure condition stays after the pressure went, e.g. 5m. (evictionPressureTransitionPeriod) [default: 5m0s]
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub eviction_pressure_transition_period: Option<GoDuration>,

    /// Port of the node API (HTTPS: exec, attach, port-forward, logs, stats), also reported in the node status. (port) [default: 10250]
    #[arg(long, value_name = "PORT", allow_negative_numbers = true, value_parser = go_int32)]
    pub port: Option<i32>,

    /// Maximum number of pods per core; 0 disables the limit. (podsPerCore) [default: 0]
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = go_int32)]
    pub pods_per_core: Option<i32>,

    /// Percent of image filesystem usage at which image garbage collection always runs; 100 disables it. (imageGCHighThresholdPercent) [default: 85]
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true, value_parser = go_int32)]
    pub image_gc_high_threshold: Option<i32>,

    /// Percent of image filesystem usage that image garbage collection frees down to. (imageGCLowThresholdPercent) [default: 80]
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true, value_parser = go_int32)]
    pub image_gc_low_threshold: Option<i32>,

    /// Minimum age of an unused image before it may be garbage collected, e.g. 2m. (imageMinimumGCAge)
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub minimum_image_ttl_duration: Option<GoDuration>,

    /// The sandbox image; image garbage collection never removes it. Defaults to the one the runtime reports.
    #[arg(long, value_name = "IMAGE")]
    pub pod_infra_container_image: Option<String>,

    /// Maximum size of a container log file before it is rotated, e.g. 10Mi. (containerLogMaxSize) [default: 10Mi]
    #[arg(long, value_name = "QUANTITY", allow_hyphen_values = true)]
    pub container_log_max_size: Option<String>,

    /// Maximum number of log files kept per container, the current one included; must be > 1. (containerLogMaxFiles) [default: 5]
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = go_int32)]
    pub container_log_max_files: Option<i32>,

    /// Pull images one at a time. (serializeImagePulls) [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub serialize_image_pulls: Option<bool>,

    /// Create QoS and pod cgroups (kubepods/burstable/pod<uid>, …). (cgroupsPerQOS) [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub cgroups_per_qos: Option<bool>,

    /// How pod cgroups are managed: cgroupfs or systemd. (cgroupDriver) [default: cgroupfs]
    #[arg(long, value_name = "DRIVER")]
    pub cgroup_driver: Option<String>,

    /// The cgroup the QoS and pod cgroups go under. (cgroupRoot) [default: /]
    #[arg(long, value_name = "CGROUP")]
    pub cgroup_root: Option<String>,

    /// The existing cgroup kube-reserved is enforced on. (kubeReservedCgroup)
    #[arg(long, value_name = "CGROUP")]
    pub kube_reserved_cgroup: Option<String>,

    /// The existing cgroup system-reserved is enforced on. (systemReservedCgroup)
    #[arg(long, value_name = "CGROUP")]
    pub system_reserved_cgroup: Option<String>,

    /// The cgroup (cgroupfs path) the agent moves itself into. (kubeletCgroups)
    #[arg(long, value_name = "CGROUP")]
    pub kubelet_cgroups: Option<String>,

    /// The container runtime's cgroup, for the summary's runtime system container.
    #[arg(long, value_name = "CGROUP")]
    pub runtime_cgroups: Option<String>,

    /// The cgroup the node's non-kernel processes in the root cgroup are moved into; needs --cgroup-root. (systemCgroups)
    #[arg(long, value_name = "CGROUP")]
    pub system_cgroups: Option<String>,

    /// The most processes a pod may have (pids.max of its cgroup); -1: no limit. (podPidsLimit) [default: -1]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub pod_max_pids: Option<i64>,

    /// DNS server IP(s) for pods with dnsPolicy ClusterFirst, comma separated; repeatable. (clusterDNS)
    #[arg(long, value_name = "IP,...", action = ArgAction::Append)]
    pub cluster_dns: Vec<String>,

    /// The cluster's DNS domain, added to pods' search list. (clusterDomain)
    #[arg(long, value_name = "DOMAIN")]
    pub cluster_domain: Option<String>,

    /// The resolv.conf pods with dnsPolicy Default get; empty disables host DNS. (resolvConf) [default: /etc/resolv.conf]
    #[arg(long, value_name = "PATH")]
    pub resolv_conf: Option<String>,

    /// Unsafe sysctls (names or prefix* patterns) pods may set, comma separated. (allowedUnsafeSysctls)
    #[arg(long, value_name = "SYSCTL,...", action = ArgAction::Append)]
    pub allowed_unsafe_sysctls: Vec<String>,

    /// Use the runtime's default seccomp profile for containers that set none. (seccompDefault) [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub seccomp_default: Option<bool>,

    /// Allow privileged containers (removed upstream, which always allows them). [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub allow_privileged: Option<bool>,

    #[command(flatten)]
    pub server: ServerFlags,

    #[command(flatten)]
    pub compat: CompatFlags,
}

/// Flags of the node API server (see `config/server.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
pub struct ServerFlags {
    /// Serve the node API (logs, exec, attach, port-forward, stats). (enableServer) [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub enable_server: Option<bool>,

    /// Serve /run, /exec, /attach, /portForward and /containerLogs; when off they answer 405. (enableDebuggingHandlers) [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub enable_debugging_handlers: Option<bool>,

    /// IP address the node API listens on (0.0.0.0 or :: for all interfaces). (address) [default: 0.0.0.0]
    #[arg(long, value_name = "IP")]
    pub address: Option<String>,

    /// Plain-HTTP port serving the read-only endpoints without authentication; 0 disables. (readOnlyPort) [default: 10255 without --config, else 0]
    #[arg(long, value_name = "PORT", allow_negative_numbers = true, value_parser = go_int32)]
    pub read_only_port: Option<i32>,

    /// Port of the plain-HTTP /healthz endpoint; 0 disables. (healthzPort) [default: 10248]
    #[arg(long, value_name = "PORT", allow_negative_numbers = true, value_parser = go_int32)]
    pub healthz_port: Option<i32>,

    /// IP address of the /healthz endpoint. (healthzBindAddress) [default: 127.0.0.1]
    #[arg(long, value_name = "IP")]
    pub healthz_bind_address: Option<String>,

    /// Serving certificate (PEM, may include intermediates). Without it a self-signed one is generated in --cert-dir. (tlsCertFile)
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<String>,

    /// Private key of --tls-cert-file (PEM). (tlsPrivateKeyFile)
    #[arg(long, value_name = "FILE")]
    pub tls_private_key_file: Option<String>,

    /// Request the node API's serving certificate from the API server (a CertificateSigningRequest for signer kubernetes.io/kubelet-serving, to be approved), and rotate it before it expires. (serverTLSBootstrap) [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub rotate_server_certificates: Option<bool>,

    /// Minimum TLS version: VersionTLS12 or VersionTLS13 (VersionTLS10/11 are served as 1.2). (tlsMinVersion) [default: VersionTLS12]
    #[arg(long, value_name = "VERSION")]
    pub tls_min_version: Option<String>,

    /// TLS 1.2 cipher suites the server may use, by Go's names, comma separated. (tlsCipherSuites) [default: all it supports]
    #[arg(long, value_name = "NAME,...", action = ArgAction::Append)]
    pub tls_cipher_suites: Vec<String>,

    /// Directory of the self-signed serving certificate (kubelet.crt, kubelet.key). [default: <root-dir>/pki]
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<String>,

    /// CA bundle that client certificates must chain to; CN is the user, O the groups. (authentication.x509.clientCAFile)
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<String>,

    /// Authenticate bearer tokens with the API server's TokenReview. (authentication.webhook.enabled) [default: false without --config, else true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub authentication_token_webhook: Option<bool>,

    /// How often the pods' volume usage is measured; negative (or 0) measures none. (volumeStatsAggPeriod) [default: 1m]
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub volume_stats_agg_period: Option<GoDuration>,

    /// How long TokenReview answers are cached. (authentication.webhook.cacheTTL) [default: 2m]
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub authentication_token_webhook_cache_ttl: Option<GoDuration>,

    /// Allow requests without credentials, as system:anonymous. (authentication.anonymous.enabled) [default: true without --config, else false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub anonymous_auth: Option<bool>,

    /// AlwaysAllow or Webhook (SubjectAccessReview). (authorization.mode) [default: AlwaysAllow without --config, else Webhook]
    #[arg(long, value_name = "MODE")]
    pub authorization_mode: Option<String>,

    /// How long allowed SubjectAccessReview answers are cached. (authorization.webhook.cacheAuthorizedTTL) [default: 5m]
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub authorization_webhook_cache_authorized_ttl: Option<GoDuration>,

    /// How long denied SubjectAccessReview answers are cached. (authorization.webhook.cacheUnauthorizedTTL) [default: 30s]
    #[arg(long, value_name = "DURATION", value_parser = go_duration, allow_hyphen_values = true)]
    pub authorization_webhook_cache_unauthorized_ttl: Option<GoDuration>,
}

/// Unlike clap's `PathBuf` parser, accepts an empty value (`--kubeconfig=`),
/// which the Go kubelet treats as "not set".
fn any_path(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

/// Why a flag's value has the wrong form; the flag and value are added by clap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagValueError {
    #[error("expected true or false (also accepted: 1, 0, t, f, TRUE, FALSE)")]
    NotBool,
    #[error("expected a whole number (32-bit)")]
    NotInt32,
    #[error("malformed header {0:?}: expected name:value")]
    MalformedHeader(String),
}

/// The kubelet's clap command, built once: building it (a few hundred flags, checked and
/// sorted by clap) costs many times the parse itself, which a fuzzer or a test calls many
/// times. Behind a lock because clap's matching takes the command mutably.
static COMMAND: LazyLock<Mutex<Command>> = LazyLock::new(|| {
    let mut command = <Flags as CommandFactory>::command();
    command.build();
    Mutex::new(command)
});

fn go_bool(s: &str) -> Result<bool, FlagValueError> {
    parse_go_bool(s).ok_or(FlagValueError::NotBool)
}

fn go_int32(s: &str) -> Result<i32, FlagValueError> {
    s.parse::<i32>().map_err(|_| FlagValueError::NotInt32)
}

fn go_duration(s: &str) -> Result<GoDuration, DurationError> {
    GoDuration::parse(s)
}

impl Flags {
    /// Parses a command line (without the program name), never exiting the
    /// process: `--help` comes back as [`ConfigError::HelpRequested`].
    ///
    /// Dockershim-era flags are reported before any other problem, so that
    /// an old command line gets the migration advice first. Flag names are
    /// normalised (`--root_dir` = `--root-dir`), as the Go kubelet does.
    pub fn parse_args<S: AsRef<str>>(args: &[S]) -> Result<Flags, ConfigError> {
        let args: Vec<String> = args.iter().map(|a| normalize_flag_name(a.as_ref())).collect();
        if let Some(flag) = first_dockershim_flag(&args) {
            return Err(dockershim_error(flag));
        }
        let argv = std::iter::once(OsString::from("kubelet")).chain(args.iter().map(OsString::from));
        // A panic inside clap leaves the command as it was (matching does not change it).
        let mut command = COMMAND.lock().unwrap_or_else(PoisonError::into_inner);
        let matches = command.try_get_matches_from_mut(argv).map_err(from_clap_error)?;
        Flags::from_arg_matches(&matches).map_err(|e| from_clap_error(e.format(&mut command)))
    }

    /// The clap command, e.g. for rendering help.
    pub fn command_for_help() -> Command {
        <Flags as CommandFactory>::command()
    }
}

/// `--root_dir=x` → `--root-dir=x` (only the name part of `--` flags).
fn normalize_flag_name(arg: &str) -> String {
    let Some(rest) = arg.strip_prefix("--") else {
        return arg.to_string();
    };
    let (name, value) = match rest.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (rest, None),
    };
    if !name.contains('_') {
        return arg.to_string();
    }
    let name = name.replace('_', "-");
    match value {
        Some(v) => format!("--{name}={v}"),
        None => format!("--{name}"),
    }
}

// ---------------------------------------------------------------------------
// Compatibility flags

/// Dockershim-era flags and what to use instead.
pub const DOCKERSHIM_FLAGS: &[(&str, &str)] = &[
    (
        "container-runtime",
        "The kubelet only talks to CRI runtimes now: drop --container-runtime and point --container-runtime-endpoint at containerd, CRI-O or cri-dockerd.",
    ),
    (
        "docker-endpoint",
        "Use --container-runtime-endpoint with containerd (unix:///run/containerd/containerd.sock), CRI-O (unix:///var/run/crio/crio.sock) or cri-dockerd (unix:///run/cri-dockerd.sock).",
    ),
    ("docker", "Use --container-runtime-endpoint with containerd, CRI-O or cri-dockerd instead."),
    (
        "experimental-dockershim-root-directory",
        "Drop the flag; the container runtime (containerd, CRI-O or cri-dockerd) manages its own state directory.",
    ),
    (
        "network-plugin",
        "CNI is configured in the container runtime now (containerd's or CRI-O's CNI config); drop the flag.",
    ),
    (
        "network-plugin-mtu",
        "Set the MTU in your CNI network configuration, which the container runtime (containerd or CRI-O) reads; drop the flag.",
    ),
    (
        "cni-bin-dir",
        "CNI is configured in the container runtime now: set the plugin directory in containerd's or CRI-O's CNI config (e.g. containerd's plugins.cri.cni.bin_dir); drop the flag.",
    ),
    (
        "cni-conf-dir",
        "CNI is configured in the container runtime now: set the config directory in containerd's or CRI-O's CNI config (e.g. containerd's plugins.cri.cni.conf_dir); drop the flag.",
    ),
    (
        "cni-cache-dir",
        "CNI is configured in the container runtime now (containerd's or CRI-O's CNI config); drop the flag.",
    ),
    (
        "image-pull-progress-deadline",
        "Configure image pull timeouts in the container runtime (e.g. containerd's image_pull_progress_timeout); drop the flag.",
    ),
    (
        "redirect-container-streaming",
        "Streaming (exec, attach, port-forward) is always served through the kubelet now; drop the flag.",
    ),
    (
        "non-masquerade-cidr",
        "It had no effect outside dockershim's kubenet; configure masquerading in your CNI plugin and drop the flag.",
    ),
];

/// Go-kubelet flags that take a value and that Gantry accepts without acting
/// on them (yet).
pub const UPSTREAM_VALUE_FLAGS: &[&str] = &[
    "cloud-config",
    "cloud-provider",
    "config-dir",
    "cpu-cfs-quota-period",
    "cpu-manager-policy",
    "cpu-manager-policy-options",
    "cpu-manager-reconcile-period",
    "experimental-mounter-path",
    "hairpin-mode",
    "image-credential-provider-bin-dir",
    "image-credential-provider-config",
    "iptables-drop-bit",
    "iptables-masquerade-bit",
    "kube-api-content-type",
    "lock-file",
    "log-flush-frequency",
    "log-json-info-buffer-size",
    "log-text-info-buffer-size",
    "logging-format",
    "max-open-files",
    "maximum-dead-containers",
    "maximum-dead-containers-per-container",
    "memory-manager-policy",
    "minimum-container-ttl-duration",
    "node-status-max-images",
    "pod-cidr",
    "provider-id",
    "qos-reserved",
    "registry-burst",
    "registry-qps",
    "reserved-cpus",
    "reserved-memory",
    "streaming-connection-idle-timeout",
    "topology-manager-policy",
    "topology-manager-policy-options",
    "topology-manager-scope",
    "vmodule",
    "volume-plugin-dir",
];

/// Go-kubelet boolean flags that Gantry accepts without acting on them (yet).
pub const UPSTREAM_BOOL_FLAGS: &[&str] = &[
    "contention-profiling",
    "cpu-cfs-quota",
    "enable-controller-attach-detach",
    "exit-on-lock-contention",
    "experimental-allocatable-ignore-eviction",
    "fail-swap-on",
    "keep-terminated-pod-volumes",
    "kernel-memcg-notification",
    "local-storage-capacity-isolation",
    "log-json-split-stream",
    "log-text-split-stream",
    "make-iptables-util-chains",
    "protect-kernel-defaults",
    "register-schedulable",
];

/// Hidden compatibility flags; see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompatFlags {
    /// Dockershim-era flags given, in command-line order (names without `--`).
    pub dockershim: Vec<String>,
    /// Other Go-kubelet flags given that Gantry does not implement yet, in
    /// command-line order, without duplicates (names with `--`).
    pub unimplemented: Vec<String>,
}

// The clap ids of the hidden args are the flag names themselves (clap ids
// must be 'static); none clashes with the ids of `Flags`' own fields.

impl Args for CompatFlags {
    fn augment_args(cmd: Command) -> Command {
        let mut cmd = cmd;
        for (name, _) in DOCKERSHIM_FLAGS {
            cmd = cmd.arg(
                Arg::new(*name)
                    .long(*name)
                    .hide(true)
                    .action(ArgAction::Append)
                    .num_args(0..=1)
                    .default_missing_value(""),
            );
        }
        for name in UPSTREAM_VALUE_FLAGS {
            cmd = cmd.arg(
                Arg::new(*name).long(*name).hide(true).action(ArgAction::Append).num_args(1).allow_hyphen_values(true),
            );
        }
        for name in UPSTREAM_BOOL_FLAGS {
            cmd = cmd.arg(
                Arg::new(*name)
                    .long(*name)
                    .hide(true)
                    .action(ArgAction::Append)
                    .num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true")
                    .value_parser(go_bool),
            );
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for CompatFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut me = CompatFlags::default();
        me.update_from_arg_matches(matches)?;
        Ok(me)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        fn given(matches: &ArgMatches, id: &str) -> Option<usize> {
            matches
                .try_contains_id(id)
                .ok()
                .filter(|present| *present)
                .and_then(|_| matches.indices_of(id))
                .and_then(|mut indices| indices.next())
        }
        let mut dockershim: Vec<(usize, String)> = DOCKERSHIM_FLAGS
            .iter()
            .filter_map(|(name, _)| given(matches, name).map(|i| (i, name.to_string())))
            .collect();
        dockershim.sort();
        let mut upstream: Vec<(usize, String)> = UPSTREAM_VALUE_FLAGS
            .iter()
            .chain(UPSTREAM_BOOL_FLAGS)
            .filter_map(|name| given(matches, name).map(|i| (i, format!("--{name}"))))
            .collect();
        upstream.sort();
        for (_, name) in dockershim {
            if !self.dockershim.contains(&name) {
                self.dockershim.push(name);
            }
        }
        for (_, name) in upstream {
            if !self.unimplemented.contains(&name) {
                self.unimplemented.push(name);
            }
        }
        Ok(())
    }
}

/// The error for a dockershim-era flag (name without `--`).
pub fn dockershim_error(flag: &str) -> ConfigError {
    let advice = DOCKERSHIM_FLAGS.iter().find(|(name, _)| *name == flag).map_or("Drop the flag.", |(_, advice)| advice);
    ConfigError::DockershimFlag { flag: format!("--{flag}"), advice }
}

/// The first dockershim-era flag in `args` (already normalised), in either
/// `--flag`, `--flag=v` or `--flag v` form; scanning stops at `--`.
fn first_dockershim_flag(args: &[String]) -> Option<&'static str> {
    for arg in args {
        if arg == "--" {
            return None;
        }
        let Some(rest) = arg.strip_prefix("--") else {
            continue;
        };
        let name = rest.split_once('=').map_or(rest, |(n, _)| n);
        if let Some((flag, _)) = DOCKERSHIM_FLAGS.iter().find(|(n, _)| *n == name) {
            return Some(flag);
        }
    }
    None
}

/// Maps a clap error to a [`ConfigError`] with a one-line message.
pub fn from_clap_error(err: clap::Error) -> ConfigError {
    let context_string = |kind: ContextKind| -> Option<String> {
        match err.get(kind) {
            Some(ContextValue::String(s)) => Some(s.clone()),
            Some(ContextValue::Strings(v)) => v.first().cloned(),
            _ => None,
        }
    };
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::DisplayVersion => {
            ConfigError::HelpRequested(err.render().to_string())
        }
        ErrorKind::UnknownArgument => {
            let raw = context_string(ContextKind::InvalidArg).unwrap_or_default();
            if raw.starts_with('-') {
                let flag = raw.split_once('=').map_or(raw.as_str(), |(n, _)| n).to_string();
                ConfigError::UnknownFlag { flag, suggestion: context_string(ContextKind::SuggestedArg) }
            } else {
                ConfigError::CommandLine {
                    message: format!(
                        "unexpected argument {raw:?}: the kubelet takes only flags (a boolean flag takes its value as --flag=true/false)"
                    ),
                }
            }
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let flag =
                context_string(ContextKind::InvalidArg).map(|a| flag_name_of(&a).to_string()).unwrap_or_default();
            let value = context_string(ContextKind::InvalidValue).unwrap_or_default();
            let reason = std::error::Error::source(&err).map(|s| s.to_string()).unwrap_or_else(|| first_line(&err));
            if value.is_empty() && err.kind() == ErrorKind::InvalidValue {
                ConfigError::CommandLine {
                    message: format!("flag {flag} needs a value (--flag=value or --flag value)"),
                }
            } else {
                ConfigError::InvalidFlagValue { flag, value, reason }
            }
        }
        _ => ConfigError::CommandLine { message: first_line(&err) },
    }
}

/// "--runonce[=<BOOL>]" / "--max-pods <N>" → the flag name alone.
fn flag_name_of(display: &str) -> &str {
    display.split([' ', '[', '=']).next().unwrap_or(display)
}

fn first_line(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let line = rendered.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

/// Parses one `--manifest-url-header` value (`name:value,name2:value2`) the
/// way upstream's `ColonSeparatedMultimapStringString` does: pairs split on
/// commas, each on its first colon, blanks around names and values trimmed,
/// empty pairs skipped.
pub fn parse_header_list(value: &str) -> Result<Vec<(String, String)>, FlagValueError> {
    let mut out = Vec::new();
    for pair in value.split(',') {
        if pair.is_empty() {
            continue;
        }
        let Some((k, v)) = pair.split_once(':') else {
            return Err(FlagValueError::MalformedHeader(pair.to_string()));
        };
        out.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, ConfigError> {
        Flags::parse_args(args)
    }

    fn ok(args: &[&str]) -> Flags {
        parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn clap_definition_is_valid() {
        Flags::command().debug_assert();
    }

    #[test]
    fn nothing_given_is_all_none() {
        assert_eq!(ok(&[]), Flags::default());
    }

    #[test]
    fn value_flags_in_both_forms() {
        let f = ok(&[
            "--config=/etc/k.yaml",
            "--kubeconfig",
            "/etc/kubeconfig",
            "--pod-manifest-path=/etc/kubernetes/manifests",
            "--manifest-url",
            "http://x/pods",
            "--container-runtime-endpoint=unix:///run/crio/crio.sock",
            "--image-service-endpoint",
            "unix:///img.sock",
            "--hostname-override=Node-1",
            "--root-dir",
            "/var/lib/gantry",
            "--runtime-request-timeout=90s",
            "--sync-frequency",
            "1m30s",
            "--file-check-frequency=5s",
            "--http-check-frequency=500ms",
            "--max-pods=42",
        ]);
        assert_eq!(f.config, Some(PathBuf::from("/etc/k.yaml")));
        assert_eq!(f.kubeconfig, Some(PathBuf::from("/etc/kubeconfig")));
        assert_eq!(f.pod_manifest_path.as_deref(), Some("/etc/kubernetes/manifests"));
        assert_eq!(f.manifest_url.as_deref(), Some("http://x/pods"));
        assert_eq!(f.container_runtime_endpoint.as_deref(), Some("unix:///run/crio/crio.sock"));
        assert_eq!(f.image_service_endpoint.as_deref(), Some("unix:///img.sock"));
        assert_eq!(f.hostname_override.as_deref(), Some("Node-1"));
        assert_eq!(f.root_dir, Some(PathBuf::from("/var/lib/gantry")));
        assert_eq!(f.runtime_request_timeout, Some(GoDuration::from_secs(90)));
        assert_eq!(f.sync_frequency, Some(GoDuration::from_secs(90)));
        assert_eq!(f.file_check_frequency, Some(GoDuration::from_secs(5)));
        assert_eq!(f.http_check_frequency, Some(GoDuration::from_nanos(500_000_000)));
        assert_eq!(f.max_pods, Some(42));
    }

    #[test]
    fn negative_numbers_reach_validation() {
        assert_eq!(ok(&["--max-pods", "-1"]).max_pods, Some(-1));
        assert_eq!(ok(&["--max-pods=-1"]).max_pods, Some(-1));
        assert_eq!(ok(&["--sync-frequency", "-1s"]).sync_frequency, Some(GoDuration::from_secs(-1)));
    }

    #[test]
    fn empty_values_are_given() {
        let f = ok(&["--pod-manifest-path=", "--manifest-url="]);
        assert_eq!(f.pod_manifest_path.as_deref(), Some(""));
        assert_eq!(f.manifest_url.as_deref(), Some(""));
    }

    #[test]
    fn go_boolean_syntax() {
        assert_eq!(ok(&["--runonce"]).runonce, Some(true));
        assert_eq!(ok(&["--runonce=true"]).runonce, Some(true));
        assert_eq!(ok(&["--runonce=false"]).runonce, Some(false));
        assert_eq!(ok(&["--runonce=1"]).runonce, Some(true));
        assert_eq!(ok(&["--runonce=F"]).runonce, Some(false));
        assert_eq!(ok(&[]).runonce, None);
        // A boolean flag never takes a separate value, as in Go.
        let e = parse(&["--runonce", "false"]).unwrap_err();
        assert!(matches!(e, ConfigError::CommandLine { .. }), "{e:?}");
        assert!(e.to_string().contains("--flag=true/false"), "{e}");
        let e = parse(&["--runonce=maybe"]).unwrap_err();
        assert!(
            matches!(&e, ConfigError::InvalidFlagValue { flag, value, .. } if flag == "--runonce" && value == "maybe"),
            "{e:?}"
        );
    }

    #[test]
    fn verbosity_forms() {
        for args in [&["-v", "4"][..], &["-v=4"], &["-v4"], &["--v=4"], &["--v", "4"]] {
            assert_eq!(ok(args).verbosity, Some(4), "{args:?}");
        }
        assert!(parse(&["-v=300"]).is_err());
        assert!(parse(&["-v=-1"]).is_err());
    }

    #[test]
    fn repeatable_flags_keep_order() {
        let f = ok(&[
            "--feature-gates=A=true",
            "--manifest-url-header",
            "a:1,b:2",
            "--feature-gates",
            "B=false",
            "--manifest-url-header=a:3",
        ]);
        assert_eq!(f.feature_gates, vec!["A=true", "B=false"]);
        assert_eq!(f.manifest_url_header, vec!["a:1,b:2", "a:3"]);
    }

    #[test]
    fn underscores_are_normalised() {
        let f = ok(&["--pod_manifest_path=/m", "--max_pods", "3"]);
        assert_eq!(f.pod_manifest_path.as_deref(), Some("/m"));
        assert_eq!(f.max_pods, Some(3));
        // Values are left alone.
        assert_eq!(ok(&["--root-dir=/a_b"]).root_dir, Some(PathBuf::from("/a_b")));
    }

    #[test]
    fn unknown_flag_is_an_error_not_an_exit() {
        let e = parse(&["--no-such-flag=1"]).unwrap_err();
        match &e {
            ConfigError::UnknownFlag { flag, .. } => assert_eq!(flag, "--no-such-flag"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(e.to_string().contains("unknown flag: --no-such-flag"), "{e}");

        let e = parse(&["--root-dirr=/x"]).unwrap_err();
        assert!(matches!(&e, ConfigError::UnknownFlag { suggestion: Some(s), .. } if s == "--root-dir"), "{e:?}");

        let e = parse(&["stray"]).unwrap_err();
        assert!(matches!(e, ConfigError::CommandLine { .. }), "{e:?}");
    }

    #[test]
    fn bad_values_name_the_flag() {
        let e = parse(&["--sync-frequency=abc"]).unwrap_err();
        match &e {
            ConfigError::InvalidFlagValue { flag, value, reason } => {
                assert_eq!(flag, "--sync-frequency");
                assert_eq!(value, "abc");
                assert!(reason.contains("invalid duration"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let e = parse(&["--max-pods=many"]).unwrap_err();
        assert!(matches!(&e, ConfigError::InvalidFlagValue { flag, .. } if flag == "--max-pods"), "{e:?}");
        let e = parse(&["--kubeconfig"]).unwrap_err();
        assert!(e.to_string().contains("--kubeconfig needs a value"), "{e}");
    }

    #[test]
    #[ignore = "prints the help text; run with --nocapture to look at it"]
    fn show_help() {
        if let Err(ConfigError::HelpRequested(text)) = parse(&["--help"]) {
            println!("{text}");
        }
    }

    #[test]
    fn help_is_returned_not_printed() {
        let e = parse(&["--help"]).unwrap_err();
        match e {
            ConfigError::HelpRequested(text) => {
                assert!(text.contains("--pod-manifest-path"), "{text}");
                assert!(!text.contains("docker-endpoint"), "compat flags are hidden");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn every_dockershim_flag_is_refused_with_advice() {
        for (name, _) in DOCKERSHIM_FLAGS {
            for args in
                [vec![format!("--{name}=x")], vec![format!("--{name}"), "x".to_string()], vec![format!("--{name}")]]
            {
                let e = Flags::parse_args(&args).unwrap_err();
                let msg = e.to_string();
                assert!(
                    matches!(&e, ConfigError::DockershimFlag { flag, .. } if flag == &format!("--{name}")),
                    "{args:?}: {e:?}"
                );
                assert!(msg.contains("dockershim") && msg.contains("1.24"), "{msg}");
            }
        }
        let msg = parse(&["--docker-endpoint=unix:///var/run/docker.sock"]).unwrap_err().to_string();
        assert!(msg.contains("--container-runtime-endpoint") && msg.contains("cri-dockerd"), "{msg}");
        let msg = parse(&["--network-plugin=cni"]).unwrap_err().to_string();
        assert!(msg.contains("CNI is configured in the container runtime"), "{msg}");
        let msg = parse(&["--cni-bin-dir", "/opt/cni/bin"]).unwrap_err().to_string();
        assert!(msg.contains("containerd's or CRI-O's CNI config"), "{msg}");
        let msg = parse(&["--image-pull-progress-deadline=1m"]).unwrap_err().to_string();
        assert!(msg.contains("pull timeouts in the container runtime"), "{msg}");
        let msg = parse(&["--container-runtime=remote"]).unwrap_err().to_string();
        assert!(msg.contains("--container-runtime-endpoint"), "{msg}");
    }

    #[test]
    fn dockershim_is_reported_before_other_errors() {
        let e = parse(&["--bogus", "--network_plugin=kubenet"]).unwrap_err();
        assert!(matches!(&e, ConfigError::DockershimFlag { flag, .. } if flag == "--network-plugin"), "{e:?}");
    }

    #[test]
    fn dockershim_flags_are_caught_when_embedded() {
        // When the binary flattens `Flags` into its own parser, `parse_args`
        // is bypassed; the hidden args still record the flags.
        let f = Flags::try_parse_from(["kubelet", "--max-pods=3", "--cni-conf-dir", "/etc/cni", "--docker"]).unwrap();
        assert_eq!(f.compat.dockershim, vec!["cni-conf-dir", "docker"]);
        assert_eq!(f.max_pods, Some(3));
    }

    #[test]
    fn embeds_as_subcommand_args_and_flattened() {
        #[derive(Parser, Debug)]
        struct Cli {
            #[command(subcommand)]
            cmd: Cmd,
        }
        #[derive(clap::Subcommand, Debug)]
        enum Cmd {
            Kubelet(Flags),
        }
        let cli =
            Cli::try_parse_from(["gantry", "kubelet", "--max-pods=4", "--pod-cidr=10.0.0.0/24", "-v", "2"]).unwrap();
        let Cmd::Kubelet(f) = cli.cmd;
        assert_eq!(f.max_pods, Some(4));
        assert_eq!(f.verbosity, Some(2));
        assert_eq!(f.compat.unimplemented, vec!["--pod-cidr"]);

        #[derive(Parser, Debug)]
        struct Flat {
            #[command(flatten)]
            kubelet: Flags,
        }
        let flat = Flat::try_parse_from(["gantry", "--runonce", "--redirect-container-streaming=true"]).unwrap();
        assert_eq!(flat.kubelet.runonce, Some(true));
        assert_eq!(flat.kubelet.compat.dockershim, vec!["redirect-container-streaming"]);
    }

    #[test]
    fn upstream_flags_are_accepted_and_recorded() {
        let f = ok(&[
            "--pod-cidr=10.0.0.0/24",
            "--register-schedulable=false",
            "--fail-swap-on",
            "--provider-id=x",
            "--pod-cidr",
            "10.0.0.0/16",
            "--max-pods=5",
        ]);
        assert_eq!(f.max_pods, Some(5));
        assert_eq!(
            f.compat.unimplemented,
            vec!["--pod-cidr", "--register-schedulable", "--fail-swap-on", "--provider-id"]
        );
        let e = parse(&["--fail-swap-on=perhaps"]).unwrap_err();
        assert!(matches!(&e, ConfigError::InvalidFlagValue { flag, .. } if flag == "--fail-swap-on"), "{e:?}");
    }

    #[test]
    fn cluster_flags() {
        let f = ok(&[
            "--node-ip=10.0.0.1,fd00::1",
            "--node-labels=a=b",
            "--node-labels",
            "c=d",
            "--register-node=false",
            "--register-with-taints=k=v:NoSchedule",
            "--kube-api-qps=20",
            "--kube-api-burst",
            "40",
            "--node-status-update-frequency=4s",
            "--kube-reserved=cpu=100m",
            "--system-reserved=memory=1Gi",
            "--eviction-hard=memory.available<200Mi",
            "--port=10251",
            "--pods-per-core=10",
        ]);
        assert_eq!(f.node_ip.as_deref(), Some("10.0.0.1,fd00::1"));
        assert_eq!(f.node_labels, vec!["a=b", "c=d"]);
        assert_eq!(f.register_node, Some(false));
        assert_eq!(f.register_with_taints, vec!["k=v:NoSchedule"]);
        assert_eq!((f.kube_api_qps, f.kube_api_burst), (Some(20), Some(40)));
        assert_eq!(f.node_status_update_frequency, Some(GoDuration::from_secs(4)));
        assert_eq!(f.kube_reserved, vec!["cpu=100m"]);
        assert_eq!(f.system_reserved, vec!["memory=1Gi"]);
        assert_eq!(f.eviction_hard, vec!["memory.available<200Mi"]);
        assert_eq!((f.port, f.pods_per_core), (Some(10251), Some(10)));
        assert!(f.compat.unimplemented.is_empty(), "{:?}", f.compat.unimplemented);
        assert_eq!(ok(&["--register-node"]).register_node, Some(true));
    }

    #[test]
    fn header_list_parsing() {
        assert_eq!(
            parse_header_list("a:hello,b:again, c : world ,,d:x:y").unwrap(),
            vec![
                ("a".into(), "hello".into()),
                ("b".into(), "again".into()),
                ("c".into(), "world".into()),
                ("d".into(), "x:y".into())
            ]
        );
        assert!(parse_header_list("novalue").unwrap_err().to_string().contains("name:value"));
        assert_eq!(parse_header_list("").unwrap(), vec![]);
    }
}
