//! Desired spec + observed runtime state → the CRI actions to take next.
//!
//! One call to [`compute`] looks at a snapshot and returns everything that should happen now.
//! The worker executes the actions, observes again, and calls it again: the plan converges
//! because every action moves the runtime state towards the spec.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::backoff::{self, Backoff};
use super::probe::{self, Health};
use super::{ContainerInfo, ContainerState, Nanos, ObservedPod, SandboxInfo};
use gantry_vocab::spec::{self, RestartPolicy};

#[derive(Debug, Default, Clone, PartialEq)]
pub struct PodActions {
    /// Stop every container and the sandbox: the pod ran to completion, or its sandbox is gone
    /// and what is left of it must be cleared before a new one is made.
    pub kill_pod: bool,
    /// Create a sandbox with this attempt number.
    pub create_sandbox: Option<u32>,
    pub kill_containers: Vec<Kill>,
    pub start: Vec<Start>,
    /// Containers that should restart but are still in crash-loop backoff.
    pub back_off: Vec<BackingOff>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Kill {
    pub id: String,
    pub name: String,
    pub reason: KillReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// The container's spec changed.
    SpecChanged,
    /// Never started: created but not started, or its start cut off when a previous agent
    /// died (see [`compute`]). Nothing ran, so there are no logs or exit status to keep and the
    /// container is removed, not stopped.
    NeverStarted,
    /// Its state is unknown: stopped before its replacement starts, so two never run at once.
    Stuck,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    pub name: String,
    pub init: bool,
    pub attempt: u32,
    /// When this start restarts a container that exited, when that one finished; the worker
    /// records it in the backoff.
    pub restart_of: Option<Nanos>,
    /// For an ephemeral container with `targetContainerName`: the ID of the target's running
    /// instance, whose process namespace it joins (CRI `NamespaceMode::TARGET`).
    pub target_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackingOff {
    pub name: String,
    pub remaining: Nanos,
    pub delay_message: String,
}

impl PodActions {
    pub fn is_empty(&self) -> bool {
        *self == PodActions::default()
    }

    /// The soonest a backoff expires, i.e. when the pod must be looked at again.
    pub fn next_wake(&self) -> Option<Nanos> {
        self.back_off.iter().map(|b| b.remaining).min()
    }
}

/// Computes the next actions for `pod`. `health` (what the probes report, by container ID)
/// tells when a sidecar has started, which the next init container waits for.
///
/// `agent_started` is when this agent began. A container created before then that exited
/// without ever running had its start cut off by the previous agent's death (the runtime
/// cancels a start whose caller went away): it is replaced at once, with no backoff and
/// whatever the restart policy, as if the start had never been tried. One that fails to
/// start under this agent is a start failure like any other.
pub fn compute(
    pod: &Pod,
    observed: &ObservedPod,
    health: &HashMap<String, Health>,
    backoff: &Backoff,
    now: Nanos,
    agent_started: Nanos,
) -> PodActions {
    let planner = Planner {
        pod,
        observed,
        health,
        backoff,
        now,
        agent_started,
        uid: spec::uid(pod),
        policy: spec::restart_policy(pod),
    };
    match observed.current_sandbox() {
        Some(sandbox) if sandbox.ready && !observed.several_ready() => planner.in_sandbox(sandbox),
        // Several ready sandboxes (one made by an agent cut off mid-start, say) are reconciled
        // as upstream does: everything is stopped and the pod gets one new sandbox.
        previous => planner.without_sandbox(previous),
    }
}

struct Planner<'a> {
    pod: &'a Pod,
    observed: &'a ObservedPod,
    health: &'a HashMap<String, Health>,
    backoff: &'a Backoff,
    now: Nanos,
    agent_started: Nanos,
    uid: &'a str,
    policy: RestartPolicy,
}

impl Planner<'_> {
    fn without_sandbox(&self, previous: Option<&SandboxInfo>) -> PodActions {
        let leftovers = self.observed.running().next().is_some() || self.observed.sandboxes.iter().any(|s| s.ready);
        let mut actions = PodActions { kill_pod: leftovers, ..Default::default() };
        if self.ran_to_completion() {
            return actions;
        }
        actions.create_sandbox = Some(previous.map_or(0, |s| s.attempt + 1));
        match spec::init_containers(self.pod).first() {
            Some(first) => self.start_or_back_off(first, true, &mut actions),
            None => {
                for c in spec::containers(self.pod) {
                    self.start_or_back_off(c, false, &mut actions);
                }
            }
        }
        actions
    }

    /// A pod whose sandbox is gone gets a new one unless its containers already finished
    /// for good (upstream: restartPolicy Never once anything ran, or OnFailure once all
    /// regular containers succeeded).
    fn ran_to_completion(&self) -> bool {
        match self.policy {
            RestartPolicy::Always => false,
            RestartPolicy::Never => !self.observed.containers.is_empty(),
            RestartPolicy::OnFailure => spec::containers(self.pod).iter().all(|c| {
                self.observed.latest(&c.name).is_some_and(|i| i.state == ContainerState::Exited && i.exit_code == 0)
            }),
        }
    }

    fn in_sandbox(&self, sandbox: &SandboxInfo) -> PodActions {
        let mut actions = self.containers_in(sandbox);
        if !actions.kill_pod {
            self.start_ephemeral(sandbox, &mut actions);
        }
        actions
    }

    /// Ephemeral containers start as soon as the sandbox runs (even during initialization),
    /// once each, and are never restarted. One with a target waits until the target runs.
    fn start_ephemeral(&self, sandbox: &SandboxInfo, actions: &mut PodActions) {
        for e in spec::ephemeral_containers(self.pod) {
            if self.observed.latest(&e.name).is_some() {
                continue;
            }
            let target_id = match e.target_container_name.as_deref() {
                None => None,
                Some(target) => match self.observed.latest_in(target, &sandbox.id) {
                    Some(i) if i.state == ContainerState::Running => Some(i.id.clone()),
                    _ => continue,
                },
            };
            actions.start.push(Start { name: e.name.clone(), init: false, attempt: 0, restart_of: None, target_id });
        }
    }

    /// The init, sidecar and regular containers' actions in a running sandbox.
    fn containers_in(&self, sandbox: &SandboxInfo) -> PodActions {
        let mut actions = PodActions::default();
        if !self.init_done(sandbox, &mut actions) {
            return actions;
        }
        let mut alive = 0;
        let mut regular = PodActions::default();
        for c in spec::containers(self.pod) {
            match self.observed.latest_in(&c.name, &sandbox.id) {
                None => self.start_or_back_off(c, false, &mut regular),
                Some(i) if self.never_started(i) => {
                    regular.kill_containers.push(self.replace(i));
                    self.start_or_back_off(c, false, &mut regular);
                }
                Some(i) if i.state == ContainerState::Running => {
                    if spec::hash_matches(c, &i.spec_hash) {
                        alive += 1;
                    } else {
                        regular.kill_containers.push(kill(i, KillReason::SpecChanged));
                        self.start_or_back_off(c, false, &mut regular);
                    }
                }
                Some(i) if i.state == ContainerState::Exited => {
                    if self.policy.restarts(i.exit_code) {
                        self.start_or_back_off(c, false, &mut regular);
                    }
                }
                Some(i) => {
                    regular.kill_containers.push(self.replace(i));
                    self.start_or_back_off(c, false, &mut regular);
                }
            }
        }
        if alive == 0 && regular.start.is_empty() && regular.back_off.is_empty() {
            // The regular containers are done for good: the pod completes, and its sidecars
            // are stopped with it rather than restarted (upstream clears their starts too).
            return PodActions { kill_pod: true, ..Default::default() };
        }
        actions.kill_containers.extend(regular.kill_containers);
        actions.start.extend(regular.start);
        actions.back_off.extend(regular.back_off);
        actions
    }

    /// Walks the init containers in order. Returns true once the pod is initialized (every
    /// regular init container succeeded and every sidecar started, or a regular container ran
    /// in this sandbox); until then fills `actions` with the one step to take next. Sidecars
    /// are kept running (restarted whatever the pod's restart policy) once initialized too.
    fn init_done(&self, sandbox: &SandboxInfo, actions: &mut PodActions) -> bool {
        let initialized =
            spec::containers(self.pod).iter().any(|c| self.observed.latest_in(&c.name, &sandbox.id).is_some());
        for c in spec::init_containers(self.pod) {
            let latest = self.observed.latest_in(&c.name, &sandbox.id);
            if spec::is_sidecar(c) {
                if !self.keep_sidecar(c, latest, actions) && !initialized {
                    return false;
                }
                continue;
            }
            if initialized {
                continue;
            }
            match latest {
                None => {}
                Some(i) if self.never_started(i) => actions.kill_containers.push(self.replace(i)),
                Some(i) if i.state == ContainerState::Running => return false,
                Some(i) if i.state == ContainerState::Exited && i.exit_code == 0 => continue,
                Some(i) if i.state == ContainerState::Exited && self.policy == RestartPolicy::Never => {
                    actions.kill_pod = true;
                    return false;
                }
                Some(i) if i.state == ContainerState::Exited => {}
                Some(i) => actions.kill_containers.push(self.replace(i)),
            }
            self.start_or_back_off(c, true, actions);
            return false;
        }
        true
    }

    /// Keeps a sidecar running: started when missing, restarted (with backoff) after it exited,
    /// replaced when its spec changed or its state is unknown. Returns whether it has started:
    /// running, with its startup probe (if any) passed; its postStart hook returned as part of
    /// the start.
    fn keep_sidecar(&self, c: &Container, latest: Option<&ContainerInfo>, actions: &mut PodActions) -> bool {
        match latest {
            Some(i) if i.state == ContainerState::Running && spec::hash_matches(c, &i.spec_hash) => {
                return probe::status_of(c, true, self.health.get(&i.id)).0;
            }
            Some(i) if i.state == ContainerState::Running => {
                actions.kill_containers.push(kill(i, KillReason::SpecChanged));
            }
            Some(i) if self.never_started(i) || i.state == ContainerState::Unknown => {
                actions.kill_containers.push(self.replace(i));
            }
            _ => {}
        }
        self.start_or_back_off(c, true, actions);
        false
    }

    fn start_or_back_off(&self, c: &Container, init: bool, actions: &mut PodActions) {
        let latest = self.observed.latest(&c.name);
        let attempt = latest.map_or(0, |i| i.attempt + 1);
        let restart_of =
            latest.filter(|i| i.state == ContainerState::Exited && !self.never_started(i)).map(|i| i.finished_at);
        if let Some(finished_at) = restart_of {
            let key = backoff::key(self.uid, &c.name);
            if let Some(remaining) = self.backoff.remaining(&key, finished_at, self.now) {
                actions.back_off.push(BackingOff {
                    name: c.name.clone(),
                    remaining,
                    delay_message: back_off_message(self.backoff.delay(&key), &c.name, self.pod),
                });
                return;
            }
        }
        actions.start.push(Start { name: c.name.clone(), init, attempt, restart_of, target_id: None });
    }

    fn never_started(&self, i: &ContainerInfo) -> bool {
        let cut_off = i.state == ContainerState::Exited && i.started_at == 0 && i.created_at < self.agent_started;
        i.state == ContainerState::Created || cut_off
    }

    /// Clears a container that never started, or whose state is unknown, out of the way of
    /// its next attempt.
    fn replace(&self, i: &ContainerInfo) -> Kill {
        kill(i, if self.never_started(i) { KillReason::NeverStarted } else { KillReason::Stuck })
    }
}

fn kill(i: &ContainerInfo, reason: KillReason) -> Kill {
    Kill { id: i.id.clone(), name: i.name.clone(), reason }
}

/// The upstream CrashLoopBackOff message.
fn back_off_message(delay: Nanos, container: &str, pod: &Pod) -> String {
    format!(
        "back-off {} restarting failed container={container} pod={}",
        format_go_duration(delay),
        spec::format_pod(pod)
    )
}

/// Whole durations the way Go prints them (`10s`, `1m20s`, `5m0s`).
pub fn format_go_duration(nanos: Nanos) -> String {
    let secs = nanos / super::SECOND;
    match (secs / 60, secs % 60) {
        (0, s) => format!("{s}s"),
        (m, s) => format!("{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests;
