//! Feature gates: `featureGates` in the config file and `--feature-gates` on
//! the command line.
//!
//! Gantry acts on the gates in [`Gate`]. Gate names that the Go kubelet knows
//! but Gantry does not act on (see [`UPSTREAM_ONLY_GATES`]) are accepted so
//! that a config file from a Go-kubelet node loads; the caller warns that they
//! have no effect. Any other name is an error, as upstream
//! (`unrecognized feature gate: <name>`).

use std::collections::BTreeMap;
use std::fmt;

/// A feature gate Gantry acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Gate {
    /// KEP-4580: RunOnce mode (`--runonce` / `runOnce`) is deprecated and
    /// refused unless this gate is enabled. Default: false.
    LegacyNodeRunOnceMode,
    /// KEP-4004: do not report `status.nodeInfo.kubeProxyVersion`.
    /// Default: true.
    DisableNodeKubeProxyVersion,
    /// Graceful node shutdown (`shutdownGracePeriod`, logind inhibitor). Default: true.
    GracefulNodeShutdown,
    /// `shutdownGracePeriodByPodPriority`. Default: true.
    GracefulNodeShutdownBasedOnPodPriority,
    /// KEP-4205: pressure stall information in `/stats/summary`. Default: true (beta in 1.34).
    KubeletPSI,
    /// KEP-2570: cgroup v2 `memory.min`/`memory.high` from requests and limits. Default: false
    /// (alpha).
    MemoryQoS,
}

impl Gate {
    pub const ALL: [Gate; 6] = [
        Gate::LegacyNodeRunOnceMode,
        Gate::DisableNodeKubeProxyVersion,
        Gate::GracefulNodeShutdown,
        Gate::GracefulNodeShutdownBasedOnPodPriority,
        Gate::KubeletPSI,
        Gate::MemoryQoS,
    ];

    /// The gate's name as written in `--feature-gates` and `featureGates`.
    pub const fn name(self) -> &'static str {
        match self {
            Gate::LegacyNodeRunOnceMode => "LegacyNodeRunOnceMode",
            Gate::DisableNodeKubeProxyVersion => "DisableNodeKubeProxyVersion",
            Gate::GracefulNodeShutdown => "GracefulNodeShutdown",
            Gate::GracefulNodeShutdownBasedOnPodPriority => "GracefulNodeShutdownBasedOnPodPriority",
            Gate::KubeletPSI => "KubeletPSI",
            Gate::MemoryQoS => "MemoryQoS",
        }
    }

    pub const fn default_enabled(self) -> bool {
        match self {
            Gate::LegacyNodeRunOnceMode | Gate::MemoryQoS => false,
            Gate::DisableNodeKubeProxyVersion
            | Gate::GracefulNodeShutdown
            | Gate::GracefulNodeShutdownBasedOnPodPriority
            | Gate::KubeletPSI => true,
        }
    }

    /// Looks a gate up by its exact (case-sensitive) name.
    pub fn from_name(name: &str) -> Option<Gate> {
        Gate::ALL.into_iter().find(|g| g.name() == name)
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Feature-gate names the Go kubelet accepts that Gantry does not act on.
/// Setting one is allowed (so that existing config files and command lines
/// keep working) but has no effect; `AllAlpha` and `AllBeta` are upstream's
/// meta-gates and do not change Gantry's own gates either.
pub const UPSTREAM_ONLY_GATES: &[&str] = &[
    "AllAlpha",
    "AllBeta",
    "AllowDNSOnlyNodeCSR",
    "AllowOverwriteTerminationGracePeriodSeconds",
    "AnyVolumeDataSource",
    "AppArmor",
    "AppArmorFields",
    "AuthorizeNodeWithSelectors",
    "AuthorizeWithSelectors",
    "ClientsAllowCBOR",
    "ClientsPreferCBOR",
    "ClusterTrustBundle",
    "ClusterTrustBundleProjection",
    "ComponentFlagz",
    "ComponentSLIs",
    "ComponentStatusz",
    "ContainerCheckpoint",
    "ContainerRestartRules",
    "ContainerStopSignals",
    "ContextualLogging",
    "CPUManager",
    "CPUManagerPolicyAlphaOptions",
    "CPUManagerPolicyBetaOptions",
    "CPUManagerPolicyOptions",
    "CrossNamespaceVolumeDataSource",
    "CSIMigrationPortworx",
    "CSIVolumeHealth",
    "CustomCPUCFSQuotaPeriod",
    "DevicePluginCDIDevices",
    "DisableCloudProviders",
    "DisableKubeletCloudCredentialProviders",
    "DRAAdminAccess",
    "DRAConsumableCapacity",
    "DRADeviceBindingConditions",
    "DRADeviceTaints",
    "DRAExtendedResource",
    "DRAPartitionableDevices",
    "DRAPrioritizedList",
    "DRAResourceClaimDeviceStatus",
    "DynamicResourceAllocation",
    "EnvFiles",
    "EventedPLEG",
    "ExecProbeTimeout",
    "HostnameOverride",
    "ImageMaximumGCAge",
    "ImageVolume",
    "InOrderInformers",
    "InPlacePodVerticalScaling",
    "InPlacePodVerticalScalingAllocatedStatus",
    "InPlacePodVerticalScalingExclusiveCPUs",
    "InPlacePodVerticalScalingExclusiveMemory",
    "InTreePluginPortworxUnregister",
    "InformerResourceVersion",
    "KubeletCgroupDriverFromCRI",
    "KubeletCrashLoopBackOffMax",
    "KubeletEnsureSecretPulledImages",
    "KubeletFineGrainedAuthz",
    "KubeletInUserNamespace",
    "KubeletPodResourcesDynamicResources",
    "KubeletPodResourcesGet",
    "KubeletPodResourcesListUseActivePods",
    "KubeletRegistrationGetOnExistsOnly",
    "KubeletSeparateDiskGC",
    "KubeletServiceAccountTokenForCredentialProviders",
    "KubeletTracing",
    "LocalStorageCapacityIsolationFSQuotaMonitoring",
    "LoggingAlphaOptions",
    "LoggingBetaOptions",
    "MatchLabelKeysInPodAffinity",
    "MatchLabelKeysInPodTopologySpread",
    "MemoryManager",
    "MutableCSINodeAllocatableCount",
    "NodeDeclaredFeatures",
    "NodeInclusionPolicyInPodTopologySpread",
    "NodeLogQuery",
    "NodeSwap",
    "PodAndContainerStatsFromCRI",
    "PodCertificateRequest",
    "PodDisruptionConditions",
    "PodHostIPs",
    "PodIndexLabel",
    "PodLevelResources",
    "PodLifecycleSleepAction",
    "PodLifecycleSleepActionAllowZero",
    "PodLogsQuerySplitStreams",
    "PodObservedGenerationTracking",
    "PodReadyToStartContainersCondition",
    "PodSchedulingReadiness",
    "PortForwardWebsockets",
    "ProcMountType",
    "QOSReserved",
    "RecoverVolumeExpansionFailure",
    "RecursiveReadOnlyMounts",
    "RelaxedDNSSearchValidation",
    "RelaxedEnvironmentVariableValidation",
    "ReloadKubeletServerCertificateFile",
    "ResourceHealthStatus",
    "RotateKubeletServerCertificate",
    "RuntimeClassInImageCriApi",
    "SchedulerQueueingHints",
    "SELinuxChangePolicy",
    "SELinuxMount",
    "SELinuxMountReadWriteOncePod",
    "SidecarContainers",
    "SizeMemoryBackedVolumes",
    "StorageNamespaceIndex",
    "SupplementalGroupsPolicy",
    "SystemdWatchdog",
    "TopologyAwareHints",
    "TopologyManagerPolicyAlphaOptions",
    "TopologyManagerPolicyBetaOptions",
    "TopologyManagerPolicyOptions",
    "TranslateStreamCloseWebsocketRequests",
    "UserNamespacesPodSecurityStandards",
    "UserNamespacesSupport",
    "VolumeAttributesClass",
    "WatchListClient",
    "WindowsHostNetwork",
    "WinDSR",
    "WinOverlay",
];

/// Why a gate could not be set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateError {
    /// Not a gate Gantry or the Go kubelet knows.
    Unrecognized(String),
    /// `Name=value` where value is not a Go boolean.
    InvalidValue { gate: String, value: String },
    /// Not of the form `Name=bool`.
    Malformed(String),
}

impl std::error::Error for GateError {}

impl fmt::Display for GateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateError::Unrecognized(name) => write!(f, "unrecognized feature gate: {name}"),
            GateError::InvalidValue { gate, value } => {
                write!(f, "invalid value {value:?} for feature gate {gate}: expected true or false")
            }
            GateError::Malformed(pair) => {
                write!(f, "malformed feature gate {pair:?}: expected Name=true or Name=false")
            }
        }
    }
}

/// The resolved feature gates: Gantry's defaults plus whatever was set
/// explicitly (config file first, then `--feature-gates` per gate).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    explicit: BTreeMap<String, bool>,
}

impl FeatureGates {
    /// Whether `gate` is on: its explicit setting, else its default.
    pub fn enabled(&self, gate: Gate) -> bool {
        self.explicit.get(gate.name()).copied().unwrap_or(gate.default_enabled())
    }

    /// Sets a gate by name. Accepts Gantry's gates and the upstream-only
    /// names in [`UPSTREAM_ONLY_GATES`]; anything else is
    /// [`GateError::Unrecognized`].
    pub fn set(&mut self, name: &str, enabled: bool) -> Result<(), GateError> {
        if !is_known(name) {
            return Err(GateError::Unrecognized(name.to_string()));
        }
        self.explicit.insert(name.to_string(), enabled);
        Ok(())
    }

    /// Gates set explicitly, by name, sorted.
    pub fn explicit(&self) -> impl Iterator<Item = (&str, bool)> {
        self.explicit.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Explicitly set gates that Gantry does not act on.
    pub fn without_effect(&self) -> Vec<&str> {
        self.explicit.keys().filter(|k| Gate::from_name(k).is_none()).map(String::as_str).collect()
    }
}

impl fmt::Display for FeatureGates {
    /// `Name=true,Other=false` for every Gantry gate (effective value) and
    /// every other explicitly set gate.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut all: BTreeMap<&str, bool> = Gate::ALL.iter().map(|g| (g.name(), self.enabled(*g))).collect();
        for (k, v) in self.explicit() {
            all.insert(k, v);
        }
        let mut first = true;
        for (k, v) in all {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

/// Whether `name` is a gate Gantry accepts (its own or an upstream one).
pub fn is_known(name: &str) -> bool {
    Gate::from_name(name).is_some() || UPSTREAM_ONLY_GATES.contains(&name)
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses one `--feature-gates` value, `A=true,B=false`, the way upstream's
/// `MapStringBool` does: pairs separated by commas, surrounding blanks
/// trimmed, empty pairs skipped, values in Go boolean syntax. Names are not
/// checked here.
pub fn parse_gate_list(value: &str) -> Result<Vec<(String, bool)>, GateError> {
    let mut out = Vec::new();
    for pair in value.split(',') {
        if pair.trim().is_empty() {
            continue;
        }
        let Some((name, v)) = pair.split_once('=') else {
            return Err(GateError::Malformed(pair.trim().to_string()));
        };
        let name = name.trim();
        let v = v.trim();
        if name.is_empty() {
            return Err(GateError::Malformed(pair.trim().to_string()));
        }
        let enabled =
            parse_go_bool(v).ok_or_else(|| GateError::InvalidValue { gate: name.to_string(), value: v.to_string() })?;
        out.push((name.to_string(), enabled));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let g = FeatureGates::default();
        assert!(!g.enabled(Gate::LegacyNodeRunOnceMode));
        assert!(g.enabled(Gate::DisableNodeKubeProxyVersion));
        assert_eq!(
            g.to_string(),
            "DisableNodeKubeProxyVersion=true,GracefulNodeShutdown=true,GracefulNodeShutdownBasedOnPodPriority=true,KubeletPSI=true,LegacyNodeRunOnceMode=false,MemoryQoS=false"
        );
        assert!(g.enabled(Gate::GracefulNodeShutdown) && g.enabled(Gate::GracefulNodeShutdownBasedOnPodPriority));
    }

    #[test]
    fn set_and_query() {
        let mut g = FeatureGates::default();
        g.set("LegacyNodeRunOnceMode", true).unwrap();
        g.set("DisableNodeKubeProxyVersion", false).unwrap();
        g.set("KubeletTracing", true).unwrap();
        assert!(g.enabled(Gate::LegacyNodeRunOnceMode));
        assert!(!g.enabled(Gate::DisableNodeKubeProxyVersion));
        assert_eq!(g.without_effect(), vec!["KubeletTracing"]);
        assert_eq!(
            g.to_string(),
            "DisableNodeKubeProxyVersion=false,GracefulNodeShutdown=true,GracefulNodeShutdownBasedOnPodPriority=true,KubeletPSI=true,KubeletTracing=true,LegacyNodeRunOnceMode=true,MemoryQoS=false"
        );
    }

    #[test]
    fn unknown_gate_rejected_case_sensitively() {
        let mut g = FeatureGates::default();
        let err = g.set("NoSuchGate", true).unwrap_err();
        assert_eq!(err.to_string(), "unrecognized feature gate: NoSuchGate");
        assert!(g.set("legacynoderunoncemode", true).is_err());
    }

    #[test]
    fn gate_list_parsing() {
        assert_eq!(
            parse_gate_list("A=true, B = false,,C=1,D=F").unwrap(),
            vec![("A".to_string(), true), ("B".to_string(), false), ("C".to_string(), true), ("D".to_string(), false)]
        );
        assert_eq!(parse_gate_list("").unwrap(), vec![]);
        assert_eq!(
            parse_gate_list("A=yes").unwrap_err(),
            GateError::InvalidValue { gate: "A".into(), value: "yes".into() }
        );
        assert_eq!(parse_gate_list("A").unwrap_err(), GateError::Malformed("A".into()));
        assert_eq!(parse_gate_list("=true").unwrap_err(), GateError::Malformed("=true".into()));
        let msg = parse_gate_list("A=maybe").unwrap_err().to_string();
        assert!(msg.contains("feature gate A") && msg.contains("maybe"), "{msg}");
    }

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true));
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false));
        }
        for bad in ["", "yes", "on", "tRUE", " true"] {
            assert_eq!(parse_go_bool(bad), None);
        }
    }
}
