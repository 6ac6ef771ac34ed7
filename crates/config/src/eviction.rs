//! Node-pressure eviction beyond `evictionHard` (which lives in `Settings` with the node's
//! allocatable): `evictionSoft` with `evictionSoftGracePeriod`, `evictionMaxPodGracePeriod`,
//! `evictionMinimumReclaim`, `evictionPressureTransitionPeriod` and
//! `localStorageCapacityIsolation`, with upstream's validation.

use std::collections::BTreeMap;
use std::time::Duration;

use super::cluster;
use super::duration::GoDuration;
use super::file::KubeletConfiguration;
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

impl EvictionSettings {
    pub(super) fn apply_file(&mut self, c: &KubeletConfiguration, invalid: Invalid) -> Result<(), ConfigError> {
        if let Some(map) = &c.eviction_soft {
            cluster::check_eviction(map).map_err(|e| invalid("evictionSoft", e.into()))?;
            self.soft = map.clone();
        }
        if let Some(map) = &c.eviction_soft_grace_period {
            cluster::check_signals(map).map_err(|e| invalid("evictionSoftGracePeriod", e.into()))?;
            if let Some((signal, value)) = map.iter().find(|(_, v)| parse_grace(v).is_none()) {
                return Err(invalid(
                    "evictionSoftGracePeriod",
                    format!("invalid grace period {value:?} for {signal}: must be a non-negative duration").into(),
                ));
            }
            self.soft_grace_period = map.clone();
        }
        if let Some(signal) = self.soft.keys().find(|s| !self.soft_grace_period.contains_key(*s)) {
            return Err(invalid(
                "evictionSoftGracePeriod",
                format!("grace period must be specified for the soft eviction threshold {signal}").into(),
            ));
        }
        if let Some(map) = &c.eviction_minimum_reclaim {
            cluster::check_minimum_reclaim(map).map_err(|e| invalid("evictionMinimumReclaim", e.into()))?;
            self.minimum_reclaim = map.clone();
        }
        match c.eviction_max_pod_grace_period {
            Some(n) if n < 0 => {
                return Err(invalid(
                    "evictionMaxPodGracePeriod",
                    format!("invalid configuration: evictionMaxPodGracePeriod {n} must not be negative").into(),
                ));
            }
            Some(n) => self.max_pod_grace_period = i64::from(n),
            None => {}
        }
        if let Some(d) = c.eviction_pressure_transition_period {
            // Zero is upstream's "unset": the default applies.
            if d.is_negative() {
                return Err(invalid(
                    "evictionPressureTransitionPeriod",
                    format!("invalid configuration: evictionPressureTransitionPeriod {d} must not be negative").into(),
                ));
            }
            if let Some(d) = d.to_std().filter(|d| !d.is_zero()) {
                self.pressure_transition_period = d;
            }
        }
        if let Some(on) = c.local_storage_capacity_isolation {
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
