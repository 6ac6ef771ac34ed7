//! In-place pod resize (KEP-1287), as a v1.34 kubelet decides it.
//!
//! Four sets of resources per container: *desired* (the API spec), *allocated* (admitted by
//! this node, checkpointed), *actuated*/*actual* (what the runtime applied, read back from CRI
//! `ContainerStatus.resources`). Here: whether a desired change is admitted
//! ([`admit`]), what each container needs to reach its allocation ([`container_action`]), in
//! which order the pod cgroup moves around the containers ([`pod_cgroup_steps`]), and the
//! memory-limit-decrease rule ([`memory_decrease_refused`]).

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition};
use k8s_openapi::serde_json::{self, json};

use crate::Nanos;

use crate::requests::{cpu, memory};
use crate::resources::{self, CgroupValues};

/// CPU (millicores) and memory (bytes) requests of a pod or a set of pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Amounts {
    pub cpu_milli: i128,
    pub memory: i128,
}

impl std::ops::Add for Amounts {
    type Output = Amounts;
    fn add(self, o: Amounts) -> Amounts {
        Amounts { cpu_milli: self.cpu_milli + o.cpu_milli, memory: self.memory + o.memory }
    }
}

impl std::iter::Sum for Amounts {
    fn sum<I: Iterator<Item = Amounts>>(iter: I) -> Amounts {
        iter.fold(Amounts::default(), |a, b| a + b)
    }
}

/// What a pod requests of the node (upstream `PodRequests`: sidecars and init containers by
/// the same formula as the pod cgroup).
pub fn pod_requests(pod: &Pod) -> Amounts {
    Amounts {
        cpu_milli: resources::pod_total(pod, |c| cpu(c).request),
        memory: resources::pod_total(pod, |c| memory(c).request),
    }
}

/// Why a resize waits (the `PodResizePending` condition's reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// Never fits this node; not retried.
    Infeasible,
    /// Fits the node but not next to the other pods now; retried when resources free up.
    Deferred,
}

impl Pending {
    pub fn as_str(self) -> &'static str {
        match self {
            Pending::Infeasible => "Infeasible",
            Pending::Deferred => "Deferred",
        }
    }
}

/// The allocation decision for a desired resize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    Accept,
    Pending(Pending, String),
}

/// Upstream's resize admission: above the node's allocatable is `Infeasible` ("Node didn't
/// have enough capacity"); above what the other pods' allocations leave is `Deferred`, with
/// the resource-fit admit handler's message. CPU is checked before memory, CPU in millicores,
/// memory in bytes.
pub fn admit(desired: Amounts, others: Amounts, allocatable: Amounts) -> Admission {
    let rows = [
        ("cpu", desired.cpu_milli, others.cpu_milli, allocatable.cpu_milli),
        ("memory", desired.memory, others.memory, allocatable.memory),
    ];
    for (name, want, _, cap) in rows {
        if want > cap {
            let message = format!("Node didn't have enough capacity: {name}, requested: {want}, capacity: {cap}");
            return Admission::Pending(Pending::Infeasible, message);
        }
    }
    for (name, want, used, cap) in rows {
        if want + used > cap {
            let message =
                format!("Node didn't have enough resource: {name}, requested: {want}, used: {used}, capacity: {cap}");
            return Admission::Pending(Pending::Deferred, message);
        }
    }
    Admission::Accept
}

/// What a running container needs to match its allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerResize {
    /// The runtime already applies the allocation.
    None,
    /// CRI `UpdateContainerResources` with the allocated values.
    Update,
    /// A changed resource's `resizePolicy` is `RestartContainer`: restart it (it is created
    /// again with the allocated values). Takes precedence over `NotRequired`.
    Restart,
}

/// A resource's `resizePolicy` restart policy; `NotRequired` unless set.
fn restarts_for(c: &Container, resource: &str) -> bool {
    c.resize_policy.iter().flatten().any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
}

/// Compares the allocated container's cgroup values with what the runtime reports applied
/// (`applied`, zero where unset). Only values that reach the container's cgroup count: CPU
/// shares and quota, memory limit.
pub fn container_action(allocated: &Container, applied: &CgroupValues) -> ContainerResize {
    let want = resources::container(allocated);
    let unlimited = |v: i64| if v <= 0 { 0 } else { v };
    let cpu_changed =
        want.cpu_shares != applied.cpu_shares || unlimited(want.cpu_quota) != unlimited(applied.cpu_quota);
    let memory_changed = unlimited(want.memory_limit) != unlimited(applied.memory_limit);
    if (cpu_changed && restarts_for(allocated, "cpu")) || (memory_changed && restarts_for(allocated, "memory")) {
        ContainerResize::Restart
    } else if cpu_changed || memory_changed {
        ContainerResize::Update
    } else {
        ContainerResize::None
    }
}

/// The pod cgroup's values before and after the containers are updated (the KEP's ordering):
/// every limit that grows is raised first, so no container's new limit exceeds its pod's; every
/// limit that shrinks is lowered last, once the containers fit under it. Quota and memory limit
/// 0 mean unlimited.
pub fn pod_cgroup_steps(old: &CgroupValues, new: &CgroupValues) -> (CgroupValues, CgroupValues) {
    let larger_limit = |a: i64, b: i64| if a <= 0 || b <= 0 { 0 } else { a.max(b) };
    let mut before = *new;
    before.cpu_shares = old.cpu_shares.max(new.cpu_shares);
    before.memory_limit = larger_limit(old.memory_limit, new.memory_limit);
    before.cpu_quota = larger_limit(old.cpu_quota, new.cpu_quota);
    if before.cpu_quota > 0 {
        before.cpu_period = resources::CPU_PERIOD_US;
    } else {
        before.cpu_period = 0;
    }
    (before, *new)
}

/// The memory-limit-decrease rule of 1.33+ for `NotRequired` containers (best effort, as the
/// KEP states it): when the container's current memory usage is above the new limit, the
/// update is skipped for that container and the pod keeps `PodResizeInProgress` with reason
/// `Error` and this message, retried on the next sync. (`RestartContainer` restarts instead.)
pub fn memory_decrease_refused(container: &str, new_limit: i64, usage: u64) -> Option<String> {
    (new_limit > 0 && usage > new_limit as u64).then(|| {
        format!("attempting to set container {container:?} memory limit ({new_limit}) below current usage ({usage})")
    })
}

pub const PENDING_CONDITION: &str = "PodResizePending";
pub const IN_PROGRESS_CONDITION: &str = "PodResizeInProgress";
/// `PodResizeInProgress` reason when applying the resize failed.
pub const ERROR_REASON: &str = "Error";

/// A resize condition (always status True while present); the transition time stays while
/// the condition does.
pub fn condition(
    type_: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Nanos,
    previous: Option<&PodCondition>,
) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: "True".into(),
        reason: (!reason.is_empty()).then(|| reason.to_string()),
        message: (!message.is_empty()).then(|| message.to_string()),
        last_transition_time: previous
            .and_then(|p| p.last_transition_time.clone())
            .or_else(|| Some(crate::status::time(now))),
        observed_generation: generation,
        ..Default::default()
    }
}

/// The message of upstream's resize events: `<prefix>: {"initContainers":[…],"containers":[…],
/// "generation":N,"error":"…"}` with each container's name and resources from `pod`.
pub fn event_message(prefix: &str, pod: &Pod, generation: i64, error: &str) -> String {
    let list = |cs: &[Container]| -> Vec<serde_json::Value> {
        cs.iter().map(|c| json!({"name": c.name, "resources": c.resources.clone().unwrap_or_default()})).collect()
    };
    // Fields in upstream's order (a JSON map here would sort them).
    let mut fields = Vec::new();
    for (key, cs) in [
        ("initContainers", gantry_vocab::spec::init_containers(pod)),
        ("containers", gantry_vocab::spec::containers(pod)),
    ] {
        if !cs.is_empty() {
            fields.push(format!("{key:?}:{}", serde_json::Value::from(list(cs))));
        }
    }
    fields.push(format!("\"generation\":{generation}"));
    if !error.is_empty() {
        fields.push(format!("\"error\":{}", serde_json::Value::from(error)));
    }
    format!("{prefix}: {{{}}}", fields.join(","))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerResizePolicy, PodSpec};

    use super::*;
    use crate::requests::tests::container as res;

    #[test]
    fn admission_is_infeasible_above_allocatable_and_deferred_above_what_is_free() {
        let alloc = Amounts { cpu_milli: 2000, memory: 4 << 30 };
        let others = Amounts { cpu_milli: 1500, memory: 1 << 30 };
        assert_eq!(admit(Amounts { cpu_milli: 500, memory: 1 << 30 }, others, alloc), Admission::Accept);
        assert_eq!(
            admit(Amounts { cpu_milli: 3000, memory: 8 << 30 }, others, alloc),
            Admission::Pending(
                Pending::Infeasible,
                "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000".into()
            ),
        );
        assert_eq!(
            admit(Amounts { cpu_milli: 100, memory: 8 << 30 }, others, alloc),
            Admission::Pending(
                Pending::Infeasible,
                "Node didn't have enough capacity: memory, requested: 8589934592, capacity: 4294967296".into()
            ),
        );
        assert_eq!(
            admit(Amounts { cpu_milli: 600, memory: 1 << 30 }, others, alloc),
            Admission::Pending(
                Pending::Deferred,
                "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000".into()
            ),
        );
    }

    #[test]
    fn pod_requests_add_regular_containers_and_sidecars() {
        let mut sidecar = res(&[("cpu", "100m"), ("memory", "64Mi")], &[]);
        sidecar.restart_policy = Some("Always".into());
        let pod = Pod {
            spec: Some(PodSpec {
                init_containers: Some(vec![sidecar]),
                containers: vec![res(&[("cpu", "250m")], &[("memory", "128Mi")])],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(pod_requests(&pod), Amounts { cpu_milli: 350, memory: 192 << 20 });
    }

    fn applied(c: &Container) -> CgroupValues {
        resources::container(c)
    }

    #[test]
    fn a_container_is_updated_in_place_unless_its_policy_says_restart() {
        let before = res(&[("cpu", "100m")], &[("cpu", "200m"), ("memory", "128Mi")]);
        let now = applied(&before);
        assert_eq!(container_action(&before, &now), ContainerResize::None);

        let cpu_up = res(&[("cpu", "100m")], &[("cpu", "400m"), ("memory", "128Mi")]);
        assert_eq!(container_action(&cpu_up, &now), ContainerResize::Update);
        let mut memory_down = res(&[("cpu", "100m")], &[("cpu", "200m"), ("memory", "64Mi")]);
        assert_eq!(container_action(&memory_down, &now), ContainerResize::Update);

        let policy =
            |r: &str| ContainerResizePolicy { resource_name: r.into(), restart_policy: "RestartContainer".into() };
        memory_down.resize_policy = Some(vec![policy("memory")]);
        assert_eq!(container_action(&memory_down, &now), ContainerResize::Restart);
        // The policy only counts for the resource that changed.
        let mut cpu_up_memory_restart = cpu_up.clone();
        cpu_up_memory_restart.resize_policy = Some(vec![policy("memory")]);
        assert_eq!(container_action(&cpu_up_memory_restart, &now), ContainerResize::Update);
    }

    #[test]
    fn an_unlimited_quota_reads_the_same_as_none() {
        let c = res(&[("cpu", "100m")], &[]);
        let reported = CgroupValues { cpu_quota: -1, ..applied(&c) };
        assert_eq!(container_action(&c, &reported), ContainerResize::None);
    }

    #[test]
    fn the_pod_cgroup_grows_before_the_containers_and_shrinks_after() {
        let old = CgroupValues {
            cpu_shares: 204,
            cpu_quota: 20_000,
            cpu_period: 100_000,
            memory_limit: 256 << 20,
            pids_limit: 0,
            memory_min: 0,
        };
        // CPU up, memory down: raise CPU first, lower memory last.
        let new = CgroupValues { cpu_shares: 409, cpu_quota: 40_000, memory_limit: 128 << 20, ..old };
        let (before, after) = pod_cgroup_steps(&old, &new);
        assert_eq!((before.cpu_shares, before.cpu_quota, before.memory_limit), (409, 40_000, 256 << 20));
        assert_eq!(after, new);
        // From unlimited to limited: unlimited until the containers are limited.
        let unlimited = CgroupValues { memory_limit: 0, ..old };
        assert_eq!(pod_cgroup_steps(&unlimited, &new).0.memory_limit, 0);
    }

    #[test]
    fn event_messages_summarise_the_resources_as_upstream() {
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container { name: "app".into(), ..res(&[("cpu", "100m")], &[]) }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            event_message("Pod resize started", &pod, 2, ""),
            r#"Pod resize started: {"containers":[{"name":"app","resources":{"requests":{"cpu":"100m"}}}],"generation":2}"#
        );
        assert!(event_message("Pod resize error", &pod, 2, "boom").ends_with(r#""generation":2,"error":"boom"}"#));
    }

    #[test]
    fn a_condition_keeps_its_transition_time() {
        let first = condition(PENDING_CONDITION, "Deferred", "m", Some(2), 10 * crate::SECOND, None);
        assert_eq!(first.status, "True");
        let later = condition(PENDING_CONDITION, "Deferred", "n", Some(3), 99 * crate::SECOND, Some(&first));
        assert_eq!(later.last_transition_time, first.last_transition_time);
        assert_eq!((later.observed_generation, later.message.as_deref()), (Some(3), Some("n")));
    }

    #[test]
    fn a_memory_limit_is_not_lowered_below_current_usage() {
        assert_eq!(memory_decrease_refused("app", 64 << 20, 32 << 20), None);
        assert_eq!(
            memory_decrease_refused("app", 64 << 20, 100 << 20).as_deref(),
            Some(r#"attempting to set container "app" memory limit (67108864) below current usage (104857600)"#)
        );
    }
}
