use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;
use crate::api::NodeMaintenanceStatus;
use crate::fixtures::*;

fn with_reached(mut m: NodeMaintenance, reached: usize) -> NodeMaintenance {
    let targets = effective_drain_plan(&m)[..reached].to_vec();
    m.status.get_or_insert_default().drain_status.reached_drain_targets = targets;
    m
}

fn entry(pod_type: PodType, pod_priority: i32, app: Option<&str>) -> DrainPlanEntry {
    let pod_selector = app.map(|a| serde_json::from_value(json!({"matchLabels": {"app": a}})).unwrap());
    DrainPlanEntry { pod_selector, pod_priority, pod_type }
}

fn names(step: &DrainStep) -> Vec<&str> {
    step.evict.iter().map(|p| p.name.as_str()).collect()
}

fn step(
    m: &NodeMaintenance,
    nodes: &[Node],
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    all: &[NodeMaintenance],
) -> DrainStep {
    plan_drain(m, Cluster { nodes, pods, pdbs, maintenances: all }, now())
}

#[test]
fn pod_types_from_owners_and_mirror_annotation() {
    assert_eq!(pod_type(&pod("a", "n1", 0, "x")), PodType::Default);
    assert_eq!(pod_type(&owned_by(pod("a", "n1", 0, "x"), "ReplicaSet", "rs")), PodType::Default);
    assert_eq!(pod_type(&owned_by(pod("a", "n1", 0, "x"), "DaemonSet", "ds")), PodType::DaemonSet);
    assert_eq!(pod_type(&mirror(pod("a", "n1", 0, "x"))), PodType::Static);
    assert_eq!(pod_type(&owned_by(pod("a", "n1", 0, "x"), "Node", "n1")), PodType::Static);
}

#[test]
fn evicts_only_the_first_entry_and_only_on_selected_nodes() {
    let nodes = [node("n1", &[]), node("n2", &[])];
    let pods = [pod("low", "n1", 0, "a"), pod("critical", "n1", 2_000_000_000, "b"), pod("other-node", "n2", 0, "a")];
    let m = maintenance("m", &["n1"], Stage::Drain, vec![]);
    let s = step(&m, &nodes, &pods, &[], std::slice::from_ref(&m));
    assert_eq!(s.reached, 1);
    assert_eq!(names(&s), ["low"]);
    assert_eq!(s.evict[0].uid, "uid-low");
    assert_eq!(s.drain_status.reached_drain_targets, default_drain_plan()[..1]);
    assert_eq!(s.node_statuses.len(), 1);
    assert_eq!(s.node_statuses[0].pods_remaining, 1);
    assert!(!s.drained);
}

#[test]
fn advances_through_empty_entries_and_targets_are_cumulative() {
    let nodes = [node("n1", &[])];
    let pods = [pod("critical", "n1", 2_000_000_000, "b")];
    let m = maintenance("m", &["n1"], Stage::Drain, vec![]);
    let s = step(&m, &nodes, &pods, &[], std::slice::from_ref(&m));
    assert_eq!(s.reached, 2, "entry 1 has no pods left, so the drain moves to entry 2");
    assert_eq!(names(&s), ["critical"]);

    // A low-priority pod appearing later matches an earlier entry and is evicted too.
    let pods = [pod("critical", "n1", 2_000_000_000, "b"), pod("late", "n1", 0, "a")];
    let m = with_reached(m, 2);
    assert_eq!(names(&step(&m, &nodes, &pods, &[], std::slice::from_ref(&m))), ["critical", "late"]);
}

#[test]
fn never_goes_back() {
    let plan = default_drain_plan();
    let pods = [pod("low", "n1", 0, "a")];
    let live: Vec<&Pod> = pods.iter().collect();
    assert_eq!(advance(&plan, 3, &live), 3);
    assert_eq!(advance(&plan, 0, &live), 1);
}

#[test]
fn selector_entries_go_first_within_a_priority() {
    let plan = vec![entry(PodType::Default, 1000, Some("db")), entry(PodType::Default, 1000, None)];
    let nodes = [node("n1", &[])];
    let pods = [pod("web", "n1", 0, "web"), pod("db", "n1", 0, "db")];
    let m = maintenance("m", &["n1"], Stage::Drain, plan);
    assert_eq!(names(&step(&m, &nodes, &pods, &[], std::slice::from_ref(&m))), ["db"]);
    let pods = [pod("web", "n1", 0, "web")];
    let s = step(&m, &nodes, &pods, &[], std::slice::from_ref(&m));
    assert_eq!((s.reached, names(&s)), (2, vec!["web"]));
}

#[test]
fn pdb_budget_is_shared_across_pods_and_blocks_with_its_name() {
    let nodes = [node("n1", &[])];
    let pods =
        [pod("r1", "n1", 0, "web"), pod("r2", "n1", 0, "web"), pod("r3", "n1", 0, "web"), pod("free", "n1", 0, "x")];
    let m = maintenance("m", &["n1"], Stage::Drain, vec![]);
    let s = step(&m, &nodes, &pods, &[pdb("web-pdb", "web", 1)], std::slice::from_ref(&m));
    assert_eq!(names(&s), ["r1", "free"]);
    let blocking = &s.node_statuses[0].blocking_pods;
    assert_eq!(blocking.len(), 2);
    assert_eq!(blocking[0].name, "r2");
    assert_eq!(blocking[0].reason, "PodDisruptionBudget default/web-pdb allows no more disruptions");
    assert_eq!(s.drain_status.pods_pending_eviction, 4);

    let s = step(&m, &nodes, &pods, &[pdb("web-pdb", "web", 0)], std::slice::from_ref(&m));
    assert_eq!(names(&s), ["free"]);
}

#[test]
fn two_pdbs_on_one_pod_are_reported_not_attempted() {
    let nodes = [node("n1", &[])];
    let pods = [pod("r1", "n1", 0, "web")];
    let m = maintenance("m", &["n1"], Stage::Drain, vec![]);
    let s = step(&m, &nodes, &pods, &[pdb("a", "web", 5), pdb("b", "web", 5)], std::slice::from_ref(&m));
    assert!(s.evict.is_empty());
    assert!(s.node_statuses[0].blocking_pods[0].reason.contains("more than one PodDisruptionBudget"));
}

#[test]
fn terminating_pods_are_active_and_stuck_ones_are_reported() {
    let nodes = [node("n1", &[])];
    let mut going = pod("going", "n1", 0, "a");
    going.metadata.deletion_timestamp = Some(Time("2026-11-22T06:00:30Z".parse().unwrap()));
    let mut stuck = pod("stuck", "n1", 0, "a");
    stuck.metadata.deletion_timestamp = Some(Time("2026-11-22T05:00:00Z".parse().unwrap()));
    let m = maintenance("m", &["n1"], Stage::Drain, vec![]);
    let s = step(&m, &nodes, &[going, stuck], &[], std::slice::from_ref(&m));
    assert!(s.evict.is_empty(), "terminating pods are not evicted again");
    assert_eq!(s.drain_status.active_evictions, 2);
    let reasons: Vec<&str> = s.node_statuses[0].blocking_pods.iter().map(|b| b.reason.as_str()).collect();
    assert_eq!(reasons, ["terminating", "stuck terminating since 2026-11-22T05:00:00Z"]);
}

#[test]
fn daemonset_pods_need_the_taint_first_and_tolerating_ones_block() {
    let plan = vec![entry(PodType::Default, i32::MAX, None), entry(PodType::DaemonSet, i32::MAX, None)];
    let ds = owned_by(pod("ds-pod", "n1", 0, "ds"), "DaemonSet", "agent");
    let mut tolerant = owned_by(pod("tolerant", "n1", 0, "ds2"), "DaemonSet", "everywhere");
    tolerant.spec.as_mut().unwrap().tolerations =
        Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]);
    let pods = [ds.clone(), tolerant];
    let m = maintenance("m", &["n1"], Stage::Drain, plan);

    let s = step(&m, &[node("n1", &[])], &pods, &[], std::slice::from_ref(&m));
    assert_eq!(s.reached, 2);
    assert_eq!(s.taint, ["n1"]);
    assert!(s.evict.is_empty(), "no DaemonSet eviction before the taint is on the node");

    let s = step(&m, &[tainted(node("n1", &[]))], &pods, &[], std::slice::from_ref(&m));
    assert!(s.taint.is_empty());
    assert_eq!(names(&s), ["ds-pod"]);
    let block = &s.node_statuses[0].blocking_pods[0];
    assert_eq!(block.name, "tolerant");
    assert!(
        block.reason.starts_with("DaemonSet default/everywhere tolerates the maintenance taint"),
        "{}",
        block.reason
    );
}

#[test]
fn static_pods_wait_for_the_node_agent_and_drained_when_all_gone() {
    let nodes = [node("n1", &[])];
    let m = maintenance("m", &["n1"], Stage::Drain, vec![]);
    let pods = [mirror(pod("etcd-n1", "n1", 2_000_001_000, "etcd"))];
    let s = step(&m, &nodes, &pods, &[], std::slice::from_ref(&m));
    assert_eq!(s.reached, 11);
    assert!(s.evict.is_empty());
    assert!(s.node_statuses[0].blocking_pods[0].reason.starts_with("static pod"));
    assert!(!s.drained);

    let mut done = pods[0].clone();
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let s = step(&m, &nodes, &[done], &[], std::slice::from_ref(&m));
    assert_eq!(s.reached, 12);
    assert!(s.drained);
    assert_eq!(s.node_statuses[0].drain_message, "Drained");
    assert!(s.node_statuses[0].drain_targets_reached);
}

#[test]
fn overlapping_maintenances_least_advanced_wins() {
    let nodes = [node("n1", &[]), node("n2", &[])];
    let pods = [pod("critical", "n1", 2_000_000_000, "a"), pod("critical2", "n2", 2_000_000_000, "a")];
    let ahead = with_reached(maintenance("ahead", &["n1", "n2"], Stage::Drain, vec![]), 2);
    let behind = with_reached(
        maintenance(
            "behind",
            &["n1"],
            Stage::Drain,
            vec![entry(PodType::Default, 0, None), entry(PodType::Default, i32::MAX, None)],
        ),
        1,
    );
    let all = [ahead.clone(), behind.clone()];
    let s = step(&ahead, &nodes, &pods, &[], &all);
    assert_eq!(names(&s), ["critical2"], "n1 is limited by the less advanced maintenance");
    assert_eq!(s.node_statuses[0].drain_message, "Draining (limited by behind)");
    assert_eq!(s.node_statuses[0].blocking_pods[0].reason, "waiting for maintenance behind");
    assert_eq!(s.node_statuses[1].drain_message, "Draining");

    // A maintenance in Cordon does not limit anything.
    let idle_behind = maintenance("behind", &["n1"], Stage::Cordon, vec![]);
    let s = step(&ahead, &nodes, &pods, &[], &[ahead.clone(), idle_behind]);
    assert_eq!(names(&s), ["critical", "critical2"]);
}

#[test]
fn preview_lists_affected_pods_per_node() {
    let nodes = [node("n1", &[]), node("n2", &[])];
    let pods = [pod("a", "n1", 0, "a"), pod("b", "n1", 0, "a"), pod("c", "n2", 0, "a")];
    let m = maintenance("m", &["n1"], Stage::Idle, vec![]);
    let p = preview(&m, Cluster { nodes: &nodes, pods: &pods, pdbs: &[], maintenances: &[] });
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].node_name.as_str(), p[0].pods_remaining), ("n1", 2));
}

#[test]
fn cordon_memory_and_restore() {
    let nodes = [cordoned(node("n1", &[])), node("n2", &[])];
    let mut first = maintenance("first", &["n1", "n2"], Stage::Cordon, vec![]);
    assert!(cordon_memory(&first, &nodes[0], &[]));
    assert!(!cordon_memory(&first, &nodes[1], &[]));

    let status = NodeMaintenanceStatus {
        node_statuses: vec![
            NodeStatus { node_name: "n1".into(), was_unschedulable: Some(true), ..Default::default() },
            NodeStatus { node_name: "n2".into(), was_unschedulable: Some(false), ..Default::default() },
        ],
        ..Default::default()
    };
    first.status = Some(status);
    // n2 is cordoned now by `first`; a second maintenance inherits first's memory.
    let second = maintenance("second", &["n2"], Stage::Cordon, vec![]);
    let nodes_now = [cordoned(node("n1", &[])), cordoned(node("n2", &[]))];
    assert!(!cordon_memory(&second, &nodes_now[1], &[first.clone(), second.clone()]));

    let all = [first.clone(), second.clone()];
    let cluster = Cluster { nodes: &nodes_now, pods: &[], pdbs: &[], maintenances: &all };
    assert!(!should_uncordon(&first, "n1", cluster), "n1 was cordoned before: stays cordoned");
    assert!(!should_uncordon(&first, "n2", cluster), "second still covers n2");
    let cluster = Cluster { maintenances: std::slice::from_ref(&first), ..cluster };
    assert!(should_uncordon(&first, "n2", cluster));
    assert!(should_untaint(&first, "n2", cluster));
}

#[test]
fn safety_refuses_all_control_plane_or_all_schedulable_nodes() {
    let nodes = [node("cp", &[(CONTROL_PLANE_LABEL, "")]), node("w1", &[]), cordoned(node("w2", &[]))];
    let cp = maintenance("m", &["cp"], Stage::Drain, vec![]);
    assert!(safety_violation(&cp, &nodes).unwrap().starts_with("the node selector covers every control-plane node"));
    let workers = maintenance("m", &["w1"], Stage::Drain, vec![]);
    assert_eq!(safety_violation(&workers, &nodes), None);
    let schedulable = maintenance("m", &["w1", "w2"], Stage::Drain, vec![]);
    assert_eq!(safety_violation(&schedulable, &nodes), None);
    let everything = maintenance("m", &["w1", "cp"], Stage::Drain, vec![]);
    assert!(safety_violation(&everything, &nodes).is_some());
    let mut allowed = everything.clone();
    allowed.metadata.annotations = Some([(ALLOW_ALL_NODES_ANNOTATION.to_string(), "true".to_string())].into());
    assert_eq!(safety_violation(&allowed, &nodes), None);
}

fn with_empty_dir(mut p: Pod, volume: &str) -> Pod {
    let volume = serde_json::from_value(json!({"name": volume, "emptyDir": {}})).unwrap();
    p.spec.get_or_insert_default().volumes = Some(vec![volume]);
    p
}

#[test]
fn bare_and_empty_dir_pods_block_their_node_before_any_eviction_until_opted_in() {
    let nodes = [node("n1", &[]), node("n2", &[]), node("n3", &[]), node("spare", &[])];
    let pods = [
        pod("web", "n1", 0, "web"),
        bare("lonely", "n1", 0, "lonely"),
        pod("api", "n2", 0, "api"),
        with_empty_dir(pod("cache", "n2", 0, "cache"), "scratch"),
        // Judged as kubectl does: DaemonSet and static pods come back, so they never block.
        with_empty_dir(owned_by(bare("agent", "n3", 0, "agent"), "DaemonSet", "agent"), "buffer"),
        mirror(bare("etcd", "n3", 0, "etcd")),
        pod("free", "n3", 0, "free"),
    ];
    let mut m = maintenance("m", &["n1", "n2", "n3"], Stage::Drain, vec![]);
    let s = step(&m, &nodes, &pods, &[], std::slice::from_ref(&m));
    assert_eq!(names(&s), ["free"], "blocked nodes lose nothing, not even their safe pods");
    let n1 = &s.node_statuses[0];
    assert_eq!(n1.blocking_pods.len(), 1);
    assert_eq!(n1.blocking_pods[0].name, "lonely");
    assert_eq!(n1.blocking_pods[0].reason, format!("{NO_CONTROLLER} (set spec.evictBarePods to evict it)"));
    assert!(n1.drain_message.starts_with("Blocked: evicting 1 pods"), "{}", n1.drain_message);
    assert_eq!(n1.pods_remaining, 2);
    let n2 = &s.node_statuses[1];
    assert_eq!(
        n2.blocking_pods.iter().map(|b| (b.name.as_str(), b.reason.as_str())).collect::<Vec<_>>(),
        [("cache", "emptyDir data would be deleted (volumes scratch; set spec.deleteEmptyDirData to evict it)")]
    );
    assert!(!s.drained);

    m.spec.evict_bare_pods = true;
    let s = step(&m, &nodes, &pods, &[], std::slice::from_ref(&m));
    assert_eq!(names(&s), ["web", "lonely", "free"]);
    assert_eq!(s.node_statuses[1].blocking_pods.len(), 1, "the emptyDir opt-in is separate");

    m.spec.delete_empty_dir_data = true;
    let s = step(&m, &nodes, &pods, &[], std::slice::from_ref(&m));
    assert_eq!(names(&s), ["web", "lonely", "api", "cache", "free"]);
}

#[test]
fn a_bare_pod_with_empty_dir_gives_both_reasons_and_a_terminating_one_none() {
    let m = maintenance("m", &["n1"], Stage::Drain, vec![]);
    let both = with_empty_dir(bare("both", "n1", 0, "x"), "data");
    let reason = loss_reason(&m, &both).unwrap();
    assert!(reason.starts_with(NO_CONTROLLER) && reason.contains(EMPTY_DIR_DATA), "{reason}");
    let mut going = both;
    going.metadata.deletion_timestamp = Some(Time(now()));
    assert_eq!(loss_reason(&m, &going), None);
}

#[test]
fn preview_names_the_pods_that_would_block() {
    let nodes = [node("n1", &[]), node("n2", &[])];
    let pods = [pod("a", "n1", 0, "a"), bare("b", "n1", 0, "b")];
    let m = maintenance("m", &["n1"], Stage::Idle, vec![]);
    let p = preview(&m, Cluster { nodes: &nodes, pods: &pods, pdbs: &[], maintenances: &[] });
    assert_eq!(p[0].pods_remaining, 2);
    assert_eq!(p[0].drain_message, "the drain would evict 2 pods; 1 of them block it");
    assert_eq!(p[0].blocking_pods[0].name, "b");
}

#[test]
fn a_blocked_node_is_not_tainted_for_its_daemon_set_pods() {
    let nodes = [node("n1", &[]), node("n2", &[]), node("spare", &[])];
    let pods = [bare("lonely", "n1", 0, "lonely"), owned_by(pod("agent", "n1", 0, "agent"), "DaemonSet", "agent")];
    // Past the Default entries: only the DaemonSet entries are left to reach.
    let m = with_reached(maintenance("m", &["n1", "n2"], Stage::Drain, vec![]), 5);
    let s = step(&m, &nodes, &pods, &[], std::slice::from_ref(&m));
    assert_eq!(s.taint, ["n2"]);
    assert!(s.evict.is_empty());
}
