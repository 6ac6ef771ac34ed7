//! The node agent's side of a drain (pure): which of its static pods the node agent keeps
//! stopped. The controller cannot evict a static pod; once a maintenance's drain has reached a
//! Static entry covering one, the planner waits ("static pod: waiting for the node agent to
//! stop it") until the pod's mirror is gone. The agent stops the pod gracefully, then deletes
//! the mirror and does not recreate it, which is what the planner sees as the pod being gone.
//! The hold lasts while the maintenance is in Drain: Complete or deletion releases it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::api::{NodeMaintenance, PodType, Stage};
use crate::plan::pod_priority;
use crate::selector::{labels_match, node_matches};

/// The node the agent runs as.
pub struct ThisNode<'a> {
    pub name: &'a str,
    /// The Node's labels, when known; the maintenance's status listing the node also counts.
    pub labels: &'a BTreeMap<String, String>,
}

fn selects(m: &NodeMaintenance, node: &ThisNode) -> bool {
    let listed = m.status.as_ref().is_some_and(|s| s.node_statuses.iter().any(|n| n.node_name == node.name));
    listed || node_matches(&m.spec.node_selector, node.name, node.labels)
}

fn covers(m: &NodeMaintenance, priority: i32, labels: &BTreeMap<String, String>) -> bool {
    let reached = m.status.as_ref().map(|s| s.drain_status.reached_drain_targets.as_slice()).unwrap_or_default();
    reached.iter().any(|e| {
        e.pod_type == PodType::Static
            && priority <= e.pod_priority
            && e.pod_selector.as_ref().is_none_or(|s| labels_match(s, labels))
    })
}

/// The name of the maintenance holding `pod`, if any. The maintenances draining this node (in
/// Drain, not being deleted) must all have reached a Static entry covering the pod: as in the
/// planner, the least advanced drain wins, so one maintenance never stops a static pod that
/// another one draining the same node still keeps.
pub fn holder<'a>(maintenances: &'a [NodeMaintenance], node: &ThisNode, pod: &Pod) -> Option<&'a str> {
    let priority = pod_priority(pod);
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let draining: Vec<&NodeMaintenance> = maintenances
        .iter()
        .filter(|m| m.spec.stage == Stage::Drain && m.metadata.deletion_timestamp.is_none())
        .filter(|m| selects(m, node))
        .collect();
    let all_cover = !draining.is_empty() && draining.iter().all(|m| covers(m, priority, &labels));
    all_cover.then(|| draining[0].metadata.name.as_deref().unwrap_or_default())
}

/// Static pod UID → the maintenance holding it, for every static pod to keep stopped.
pub fn static_pods_to_hold(
    maintenances: &[NodeMaintenance],
    node: &ThisNode,
    static_pods: &[Pod],
) -> BTreeMap<String, String> {
    static_pods
        .iter()
        .filter_map(|p| {
            let uid = p.metadata.uid.clone()?;
            Some((uid, holder(maintenances, node, p)?.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::api::{DrainPlanEntry, LabelSelector, NodeMaintenanceStatus, default_drain_plan};
    use crate::fixtures::{maintenance, mirror, node, now, pod};
    use crate::plan::{Cluster, plan_drain};

    fn static_pod(name: &str, priority: Option<i32>, class: Option<&str>) -> Pod {
        let mut p = pod(name, "n1", 0, name);
        let spec = p.spec.as_mut().unwrap();
        spec.priority = priority;
        spec.priority_class_name = class.map(str::to_string);
        p
    }

    fn reached(mut m: NodeMaintenance, entries: usize) -> NodeMaintenance {
        let mut status = NodeMaintenanceStatus::default();
        status.drain_status.reached_drain_targets = default_drain_plan()[..entries].to_vec();
        m.status = Some(status);
        m
    }

    fn held(ms: &[NodeMaintenance], pods: &[Pod]) -> Vec<(String, String)> {
        let labels = BTreeMap::new();
        static_pods_to_hold(ms, &ThisNode { name: "n1", labels: &labels }, pods).into_iter().collect()
    }

    #[test]
    fn priority_comes_from_the_spec_or_the_builtin_class() {
        assert_eq!(pod_priority(&static_pod("a", Some(7), Some("system-node-critical"))), 7);
        assert_eq!(pod_priority(&static_pod("a", None, Some("system-node-critical"))), 2_000_001_000);
        assert_eq!(pod_priority(&static_pod("a", None, Some("system-cluster-critical"))), 2_000_000_000);
        assert_eq!(pod_priority(&static_pod("a", None, Some("custom"))), 0);
    }

    /// Without Priority admission (the test server) a mirror has only the class name; the
    /// planner and the agent must still see the same priority, or the drain would wait at a
    /// Static entry the agent thinks does not cover the pod.
    #[test]
    fn planner_and_agent_agree_on_a_static_pod_with_only_a_class_name() {
        let nodes = [node("n1", &[])];
        let file_pod = static_pod("etcd-n1", None, Some("system-node-critical"));
        let mirror_pod = mirror(file_pod.clone());
        let mut m = maintenance("m", &["n1"], Stage::Drain, vec![]);
        let ms = [m.clone()];
        let step = plan_drain(
            &m,
            Cluster { nodes: &nodes, pods: std::slice::from_ref(&mirror_pod), pdbs: &[], maintenances: &ms },
            now(),
        );
        assert_eq!(step.reached, 11, "the planner waits at Static <= system-node-critical");
        let mut status = NodeMaintenanceStatus { drain_status: step.drain_status, ..Default::default() };
        status.node_statuses = step.node_statuses;
        m.status = Some(status);
        assert_eq!(held(std::slice::from_ref(&m), &[file_pod]).len(), 1, "and that entry makes the agent hold it");
    }

    #[test]
    fn held_once_the_drain_reaches_a_static_entry_covering_the_pod() {
        let pods = [static_pod("etcd", None, Some("system-node-critical")), static_pod("web", None, None)];
        let m = |entries| reached(maintenance("m", &["n1"], Stage::Drain, vec![]), entries);
        assert!(held(&[m(8)], &pods).is_empty(), "DaemonSet entries do not touch static pods");
        assert_eq!(held(&[m(9)], &pods), [("uid-web".to_string(), "m".to_string())], "Static <= 1e9");
        assert_eq!(held(&[m(11)], &pods).len(), 2, "Static <= system-node-critical");
    }

    #[test]
    fn only_a_draining_maintenance_of_this_node_holds() {
        let pods = [static_pod("web", None, None)];
        let other_node = reached(maintenance("m", &["n2"], Stage::Drain, vec![]), 12);
        assert!(held(&[other_node], &pods).is_empty());
        let complete = reached(maintenance("m", &["n1"], Stage::Complete, vec![]), 12);
        assert!(held(&[complete], &pods).is_empty(), "Complete releases");
        let mut deleting = reached(maintenance("m", &["n1"], Stage::Drain, vec![]), 12);
        deleting.metadata.deletion_timestamp = Some(Time(now()));
        assert!(held(&[deleting], &pods).is_empty(), "deletion runs Complete, which releases");
        // Listed in the status (the controller's view) counts even if the selector no longer matches.
        let mut listed = reached(maintenance("m", &["n2"], Stage::Drain, vec![]), 12);
        listed
            .status
            .as_mut()
            .unwrap()
            .node_statuses
            .push(crate::api::NodeStatus { node_name: "n1".into(), ..Default::default() });
        assert_eq!(held(&[listed], &pods).len(), 1);
    }

    #[test]
    fn the_least_advanced_drain_of_the_node_wins() {
        let pods = [static_pod("web", None, None)];
        let ahead = reached(maintenance("ahead", &["n1"], Stage::Drain, vec![]), 12);
        let behind = reached(maintenance("behind", &["n1"], Stage::Drain, vec![]), 4);
        assert!(held(&[ahead.clone(), behind], &pods).is_empty(), "another drain still keeps the pod");
        let idle_elsewhere = reached(maintenance("other", &["n2"], Stage::Drain, vec![]), 1);
        let cordon_only = reached(maintenance("cordon", &["n1"], Stage::Cordon, vec![]), 0);
        assert_eq!(held(&[ahead, idle_elsewhere, cordon_only], &pods), [("uid-web".to_string(), "ahead".to_string())]);
    }

    #[test]
    fn an_entry_selector_narrows_the_hold() {
        let only_db =
            LabelSelector { match_labels: [("app".to_string(), "db".to_string())].into(), ..Default::default() };
        let plan =
            vec![DrainPlanEntry { pod_selector: Some(only_db), pod_priority: i32::MAX, pod_type: PodType::Static }];
        let mut m = maintenance("m", &["n1"], Stage::Drain, plan.clone());
        m.status = Some(NodeMaintenanceStatus::default());
        m.status.as_mut().unwrap().drain_status.reached_drain_targets = plan;
        let pods = [static_pod("db", None, None), static_pod("web", None, None)];
        assert_eq!(held(&[m], &pods), [("uid-db".to_string(), "m".to_string())]);
    }

    /// Both sides agree: the planner's status makes the agent hold the pod, and the mirror the
    /// agent then deletes is what the planner waits for.
    #[test]
    fn planner_status_drives_the_hold_and_the_deleted_mirror_finishes_the_drain() {
        let nodes = [node("n1", &[])];
        let file_pod = static_pod("etcd-n1", None, Some("system-node-critical"));
        let mut mirror_pod = mirror(file_pod.clone());
        mirror_pod.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        let mut m = maintenance("m", &["n1"], Stage::Drain, vec![]);
        let cluster = |pods: &'static [Pod], ms: &'static [NodeMaintenance]| Cluster {
            nodes: Box::leak(Box::new(nodes.clone())),
            pods,
            pdbs: &[],
            maintenances: ms,
        };
        let pods: &'static [Pod] = Box::leak(Box::new([mirror_pod]));
        let step = plan_drain(&m, cluster(pods, Box::leak(Box::new([m.clone()]))), now());
        assert!(!step.drained);
        let mut status = NodeMaintenanceStatus { drain_status: step.drain_status, ..Default::default() };
        status.node_statuses = step.node_statuses;
        m.status = Some(status);
        assert_eq!(held(std::slice::from_ref(&m), &[file_pod]).len(), 1, "the agent holds the static pod");
        let step = plan_drain(&m, cluster(&[], Box::leak(Box::new([m.clone()]))), now());
        assert!(step.drained, "with the mirror deleted the drain completes");
    }
}
