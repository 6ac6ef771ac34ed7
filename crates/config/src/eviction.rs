//! Node-pressure eviction beyond `evictionHard` (which lives in `Settings` with the node's
//! allocatable): `evictionSoft` with `evictionSoftGracePeriod`, `evictionMaxPodGracePeriod`,
//! `evictionMinimumReclaim`, `evictionPressureTransitionPeriod` and
//! `localStorageCapacityIsolation`, with upstream's validation.

use std::collections::BTreeMap;
use std::time::Duration;

use super::cluster;
use super::duration::GoDuration;
use super::file::KubeletConfiguration;
use super::flags::Flags;
use super::{ConfigError, Problem};

type Invalid<'a> = &'a dyn Fn(&str, Problem) -> ConfigError;

/// Upstream's default `evictionPressureTransitionPeriod`.
pub const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionSettings {
    /// `evictionSoft`: signal → threshold, each with a grace period.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`: signal → Go duration (validated).
    pub soft_grace_period: BTreeMap<String, String>,
    /// `evictionMaxPodGracePeriod`, default 0: the grace of a pod evicted for a soft threshold.
    pub max_pod_grace_period: i64,
    /// `evictionMinimumReclaim`: signal → quantity or percentage.
    pub minimum_reclaim: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod`, default 5m.
    pub pressure_transition_period: Duration,
    /// `localStorageCapacityIsolation`, default true: ephemeral-storage limits and emptyDir
    /// `sizeLimit` evict.
    pub local_storage_capacity_isolation: bool,
}

impl Default for EvictionSettings {
    fn default() -> Self {
        EvictionSettings {
            soft: BTreeMap::new(),
            soft_grace_period: BTreeMap::new(),
            max_pod_grace_period: 0,
            minimum_reclaim: BTreeMap::new(),
            pressure_transition_period: DEFAULT_PRESSURE_TRANSITION_PERIOD,
            local_storage_capacity_isolation: true,
        }
    }
}

/// A Go duration as the soft grace periods are written (`30s`, `1m30s`).
pub fn parse_grace(text: &str) -> Option<Duration> {
    GoDuration::parse(text).ok().filter(|d| !d.is_negative()).and_then(GoDuration::to_std)
}

/// The settings as one input gives them (the config file, or the flags), and the names its
/// errors use.
struct Input {
    soft: Option<BTreeMap<String, String>>,
    soft_grace_period: Option<BTreeMap<String, String>>,
    minimum_reclaim: Option<BTreeMap<String, String>>,
    max_pod_grace_period: Option<i32>,
    pressure_transition_period: Option<GoDuration>,
    local_storage_capacity_isolation: Option<bool>,
    /// evictionSoft, evictionSoftGracePeriod, evictionMinimumReclaim, evictionMaxPodGracePeriod,
    /// evictionPressureTransitionPeriod in this input's spelling.
    names: [&'static str; 5],
}

impl EvictionSettings {
    pub(super) fn apply_file(&mut self, c: &KubeletConfiguration, invalid: Invalid) -> Result<(), ConfigError> {
        self.apply(
            Input {
                soft: c.eviction_soft.clone(),
                soft_grace_period: c.eviction_soft_grace_period.clone(),
                minimum_reclaim: c.eviction_minimum_reclaim.clone(),
                max_pod_grace_period: c.eviction_max_pod_grace_period,
                pressure_transition_period: c.eviction_pressure_transition_period,
                local_storage_capacity_isolation: c.local_storage_capacity_isolation,
                names: [
                    "evictionSoft",
                    "evictionSoftGracePeriod",
                    "evictionMinimumReclaim",
                    "evictionMaxPodGracePeriod",
                    "evictionPressureTransitionPeriod",
                ],
            },
            invalid,
        )
    }

    /// The flags override the file, as upstream's flag precedence.
    pub(super) fn apply_flags(&mut self, f: &Flags, invalid: Invalid) -> Result<(), ConfigError> {
        let list = |values: &[String], separator: char, flag: &str| -> Result<_, ConfigError> {
            if values.is_empty() {
                return Ok(None);
            }
            let mut map = BTreeMap::new();
            for value in values {
                map.extend(cluster::parse_key_value_list(value, separator).map_err(|e| invalid(flag, e.into()))?);
            }
            Ok(Some(map))
        };
        self.apply(
            Input {
                soft: list(&f.eviction_soft, '<', "--eviction-soft")?,
                soft_grace_period: list(&f.eviction_soft_grace_period, '=', "--eviction-soft-grace-period")?,
                minimum_reclaim: list(&f.eviction_minimum_reclaim, '=', "--eviction-minimum-reclaim")?,
                max_pod_grace_period: f.eviction_max_pod_grace_period,
                pressure_transition_period: f.eviction_pressure_transition_period,
                local_storage_capacity_isolation: None,
                names: [
                    "--eviction-soft",
                    "--eviction-soft-grace-period",
                    "--eviction-minimum-reclaim",
                    "--eviction-max-pod-grace-period",
                    "--eviction-pressure-transition-period",
                ],
            },
            invalid,
        )
    }

    fn apply(&mut self, input: Input, invalid: Invalid) -> Result<(), ConfigError> {
        let [soft_name, grace_name, reclaim_name, max_grace_name, transition_name] = input.names;
        if let Some(map) = input.soft {
            cluster::check_eviction(&map).map_err(|e| invalid(soft_name, e.into()))?;
            self.soft = map;
        }
        if let Some(map) = input.soft_grace_period {
            cluster::check_signals(&map).map_err(|e| invalid(grace_name, e.into()))?;
            if let Some((signal, value)) = map.iter().find(|(_, v)| parse_grace(v).is_none()) {
                return Err(invalid(
                    grace_name,
                    format!("invalid grace period {value:?} for {signal}: must be a non-negative duration").into(),
                ));
            }
            self.soft_grace_period = map;
        }
        if let Some(signal) = self.soft.keys().find(|s| !self.soft_grace_period.contains_key(*s)) {
            return Err(invalid(
                grace_name,
                format!("grace period must be specified for the soft eviction threshold {signal}").into(),
            ));
        }
        if let Some(map) = input.minimum_reclaim {
            cluster::check_minimum_reclaim(&map).map_err(|e| invalid(reclaim_name, e.into()))?;
            self.minimum_reclaim = map;
        }
        match input.max_pod_grace_period {
            Some(n) if n < 0 => {
                return Err(invalid(
                    max_grace_name,
                    format!("invalid configuration: {max_grace_name} {n} must not be negative").into(),
                ));
            }
            Some(n) => self.max_pod_grace_period = i64::from(n),
            None => {}
        }
        if let Some(d) = input.pressure_transition_period {
            if d.is_negative() {
                return Err(invalid(
                    transition_name,
                    format!("invalid configuration: {transition_name} {d} must not be negative").into(),
                ));
            }
            // Zero is upstream's "unset": the default applies.
            if let Some(d) = d.to_std().filter(|d| !d.is_zero()) {
                self.pressure_transition_period = d;
            }
        }
        if let Some(on) = input.local_storage_capacity_isolation {
            self.local_storage_capacity_isolation = on;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Input;

    fn apply(yaml: &str) -> Result<EvictionSettings, ConfigError> {
        let c: KubeletConfiguration = serde_yaml_ng::from_str(yaml).unwrap();
        let mut s = EvictionSettings::default();
        let invalid = |field: &str, problem: Problem| ConfigError::InvalidValue {
            input: Input::CommandLine,
            field: field.to_string(),
            problem: Box::new(problem),
        };
        s.apply_file(&c, &invalid).map(|()| s)
    }

    #[test]
    fn defaults_and_values() {
        assert_eq!(apply("{}").unwrap(), EvictionSettings::default());
        let s = apply(
            "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 1m30s}\n\
             evictionMaxPodGracePeriod: 20\nevictionMinimumReclaim: {nodefs.available: 5%}\n\
             evictionPressureTransitionPeriod: 10s\nlocalStorageCapacityIsolation: false\n",
        )
        .unwrap();
        assert_eq!(s.soft["memory.available"], "1Gi");
        assert_eq!(parse_grace(&s.soft_grace_period["memory.available"]), Some(Duration::from_secs(90)));
        assert_eq!(s.max_pod_grace_period, 20);
        assert_eq!(s.pressure_transition_period, Duration::from_secs(10));
        assert!(!s.local_storage_capacity_isolation);
    }

    #[test]
    fn errors_name_the_field() {
        let err = |yaml: &str| apply(yaml).unwrap_err().to_string();
        let missing = err("evictionSoft: {memory.available: 1Gi}\n");
        assert!(
            missing.contains("evictionSoftGracePeriod")
                && missing.contains("grace period must be specified for the soft eviction threshold memory.available"),
            "{missing}"
        );
        assert!(err("evictionSoft: {memory.free: 1Gi}\n").contains("evictionSoft"));
        assert!(err("evictionSoftGracePeriod: {memory.available: soon}\n").contains("evictionSoftGracePeriod"));
        assert!(err("evictionMinimumReclaim: {nodefs.available: 101%}\n").contains("evictionMinimumReclaim"));
        assert!(err("evictionMaxPodGracePeriod: -1\n").contains("evictionMaxPodGracePeriod"));
        assert!(err("evictionPressureTransitionPeriod: -1s\n").contains("evictionPressureTransitionPeriod"));
    }
}
