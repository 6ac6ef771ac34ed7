//! Graceful node shutdown, the pure part (upstream's node shutdown manager): the priority
//! groups from the configuration, which pods stop in which group and with what grace, and the
//! status a pod is left with.
//!
//! Pods stop group by group, lowest priority first; a group's pods stop together, each with
//! the smaller of its own `terminationGracePeriodSeconds` and the group's window, and the next
//! group starts when they all stopped or the window is over.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use gantry_vocab::spec;

/// The pod status reason of a pod stopped for a node shutdown.
pub const REASON: &str = "Terminated";
/// The pod status message (and `DisruptionTarget` condition message) of such a pod.
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// Why a pod that arrives while the node shuts down is not admitted.
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// What the Node's Ready condition says while the node shuts down.
pub const NODE_NOT_READY_MESSAGE: &str = "node is shutting down";
/// The Node event reason, with the two messages upstream records.
pub const EVENT_REASON: &str = "NodeShutdown";
pub const EVENT_SHUTDOWN: &str = "Shutdown manager detected shutdown event";
pub const EVENT_CANCELLED: &str = "Shutdown manager detected shutdown cancellation";

/// Upstream's `scheduling.SystemCriticalPriority` (system-cluster-critical).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One `shutdownGracePeriodByPodPriority` entry: pods from `priority` up (to the next
/// group's) get `seconds` to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub priority: i32,
    pub seconds: i64,
}

/// The groups, lowest priority first: `by_priority` when given, else the two that
/// `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` make (regular pods get the
/// difference, critical pods the critical period). Empty: graceful shutdown is off.
pub fn groups(grace_period: Duration, critical: Duration, by_priority: &[Group]) -> Vec<Group> {
    let mut groups = if by_priority.is_empty() { migrate(grace_period, critical) } else { by_priority.to_vec() };
    groups.sort_by_key(|g| g.priority);
    groups
}

fn migrate(grace_period: Duration, critical: Duration) -> Vec<Group> {
    if grace_period.is_zero() || critical > grace_period {
        return Vec::new();
    }
    let regular = (grace_period - critical).as_secs() as i64;
    vec![
        Group { priority: 0, seconds: regular },
        Group { priority: SYSTEM_CRITICAL_PRIORITY, seconds: critical.as_secs() as i64 },
    ]
}

/// The whole shutdown's length: what logind's `InhibitDelayMaxSec` must allow.
pub fn requested(groups: &[Group]) -> Duration {
    Duration::from_secs(groups.iter().map(|g| g.seconds.max(0) as u64).sum())
}

/// One pod to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    pub uid: String,
    /// `namespace/name`, for logs.
    pub name: String,
    /// The smaller of the pod's `terminationGracePeriodSeconds` and the group's window.
    pub grace_seconds: i64,
}

/// The pods of one group and how long the group may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub priority: i32,
    pub window: Duration,
    pub kills: Vec<Kill>,
}

/// The stages of a shutdown, in order; groups without pods are left out (nobody waits for
/// them). Pods already finished (`Succeeded`, `Failed`) are not active and are not stopped.
pub fn plan(groups: &[Group], pods: &[Pod]) -> Vec<Stage> {
    let mut stages: Vec<Stage> = groups
        .iter()
        .map(|g| Stage {
            priority: g.priority,
            window: Duration::from_secs(g.seconds.max(0) as u64),
            kills: Vec::new(),
        })
        .collect();
    if stages.is_empty() {
        return stages;
    }
    for pod in pods.iter().filter(|p| is_active(p)) {
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let i = group_of(groups, priority);
        let own = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds);
        let grace_seconds = match own {
            Some(own) if own <= groups[i].seconds => own,
            _ => groups[i].seconds,
        };
        stages[i].kills.push(Kill { uid: spec::uid(pod).to_string(), name: spec::full_name(pod), grace_seconds });
    }
    stages.retain(|s| !s.kills.is_empty());
    stages
}

/// The group with the largest priority not above `priority`; a priority below every group's
/// goes to the first, one above every group's to the last.
fn group_of(groups: &[Group], priority: i32) -> usize {
    groups.iter().rposition(|g| g.priority <= priority).unwrap_or(0)
}

fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The status of a pod stopped for the shutdown: `Failed` (unless it had already
/// `Succeeded`), reason `Terminated` with upstream's message, and the `DisruptionTarget`
/// condition (reason `TerminationByKubelet`) on top of what `status` says.
pub fn stopped_status(mut status: PodStatus, generation: Option<i64>, now: Time) -> PodStatus {
    if status.phase.as_deref() != Some("Succeeded") {
        status.phase = Some("Failed".into());
    }
    status.reason = Some(REASON.into());
    status.message = Some(MESSAGE.into());
    crate::eviction::set_disruption_target(&mut status, generation, MESSAGE, now);
    status
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn pod(name: &str, priority: Option<i32>, grace: Option<i64>, phase: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec { priority, termination_grace_period_seconds: grace, ..Default::default() }),
            status: phase.map(|p| PodStatus { phase: Some(p.into()), ..Default::default() }),
        }
    }

    fn names(stage: &Stage) -> Vec<(&str, i64)> {
        stage.kills.iter().map(|k| (k.name.as_str(), k.grace_seconds)).collect()
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn grace_periods_make_a_regular_and_a_critical_group() {
        assert_eq!(
            groups(S(30), S(10), &[]),
            vec![Group { priority: 0, seconds: 20 }, Group { priority: SYSTEM_CRITICAL_PRIORITY, seconds: 10 }]
        );
        assert_eq!(requested(&groups(S(30), S(10), &[])), S(30));
        assert_eq!(groups(S(10), S(0), &[])[0], Group { priority: 0, seconds: 10 });
        assert!(groups(S(0), S(0), &[]).is_empty(), "shutdownGracePeriod 0: off");
        assert!(groups(S(5), S(10), &[]).is_empty(), "critical longer than the whole: off, as upstream");
    }

    #[test]
    fn by_priority_wins_and_is_sorted() {
        let list = [Group { priority: 100_000, seconds: 5 }, Group { priority: 0, seconds: 30 }];
        let g = groups(S(30), S(10), &list);
        assert_eq!(g, vec![Group { priority: 0, seconds: 30 }, Group { priority: 100_000, seconds: 5 }]);
        assert_eq!(requested(&g), S(35));
    }

    #[test]
    fn pods_join_the_highest_group_not_above_their_priority() {
        let g = [
            Group { priority: 10, seconds: 5 },
            Group { priority: 100, seconds: 6 },
            Group { priority: 1000, seconds: 7 },
        ];
        let pods = [
            pod("below-all", Some(1), None, None),
            pod("at-10", Some(10), None, None),
            pod("between", Some(999), None, None),
            pod("at-1000", Some(1000), None, None),
            pod("above-all", Some(i32::MAX), None, None),
            pod("none", None, None, None),
        ];
        let stages = plan(&g, &pods);
        assert_eq!(stages.len(), 3);
        assert_eq!(names(&stages[0]), [("default/below-all", 5), ("default/at-10", 5), ("default/none", 5)]);
        assert_eq!(names(&stages[1]), [("default/between", 6)]);
        assert_eq!(names(&stages[2]), [("default/at-1000", 7), ("default/above-all", 7)]);
        assert_eq!(stages.iter().map(|s| s.window).collect::<Vec<_>>(), [S(5), S(6), S(7)]);
    }

    #[test]
    fn regular_pods_stop_before_critical_ones_with_the_smaller_grace() {
        let g = groups(S(20), S(8), &[]);
        let pods = [
            pod("critical", Some(2_000_001_000), Some(30), None),
            pod("quick", None, Some(3), None),
            pod("slow", Some(1000), Some(60), None),
            pod("done", None, None, Some("Succeeded")),
            pod("failed", None, None, Some("Failed")),
        ];
        let stages = plan(&g, &pods);
        assert_eq!(stages.len(), 2, "{stages:?}");
        assert_eq!((stages[0].priority, stages[0].window), (0, S(12)));
        assert_eq!(names(&stages[0]), [("default/quick", 3), ("default/slow", 12)], "finished pods are left alone");
        assert_eq!((stages[1].priority, stages[1].window), (SYSTEM_CRITICAL_PRIORITY, S(8)));
        assert_eq!(names(&stages[1]), [("default/critical", 8)]);
    }

    #[test]
    fn empty_groups_are_skipped() {
        let stages = plan(&groups(S(20), S(8), &[]), &[pod("critical", Some(SYSTEM_CRITICAL_PRIORITY), None, None)]);
        assert_eq!(stages.len(), 1);
        assert_eq!(stages[0].priority, SYSTEM_CRITICAL_PRIORITY);
        assert!(plan(&[], &[pod("a", None, None, None)]).is_empty(), "no groups: nothing to plan");
    }

    #[test]
    fn a_stopped_pod_fails_with_the_shutdown_reason_and_condition() {
        let now = Time(Timestamp::from_second(1_000).unwrap());
        let running = PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "False".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let s = stopped_status(running, Some(3), now.clone());
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Terminated"));
        assert_eq!(s.message.as_deref(), Some("Pod was terminated in response to imminent node shutdown."));
        let conditions = s.conditions.unwrap();
        let target = conditions.iter().find(|c| c.type_ == "DisruptionTarget").unwrap();
        assert_eq!(
            (target.status.as_str(), target.reason.as_deref(), target.message.as_deref()),
            ("True", Some("TerminationByKubelet"), Some(MESSAGE))
        );
        assert_eq!((target.observed_generation, target.last_transition_time.as_ref()), (Some(3), Some(&now)));
        assert!(conditions.iter().any(|c| c.type_ == "Ready"), "the other conditions stay");

        let succeeded = PodStatus { phase: Some("Succeeded".into()), ..Default::default() };
        assert_eq!(stopped_status(succeeded, None, now).phase.as_deref(), Some("Succeeded"));
    }

    #[test]
    fn the_condition_keeps_its_transition_time() {
        let first = Time(Timestamp::from_second(1_000).unwrap());
        let s = stopped_status(PodStatus::default(), None, first.clone());
        let s = stopped_status(s, None, Time(Timestamp::from_second(2_000).unwrap()));
        let conditions = s.conditions.unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, Some(first));
    }
}
