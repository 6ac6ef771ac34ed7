//! The maintenance conditions on each Node (KEP-5683 names), computed from every maintenance
//! covering the node, so whichever maintenance reconciles last writes the same answer (pure).
//!
//! - `MaintenanceInProgress`: a maintenance in Cordon or Drain covers the node.
//! - `DrainInProgress`: one of them is draining it and has not finished there.
//! - `Drained`: a drain finished there and none is still running.
//!
//! Only these three types are ever written (a strategic merge keyed by type), so the
//! conditions the node agent owns are never touched.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{CONDITION_DRAINED, NodeMaintenance, NodeStatus, Stage};

pub const CONDITION_MAINTENANCE_IN_PROGRESS: &str = "MaintenanceInProgress";
pub const CONDITION_DRAIN_IN_PROGRESS: &str = "DrainInProgress";
const TYPES: [&str; 3] = [CONDITION_MAINTENANCE_IN_PROGRESS, CONDITION_DRAIN_IN_PROGRESS, CONDITION_DRAINED];

/// One maintenance as it stands after this reconcile: its effective stage and its node statuses.
pub struct Covering<'a> {
    pub name: &'a str,
    pub stage: Stage,
    pub nodes: &'a [NodeStatus],
}

impl<'a> Covering<'a> {
    /// A maintenance as stored; one being deleted counts as Complete.
    pub fn stored(m: &'a NodeMaintenance) -> Covering<'a> {
        let stage = if m.metadata.deletion_timestamp.is_some() { Stage::Complete } else { m.spec.stage };
        let nodes = m.status.as_ref().map(|s| s.node_statuses.as_slice()).unwrap_or_default();
        Covering { name: m.metadata.name.as_deref().unwrap_or_default(), stage, nodes }
    }

    fn on(&self, node: &str) -> Option<&'a NodeStatus> {
        matches!(self.stage, Stage::Cordon | Stage::Drain).then(|| self.nodes.iter().find(|s| s.node_name == node))?
    }
}

fn drained(s: &NodeStatus) -> bool {
    s.drain_targets_reached && s.pods_remaining == 0
}

/// The three conditions `node` should carry, as (type, status, reason, message).
fn desired(node: &str, maintenances: &[Covering]) -> [(&'static str, bool, &'static str, String); 3] {
    let active: Vec<(&str, Stage, &NodeStatus)> =
        maintenances.iter().filter_map(|m| Some((m.name, m.stage, m.on(node)?))).collect();
    let names = |pick: &dyn Fn(Stage, &NodeStatus) -> bool| -> Vec<&str> {
        active.iter().filter(|(_, stage, s)| pick(*stage, s)).map(|(n, _, _)| *n).collect()
    };
    let all = names(&|_, _| true);
    let draining = names(&|stage, s| stage == Stage::Drain && !drained(s));
    let done = names(&|stage, s| stage == Stage::Drain && drained(s));
    let in_progress = !all.is_empty();
    let drain_running = !draining.is_empty();
    let is_drained = !done.is_empty() && !drain_running;
    [
        (
            CONDITION_MAINTENANCE_IN_PROGRESS,
            in_progress,
            if in_progress { "NodeMaintenance" } else { "NoMaintenance" },
            if in_progress { format!("Node maintenance in progress: {}", all.join(", ")) } else { String::new() },
        ),
        (
            CONDITION_DRAIN_IN_PROGRESS,
            drain_running,
            if drain_running { "Draining" } else { "NotDraining" },
            if drain_running { format!("Drained by maintenance {}", draining.join(", ")) } else { String::new() },
        ),
        (
            CONDITION_DRAINED,
            is_drained,
            if is_drained { "Drained" } else { "NotDrained" },
            if is_drained {
                format!("Drain targets reached for maintenance {}", done.join(", "))
            } else {
                String::new()
            },
        ),
    ]
}

/// The conditions to write on `node`, or nothing if it already carries them (timestamps
/// aside) or never carried any and none is true.
pub fn update(node: &Node, maintenances: &[Covering], now: Timestamp) -> Option<Vec<NodeCondition>> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let current = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let find = |ty: &str| current.iter().find(|c| c.type_ == ty);
    let want = desired(name, maintenances);
    let never_had = TYPES.iter().all(|ty| find(ty).is_none());
    if never_had && want.iter().all(|(_, on, _, _)| !on) {
        return None;
    }
    let status = |on: bool| if on { "True" } else { "False" }.to_string();
    let same = want.iter().all(|(ty, on, reason, message)| {
        find(ty).is_some_and(|c| {
            c.status == status(*on)
                && c.reason.as_deref() == Some(*reason)
                && c.message.as_deref().unwrap_or("") == message
        })
    });
    if same {
        return None;
    }
    let conditions = want
        .into_iter()
        .map(|(ty, on, reason, message)| {
            // The transition time moves only when the status flips, as for the agent's own.
            let transition = match find(ty) {
                Some(c) if c.status == status(on) => c.last_transition_time.clone(),
                _ => Some(Time(now)),
            };
            NodeCondition {
                type_: ty.to_string(),
                status: status(on),
                reason: Some(reason.to_string()),
                message: Some(message),
                last_heartbeat_time: Some(Time(now)),
                last_transition_time: transition,
            }
        })
        .collect();
    Some(conditions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{node, now};

    fn status(node: &str, reached: bool, remaining: i32) -> NodeStatus {
        NodeStatus {
            node_name: node.into(),
            drain_targets_reached: reached,
            pods_remaining: remaining,
            ..Default::default()
        }
    }

    fn get<'a>(conditions: &'a [NodeCondition], ty: &str) -> &'a NodeCondition {
        conditions.iter().find(|c| c.type_ == ty).unwrap()
    }

    fn with(mut n: Node, conditions: Vec<NodeCondition>) -> Node {
        n.status.get_or_insert_default().conditions = Some(conditions);
        n
    }

    #[test]
    fn a_node_no_maintenance_ever_touched_gets_nothing() {
        let idle = [status("n1", false, 3)];
        let m = [Covering { name: "m", stage: Stage::Idle, nodes: &idle }];
        assert!(update(&node("n1", &[]), &m, now()).is_none());
    }

    #[test]
    fn cordon_then_drain_then_drained_then_complete() {
        let n1 = node("n1", &[]);
        let busy = [status("n1", false, 2)];
        let cordon = update(&n1, &[Covering { name: "m", stage: Stage::Cordon, nodes: &busy }], now()).unwrap();
        assert_eq!(get(&cordon, CONDITION_MAINTENANCE_IN_PROGRESS).status, "True");
        assert_eq!(get(&cordon, CONDITION_DRAIN_IN_PROGRESS).status, "False");

        let n1 = with(n1, cordon);
        let draining = update(&n1, &[Covering { name: "m", stage: Stage::Drain, nodes: &busy }], now()).unwrap();
        let drain = get(&draining, CONDITION_DRAIN_IN_PROGRESS);
        assert_eq!((drain.status.as_str(), drain.message.as_deref()), ("True", Some("Drained by maintenance m")));
        assert_eq!(get(&draining, CONDITION_DRAINED).status, "False");

        let n1 = with(n1, draining.clone());
        let again = update(&n1, &[Covering { name: "m", stage: Stage::Drain, nodes: &busy }], now());
        assert!(again.is_none(), "nothing changed, nothing written");

        let done = [status("n1", true, 0)];
        let drained = update(&n1, &[Covering { name: "m", stage: Stage::Drain, nodes: &done }], now()).unwrap();
        assert_eq!(get(&drained, CONDITION_DRAINED).status, "True");
        assert_eq!(get(&drained, CONDITION_DRAIN_IN_PROGRESS).status, "False");
        let kept = get(&drained, CONDITION_MAINTENANCE_IN_PROGRESS);
        assert_eq!(kept.last_transition_time, get(&draining, CONDITION_MAINTENANCE_IN_PROGRESS).last_transition_time);

        let n1 = with(n1, drained);
        let complete = update(&n1, &[Covering { name: "m", stage: Stage::Complete, nodes: &done }], now()).unwrap();
        assert!(complete.iter().all(|c| c.status == "False"), "{complete:?}");
    }

    #[test]
    fn a_running_drain_of_another_maintenance_keeps_the_node_not_drained() {
        let done = [status("n1", true, 0)];
        let busy = [status("n1", false, 1)];
        let both = [
            Covering { name: "ahead", stage: Stage::Drain, nodes: &done },
            Covering { name: "behind", stage: Stage::Drain, nodes: &busy },
        ];
        let c = update(&node("n1", &[]), &both, now()).unwrap();
        assert_eq!(get(&c, CONDITION_DRAINED).status, "False");
        assert_eq!(get(&c, CONDITION_DRAIN_IN_PROGRESS).message.as_deref(), Some("Drained by maintenance behind"));
        let m = get(&c, CONDITION_MAINTENANCE_IN_PROGRESS);
        assert_eq!(m.message.as_deref(), Some("Node maintenance in progress: ahead, behind"));
    }
}
