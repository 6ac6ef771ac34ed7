//! The API `PodStatus` a pod has, computed from its spec and the runtime's view of it.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::probe::{self, Health};
use super::{ContainerInfo, ContainerState, Nanos, ObservedPod};
use gantry_vocab::spec::{self, RestartPolicy};

/// Why a container is not running, as learned while syncing (image errors, backoff, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

pub struct Input<'a> {
    pub pod: &'a Pod,
    pub observed: &'a ObservedPod,
    /// Waiting reasons from the last sync, by container name.
    pub waiting: &'a HashMap<String, Waiting>,
    /// What the probes report, by container ID.
    pub health: &'a HashMap<String, Health>,
    /// `runtimeName` from CRI Version, the prefix of container IDs (`containerd://…`).
    pub runtime_name: &'a str,
    /// The runtime handler supports recursive read-only mounts.
    pub recursive_read_only: bool,
    pub host_ip: Option<&'a str>,
    pub start_time: Option<Nanos>,
    /// The previous status, so condition transition times only move on a change.
    pub previous: Option<&'a PodStatus>,
    pub now: Nanos,
}

/// The status of the pod. `observedGeneration`, on the status and on the conditions Gantry owns,
/// is the generation it was computed from (gate `PodObservedGenerationTracking`, beta and on in
/// 1.34).
pub fn compute(input: &Input) -> PodStatus {
    let init_statuses: Vec<ContainerStatus> =
        spec::init_containers(input.pod).iter().map(|c| container_status(input, c, true)).collect();
    let statuses: Vec<ContainerStatus> =
        spec::containers(input.pod).iter().map(|c| container_status(input, c, false)).collect();
    // Ephemeral containers are reported but count for neither phase nor readiness.
    let ephemeral: Vec<ContainerStatus> = spec::ephemeral_containers(input.pod)
        .iter()
        .map(|e| ContainerStatus {
            ready: false,
            started: None,
            ..container_status(input, &spec::ephemeral_as_container(e), false)
        })
        .collect();
    let phase = phase(input, &init_statuses, &statuses);
    let conditions = conditions(input, &init_statuses, &statuses, phase);
    let pod_ip = pod_ip(input);
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: input.host_ip.map(str::to_string),
        host_ips: input.host_ip.map(|ip| vec![HostIP { ip: ip.to_string() }]),
        pod_ips: pod_ip.as_ref().map(|ip| vec![PodIP { ip: ip.clone() }]),
        pod_ip,
        start_time: input.start_time.map(time),
        qos_class: Some(super::qos::class(input.pod).as_str().to_string()),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(statuses),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        observed_generation: input.pod.metadata.generation,
        ..Default::default()
    }
}

fn pod_ip(input: &Input) -> Option<String> {
    if spec::host_network(input.pod) {
        return input.host_ip.map(str::to_string);
    }
    input.observed.current_sandbox().filter(|s| s.ready).and_then(|s| s.ip.clone())
}

fn container_status(input: &Input, c: &Container, init: bool) -> ContainerStatus {
    let latest = input.observed.latest(&c.name);
    let reported_wait = input.waiting.get(&c.name);
    let (state, last_state) = match latest {
        None => (waiting(reported_wait.cloned().unwrap_or_else(|| default_waiting(input.pod, init))), None),
        Some(i) => match i.state {
            ContainerState::Running => (running(i), previous_terminated(input, c)),
            ContainerState::Exited => match reported_wait {
                Some(w) => (waiting(w.clone()), Some(terminated(i, input.runtime_name))),
                None => (terminated(i, input.runtime_name), previous_terminated(input, c)),
            },
            ContainerState::Created | ContainerState::Unknown => {
                (waiting(reported_wait.cloned().unwrap_or_else(|| default_waiting(input.pod, init))), None)
            }
        },
    };
    let is_running = latest.is_some_and(|i| i.state == ContainerState::Running);
    let (started, ready) = probe::status_of(c, is_running, latest.and_then(|i| input.health.get(&i.id)));
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: latest.map(|i| i.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|i| format!("{}://{}", input.runtime_name, i.id)),
        restart_count: latest.map_or(0, |i| i.attempt as i32),
        // A regular init container is ready once it completed; a sidecar, like a regular
        // container, when its probes say so.
        ready: if init && !spec::is_sidecar(c) {
            latest.is_some_and(|i| i.state == ContainerState::Exited && i.exit_code == 0)
        } else {
            ready
        },
        started: Some(started),
        state: Some(state),
        last_state: last_state.or_else(|| Some(ApiState::default())),
        volume_mounts: container_fields::volume_mounts(c, input.recursive_read_only),
        user: latest.and_then(|i| container_fields::user(i.user.as_ref())),
        resources: latest.filter(|_| is_running).map(|i| container_fields::resources(c, &i.applied)),
        ..Default::default()
    }
}

fn default_waiting(pod: &Pod, init: bool) -> Waiting {
    let reason = if !init && !spec::init_containers(pod).is_empty() { "PodInitializing" } else { "ContainerCreating" };
    Waiting { reason: reason.to_string(), message: String::new() }
}

fn waiting(w: Waiting) -> ApiState {
    ApiState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(w.reason),
            message: (!w.message.is_empty()).then_some(w.message),
        }),
        ..Default::default()
    }
}

fn running(i: &ContainerInfo) -> ApiState {
    ApiState { running: Some(ContainerStateRunning { started_at: Some(time(i.started_at)) }), ..Default::default() }
}

fn terminated(i: &ContainerInfo, runtime_name: &str) -> ApiState {
    let reason = match i.reason.as_str() {
        "" if i.exit_code == 0 => "Completed",
        "" => "Error",
        r => r,
    };
    ApiState {
        terminated: Some(ContainerStateTerminated {
            exit_code: i.exit_code,
            reason: Some(reason.to_string()),
            message: (!i.message.is_empty()).then(|| i.message.clone()),
            started_at: (i.started_at > 0).then(|| time(i.started_at)),
            finished_at: (i.finished_at > 0).then(|| time(i.finished_at)),
            container_id: Some(format!("{runtime_name}://{}", i.id)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn previous_terminated(input: &Input, c: &Container) -> Option<ApiState> {
    input
        .observed
        .previous(&c.name)
        .filter(|p| p.state == ContainerState::Exited)
        .map(|p| terminated(p, input.runtime_name))
}

/// The pod phase, following the Go kubelet's rules (`getPhase`) for a pod that is not being
/// deleted. Sidecars count as running while they run and as pending initialization until they
/// started; their exits never decide the phase.
fn phase(input: &Input, init: &[ContainerStatus], regular: &[ContainerStatus]) -> &'static str {
    let policy = spec::restart_policy(input.pod);
    let any_regular_started = regular.iter().any(|s| s.restart_count > 0 || has_run(s));
    let mut pending_init = 0;
    let mut failed_init = 0;
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for (c, s) in spec::init_containers(input.pod).iter().zip(init) {
        if spec::is_sidecar(c) {
            let state = s.state.as_ref();
            if state.is_some_and(|st| st.running.is_some()) {
                running += 1;
                pending_init += usize::from(s.started != Some(true));
            } else if state.is_some_and(|st| st.waiting.is_some()) && exit_of(s).is_none() {
                pending_init += 1;
            }
            continue;
        }
        match exit_of(s) {
            Some(0) => {}
            Some(_) => failed_init += 1,
            None => pending_init += 1,
        }
    }
    for s in regular {
        let state = s.state.as_ref();
        if state.is_some_and(|st| st.running.is_some()) {
            running += 1;
        } else if let Some(code) = exit_of(s) {
            stopped += 1;
            succeeded += usize::from(code == 0);
        } else {
            waiting += 1;
        }
    }
    if failed_init > 0 && policy == RestartPolicy::Never {
        return "Failed";
    }
    if (pending_init > 0 && !any_regular_started) || waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped == 0 {
        return "Pending";
    }
    match policy {
        RestartPolicy::Always => "Running",
        _ if stopped == succeeded => "Succeeded",
        RestartPolicy::Never => "Failed",
        RestartPolicy::OnFailure => "Running",
    }
}

fn has_run(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.running.is_some() || st.terminated.is_some())
}

/// The exit code of the container's last run: the current terminated state, or the last
/// termination of a container that waits to restart.
fn exit_of(s: &ContainerStatus) -> Option<i32> {
    let current = s.state.as_ref().and_then(|st| st.terminated.as_ref());
    let waiting_after_exit = s.state.as_ref().is_some_and(|st| st.waiting.is_some());
    let last = s.last_state.as_ref().and_then(|st| st.terminated.as_ref()).filter(|_| waiting_after_exit);
    current.or(last).map(|t| t.exit_code)
}

fn conditions(input: &Input, init: &[ContainerStatus], regular: &[ContainerStatus], phase: &str) -> Vec<PodCondition> {
    let sandbox_ready = input.observed.current_sandbox().is_some_and(|s| s.ready);
    // A sidecar counts as initialized once started, a regular init container once completed.
    let sidecar_status = || spec::init_containers(input.pod).iter().zip(init).map(|(c, s)| (spec::is_sidecar(c), s));
    let incomplete: Vec<&str> = sidecar_status()
        .filter(|(sidecar, s)| if *sidecar { s.started != Some(true) } else { !s.ready })
        .map(|(_, s)| s.name.as_str())
        .collect();
    let initialized = incomplete.is_empty() || regular.iter().any(has_run);
    // Sidecars' readiness counts as the regular containers' does, listed first as upstream.
    let sidecars = sidecar_status().filter(|(sidecar, _)| *sidecar).map(|(_, s)| s);
    let unready: Vec<&str> = sidecars.chain(regular).filter(|s| !s.ready).map(|s| s.name.as_str()).collect();
    let containers_ready = match phase {
        "Succeeded" => cond(false, "PodCompleted", ""),
        "Failed" => cond(false, "PodFailed", ""),
        _ if unready.is_empty() => cond(true, "", ""),
        _ => cond(false, "ContainersNotReady", &format!("containers with unready status: [{}]", unready.join(" "))),
    };
    let initialized = if initialized {
        cond(true, if phase == "Succeeded" { "PodCompleted" } else { "" }, "")
    } else {
        cond(
            false,
            "ContainersNotInitialized",
            &format!("containers with incomplete status: [{}]", incomplete.join(" ")),
        )
    };
    let mut conditions: Vec<PodCondition> = [
        ("PodReadyToStartContainers", cond(sandbox_ready, "", "")),
        ("Initialized", initialized),
        ("Ready", containers_ready.clone()),
        ("ContainersReady", containers_ready),
        ("PodScheduled", cond(true, "", "")),
    ]
    .into_iter()
    .map(|(type_, c)| condition(input, type_, c))
    .collect();
    conditions.extend(foreign_conditions(input.pod));
    conditions
}

/// Whether a newer copy of a pod changes anything a sync reads. A copy whose only changes are
/// its resource version, its managed fields and the kubelet's own part of its status (the
/// pod's own status write coming back from the API server) needs no sync: upstream's pod
/// config calls that a reconcile, not an update. Conditions other components own (readiness
/// gates, `DisruptionTarget`) go into the status, so a change to them does need one.
pub fn needs_sync(old: &Pod, new: &Pod) -> bool {
    let bookkeeping_aside =
        |pod: &Pod| ObjectMeta { resource_version: None, managed_fields: None, ..pod.metadata.clone() };
    old.spec != new.spec
        || bookkeeping_aside(old) != bookkeeping_aside(new)
        || !foreign_conditions(old).eq(foreign_conditions(new))
}

/// Conditions others set on the pod (e.g. `DisruptionTarget`, readiness gates); the status
/// keeps them.
fn foreign_conditions(pod: &Pod) -> impl Iterator<Item = PodCondition> + '_ {
    let existing = pod.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    existing.iter().filter(|c| !is_kubelet_condition(c)).cloned()
}

/// Whether the kubelet owns the condition (upstream's `PodConditionByKubelet`): its status
/// writes replace it, while others' conditions are kept.
pub fn is_kubelet_condition(condition: &PodCondition) -> bool {
    // The resize conditions are the kubelet's too; the worker adds them (`resize`).
    const OWNED: [&str; 7] = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
        "PodResizePending",
        "PodResizeInProgress",
    ];
    OWNED.contains(&condition.type_.as_str())
}

#[derive(Clone)]
struct Cond {
    status: bool,
    reason: String,
    message: String,
}

fn cond(status: bool, reason: &str, message: &str) -> Cond {
    Cond { status, reason: reason.to_string(), message: message.to_string() }
}

fn condition(input: &Input, type_: &str, c: Cond) -> PodCondition {
    let status = if c.status { "True" } else { "False" }.to_string();
    let previous =
        input.previous.and_then(|p| p.conditions.as_ref()).and_then(|cs| cs.iter().find(|pc| pc.type_ == type_));
    let transition = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Some(time(input.now)),
    };
    PodCondition {
        type_: type_.to_string(),
        status,
        reason: (!c.reason.is_empty()).then_some(c.reason),
        message: (!c.message.is_empty()).then_some(c.message),
        last_transition_time: transition,
        observed_generation: input.pod.metadata.generation,
        ..Default::default()
    }
}

/// Nanoseconds since the epoch as an API timestamp (whole seconds, as the API serialises).
pub fn time(nanos: Nanos) -> Time {
    Time(Timestamp::from_second(nanos / super::SECOND).unwrap_or(Timestamp::UNIX_EPOCH))
}

mod container_fields;

#[cfg(test)]
mod tests;
