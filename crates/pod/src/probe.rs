//! The probe state machine: probe results over time → a container's `started`, `ready` and
//! whether it must be killed, with upstream's thresholds, initial delay and startup gating.
//!
//! Upstream semantics (`pkg/kubelet/prober/worker.go`): a result only changes what is reported
//! once it repeats `successThreshold` / `failureThreshold` times in a row; readiness starts as
//! failure, liveness as success, startup as unknown; liveness and readiness are not probed until
//! the startup probe succeeded, and the startup probe stops then; a liveness or startup failure
//! puts the probe on hold until the container is replaced.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};

use super::{ContainerInfo, ContainerState, Nanos, ObservedPod, SECOND};
use gantry_vocab::spec::{self, RestartPolicy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Startup,
    Liveness,
    Readiness,
}

impl Kind {
    /// As upstream capitalises it in events ("Liveness probe failed: …").
    pub fn title(self) -> &'static str {
        match self {
            Kind::Startup => "Startup",
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
        }
    }

    pub fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            Kind::Startup => c.startup_probe.as_ref(),
            Kind::Liveness => c.liveness_probe.as_ref(),
            Kind::Readiness => c.readiness_probe.as_ref(),
        }
    }
}

/// A probe's timing and thresholds with the API defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub initial_delay: Nanos,
    pub period: Nanos,
    pub timeout: Nanos,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Params {
    pub fn of(p: &Probe) -> Self {
        let secs = |v: Option<i32>, default: i32, min: i32| Nanos::from(v.unwrap_or(default).max(min)) * SECOND;
        let count = |v: Option<i32>, default: i32| v.filter(|v| *v > 0).unwrap_or(default) as u32;
        Params {
            initial_delay: secs(p.initial_delay_seconds, 0, 0),
            period: secs(p.period_seconds, 10, 1),
            timeout: secs(p.timeout_seconds, 1, 1),
            success_threshold: count(p.success_threshold, 1),
            failure_threshold: count(p.failure_threshold, 3),
        }
    }
}

/// What one probe run found. Upstream's `Warning` (e.g. a redirect to another host) counts as
/// success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
}

/// One probe of one container instance.
#[derive(Debug, Clone)]
pub struct Tracker {
    pub kind: Kind,
    pub params: Params,
    /// What is reported; `None` is upstream's "unknown" (startup before its first verdict).
    reported: Option<Outcome>,
    last: Option<Outcome>,
    run: u32,
    on_hold: bool,
    last_probe: Option<Nanos>,
}

impl Tracker {
    pub fn new(kind: Kind, params: Params) -> Self {
        let reported = match kind {
            Kind::Readiness => Some(Outcome::Failure),
            Kind::Liveness => Some(Outcome::Success),
            Kind::Startup => None,
        };
        Tracker { kind, params, reported, last: None, run: 0, on_hold: false, last_probe: None }
    }

    pub fn reported(&self) -> Option<Outcome> {
        self.reported
    }

    /// When this probe runs next (given the container's start and whether it has started), or
    /// `None` while it is on hold or has nothing more to do.
    pub fn next_due(&self, started_at: Nanos, started: bool) -> Option<Nanos> {
        let gated_off = match self.kind {
            Kind::Startup => started,
            Kind::Liveness | Kind::Readiness => !started,
        };
        if self.on_hold || gated_off {
            return None;
        }
        let first = started_at + self.params.initial_delay;
        Some(self.last_probe.map_or(first, |last| (last + self.params.period).max(first)))
    }

    /// Records one probe result; returns the newly reported outcome when it changed.
    pub fn record(&mut self, outcome: Outcome, now: Nanos) -> Option<Outcome> {
        self.last_probe = Some(now);
        if self.last == Some(outcome) {
            self.run += 1;
        } else {
            self.last = Some(outcome);
            self.run = 1;
        }
        let threshold = match outcome {
            Outcome::Success => self.params.success_threshold,
            Outcome::Failure => self.params.failure_threshold,
        };
        if self.run < threshold {
            return None;
        }
        if outcome == Outcome::Failure && self.kind != Kind::Readiness {
            // The container is about to be killed; nothing to probe until it is replaced.
            self.on_hold = true;
            self.run = 0;
        }
        let changed = self.reported != Some(outcome);
        self.reported = Some(outcome);
        changed.then_some(outcome)
    }
}

/// What the probes say about one container instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    pub started: bool,
    pub ready: bool,
    /// A liveness or startup probe failed: the container must be killed.
    pub failed: Option<Kind>,
}

/// The probes of one container instance.
#[derive(Debug, Clone)]
pub struct ContainerProbes {
    pub started_at: Nanos,
    pub trackers: Vec<Tracker>,
}

impl ContainerProbes {
    pub fn new(c: &Container, started_at: Nanos) -> Self {
        let trackers = [Kind::Startup, Kind::Liveness, Kind::Readiness]
            .into_iter()
            .filter_map(|k| k.of(c).map(|p| Tracker::new(k, Params::of(p))))
            .collect();
        ContainerProbes { started_at, trackers }
    }

    fn tracker(&self, kind: Kind) -> Option<&Tracker> {
        self.trackers.iter().find(|t| t.kind == kind)
    }

    pub fn params(&self, kind: Kind) -> Option<Params> {
        self.tracker(kind).map(|t| t.params)
    }

    pub fn health(&self) -> Health {
        let passed = |k: Kind| self.tracker(k).is_none_or(|t| t.reported() == Some(Outcome::Success));
        let failed = |k: Kind| self.tracker(k).is_some_and(|t| t.reported() == Some(Outcome::Failure));
        let started = passed(Kind::Startup);
        Health {
            started,
            ready: started && passed(Kind::Readiness),
            failed: [Kind::Startup, Kind::Liveness].into_iter().find(|k| failed(*k)),
        }
    }

    /// The soonest any probe is due, with its kind.
    pub fn next_due(&self) -> Option<(Nanos, Kind)> {
        let started = self.health().started;
        self.trackers.iter().filter_map(|t| t.next_due(self.started_at, started).map(|at| (at, t.kind))).min()
    }

    /// Records a result; returns the new health when what is reported changed.
    pub fn record(&mut self, kind: Kind, outcome: Outcome, now: Nanos) -> Option<Health> {
        let tracker = self.trackers.iter_mut().find(|t| t.kind == kind)?;
        tracker.record(outcome, now).map(|_| self.health())
    }
}

/// `started` and `ready` for a container's status. Without a report from its prober yet, a
/// container with a startup probe has not started and one with a readiness probe is not ready.
pub fn status_of(c: &Container, running: bool, health: Option<&Health>) -> (bool, bool) {
    if !running {
        return (false, false);
    }
    match health {
        Some(h) => (h.started, h.ready),
        None => {
            let started = c.startup_probe.is_none();
            (started, started && c.readiness_probe.is_none())
        }
    }
}

/// A running container to kill because a liveness or startup probe failed, with the upstream
/// `Killing` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeKill {
    pub id: String,
    pub name: String,
    pub kind: Kind,
    pub message: String,
}

/// Running containers whose current instance failed a liveness or startup probe, with
/// upstream's `Killing` message: a regular container's says whether the pod's restart policy
/// brings it back; a sidecar's names it an init container (it always comes back).
pub fn kills(pod: &Pod, observed: &ObservedPod, health: &HashMap<String, Health>) -> Vec<ProbeKill> {
    let running = |i: &&ContainerInfo| i.state == ContainerState::Running;
    let restarts = spec::restart_policy(pod) != RestartPolicy::Never;
    observed
        .containers
        .iter()
        .filter(running)
        .filter_map(|i| {
            let kind = health.get(&i.id)?.failed?;
            let what = if kind == Kind::Startup { "startup" } else { "liveness" };
            let sidecar = spec::sidecars(pod).any(|c| c.name == i.name);
            let message = match sidecar {
                true => format!("Init container {} failed {what} probe", i.name),
                false if restarts => format!("Container {} failed {what} probe, will be restarted", i.name),
                false => format!("Container {} failed {what} probe", i.name),
            };
            Some(ProbeKill { id: i.id.clone(), name: i.name.clone(), kind, message })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;

    fn probe(delay: i32, period: i32, success: i32, failure: i32) -> Probe {
        Probe {
            initial_delay_seconds: Some(delay),
            period_seconds: Some(period),
            success_threshold: Some(success),
            failure_threshold: Some(failure),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_follow_the_api() {
        let p = Params::of(&Probe::default());
        assert_eq!(
            p,
            Params {
                initial_delay: 0,
                period: 10 * SECOND,
                timeout: SECOND,
                success_threshold: 1,
                failure_threshold: 3
            }
        );
    }

    #[test]
    fn failure_is_reported_only_after_the_threshold_in_a_row() {
        let mut t = Tracker::new(Kind::Liveness, Params::of(&probe(0, 1, 1, 3)));
        assert_eq!(t.record(Outcome::Failure, 1), None);
        assert_eq!(t.record(Outcome::Failure, 2), None);
        assert_eq!(t.record(Outcome::Success, 3), None, "already reported as success");
        assert_eq!(t.record(Outcome::Failure, 4), None, "the run starts again");
        assert_eq!(t.record(Outcome::Failure, 5), None);
        assert_eq!(t.record(Outcome::Failure, 6), Some(Outcome::Failure));
        assert_eq!(t.next_due(0, true), None, "liveness failure puts the probe on hold");
    }

    #[test]
    fn readiness_starts_unready_and_needs_success_threshold() {
        let mut t = Tracker::new(Kind::Readiness, Params::of(&probe(0, 1, 2, 1)));
        assert_eq!(t.reported(), Some(Outcome::Failure));
        assert_eq!(t.record(Outcome::Success, 1), None);
        assert_eq!(t.record(Outcome::Success, 2), Some(Outcome::Success));
        assert_eq!(t.record(Outcome::Failure, 3), Some(Outcome::Failure));
        assert!(t.next_due(0, true).is_some(), "readiness keeps probing after a failure");
    }

    #[test]
    fn initial_delay_then_period() {
        let mut t = Tracker::new(Kind::Readiness, Params::of(&probe(5, 10, 1, 3)));
        let start = 100 * SECOND;
        assert_eq!(t.next_due(start, true), Some(start + 5 * SECOND));
        t.record(Outcome::Success, start + 5 * SECOND);
        assert_eq!(t.next_due(start, true), Some(start + 15 * SECOND));
    }

    #[test]
    fn startup_gates_liveness_and_readiness() {
        let c = Container {
            startup_probe: Some(probe(0, 1, 1, 2)),
            liveness_probe: Some(probe(0, 1, 1, 1)),
            readiness_probe: Some(probe(0, 1, 1, 1)),
            ..Default::default()
        };
        let mut probes = ContainerProbes::new(&c, 0);
        assert_eq!(probes.health(), Health { started: false, ready: false, failed: None });
        assert_eq!(probes.next_due(), Some((0, Kind::Startup)), "only the startup probe runs");
        let h = probes.record(Kind::Startup, Outcome::Success, SECOND).unwrap();
        assert!(h.started && !h.ready, "readiness still has to pass");
        let due: Vec<Kind> = probes
            .trackers
            .iter()
            .filter(|t| t.next_due(0, true).is_some() && t.kind != Kind::Startup)
            .map(|t| t.kind)
            .collect();
        assert_eq!(due, [Kind::Liveness, Kind::Readiness]);
        assert_eq!(probes.trackers[0].next_due(0, true), None, "startup stops once started");
        let h = probes.record(Kind::Readiness, Outcome::Success, 2 * SECOND).unwrap();
        assert!(h.ready);
        let h = probes.record(Kind::Liveness, Outcome::Failure, 3 * SECOND).unwrap();
        assert_eq!(h.failed, Some(Kind::Liveness));
    }

    #[test]
    fn startup_failure_asks_for_a_kill() {
        let c = Container { startup_probe: Some(probe(0, 1, 1, 1)), ..Default::default() };
        let mut probes = ContainerProbes::new(&c, 0);
        let h = probes.record(Kind::Startup, Outcome::Failure, SECOND).unwrap();
        assert_eq!(h.failed, Some(Kind::Startup));
        assert!(!h.started);
    }

    #[test]
    fn status_without_a_prober_report() {
        let plain = Container::default();
        assert_eq!(status_of(&plain, true, None), (true, true));
        assert_eq!(status_of(&plain, false, None), (false, false));
        let gated = Container { readiness_probe: Some(Probe::default()), ..Default::default() };
        assert_eq!(status_of(&gated, true, None), (true, false));
        let slow = Container { startup_probe: Some(Probe::default()), ..Default::default() };
        assert_eq!(status_of(&slow, true, None), (false, false));
    }

    #[test]
    fn kills_name_the_failed_probe() {
        let info = |id: &str, name: &str, state| ContainerInfo {
            sandbox_id: "s".into(),
            ..ContainerInfo::fixture(id, name, state)
        };
        let observed = ObservedPod {
            sandboxes: vec![],
            containers: vec![info("a", "web", ContainerState::Running), info("b", "old", ContainerState::Exited)],
        };
        let failed = Health { failed: Some(Kind::Liveness), ..Default::default() };
        let health = HashMap::from([("a".to_string(), failed), ("b".to_string(), failed)]);
        let policy = |p: &str| Pod {
            spec: Some(PodSpec {
                restart_policy: Some(p.into()),
                init_containers: Some(vec![Container {
                    name: "proxy".into(),
                    restart_policy: Some("Always".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let found = kills(&policy("Always"), &observed, &health);
        assert_eq!(found.len(), 1, "exited containers are not killed again");
        assert_eq!(found[0].message, "Container web failed liveness probe, will be restarted");
        assert_eq!(kills(&policy("Never"), &observed, &health)[0].message, "Container web failed liveness probe");
        let sidecar = ObservedPod { sandboxes: vec![], containers: vec![info("a", "proxy", ContainerState::Running)] };
        assert_eq!(kills(&policy("Never"), &sidecar, &health)[0].message, "Init container proxy failed liveness probe");
    }
}
