//! The pure drain planner: given the nodes, pods, PodDisruptionBudgets and all maintenances,
//! which pods one maintenance evicts next, which nodes it taints, and what its status says.
//! No I/O; the controller feeds it snapshots and acts on the result.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::api::{
    ALLOW_ALL_NODES_ANNOTATION, BlockingPod, DRAIN_TAINT_KEY, DrainPlanEntry, DrainStatus, LabelSelector,
    NodeMaintenance, NodeStatus, PodType, Stage, default_drain_plan,
};
use crate::selector::{labels_match, node_matches};

use gantry_vocab::keys::MIRROR as MIRROR_ANNOTATION;
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// A snapshot of the cluster objects the planner reads.
#[derive(Clone, Copy)]
pub struct Cluster<'a> {
    pub nodes: &'a [Node],
    pub pods: &'a [Pod],
    pub pdbs: &'a [PodDisruptionBudget],
    pub maintenances: &'a [NodeMaintenance],
}

/// A pod to evict, by namespace and name (UID as precondition against a recreated namesake).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
}

/// What one maintenance's drain does next and reports.
#[derive(Debug, PartialEq)]
pub struct DrainStep {
    /// How many drain plan entries are reached (the prefix of the plan targeted so far).
    pub reached: usize,
    pub evict: Vec<PodRef>,
    /// Nodes that need the maintenance taint before their DaemonSet pods can be evicted.
    pub taint: Vec<String>,
    pub drain_status: DrainStatus,
    pub node_statuses: Vec<NodeStatus>,
    /// Every pod targeted by the whole plan is gone from every selected node.
    pub drained: bool,
}

/// The plan in force: the spec's, or the KEP's 12 default entries when it is empty.
pub fn effective_drain_plan(m: &NodeMaintenance) -> Vec<DrainPlanEntry> {
    if m.spec.drain_plan.is_empty() { default_drain_plan() } else { m.spec.drain_plan.clone() }
}

/// Names of the nodes the maintenance selects, sorted.
pub fn selected_nodes(m: &NodeMaintenance, nodes: &[Node]) -> Vec<String> {
    let mut names: Vec<String> = nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let labels = n.metadata.labels.clone().unwrap_or_default();
            node_matches(&m.spec.node_selector, name, &labels).then(|| name.to_string())
        })
        .collect();
    names.sort();
    names
}

/// Static pods show up as mirror pods (or are owned by the Node); DaemonSet pods are
/// controlled by a DaemonSet; everything else is Default.
pub fn pod_type(pod: &Pod) -> PodType {
    let annotations = pod.metadata.annotations.as_ref();
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    if annotations.is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)) || owners.iter().any(|o| o.kind == "Node") {
        PodType::Static
    } else if owners.iter().any(|o| o.kind == "DaemonSet" && o.controller == Some(true)) {
        PodType::DaemonSet
    } else {
        PodType::Default
    }
}

/// The built-in priority classes, as the API server's Priority admission resolves them.
const BUILTIN_PRIORITIES: [(&str, i32); 2] =
    [("system-node-critical", 2_000_001_000), ("system-cluster-critical", 2_000_000_000)];

/// A pod's priority: `spec.priority`, else the built-in class's value (a mirror pod created
/// where Priority admission does not run, or a static pod file, has only the class name),
/// else 0. The node agent resolves static pods the same way, so both sides agree.
pub fn pod_priority(pod: &Pod) -> i32 {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.priority).unwrap_or_else(|| {
        let class = spec.and_then(|s| s.priority_class_name.as_deref()).unwrap_or_default();
        BUILTIN_PRIORITIES.iter().find(|(name, _)| *name == class).map_or(0, |(_, p)| *p)
    })
}

pub fn entry_matches(entry: &DrainPlanEntry, pod: &Pod) -> bool {
    let priority = pod_priority(pod);
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    pod_type(pod) == entry.pod_type
        && priority <= entry.pod_priority
        && entry.pod_selector.as_ref().is_none_or(|s| labels_match(s, &labels))
}

fn targeted(targets: &[DrainPlanEntry], pod: &Pod) -> bool {
    targets.iter().any(|e| entry_matches(e, pod))
}

fn is_terminal(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn name_of(m: &NodeMaintenance) -> &str {
    m.metadata.name.as_deref().unwrap_or_default()
}

/// The live (non-terminal) pods on the given nodes.
fn live_pods<'a>(pods: &'a [Pod], nodes: &BTreeSet<&str>) -> Vec<&'a Pod> {
    pods.iter().filter(|p| !is_terminal(p) && node_of(p).is_some_and(|n| nodes.contains(n))).collect()
}

/// Moves to the next entry while no live pod matches the entries reached so far; never goes
/// back. A maintenance starting on nodes another one already emptied is fast-forwarded.
pub fn advance(plan: &[DrainPlanEntry], reached: usize, live: &[&Pod]) -> usize {
    let mut reached = reached.clamp(1, plan.len().max(1));
    while reached < plan.len() && !live.iter().any(|p| targeted(&plan[..reached], p)) {
        reached += 1;
    }
    reached
}

/// Other maintenances draining a node limit what this one may evict there: the least
/// advanced targets win (KEP-4212), so a pod is evictable only if each of them targets it.
fn limiters<'a>(me: &NodeMaintenance, node: &str, cluster: Cluster<'a>) -> Vec<(&'a str, Vec<DrainPlanEntry>)> {
    cluster
        .maintenances
        .iter()
        .filter(|o| name_of(o) != name_of(me) && o.spec.stage == Stage::Drain)
        .filter(|o| selected_nodes(o, cluster.nodes).iter().any(|n| n == node))
        .map(|o| {
            let reached = o.status.as_ref().map(|s| s.drain_status.reached_drain_targets.clone()).unwrap_or_default();
            (name_of(o), reached)
        })
        .collect()
}

fn pdb_selector(pdb: &PodDisruptionBudget) -> Option<LabelSelector> {
    let selector = pdb.spec.as_ref()?.selector.as_ref()?;
    serde_json::to_value(selector).ok().and_then(|v| serde_json::from_value(v).ok())
}

/// The PodDisruptionBudgets whose selector matches the pod (same namespace).
pub fn pdbs_of<'a>(pod: &Pod, pdbs: &'a [PodDisruptionBudget]) -> Vec<&'a PodDisruptionBudget> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    pdbs.iter()
        .filter(|b| b.metadata.namespace == pod.metadata.namespace)
        .filter(|b| pdb_selector(b).is_some_and(|s| labels_match(&s, &labels)))
        .collect()
}

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        node: node_of(pod).unwrap_or_default().to_string(),
    }
}

fn node_has_drain_taint(node: Option<&Node>) -> bool {
    let taints = node.and_then(|n| n.spec.as_ref()).and_then(|s| s.taints.as_deref()).unwrap_or_default();
    taints.iter().any(|t| t.key == DRAIN_TAINT_KEY && t.effect == "NoSchedule")
}

fn tolerates_drain_taint(pod: &Pod) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
    tolerations.iter().any(|t| {
        let key_ok = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => k == DRAIN_TAINT_KEY,
        };
        key_ok && t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "NoSchedule")
    })
}

fn daemonset_owner(pod: &Pod) -> String {
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let name = owners.iter().find(|o| o.kind == "DaemonSet").map(|o| o.name.as_str()).unwrap_or_default();
    format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), name)
}

/// Why a targeted pod is not evicted in this step, or `None` if it may be evicted now.
/// Takes one disruption from each PDB budget the pod consumes.
fn hold_reason(
    pod: &Pod,
    node: Option<&Node>,
    budgets: &mut BTreeMap<String, i32>,
    now: Timestamp,
    pdbs: &[PodDisruptionBudget],
) -> Option<String> {
    if let Some(deleted) = pod.metadata.deletion_timestamp.as_ref() {
        return Some(if deleted.0 < now {
            format!("stuck terminating since {}", deleted.0)
        } else {
            "terminating".to_string()
        });
    }
    match pod_type(pod) {
        PodType::Static => return Some("static pod: waiting for the node agent to stop it".to_string()),
        PodType::DaemonSet if tolerates_drain_taint(pod) => {
            return Some(format!(
                "DaemonSet {} tolerates the maintenance taint {DRAIN_TAINT_KEY} and would recreate the pod",
                daemonset_owner(pod)
            ));
        }
        PodType::DaemonSet if !node_has_drain_taint(node) => {
            return Some(format!("waiting for the maintenance taint {DRAIN_TAINT_KEY} on the node"));
        }
        _ => {}
    }
    let guarding = pdbs_of(pod, pdbs);
    if guarding.len() > 1 {
        return Some(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
        );
    }
    let pdb = guarding.first()?;
    let key = format!(
        "{}/{}",
        pdb.metadata.namespace.as_deref().unwrap_or_default(),
        pdb.metadata.name.as_deref().unwrap_or_default()
    );
    let allowed = pdb.status.as_ref().map_or(0, |s| s.disruptions_allowed);
    let budget = budgets.entry(key.clone()).or_insert(allowed);
    if *budget <= 0 {
        return Some(format!("PodDisruptionBudget {key} allows no more disruptions"));
    }
    *budget -= 1;
    None
}

/// One drain step of `m` (in stage Drain): which pods to evict and what the status says.
pub fn plan_drain(m: &NodeMaintenance, cluster: Cluster, now: Timestamp) -> DrainStep {
    let plan = effective_drain_plan(m);
    let node_names = selected_nodes(m, cluster.nodes);
    let node_set: BTreeSet<&str> = node_names.iter().map(String::as_str).collect();
    let live = live_pods(cluster.pods, &node_set);
    let previously = m.status.as_ref().map_or(0, |s| s.drain_status.reached_drain_targets.len());
    let reached = advance(&plan, previously, &live);
    let targets = &plan[..reached];
    let needs_taint = targets.iter().any(|e| e.pod_type >= PodType::DaemonSet);

    let mut budgets = BTreeMap::new();
    let mut step = DrainStep {
        reached,
        evict: vec![],
        taint: vec![],
        drain_status: DrainStatus { reached_drain_targets: targets.to_vec(), ..Default::default() },
        node_statuses: vec![],
        drained: false,
    };
    for name in &node_names {
        let node = cluster.nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name));
        if needs_taint && !node_has_drain_taint(node) {
            step.taint.push(name.clone());
        }
        let limits = limiters(m, name, cluster);
        let mut status = NodeStatus { node_name: name.clone(), ..Default::default() };
        let mut limited_by = BTreeSet::new();
        let on_node = live.iter().filter(|p| node_of(p) == Some(name.as_str()) && targeted(targets, p));
        for pod in on_node {
            status.pods_remaining += 1;
            let blockers: Vec<&str> = limits.iter().filter(|(_, t)| !targeted(t, pod)).map(|(n, _)| *n).collect();
            let reason = if blockers.is_empty() {
                hold_reason(pod, node, &mut budgets, now, cluster.pdbs)
            } else {
                limited_by.extend(blockers.iter().copied());
                Some(format!("waiting for maintenance {}", blockers.join(", ")))
            };
            match reason {
                None => {
                    step.drain_status.pods_pending_eviction += 1;
                    step.evict.push(pod_ref(pod));
                }
                Some(reason) => {
                    if pod.metadata.deletion_timestamp.is_some() {
                        step.drain_status.active_evictions += 1;
                    } else {
                        step.drain_status.pods_pending_eviction += 1;
                    }
                    let (namespace, name) = (pod_ref(pod).namespace, pod_ref(pod).name);
                    status.blocking_pods.push(BlockingPod { namespace, name, reason });
                }
            }
        }
        let node_done = reached == plan.len() && status.pods_remaining == 0;
        status.drain_targets_reached = node_done;
        status.drain_message = if node_done {
            "Drained".to_string()
        } else if limited_by.is_empty() {
            "Draining".to_string()
        } else {
            format!("Draining (limited by {})", limited_by.into_iter().collect::<Vec<_>>().join(", "))
        };
        step.node_statuses.push(status);
    }
    step.drained = step.node_statuses.iter().all(|s| s.drain_targets_reached);
    step
}

/// The Idle preview: per selected node, the pods the whole plan would drain, touching nothing.
pub fn preview(m: &NodeMaintenance, cluster: Cluster) -> Vec<NodeStatus> {
    let plan = effective_drain_plan(m);
    let node_names = selected_nodes(m, cluster.nodes);
    let node_set: BTreeSet<&str> = node_names.iter().map(String::as_str).collect();
    let live = live_pods(cluster.pods, &node_set);
    node_names
        .iter()
        .map(|name| {
            let count = live.iter().filter(|p| node_of(p) == Some(name.as_str()) && targeted(&plan, p)).count();
            NodeStatus {
                node_name: name.clone(),
                pods_remaining: count as i32,
                drain_message: format!("Idle: the drain would evict {count} pods"),
                ..Default::default()
            }
        })
        .collect()
}

/// Whether the node was cordoned before maintenance: another active maintenance's memory
/// wins over the node's current state, which that maintenance may have set itself.
pub fn cordon_memory(me: &NodeMaintenance, node: &Node, maintenances: &[NodeMaintenance]) -> bool {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let remembered = maintenances
        .iter()
        .filter(|o| name_of(o) != name_of(me) && matches!(o.spec.stage, Stage::Cordon | Stage::Drain))
        .filter_map(|o| o.status.as_ref()?.node_statuses.iter().find(|s| s.node_name == name)?.was_unschedulable)
        .next();
    remembered.unwrap_or_else(|| node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false))
}

/// On Complete: uncordon only if the node was schedulable before and no other active
/// maintenance still covers it.
pub fn should_uncordon(me: &NodeMaintenance, node_name: &str, cluster: Cluster) -> bool {
    let was =
        me.status.as_ref().and_then(|s| s.node_statuses.iter().find(|n| n.node_name == node_name)?.was_unschedulable);
    let still_covered = cluster
        .maintenances
        .iter()
        .filter(|o| name_of(o) != name_of(me) && matches!(o.spec.stage, Stage::Cordon | Stage::Drain))
        .any(|o| selected_nodes(o, cluster.nodes).iter().any(|n| n == node_name));
    was == Some(false) && !still_covered
}

/// Whether the drain taint may be removed from the node on Complete.
pub fn should_untaint(me: &NodeMaintenance, node_name: &str, cluster: Cluster) -> bool {
    !cluster
        .maintenances
        .iter()
        .filter(|o| name_of(o) != name_of(me) && o.spec.stage == Stage::Drain)
        .any(|o| selected_nodes(o, cluster.nodes).iter().any(|n| n == node_name))
}

/// Refuses a maintenance covering every control-plane node or every schedulable node, unless
/// its `maintenance.gantry.dev/allow-all-nodes: "true"` annotation says so explicitly.
pub fn safety_violation(m: &NodeMaintenance, nodes: &[Node]) -> Option<String> {
    let allowed =
        m.metadata.annotations.as_ref().and_then(|a| a.get(ALLOW_ALL_NODES_ANNOTATION)).is_some_and(|v| v == "true");
    if allowed {
        return None;
    }
    let selected: BTreeSet<String> = selected_nodes(m, nodes).into_iter().collect();
    let covers_all = |filter: &dyn Fn(&Node) -> bool| {
        let group: Vec<&str> = nodes.iter().filter(|n| filter(n)).filter_map(|n| n.metadata.name.as_deref()).collect();
        !group.is_empty() && group.iter().all(|n| selected.contains(*n))
    };
    let control_plane = |n: &Node| n.metadata.labels.as_ref().is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL));
    let schedulable = |n: &Node| !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
    let why = if covers_all(&control_plane) {
        "the node selector covers every control-plane node"
    } else if covers_all(&schedulable) {
        "the node selector covers every schedulable node"
    } else {
        return None;
    };
    Some(format!("{why}; set the annotation {ALLOW_ALL_NODES_ANNOTATION}: \"true\" to proceed anyway"))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
