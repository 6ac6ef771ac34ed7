//! Probers: one tokio task per running container that has probes. Each runs its container's
//! startup, liveness and readiness probes on their schedule, feeds the results to the pure
//! state machine (`pod::probe`), records `Unhealthy`/`ProbeWarning` events, and wakes the pod
//! worker whenever what the probes report changes, so status and kills follow promptly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Shared;
use super::worker::{Msg, now};
use crate::events::EventType;
use crate::runtime::handlers::{self, Target};
use crate::runtime::http_get::Verdict;
use gantry_pod::probe::{ContainerProbes, Health, Kind, Outcome};
use gantry_pod::{ContainerState, ObservedPod};
use gantry_vocab::spec;

/// What the probes report, by container ID.
type HealthMap = Arc<Mutex<HashMap<String, Health>>>;

/// The probers of one pod; dropping it stops them.
pub struct Probers {
    tasks: HashMap<String, JoinHandle<()>>,
    health: HealthMap,
    /// Weak, so the worker's channel still closes when its handle goes.
    wake: mpsc::WeakUnboundedSender<Msg>,
}

impl Probers {
    pub fn new(wake: &mpsc::UnboundedSender<Msg>) -> Self {
        Probers { tasks: HashMap::new(), health: HealthMap::default(), wake: wake.downgrade() }
    }

    /// Starts probers for running containers with probes and stops those whose container
    /// is no longer running.
    pub fn sync(&mut self, pod: &Pod, observed: &ObservedPod, shared: &Arc<Shared>) {
        let pod_ip = observed.current_sandbox().and_then(|s| s.ip.clone());
        let mut wanted = Vec::new();
        // Sidecars are probed like regular containers; run-to-completion init containers never.
        for c in spec::sidecars(pod).chain(spec::containers(pod)).filter(|c| has_probes(c)) {
            let Some(info) = observed.latest(&c.name).filter(|i| i.state == ContainerState::Running) else { continue };
            wanted.push(info.id.clone());
            if !self.tasks.contains_key(&info.id) {
                let task = Task {
                    shared: shared.clone(),
                    pod: pod.clone(),
                    container: c.clone(),
                    container_id: info.id.clone(),
                    pod_ip: pod_ip.clone(),
                    health: self.health.clone(),
                    wake: self.wake.clone(),
                };
                let probes = ContainerProbes::new(c, info.started_at);
                self.tasks.insert(info.id.clone(), tokio::spawn(task.run(probes)));
            }
        }
        self.tasks.retain(|id, task| {
            let keep = wanted.contains(id);
            if !keep {
                task.abort();
            }
            keep
        });
        self.health.lock().unwrap().retain(|id, _| wanted.contains(id));
    }

    pub fn health(&self) -> HashMap<String, Health> {
        self.health.lock().unwrap().clone()
    }
}

impl Drop for Probers {
    fn drop(&mut self) {
        for task in self.tasks.values() {
            task.abort();
        }
    }
}

fn has_probes(c: &Container) -> bool {
    c.startup_probe.is_some() || c.liveness_probe.is_some() || c.readiness_probe.is_some()
}

struct Task {
    shared: Arc<Shared>,
    pod: Pod,
    container: Container,
    container_id: String,
    pod_ip: Option<String>,
    health: HealthMap,
    wake: mpsc::WeakUnboundedSender<Msg>,
}

impl Task {
    async fn run(self, mut probes: ContainerProbes) {
        self.health.lock().unwrap().insert(self.container_id.clone(), probes.health());
        // Nothing due: every probe is done or on hold until the container is replaced.
        while let Some((due, kind)) = probes.next_due() {
            let wait = Duration::from_nanos(due.saturating_sub(now()).max(0) as u64);
            tokio::time::sleep(wait).await;
            let timeout =
                probes.params(kind).map_or(Duration::from_secs(1), |p| Duration::from_nanos(p.timeout as u64));
            let outcome = self.probe_once(kind, timeout).await;
            let result = if outcome == Outcome::Success { "successful" } else { "failed" };
            gantry_metrics::record_probe(
                &self.shared.metrics,
                kind.title(),
                result,
                &self.container.name,
                spec::name(&self.pod),
                spec::namespace(&self.pod),
                spec::uid(&self.pod),
            );
            if let Some(health) = probes.record(kind, outcome, now()) {
                tracing::info!(pod = %spec::full_name(&self.pod), container = %self.container.name, probe = kind.title(), ?health, "probe result changed");
                self.health.lock().unwrap().insert(self.container_id.clone(), health);
                if let Some(wake) = self.wake.upgrade() {
                    let _ = wake.send(Msg::Wake);
                }
            }
        }
    }

    async fn probe_once(&self, kind: Kind, timeout: Duration) -> Outcome {
        let Some(probe) = kind.of(&self.container) else { return Outcome::Failure };
        let cri = &self.shared.driver.cri().runtime;
        let target = Target::new(cri, &self.container_id, &self.container, &self.pod, self.pod_ip.as_deref());
        let event = |reason: &str, message: String| {
            self.shared.events.record(&self.pod, Some(&self.container.name), EventType::Warning, reason, &message)
        };
        match handlers::probe(target, probe, timeout).await {
            Ok(Verdict::Success(_)) => Outcome::Success,
            Ok(Verdict::Warning(output)) => {
                event("ProbeWarning", format!("{} probe warning: {output}", kind.title()));
                Outcome::Success
            }
            Ok(Verdict::Failure(output)) => {
                event("Unhealthy", format!("{} probe failed: {output}", kind.title()));
                Outcome::Failure
            }
            Err(e) => {
                event("Unhealthy", format!("{} probe errored: {e}", kind.title()));
                Outcome::Failure
            }
        }
    }
}
