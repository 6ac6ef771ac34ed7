//! The pure reconcile step: from one NodeMaintenance and a snapshot of the cluster, what the
//! controller changes (finalizer, nodes, evictions) and the status it writes. The controller
//! applies a [`Decision`] and never decides anything itself.

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition};

use crate::api::{
    CONDITION_DRAINED, CONDITION_INVALID, CONDITION_UNSAFE, Condition, DRAIN_TAINT_KEY, DrainPlanEntry,
    NodeMaintenance, NodeMaintenanceStatus, NodeStatus, Stage, StageStatus,
};
use crate::node_conditions::{self, Covering};
use crate::plan::{self, Cluster, PodRef};
use crate::validate;

/// Everything one reconcile of a NodeMaintenance does, in the order the controller applies it:
/// status first (so the cordon memory is stored before any node is cordoned), then the spec
/// write-back and the finalizer, then nodes, then evictions.
#[derive(Debug, Default, PartialEq)]
pub struct Decision {
    pub status: NodeMaintenanceStatus,
    /// The KEP's default plan, written back when `spec.drainPlan` is empty.
    pub write_back_plan: Option<Vec<DrainPlanEntry>>,
    pub add_finalizer: bool,
    pub remove_finalizer: bool,
    pub cordon: Vec<String>,
    pub uncordon: Vec<String>,
    pub taint: Vec<String>,
    pub untaint: Vec<String>,
    pub evict: Vec<PodRef>,
    /// The drain is still running: look again even if nothing in the cluster changes.
    pub requeue: bool,
    /// Node name → the maintenance conditions to write on it (only where they change).
    pub node_conditions: Vec<(String, Vec<NodeCondition>)>,
}

/// What the controller should do now for `m`.
pub fn decide(m: &NodeMaintenance, cluster: Cluster, now: Timestamp) -> Decision {
    let old = m.status.clone().unwrap_or_default();
    let deleting = m.metadata.deletion_timestamp.is_some();
    let mut d = Decision { status: old.clone(), ..Default::default() };

    if let Err(e) = validate::check_drain_plan(&m.spec.drain_plan).and(validate::check_against_status(&m.spec, &old))
        && !deleting
    {
        set_condition(&mut d.status, CONDITION_INVALID, true, "InvalidSpec", &e.to_string(), m, now);
        return d;
    }
    set_condition(&mut d.status, CONDITION_INVALID, false, "ValidSpec", "", m, now);

    let stage = if deleting { Stage::Complete } else { m.spec.stage };
    if matches!(stage, Stage::Cordon | Stage::Drain)
        && let Some(why) = plan::safety_violation(m, cluster.nodes)
    {
        set_condition(&mut d.status, CONDITION_UNSAFE, true, "CoversAllNodes", &why, m, now);
        return d;
    }
    set_condition(&mut d.status, CONDITION_UNSAFE, false, "Safe", "", m, now);

    if m.spec.drain_plan.is_empty() && !deleting {
        d.write_back_plan = Some(plan::effective_drain_plan(m));
    }
    record_stage(&mut d.status, stage, now);
    let has_finalizer = m.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == crate::api::FINALIZER));
    match stage {
        Stage::Idle => d.status.node_statuses = previewed(plan::preview(m, cluster), "Idle"),
        Stage::Cordon => {
            d.add_finalizer = !has_finalizer;
            cordon(m, cluster, &mut d);
            show_preview(m, cluster, &mut d);
        }
        Stage::Drain => {
            d.add_finalizer = !has_finalizer;
            cordon(m, cluster, &mut d);
            drain(m, cluster, now, &mut d);
        }
        // Without the finalizer the restore already happened (or nothing was ever touched);
        // doing it again would undo cordons made by others since.
        Stage::Complete if has_finalizer => {
            complete(m, cluster, &mut d);
            d.remove_finalizer = true;
        }
        Stage::Complete => {}
    }
    d.node_conditions = node_conditions(m, stage, cluster, &d.status, now);
    d
}

/// The conditions of this maintenance's nodes, judged with its new status and the others' stored ones.
fn node_conditions(
    m: &NodeMaintenance,
    stage: Stage,
    cluster: Cluster,
    status: &NodeMaintenanceStatus,
    now: Timestamp,
) -> Vec<(String, Vec<NodeCondition>)> {
    let me = m.metadata.name.as_deref().unwrap_or_default();
    let mut all: Vec<Covering> =
        cluster.maintenances.iter().filter(|o| o.metadata.name.as_deref() != Some(me)).map(Covering::stored).collect();
    all.push(Covering { name: me, stage, nodes: &status.node_statuses });
    status
        .node_statuses
        .iter()
        .filter_map(|s| {
            let node = find_node(cluster, &s.node_name)?;
            Some((s.node_name.clone(), node_conditions::update(node, &all, now)?))
        })
        .collect()
}

fn record_stage(status: &mut NodeMaintenanceStatus, stage: Stage, now: Timestamp) {
    if !status.stage_statuses.iter().any(|s| s.name == stage) {
        status.stage_statuses.push(StageStatus { name: stage, start_timestamp: now.to_string() });
    }
}

fn find_node<'a>(cluster: Cluster<'a>, name: &str) -> Option<&'a Node> {
    cluster.nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name))
}

fn unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
}

fn has_drain_taint(node: &Node) -> bool {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    taints.iter().any(|t| t.key == DRAIN_TAINT_KEY)
}

/// Remembers, once per node, whether it was cordoned before; then cordons it.
fn cordon(m: &NodeMaintenance, cluster: Cluster, d: &mut Decision) {
    let old = std::mem::take(&mut d.status.node_statuses);
    for name in plan::selected_nodes(m, cluster.nodes) {
        let Some(node) = find_node(cluster, &name) else { continue };
        let mut status = old.iter().find(|s| s.node_name == name).cloned().unwrap_or_else(|| NodeStatus {
            node_name: name.clone(),
            drain_message: "Cordoned".to_string(),
            ..Default::default()
        });
        if status.was_unschedulable.is_none() {
            status.was_unschedulable = Some(plan::cordon_memory(m, node, cluster.maintenances));
        }
        if !unschedulable(node) {
            d.cordon.push(name);
        }
        d.status.node_statuses.push(status);
    }
    // A node that no longer matches (relabelled, or gone) keeps its memory, so Complete can
    // still restore it.
    let kept: Vec<NodeStatus> = old
        .into_iter()
        .filter(|s| s.was_unschedulable.is_some())
        .filter(|s| !d.status.node_statuses.iter().any(|n| n.node_name == s.node_name))
        .collect();
    d.status.node_statuses.extend(kept);
}

fn previewed(mut statuses: Vec<NodeStatus>, stage: &str) -> Vec<NodeStatus> {
    for s in &mut statuses {
        s.drain_message = format!("{stage}: {}", s.drain_message);
    }
    statuses
}

/// In Cordon, each node shows what the Drain stage will evict and which pods would block it,
/// next to the cordon memory.
fn show_preview(m: &NodeMaintenance, cluster: Cluster, d: &mut Decision) {
    for fresh in previewed(plan::preview(m, cluster), "Cordoned") {
        let Some(status) = d.status.node_statuses.iter_mut().find(|s| s.node_name == fresh.node_name) else {
            continue;
        };
        status.pods_remaining = fresh.pods_remaining;
        status.drain_message = fresh.drain_message;
        status.blocking_pods = fresh.blocking_pods;
    }
}

fn drain(m: &NodeMaintenance, cluster: Cluster, now: Timestamp, d: &mut Decision) {
    let step = plan::plan_drain(m, cluster, now);
    for fresh in step.node_statuses {
        let memory = d.status.node_statuses.iter().find(|s| s.node_name == fresh.node_name);
        let was_unschedulable = memory.and_then(|s| s.was_unschedulable);
        d.status.node_statuses.retain(|s| s.node_name != fresh.node_name);
        d.status.node_statuses.push(NodeStatus { was_unschedulable, ..fresh });
    }
    d.status.node_statuses.sort_by(|a, b| a.node_name.cmp(&b.node_name));
    d.status.drain_status = step.drain_status;
    d.taint = step.taint;
    d.evict = step.evict;
    d.requeue = !step.drained;
    let (reason, message) = if step.drained {
        ("DrainTargetsReached", "every pod the drain plan targets is gone from the selected nodes".to_string())
    } else {
        let remaining: i32 = d.status.node_statuses.iter().map(|s| s.pods_remaining).sum();
        ("Draining", format!("{remaining} pods remaining"))
    };
    set_condition(&mut d.status, CONDITION_DRAINED, step.drained, reason, &message, m, now);
}

/// Undoes this maintenance's cordon and taint on every node it touched, unless another
/// maintenance still needs them or the node was cordoned before.
fn complete(m: &NodeMaintenance, cluster: Cluster, d: &mut Decision) {
    let touched: BTreeSet<String> =
        d.status.node_statuses.iter().filter(|s| s.was_unschedulable.is_some()).map(|s| s.node_name.clone()).collect();
    for name in touched {
        let Some(node) = find_node(cluster, &name) else { continue };
        if has_drain_taint(node) && plan::should_untaint(m, &name, cluster) {
            d.untaint.push(name.clone());
        }
        if unschedulable(node) && plan::should_uncordon(m, &name, cluster) {
            d.uncordon.push(name.clone());
        }
    }
    for status in &mut d.status.node_statuses {
        status.drain_message = "Complete".to_string();
        status.blocking_pods.clear();
    }
}

/// Sets a condition, keeping its transition time when the status does not change.
fn set_condition(
    status: &mut NodeMaintenanceStatus,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    m: &NodeMaintenance,
    now: Timestamp,
) {
    let value = if value { "True" } else { "False" }.to_string();
    let existing = status.conditions.iter().position(|c| c.type_ == type_);
    // "False" conditions that never were anything else are noise; leave them out.
    if existing.is_none() && value == "False" && type_ != CONDITION_DRAINED {
        return;
    }
    let last_transition_time = match existing.map(|i| &status.conditions[i]) {
        Some(c) if c.status == value => c.last_transition_time.clone(),
        _ => now.to_string(),
    };
    let condition = Condition {
        type_: type_.to_string(),
        status: value,
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time,
        observed_generation: m.metadata.generation,
    };
    match existing {
        Some(i) => status.conditions[i] = condition,
        None => status.conditions.push(condition),
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
