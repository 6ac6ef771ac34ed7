//! Graceful node shutdown: `shutdownGracePeriod`, `shutdownGracePeriodCriticalPods` and
//! `shutdownGracePeriodByPodPriority`, with upstream's validation.

use std::time::Duration;

use super::file::KubeletConfiguration;
use super::gates::{FeatureGates, Gate};
use super::{ConfigError, Problem};

type Invalid<'a> = &'a dyn Fn(&str, Problem) -> ConfigError;

/// One `shutdownGracePeriodByPodPriority` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityGrace {
    pub priority: i32,
    pub seconds: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownSettings {
    /// `shutdownGracePeriod`, default 0 (off).
    pub grace_period: Duration,
    /// `shutdownGracePeriodCriticalPods`, default 0: the part of `grace_period` kept for
    /// critical pods.
    pub grace_period_critical_pods: Duration,
    /// `shutdownGracePeriodByPodPriority`: replaces the two above when given.
    pub grace_period_by_pod_priority: Vec<PriorityGrace>,
}

impl ShutdownSettings {
    pub(super) fn apply_file(
        &mut self,
        c: &KubeletConfiguration,
        gates: &FeatureGates,
        invalid: Invalid,
    ) -> Result<(), ConfigError> {
        let period = c.shutdown_grace_period.unwrap_or_default();
        let critical = c.shutdown_grace_period_critical_pods.unwrap_or_default();
        if period.is_negative() || critical.is_negative() || critical > period {
            return Err(invalid(
                "shutdownGracePeriod",
                format!(
                    "invalid configuration: shutdownGracePeriod {period} must be >= 0, shutdownGracePeriodCriticalPods \
                     {critical} must be >= 0, and shutdownGracePeriodCriticalPods {critical} must be <= \
                     shutdownGracePeriod {period}"
                )
                .into(),
            ));
        }
        for (field, d) in [("shutdownGracePeriod", period), ("shutdownGracePeriodCriticalPods", critical)] {
            let d_std = d.to_std().unwrap_or_default();
            if !d_std.is_zero() && d_std < Duration::from_secs(1) {
                return Err(invalid(
                    field,
                    format!("invalid configuration: {field} {d} must be either zero or otherwise >= 1 sec").into(),
                ));
            }
        }
        if (!period.is_zero() || !critical.is_zero()) && !gates.enabled(Gate::GracefulNodeShutdown) {
            return Err(invalid(
                "shutdownGracePeriod",
                "invalid configuration: Specifying shutdownGracePeriod or shutdownGracePeriodCriticalPods requires \
                 feature gate GracefulNodeShutdown"
                    .into(),
            ));
        }
        let list = c.shutdown_grace_period_by_pod_priority.as_deref().unwrap_or_default();
        if !list.is_empty() {
            if !gates.enabled(Gate::GracefulNodeShutdownBasedOnPodPriority) {
                return Err(invalid(
                    "shutdownGracePeriodByPodPriority",
                    "invalid configuration: Specifying shutdownGracePeriodByPodPriority requires feature gate \
                     GracefulNodeShutdownBasedOnPodPriority"
                        .into(),
                ));
            }
            if !period.is_zero() || !critical.is_zero() {
                return Err(invalid(
                    "shutdownGracePeriodByPodPriority",
                    "invalid configuration: Cannot specify both shutdownGracePeriodByPodPriority and \
                     shutdownGracePeriod at the same time"
                        .into(),
                ));
            }
        }
        let mut by_priority = Vec::with_capacity(list.len());
        for (i, entry) in list.iter().enumerate() {
            let seconds = entry.shutdown_grace_period_seconds.unwrap_or_default();
            if seconds < 0 {
                return Err(invalid(
                    &format!("shutdownGracePeriodByPodPriority[{i}].shutdownGracePeriodSeconds"),
                    format!("{seconds} must not be negative").into(),
                ));
            }
            by_priority.push(PriorityGrace { priority: entry.priority.unwrap_or_default(), seconds });
        }
        self.grace_period = period.to_std().unwrap_or_default();
        self.grace_period_critical_pods = critical.to_std().unwrap_or_default();
        self.grace_period_by_pod_priority = by_priority;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConfigError, Input};

    fn apply(yaml: &str, gates: &FeatureGates) -> Result<ShutdownSettings, ConfigError> {
        let c: KubeletConfiguration = serde_yaml_ng::from_str(yaml).unwrap();
        let invalid = |field: &str, problem: Problem| ConfigError::InvalidValue {
            input: Input::CommandLine,
            field: field.to_string(),
            problem: Box::new(problem),
        };
        let mut s = ShutdownSettings::default();
        s.apply_file(&c, gates, &invalid)?;
        Ok(s)
    }

    #[test]
    fn grace_periods_are_read() {
        let s = apply("shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n", &FeatureGates::default());
        let s = s.unwrap();
        assert_eq!((s.grace_period, s.grace_period_critical_pods), (Duration::from_secs(30), Duration::from_secs(10)));
        let s = apply(
            "shutdownGracePeriodByPodPriority: [{priority: 100, shutdownGracePeriodSeconds: 10}, {priority: 0}]\n",
            &FeatureGates::default(),
        )
        .unwrap();
        assert_eq!(
            s.grace_period_by_pod_priority,
            [PriorityGrace { priority: 100, seconds: 10 }, PriorityGrace { priority: 0, seconds: 0 }]
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        let gates = FeatureGates::default();
        let err = |yaml| apply(yaml, &gates).unwrap_err().to_string();
        assert!(
            err("shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n")
                .contains("shutdownGracePeriodCriticalPods 20s must be <= shutdownGracePeriod 10s")
        );
        assert!(err("shutdownGracePeriod: -1s\n").contains("shutdownGracePeriod -1s must be >= 0"));
        assert!(err("shutdownGracePeriod: 500ms\n").contains("must be either zero or otherwise >= 1 sec"));
        assert!(
            err("shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority: [{priority: 1, shutdownGracePeriodSeconds: 1}]\n")
                .contains("Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod")
        );
        assert!(
            err("shutdownGracePeriodByPodPriority: [{priority: 1, shutdownGracePeriodSeconds: -1}]\n")
                .contains("shutdownGracePeriodByPodPriority[0].shutdownGracePeriodSeconds")
        );
        let mut off = FeatureGates::default();
        off.set("GracefulNodeShutdownBasedOnPodPriority", false).unwrap();
        let e = apply("shutdownGracePeriodByPodPriority: [{priority: 1, shutdownGracePeriodSeconds: 1}]\n", &off);
        assert!(e.unwrap_err().to_string().contains("requires feature gate GracefulNodeShutdownBasedOnPodPriority"));
    }
}
