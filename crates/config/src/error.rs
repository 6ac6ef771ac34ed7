//! Configuration errors. Every message names the input (a command-line flag
//! or the config file) and the field, and says what to do about it.

use std::fmt;
use std::path::PathBuf;

/// Why a value is not acceptable: the typed error of the parser or check that refused it, or
/// the explanation of a rule checked where the value is read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    #[error(transparent)]
    Value(#[from] crate::ValueError),
    #[error(transparent)]
    Setting(#[from] crate::SettingError),
    #[error(transparent)]
    FlagValue(#[from] crate::FlagValueError),
    #[error(transparent)]
    Name(#[from] crate::UnknownName),
    /// A rule checked in place (a range, a form), explained for the user.
    #[error("{0}")]
    Rule(String),
}

impl From<String> for Problem {
    fn from(rule: String) -> Self {
        Problem::Rule(rule)
    }
}

impl From<&str> for Problem {
    fn from(rule: &str) -> Self {
        Problem::Rule(rule.to_string())
    }
}

/// Where a setting came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A command-line flag; the error's `field` is the flag (`--max-pods`).
    CommandLine,
    /// The `--config` file; the error's `field` is the field path (`maxPods`).
    ConfigFile(PathBuf),
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Input::CommandLine => f.write_str("on the command line"),
            Input::ConfigFile(p) => write!(f, "in config file {}", p.display()),
        }
    }
}

/// Formats an optional "(line L, column C)" position.
pub(crate) struct At(pub Option<usize>, pub Option<usize>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            (Some(l), Some(c)) => write!(f, " (line {l}, column {c})"),
            (Some(l), None) => write!(f, " (line {l})"),
            _ => Ok(()),
        }
    }
}

pub(crate) struct DidYouMean<'a>(pub &'a Option<String>);

impl fmt::Display for DidYouMean<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(s) => write!(f, " (did you mean `{s}`?)"),
            None => Ok(()),
        }
    }
}

/// Why the kubelet configuration could not be resolved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `-h`/`--help` was given: print this text and exit successfully.
    #[error("{0}")]
    HelpRequested(String),

    /// A flag neither Gantry nor the Go kubelet knows.
    #[error("unknown flag: {flag}{}; run `gantry kubelet --help` for the list of flags", DidYouMean(suggestion))]
    UnknownFlag { flag: String, suggestion: Option<String> },

    /// A flag with a value of the wrong form (`--sync-frequency=abc`).
    #[error("invalid value {value:?} for flag {flag}: {reason}")]
    InvalidFlagValue { flag: String, value: String, reason: String },

    /// Any other command-line problem (missing value, stray argument, ...).
    #[error("invalid command line: {message}")]
    CommandLine { message: String },

    /// A flag of the dockershim era.
    #[error(
        "flag {flag} is no longer supported: built-in Docker support (dockershim) was removed from the kubelet in Kubernetes 1.24. {advice}"
    )]
    DockershimFlag { flag: String, advice: &'static str },

    /// The `--config` file could not be read.
    #[error("cannot read kubelet config file {} (given with --config): {source}", path.display())]
    ReadConfigFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The config file is not well-formed YAML/JSON, or not a mapping.
    #[error("kubelet config file {} is not valid {format}{}: {reason}", path.display(), At(*line, *column))]
    Syntax { path: PathBuf, format: &'static str, line: Option<usize>, column: Option<usize>, reason: String },

    /// `apiVersion` or `kind` is missing or not the KubeletConfiguration one.
    #[error("kubelet config file {}: {problem}", path.display())]
    TypeMeta { path: PathBuf, field: &'static str, problem: String },

    /// A field that KubeletConfiguration v1beta1 does not have.
    #[error(
        "kubelet config file {}: unknown field `{field}`{}: KubeletConfiguration (kubelet.config.k8s.io/v1beta1) has no such field{}",
        path.display(), At(*line, *column), DidYouMean(suggestion)
    )]
    UnknownField {
        path: PathBuf,
        /// Full path, e.g. `authentication.x509.clientCaFile`.
        field: String,
        line: Option<usize>,
        column: Option<usize>,
        /// A known field differing only in case.
        suggestion: Option<String>,
    },

    /// A field whose value has the wrong type or form.
    #[error("kubelet config file {}: field `{field}`{}: {reason}", path.display(), At(*line, *column))]
    InvalidField { path: PathBuf, field: String, line: Option<usize>, column: Option<usize>, reason: String },

    /// A value that parsed but is not acceptable (negative count, empty
    /// endpoint, relative path, ...).
    #[error("invalid value for {field} {input}: {problem}")]
    InvalidValue {
        input: Input,
        field: String,
        /// Boxed: some causes are large, and every config function returns this error.
        #[source]
        problem: Box<Problem>,
    },

    /// A feature gate neither Gantry nor the Go kubelet knows.
    #[error(
        "unrecognized feature gate: {gate} (set with {field} {input}); check the spelling and case of the gate name"
    )]
    UnknownFeatureGate { input: Input, field: String, gate: String },

    /// A malformed `--feature-gates` value.
    #[error("invalid {field} {input}: {problem}")]
    InvalidFeatureGate {
        input: Input,
        field: String,
        #[source]
        problem: crate::GateError,
    },

    /// RunOnce requested without the LegacyNodeRunOnceMode gate (KEP-4580).
    #[error(
        "RunOnce mode ({set_by}) is deprecated (KEP-4580) and disabled by default. To use it anyway, enable the \
         LegacyNodeRunOnceMode feature gate (--feature-gates=LegacyNodeRunOnceMode=true or \
         `featureGates: {{LegacyNodeRunOnceMode: true}}` in the config file). Better, run Gantry in standalone mode \
         instead: without --kubeconfig, with --pod-manifest-path pointing at your static pod manifests"
    )]
    RunOnceDeprecated { set_by: String },

    /// No node name: no `--hostname-override` and no readable hostname.
    #[error(
        "cannot determine the node name: the machine's hostname is empty or unreadable \
         (/proc/sys/kernel/hostname, /etc/hostname); set --hostname-override"
    )]
    NoHostname,
}
