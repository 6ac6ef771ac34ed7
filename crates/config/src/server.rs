//! Settings of the node API server (issue 7): where it listens, its TLS certificate, and how
//! it authenticates and authorizes requests, with upstream names, defaults and validation.
//!
//! Upstream applies "legacy" defaults when the kubelet runs from flags only (no `--config`):
//! the read-only port 10255, anonymous requests allowed, webhook token authentication off and
//! authorization `AlwaysAllow`. With a config file the defaults are the secure ones: no
//! read-only port, anonymous off, webhook authentication on, authorization `Webhook`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::file::KubeletConfiguration;
use super::flags::Flags;
use super::{ConfigError, GoDuration, Problem};

pub const DEFAULT_HEALTHZ_PORT: u16 = 10248;
pub const LEGACY_READ_ONLY_PORT: u16 = 10255;
pub const DEFAULT_WEBHOOK_CACHE_TTL: Duration = Duration::from_secs(120);
pub const DEFAULT_CACHE_AUTHORIZED_TTL: Duration = Duration::from_secs(300);
pub const DEFAULT_CACHE_UNAUTHORIZED_TTL: Duration = Duration::from_secs(30);
/// Upstream's `volumeStatsAggPeriod` default.
pub const DEFAULT_VOLUME_STATS_AGG_PERIOD: Duration = Duration::from_secs(60);
/// Upstream's names of the self-signed serving certificate in `--cert-dir`.
pub const SELF_SIGNED_CERT: &str = "kubelet.crt";
pub const SELF_SIGNED_KEY: &str = "kubelet.key";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationMode {
    AlwaysAllow,
    Webhook,
}

/// A name that is not one of the enum's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownName {
    #[error("authorization mode {0:?} is not supported; use AlwaysAllow or Webhook")]
    AuthorizationMode(String),
    #[error("unknown tls version {0:?}")]
    TlsVersion(String),
}

impl AuthorizationMode {
    fn parse(s: &str) -> Result<Self, UnknownName> {
        match s {
            "AlwaysAllow" => Ok(AuthorizationMode::AlwaysAllow),
            "Webhook" => Ok(AuthorizationMode::Webhook),
            other => Err(UnknownName::AuthorizationMode(other.to_string())),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    /// `enableServer` / `--enable-server`, default true.
    pub enabled: bool,
    /// `enableDebuggingHandlers` / `--enable-debugging-handlers`, default true: `/run`, `/exec`,
    /// `/attach`, `/portForward`, `/containerLogs`; when off they answer 405.
    pub debugging_handlers: bool,
    /// `address` / `--address`, default 0.0.0.0. The port is `Settings::port`.
    pub address: IpAddr,
    /// `readOnlyPort` / `--read-only-port`: 0 = off (config file default), 10255 with flags only.
    pub read_only_port: u16,
    /// `healthzPort` / `--healthz-port`, default 10248; 0 disables.
    pub healthz_port: u16,
    /// `healthzBindAddress` / `--healthz-bind-address`, default 127.0.0.1.
    pub healthz_bind_address: IpAddr,
    /// `tlsCertFile` / `--tls-cert-file`.
    pub tls_cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile` / `--tls-private-key-file`.
    pub tls_private_key_file: Option<PathBuf>,
    /// `tlsMinVersion` / `--tls-min-version`, default TLS 1.2.
    pub tls_min_version: TlsVersion,
    /// `tlsCipherSuites` / `--tls-cipher-suites`: Go's names, validated; empty = every suite
    /// the server supports.
    pub tls_cipher_suites: Vec<String>,
    /// `--cert-dir`; None = `<root-dir>/pki`.
    pub cert_dir: Option<PathBuf>,
    /// `serverTLSBootstrap` / `--rotate-server-certificates`, default false: the serving
    /// certificate comes from the API server (signer `kubernetes.io/kubelet-serving`), not from
    /// `tlsCertFile` or a self-signed pair.
    pub server_tls_bootstrap: bool,
    /// `authentication.x509.clientCAFile` / `--client-ca-file`.
    pub client_ca_file: Option<PathBuf>,
    /// `authentication.webhook.enabled` / `--authentication-token-webhook`.
    pub webhook_authentication: bool,
    /// `authentication.webhook.cacheTTL` / `--authentication-token-webhook-cache-ttl`, default 2m.
    pub webhook_cache_ttl: Duration,
    /// `authentication.anonymous.enabled` / `--anonymous-auth`.
    pub anonymous: bool,
    /// `authorization.mode` / `--authorization-mode`.
    pub authorization_mode: AuthorizationMode,
    /// `authorization.webhook.cacheAuthorizedTTL`, default 5m.
    pub cache_authorized_ttl: Duration,
    /// `authorization.webhook.cacheUnauthorizedTTL`, default 30s.
    pub cache_unauthorized_ttl: Duration,
    /// `volumeStatsAggPeriod` / `--volume-stats-agg-period`, default 1m: how often the pods'
    /// volume usage is measured for `/stats/summary` and `/metrics`; `None` (a negative
    /// period, or 0 on the command line) measures none, as upstream.
    pub volume_stats_agg_period: Option<Duration>,
}

impl Default for ServerSettings {
    /// The config-file defaults (secure).
    fn default() -> Self {
        ServerSettings {
            enabled: true,
            debugging_handlers: true,
            address: IpAddr::from([0, 0, 0, 0]),
            read_only_port: 0,
            healthz_port: DEFAULT_HEALTHZ_PORT,
            healthz_bind_address: IpAddr::from([127, 0, 0, 1]),
            tls_cert_file: None,
            tls_private_key_file: None,
            tls_min_version: TlsVersion::default(),
            tls_cipher_suites: Vec::new(),
            cert_dir: None,
            server_tls_bootstrap: false,
            client_ca_file: None,
            webhook_authentication: true,
            webhook_cache_ttl: DEFAULT_WEBHOOK_CACHE_TTL,
            anonymous: false,
            authorization_mode: AuthorizationMode::Webhook,
            cache_authorized_ttl: DEFAULT_CACHE_AUTHORIZED_TTL,
            cache_unauthorized_ttl: DEFAULT_CACHE_UNAUTHORIZED_TTL,
            volume_stats_agg_period: Some(DEFAULT_VOLUME_STATS_AGG_PERIOD),
        }
    }
}

/// The TLS versions upstream's `tlsMinVersion` names. rustls serves 1.2 and 1.3 only, so a
/// lower minimum serves 1.2 and later (the server warns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum TlsVersion {
    Tls10,
    Tls11,
    #[default]
    Tls12,
    Tls13,
}

impl TlsVersion {
    pub fn parse(name: &str) -> Result<Self, UnknownName> {
        match name {
            "VersionTLS10" => Ok(TlsVersion::Tls10),
            "VersionTLS11" => Ok(TlsVersion::Tls11),
            "VersionTLS12" => Ok(TlsVersion::Tls12),
            "VersionTLS13" => Ok(TlsVersion::Tls13),
            other => Err(UnknownName::TlsVersion(other.to_string())),
        }
    }
}

/// Every cipher suite name upstream accepts (Go's secure and insecure lists). Go lets the
/// list restrict TLS 1.2 and below only; TLS 1.3 suites are always on.
const GO_CIPHER_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_RC4_128_SHA",
];

/// Checks the names against upstream's list (its error message) and writes Go's short
/// ChaCha20 aliases with their `_SHA256` suffix, the IANA name rustls uses.
fn cipher_suites(field: &str, names: &[&str], invalid: Invalid) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        if !GO_CIPHER_SUITES.contains(&name) {
            return Err(invalid(field, format!("Cipher suite {name} not supported or doesn't exist").into()));
        }
        let iana = if name.ends_with("_CHACHA20_POLY1305") { format!("{name}_SHA256") } else { name.to_string() };
        if !out.contains(&iana) {
            out.push(iana);
        }
    }
    Ok(out)
}

type Invalid<'a> = &'a dyn Fn(&str, Problem) -> ConfigError;

fn port(field: &str, label: &str, value: i32, invalid: Invalid) -> Result<u16, ConfigError> {
    u16::try_from(value).map_err(|_| {
        invalid(field, format!("invalid configuration: {label} {value} must be between 0 and 65535, inclusive").into())
    })
}

fn ip(field: &str, value: &str, invalid: Invalid) -> Result<IpAddr, ConfigError> {
    value.trim().parse().map_err(|_| invalid(field, format!("{value:?} is not an IP address").into()))
}

fn ttl(field: &str, value: GoDuration, invalid: Invalid) -> Result<Duration, ConfigError> {
    value.to_std().ok_or_else(|| invalid(field, format!("{value} must not be negative").into()))
}

fn path(value: &str) -> Option<PathBuf> {
    (!value.is_empty()).then(|| PathBuf::from(value))
}

impl ServerSettings {
    /// Upstream's flag-only defaults (`applyLegacyDefaults`).
    pub fn legacy() -> Self {
        ServerSettings {
            read_only_port: LEGACY_READ_ONLY_PORT,
            anonymous: true,
            webhook_authentication: false,
            authorization_mode: AuthorizationMode::AlwaysAllow,
            ..Default::default()
        }
    }

    /// The server settings for the start-up log line.
    pub fn summary(&self) -> String {
        let opt = |p: &Option<PathBuf>| p.as_ref().map_or_else(|| "<none>".to_string(), |p| p.display().to_string());
        format!(
            "enableServer={} enableDebuggingHandlers={} address={} readOnlyPort={} healthzPort={} healthzBindAddress={} tlsCertFile={} \
             serverTLSBootstrap={} clientCAFile={} anonymousAuth={} authenticationTokenWebhook={} authorizationMode={:?}",
            self.enabled,
            self.debugging_handlers,
            self.address,
            self.read_only_port,
            self.healthz_port,
            self.healthz_bind_address,
            opt(&self.tls_cert_file),
            self.server_tls_bootstrap,
            opt(&self.client_ca_file),
            self.anonymous,
            self.webhook_authentication,
            self.authorization_mode,
        )
    }

    /// The directory of the self-signed certificate.
    pub fn cert_dir(&self, root_dir: &Path) -> PathBuf {
        self.cert_dir.clone().unwrap_or_else(|| root_dir.join("pki"))
    }

    pub(super) fn apply_file(&mut self, c: &KubeletConfiguration, invalid: Invalid) -> Result<(), ConfigError> {
        // Zero is "default" in the file (upstream's defaulting); negative turns it off.
        if let Some(d) = c.volume_stats_agg_period.filter(|d| !d.is_zero()) {
            self.volume_stats_agg_period = d.to_std();
        }
        if let Some(e) = c.enable_server {
            self.enabled = e;
        }
        if let Some(e) = c.enable_debugging_handlers {
            self.debugging_handlers = e;
        }
        if let Some(a) = c.address.as_deref().filter(|a| !a.is_empty()) {
            self.address = ip("address", a, invalid)?;
        }
        if let Some(p) = c.read_only_port {
            self.read_only_port = port("readOnlyPort", "readOnlyPort (--read-only-port)", p, invalid)?;
        }
        if let Some(p) = c.healthz_port {
            self.healthz_port = port("healthzPort", "healthzPort (--healthz-port)", p, invalid)?;
        }
        if let Some(a) = c.healthz_bind_address.as_deref().filter(|a| !a.is_empty()) {
            self.healthz_bind_address = ip("healthzBindAddress", a, invalid)?;
        }
        if let Some(f) = c.tls_cert_file.as_deref() {
            self.tls_cert_file = path(f);
        }
        if let Some(f) = c.tls_private_key_file.as_deref() {
            self.tls_private_key_file = path(f);
        }
        if let Some(b) = c.server_tls_bootstrap {
            self.server_tls_bootstrap = b;
        }
        if let Some(v) = c.tls_min_version.as_deref().filter(|v| !v.is_empty()) {
            self.tls_min_version = TlsVersion::parse(v).map_err(|e| invalid("tlsMinVersion", e.into()))?;
        }
        if let Some(names) = &c.tls_cipher_suites {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            self.tls_cipher_suites = cipher_suites("tlsCipherSuites", &names, invalid)?;
        }
        if let Some(authn) = &c.authentication {
            if let Some(f) = authn.x509.as_ref().and_then(|x| x.client_ca_file.as_deref()) {
                self.client_ca_file = path(f);
            }
            if let Some(w) = &authn.webhook {
                if let Some(e) = w.enabled {
                    self.webhook_authentication = e;
                }
                if let Some(d) = w.cache_ttl.filter(|d| !d.is_zero()) {
                    self.webhook_cache_ttl = ttl("authentication.webhook.cacheTTL", d, invalid)?;
                }
            }
            if let Some(e) = authn.anonymous.as_ref().and_then(|a| a.enabled) {
                self.anonymous = e;
            }
        }
        if let Some(authz) = &c.authorization {
            if let Some(m) = authz.mode.as_deref().filter(|m| !m.is_empty()) {
                self.authorization_mode =
                    AuthorizationMode::parse(m).map_err(|e| invalid("authorization.mode", e.into()))?;
            }
            if let Some(w) = &authz.webhook {
                if let Some(d) = w.cache_authorized_ttl.filter(|d| !d.is_zero()) {
                    self.cache_authorized_ttl = ttl("authorization.webhook.cacheAuthorizedTTL", d, invalid)?;
                }
                if let Some(d) = w.cache_unauthorized_ttl.filter(|d| !d.is_zero()) {
                    self.cache_unauthorized_ttl = ttl("authorization.webhook.cacheUnauthorizedTTL", d, invalid)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn apply_flags(&mut self, f: &Flags, invalid: Invalid) -> Result<(), ConfigError> {
        let s = &f.server;
        if let Some(d) = s.volume_stats_agg_period {
            self.volume_stats_agg_period = d.to_std().filter(|d| !d.is_zero());
        }
        if let Some(e) = s.enable_server {
            self.enabled = e;
        }
        if let Some(e) = s.enable_debugging_handlers {
            self.debugging_handlers = e;
        }
        if let Some(a) = &s.address {
            self.address = ip("--address", a, invalid)?;
        }
        if let Some(p) = s.read_only_port {
            self.read_only_port = port("--read-only-port", "readOnlyPort (--read-only-port)", p, invalid)?;
        }
        if let Some(p) = s.healthz_port {
            self.healthz_port = port("--healthz-port", "healthzPort (--healthz-port)", p, invalid)?;
        }
        if let Some(a) = &s.healthz_bind_address {
            self.healthz_bind_address = ip("--healthz-bind-address", a, invalid)?;
        }
        if let Some(f) = &s.tls_cert_file {
            self.tls_cert_file = path(f);
        }
        if let Some(f) = &s.tls_private_key_file {
            self.tls_private_key_file = path(f);
        }
        if let Some(b) = s.rotate_server_certificates {
            self.server_tls_bootstrap = b;
        }
        if let Some(v) = &s.tls_min_version {
            self.tls_min_version = TlsVersion::parse(v).map_err(|e| invalid("--tls-min-version", e.into()))?;
        }
        if !s.tls_cipher_suites.is_empty() {
            let names: Vec<&str> = s.tls_cipher_suites.iter().flat_map(|v| v.split(',')).collect();
            self.tls_cipher_suites = cipher_suites("--tls-cipher-suites", &names, invalid)?;
        }
        if let Some(d) = &s.cert_dir {
            self.cert_dir = path(d);
        }
        if let Some(f) = &s.client_ca_file {
            self.client_ca_file = path(f);
        }
        if let Some(e) = s.authentication_token_webhook {
            self.webhook_authentication = e;
        }
        if let Some(d) = s.authentication_token_webhook_cache_ttl {
            self.webhook_cache_ttl = ttl("--authentication-token-webhook-cache-ttl", d, invalid)?;
        }
        if let Some(e) = s.anonymous_auth {
            self.anonymous = e;
        }
        if let Some(m) = &s.authorization_mode {
            self.authorization_mode =
                AuthorizationMode::parse(m).map_err(|e| invalid("--authorization-mode", e.into()))?;
        }
        if let Some(d) = s.authorization_webhook_cache_authorized_ttl {
            self.cache_authorized_ttl = ttl("--authorization-webhook-cache-authorized-ttl", d, invalid)?;
        }
        if let Some(d) = s.authorization_webhook_cache_unauthorized_ttl {
            self.cache_unauthorized_ttl = ttl("--authorization-webhook-cache-unauthorized-ttl", d, invalid)?;
        }
        self.check(invalid)
    }

    fn check(&self, invalid: Invalid) -> Result<(), ConfigError> {
        // Upstream needs both files or neither (then it generates a self-signed pair).
        match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(_), None) => Err(invalid(
                "tlsPrivateKeyFile",
                "tlsCertFile (--tls-cert-file) is set but tlsPrivateKeyFile (--tls-private-key-file) is not".into(),
            )),
            (None, Some(_)) => Err(invalid(
                "tlsCertFile",
                "tlsPrivateKeyFile (--tls-private-key-file) is set but tlsCertFile (--tls-cert-file) is not".into(),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Input;

    fn invalid(field: &str, problem: Problem) -> ConfigError {
        ConfigError::InvalidValue { input: Input::CommandLine, field: field.into(), problem: Box::new(problem) }
    }

    fn resolve(file: Option<&str>, flags: &[&str]) -> Result<ServerSettings, String> {
        let f = Flags::parse_args(flags).map_err(|e| e.to_string())?;
        let mut s = if file.is_some() { ServerSettings::default() } else { ServerSettings::legacy() };
        if let Some(file) = file {
            let c: KubeletConfiguration = serde_yaml_ng::from_str(file).unwrap();
            s.apply_file(&c, &invalid).map_err(|e| e.to_string())?;
        }
        s.apply_flags(&f, &invalid).map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn config_file_defaults_are_secure_and_flag_only_defaults_are_legacy() {
        let s = resolve(Some("{}"), &[]).unwrap();
        assert_eq!((s.anonymous, s.webhook_authentication, s.read_only_port), (false, true, 0));
        assert_eq!(s.authorization_mode, AuthorizationMode::Webhook);
        assert_eq!(
            (s.cache_authorized_ttl, s.cache_unauthorized_ttl),
            (Duration::from_secs(300), Duration::from_secs(30))
        );
        let s = resolve(None, &[]).unwrap();
        assert_eq!((s.anonymous, s.webhook_authentication, s.read_only_port), (true, false, 10255));
        assert_eq!(s.authorization_mode, AuthorizationMode::AlwaysAllow);
        assert_eq!(s.cert_dir(Path::new("/var/lib/kubelet")), PathBuf::from("/var/lib/kubelet/pki"));
    }

    #[test]
    fn file_fields_use_upstream_names_and_flags_override_them() {
        let file = "address: 127.0.0.1\nreadOnlyPort: 10255\nhealthzPort: 0\ntlsCertFile: /c\ntlsPrivateKeyFile: /k\n\
                    authentication: {x509: {clientCAFile: /ca}, webhook: {enabled: false, cacheTTL: 10s}, anonymous: {enabled: true}}\n\
                    authorization: {mode: AlwaysAllow, webhook: {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 5s}}\n";
        let s = resolve(Some(file), &[]).unwrap();
        assert!(s.debugging_handlers);
        assert!(!resolve(Some("enableDebuggingHandlers: false"), &[]).unwrap().debugging_handlers);
        assert!(!resolve(None, &["--enable-debugging-handlers=false"]).unwrap().debugging_handlers);
        assert_eq!(s.address, IpAddr::from([127, 0, 0, 1]));
        assert_eq!((s.read_only_port, s.healthz_port), (10255, 0));
        assert_eq!(s.client_ca_file, Some(PathBuf::from("/ca")));
        assert_eq!(
            (s.webhook_authentication, s.webhook_cache_ttl, s.anonymous),
            (false, Duration::from_secs(10), true)
        );
        assert_eq!(s.authorization_mode, AuthorizationMode::AlwaysAllow);
        assert_eq!(s.cache_unauthorized_ttl, Duration::from_secs(5));
        let s = resolve(
            Some(file),
            &["--anonymous-auth=false", "--authorization-mode=Webhook", "--address=::1", "--cert-dir=/certs"],
        )
        .unwrap();
        assert_eq!((s.anonymous, s.authorization_mode), (false, AuthorizationMode::Webhook));
        assert_eq!(s.address, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(s.cert_dir(Path::new("/r")), PathBuf::from("/certs"));
    }

    #[test]
    fn bad_values_name_the_field() {
        let err = resolve(Some("authorization: {mode: RBAC}"), &[]).unwrap_err();
        assert!(err.contains("authorization.mode") && err.contains("AlwaysAllow or Webhook"), "{err}");
        let err = resolve(Some("healthzPort: 70000"), &[]).unwrap_err();
        assert!(err.contains("healthzPort (--healthz-port) 70000 must be between 0 and 65535"), "{err}");
        let err = resolve(None, &["--address=nowhere"]).unwrap_err();
        assert!(err.contains("--address") && err.contains("not an IP address"), "{err}");
        let err = resolve(None, &["--tls-cert-file=/c"]).unwrap_err();
        assert!(err.contains("tlsPrivateKeyFile (--tls-private-key-file) is not"), "{err}");
    }

    #[test]
    fn tls_version_and_cipher_suites_from_file_and_flags() {
        assert_eq!(resolve(Some("{}"), &[]).unwrap().tls_min_version, TlsVersion::Tls12);
        let file = "tlsMinVersion: VersionTLS13\ntlsCipherSuites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305]\n";
        let s = resolve(Some(file), &[]).unwrap();
        assert_eq!(s.tls_min_version, TlsVersion::Tls13);
        assert_eq!(
            s.tls_cipher_suites,
            ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"],
            "Go's short ChaCha20 alias becomes the IANA name"
        );
        let s = resolve(
            Some(file),
            &[
                "--tls-min-version=VersionTLS12",
                "--tls-cipher-suites=TLS_RSA_WITH_AES_128_CBC_SHA,TLS_AES_128_GCM_SHA256",
            ],
        )
        .unwrap();
        assert_eq!(s.tls_min_version, TlsVersion::Tls12);
        assert_eq!(s.tls_cipher_suites, ["TLS_RSA_WITH_AES_128_CBC_SHA", "TLS_AES_128_GCM_SHA256"]);
    }

    #[test]
    fn bad_tls_settings_name_the_field_with_upstream_messages() {
        let err = resolve(Some("tlsMinVersion: TLS1.3"), &[]).unwrap_err();
        assert!(err.contains("tlsMinVersion") && err.contains(r#"unknown tls version "TLS1.3""#), "{err}");
        let err = resolve(None, &["--tls-cipher-suites=TLS_AES_128_GCM_SHA256,TLS_NOPE"]).unwrap_err();
        assert!(
            err.contains("--tls-cipher-suites") && err.contains("Cipher suite TLS_NOPE not supported or doesn't exist"),
            "{err}"
        );
    }
}
