//! The controller's Prometheus metrics: maintenances per stage, eviction requests by result,
//! and how long drains take (Drain stage start → Drained, both read from the status, so a
//! restarted controller measures a drain it continued correctly).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use gantry_maintenance::api::{NodeMaintenance, Stage};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// How an eviction request ended, for `gantry_maintenance_evictions_total{result}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionResult {
    Accepted,
    /// 429: a PodDisruptionBudget refused it.
    Refused,
    /// Any other error.
    Failed,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    maintenances: Family<StageLabel, Gauge>,
    evictions: Family<ResultLabel, Counter>,
    drain_duration: Histogram,
}

const STAGES: [(Stage, &str); 4] =
    [(Stage::Idle, "Idle"), (Stage::Cordon, "Cordon"), (Stage::Drain, "Drain"), (Stage::Complete, "Complete")];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let maintenances = Family::<StageLabel, Gauge>::default();
        let evictions = Family::<ResultLabel, Counter>::default();
        // 1 s to ~4.5 h: drains wait on PDBs and graceful terminations.
        let drain_duration = Histogram::new(exponential_buckets(1.0, 2.0, 15));
        registry.register("gantry_maintenance_maintenances", "NodeMaintenance objects by stage", maintenances.clone());
        registry.register(
            "gantry_maintenance_evictions",
            "Eviction requests made (result=attempted counts every request; refused: a PodDisruptionBudget \
             refused it (429); failed: any other error)",
            evictions.clone(),
        );
        registry.register(
            "gantry_maintenance_drain_duration_seconds",
            "Time from the start of the Drain stage to the Drained condition",
            drain_duration.clone(),
        );
        for (_, stage) in STAGES {
            maintenances.get_or_create(&StageLabel { stage }).set(0);
        }
        for result in ["attempted", "refused", "failed"] {
            evictions.get_or_create(&ResultLabel { result }).get();
        }
        Metrics { registry: Mutex::new(registry), maintenances, evictions, drain_duration }
    }

    /// Sets the per-stage gauge from all maintenances (deleting ones count as Complete).
    pub fn observe_maintenances(&self, all: &[NodeMaintenance]) {
        for (stage, label) in STAGES {
            let count = all
                .iter()
                .filter(
                    |m| if m.metadata.deletion_timestamp.is_some() { Stage::Complete } else { m.spec.stage } == stage,
                )
                .count();
            self.maintenances.get_or_create(&StageLabel { stage: label }).set(count as i64);
        }
    }

    pub fn eviction(&self, result: EvictionResult) {
        self.evictions.get_or_create(&ResultLabel { result: "attempted" }).inc();
        let label = match result {
            EvictionResult::Accepted => return,
            EvictionResult::Refused => "refused",
            EvictionResult::Failed => "failed",
        };
        self.evictions.get_or_create(&ResultLabel { result: label }).inc();
    }

    pub fn drained_after(&self, seconds: f64) {
        self.drain_duration.observe(seconds.max(0.0));
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_maintenance::fixtures;

    #[test]
    fn exposition_has_every_stage_and_result_even_at_zero() {
        let text = Metrics::new().encode();
        for line in [
            "gantry_maintenance_maintenances{stage=\"Drain\"} 0",
            "gantry_maintenance_evictions_total{result=\"refused\"} 0",
            "gantry_maintenance_drain_duration_seconds_count 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn evictions_count_attempts_and_outcomes() {
        let metrics = Metrics::new();
        metrics.eviction(EvictionResult::Accepted);
        metrics.eviction(EvictionResult::Refused);
        metrics.eviction(EvictionResult::Failed);
        let text = metrics.encode();
        assert!(text.contains("gantry_maintenance_evictions_total{result=\"attempted\"} 3"), "{text}");
        assert!(text.contains("gantry_maintenance_evictions_total{result=\"refused\"} 1"), "{text}");
        assert!(text.contains("gantry_maintenance_evictions_total{result=\"failed\"} 1"), "{text}");
    }

    #[test]
    fn stage_gauge_counts_deleting_maintenances_as_complete() {
        let metrics = Metrics::new();
        let draining = fixtures::maintenance("a", &["n1"], Stage::Drain, vec![]);
        let mut deleting = fixtures::maintenance("b", &["n1"], Stage::Drain, vec![]);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        metrics.observe_maintenances(&[draining, deleting]);
        let text = metrics.encode();
        assert!(text.contains("gantry_maintenance_maintenances{stage=\"Drain\"} 1"), "{text}");
        assert!(text.contains("gantry_maintenance_maintenances{stage=\"Complete\"} 1"), "{text}");
    }
}
