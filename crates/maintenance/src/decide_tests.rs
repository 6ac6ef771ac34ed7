use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::{BlockingPod, FINALIZER};
use crate::fixtures::*;

fn decide_one(m: &NodeMaintenance, nodes: &[Node], pods: &[k8s_openapi::api::core::v1::Pod]) -> Decision {
    let all = [m.clone()];
    decide(m, Cluster { nodes, pods, pdbs: &[], maintenances: &all }, now())
}

fn with_finalizer(mut m: NodeMaintenance) -> NodeMaintenance {
    m.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    m
}

fn condition<'a>(d: &'a Decision, type_: &str) -> Option<&'a Condition> {
    d.status.conditions.iter().find(|c| c.type_ == type_)
}

#[test]
fn idle_previews_and_writes_back_the_default_plan_without_touching_anything() {
    let m = maintenance("m", &["n1"], Stage::Idle, vec![]);
    let d = decide_one(&m, &[node("n1", &[]), node("n2", &[])], &[pod("a", "n1", 0, "x")]);
    assert_eq!(d.write_back_plan.as_ref().map(Vec::len), Some(12));
    assert!(d.cordon.is_empty() && d.evict.is_empty() && !d.add_finalizer);
    assert_eq!(d.status.node_statuses.len(), 1);
    assert_eq!(d.status.node_statuses[0].pods_remaining, 1);
    assert_eq!(d.status.stage_statuses[0].name, Stage::Idle);
}

#[test]
fn cordon_remembers_the_previous_state_before_cordoning() {
    let m = maintenance("m", &["n1", "n2"], Stage::Cordon, vec![]);
    let d = decide_one(&m, &[node("n1", &[]), cordoned(node("n2", &[])), node("spare", &[])], &[]);
    assert!(d.add_finalizer);
    assert_eq!(d.cordon, vec!["n1".to_string()]);
    let memory: Vec<_> = d.status.node_statuses.iter().map(|s| (s.node_name.as_str(), s.was_unschedulable)).collect();
    assert_eq!(memory, vec![("n1", Some(false)), ("n2", Some(true))]);
}

#[test]
fn memory_survives_the_maintenances_own_cordon() {
    let mut m = with_finalizer(maintenance("m", &["n1"], Stage::Drain, vec![]));
    let first = decide_one(&m, &[node("n1", &[]), node("spare", &[])], &[]);
    assert_eq!(first.cordon, vec!["n1".to_string()]);
    m.status = Some(first.status);
    let again = decide_one(&m, &[cordoned(node("n1", &[])), node("spare", &[])], &[]);
    assert!(again.cordon.is_empty());
    assert_eq!(again.status.node_statuses[0].was_unschedulable, Some(false));
}

#[test]
fn drain_evicts_reports_and_requeues_until_drained() {
    let m = with_finalizer(maintenance("m", &["n1"], Stage::Drain, vec![]));
    let pods = [pod("a", "n1", 0, "x"), pod("other", "n2", 0, "x")];
    let d = decide_one(&m, &[cordoned(node("n1", &[])), node("n2", &[])], &pods);
    assert_eq!(d.evict.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), vec!["a"]);
    assert!(d.requeue);
    assert_eq!(condition(&d, CONDITION_DRAINED).map(|c| c.status.as_str()), Some("False"));

    let done = decide_one(&m, &[tainted(cordoned(node("n1", &[])))], &[pods[1].clone()]);
    assert!(done.evict.is_empty() && !done.requeue);
    let drained = condition(&done, CONDITION_DRAINED).unwrap();
    assert_eq!((drained.status.as_str(), drained.reason.as_str()), ("True", "DrainTargetsReached"));
}

#[test]
fn complete_restores_only_what_the_maintenance_changed() {
    let mut m = with_finalizer(maintenance("m", &["n1", "n2"], Stage::Complete, vec![]));
    let status = m.status.get_or_insert_default();
    for (name, was) in [("n1", false), ("n2", true)] {
        status.node_statuses.push(NodeStatus {
            node_name: name.into(),
            was_unschedulable: Some(was),
            blocking_pods: vec![BlockingPod::default()],
            ..Default::default()
        });
    }
    let nodes = [tainted(cordoned(node("n1", &[]))), cordoned(node("n2", &[]))];
    let d = decide_one(&m, &nodes, &[]);
    assert_eq!(d.uncordon, vec!["n1".to_string()]);
    assert_eq!(d.untaint, vec!["n1".to_string()]);
    assert!(d.remove_finalizer);
    assert!(d.status.node_statuses.iter().all(|s| s.blocking_pods.is_empty() && s.drain_message == "Complete"));
}

#[test]
fn deletion_mid_drain_runs_complete() {
    let mut m = with_finalizer(maintenance("m", &["n1"], Stage::Drain, vec![]));
    m.metadata.deletion_timestamp = Some(Time(now()));
    m.status.get_or_insert_default().node_statuses.push(NodeStatus {
        node_name: "n1".into(),
        was_unschedulable: Some(false),
        ..Default::default()
    });
    let d = decide_one(&m, &[cordoned(node("n1", &[]))], &[pod("a", "n1", 0, "x")]);
    assert!(d.evict.is_empty());
    assert_eq!(d.uncordon, vec!["n1".to_string()]);
    assert!(d.remove_finalizer);
}

#[test]
fn invalid_spec_gets_a_condition_and_no_action() {
    let mut m = maintenance("m", &["n1"], Stage::Cordon, vec![]);
    m.spec.drain_plan = crate::api::default_drain_plan();
    m.spec.drain_plan.swap(0, 5);
    let d = decide_one(&m, &[node("n1", &[])], &[]);
    let invalid = condition(&d, CONDITION_INVALID).unwrap();
    assert_eq!(invalid.status, "True");
    assert!(invalid.message.starts_with("spec.drainPlan["), "{}", invalid.message);
    assert!(d.cordon.is_empty() && !d.add_finalizer);
}

#[test]
fn covering_every_node_is_refused_unless_allowed() {
    let m = maintenance("m", &["n1"], Stage::Cordon, vec![]);
    let d = decide_one(&m, &[node("n1", &[])], &[]);
    assert_eq!(condition(&d, CONDITION_UNSAFE).map(|c| c.status.as_str()), Some("True"));
    assert!(d.cordon.is_empty());

    let mut allowed = m.clone();
    allowed.metadata.annotations = Some([(crate::api::ALLOW_ALL_NODES_ANNOTATION.into(), "true".into())].into());
    assert_eq!(decide_one(&allowed, &[node("n1", &[])], &[]).cordon, vec!["n1".to_string()]);
}

#[test]
fn condition_keeps_its_transition_time_while_unchanged() {
    let mut m = with_finalizer(maintenance("m", &["n1"], Stage::Drain, vec![]));
    let nodes = [cordoned(node("n1", &[])), node("n2", &[])];
    let first = decide_one(&m, &nodes, &[pod("a", "n1", 0, "x")]);
    m.status = Some(first.status.clone());
    let later = decide(
        &m,
        Cluster { nodes: &nodes, pods: &[pod("a", "n1", 0, "x")], pdbs: &[], maintenances: &[m.clone()] },
        "2026-11-22T07:00:00Z".parse().unwrap(),
    );
    assert_eq!(
        condition(&later, CONDITION_DRAINED).unwrap().last_transition_time,
        condition(&first, CONDITION_DRAINED).unwrap().last_transition_time
    );
}

#[test]
fn a_finished_maintenance_leaves_later_cordons_alone() {
    let mut m = maintenance("m", &["n1"], Stage::Complete, vec![]);
    m.status.get_or_insert_default().node_statuses.push(NodeStatus {
        node_name: "n1".into(),
        was_unschedulable: Some(false),
        ..Default::default()
    });
    let d = decide_one(&m, &[cordoned(node("n1", &[]))], &[]);
    assert!(d.uncordon.is_empty() && d.untaint.is_empty() && !d.remove_finalizer);
}

#[test]
fn a_node_that_stops_matching_keeps_its_cordon_memory_for_complete() {
    let mut m = with_finalizer(maintenance("m", &["n1"], Stage::Cordon, vec![]));
    m.status.get_or_insert_default().node_statuses.push(NodeStatus {
        node_name: "gone-from-selector".into(),
        was_unschedulable: Some(false),
        ..Default::default()
    });
    let nodes = [node("n1", &[]), cordoned(node("gone-from-selector", &[])), node("spare", &[])];
    let d = decide_one(&m, &nodes, &[]);
    assert!(d.status.node_statuses.iter().any(|s| s.node_name == "gone-from-selector"));
    m.spec.stage = Stage::Complete;
    m.status = Some(d.status);
    assert_eq!(decide_one(&m, &nodes, &[]).uncordon, vec!["gone-from-selector".to_string()]);
}

#[test]
fn cordon_shows_the_pods_the_drain_will_evict_and_those_that_block_it() {
    let m = maintenance("m", &["n1"], Stage::Cordon, vec![]);
    let pods = [pod("a", "n1", 0, "x"), pod("b", "n1", 0, "x"), bare("c", "n1", 0, "y"), pod("d", "n2", 0, "x")];
    let d = decide_one(&m, &[node("n1", &[]), node("n2", &[])], &pods);
    assert!(d.evict.is_empty());
    let n1 = &d.status.node_statuses[0];
    assert_eq!((n1.pods_remaining, n1.was_unschedulable), (3, Some(false)));
    assert_eq!(n1.drain_message, "Cordoned: the drain would evict 3 pods; 1 of them block it");
    assert_eq!(n1.blocking_pods.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["c"]);
}
