//! The spec rules the CRD's CEL validation states, checked again by the controller for API
//! servers that do not evaluate CEL: an object breaking them gets the `Invalid` condition and is
//! not acted on.

use crate::api::{DrainPlanEntry, NodeMaintenanceSpec, NodeMaintenanceStatus};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error(
        "spec.drainPlan[{index}]: podType {found:?} comes after {previous:?}; the order is Default, DaemonSet, Static"
    )]
    TypeOrder { index: usize, found: String, previous: String },
    #[error(
        "spec.drainPlan[{index}]: podPriority {found} is lower than the previous entry's {previous} of the same podType"
    )]
    PriorityOrder { index: usize, found: i32, previous: i32 },
    #[error(
        "spec.drainPlan[{index}]: an entry with a podSelector must come before the entry without one of the same podType and podPriority"
    )]
    SelectorOrder { index: usize },
    #[error("spec.drainPlan[{index}]: duplicate of entry {first}")]
    Duplicate { index: usize, first: usize },
    #[error("spec.stage: {found} is before the already started stage {started}; stages only move forward")]
    StageBackwards { found: String, started: String },
    #[error("spec.drainPlan: changed after it was set; drainPlan is immutable")]
    DrainPlanChanged,
}

/// KEP order: by podType, then ascending podPriority, and entries with a selector before the
/// entry without one at the same podType and podPriority; no duplicates.
pub fn check_drain_plan(plan: &[DrainPlanEntry]) -> Result<(), SpecError> {
    for (index, pair) in plan.windows(2).enumerate() {
        let (prev, cur, index) = (&pair[0], &pair[1], index + 1);
        if cur.pod_type < prev.pod_type {
            let (found, previous) = (format!("{:?}", cur.pod_type), format!("{:?}", prev.pod_type));
            return Err(SpecError::TypeOrder { index, found, previous });
        }
        if cur.pod_type == prev.pod_type && cur.pod_priority < prev.pod_priority {
            return Err(SpecError::PriorityOrder { index, found: cur.pod_priority, previous: prev.pod_priority });
        }
        let same_step = cur.pod_type == prev.pod_type && cur.pod_priority == prev.pod_priority;
        if same_step && prev.pod_selector.is_none() && cur.pod_selector.is_some() {
            return Err(SpecError::SelectorOrder { index });
        }
    }
    for (index, entry) in plan.iter().enumerate() {
        if let Some(first) = plan[..index].iter().position(|e| e == entry) {
            return Err(SpecError::Duplicate { index, first });
        }
    }
    Ok(())
}

/// The transition rules, checked against what the status recorded (the stages already
/// started and the targets already reached) so the controller needs no copy of the old spec.
pub fn check_against_status(spec: &NodeMaintenanceSpec, status: &NodeMaintenanceStatus) -> Result<(), SpecError> {
    if let Some(started) = status.stage_statuses.iter().map(|s| s.name).max()
        && spec.stage < started
    {
        let (found, started) = (spec.stage.as_str().to_string(), started.as_str().to_string());
        return Err(SpecError::StageBackwards { found, started });
    }
    let reached = &status.drain_status.reached_drain_targets;
    if !reached.is_empty() && !spec.drain_plan.starts_with(reached) {
        return Err(SpecError::DrainPlanChanged);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LabelSelector, PodType, Stage, StageStatus, default_drain_plan};

    fn entry(pod_type: PodType, pod_priority: i32, app: Option<&str>) -> DrainPlanEntry {
        let pod_selector = app
            .map(|a| LabelSelector { match_labels: [("app".to_string(), a.to_string())].into(), ..Default::default() });
        DrainPlanEntry { pod_selector, pod_priority, pod_type }
    }

    #[test]
    fn default_plan_is_valid() {
        assert_eq!(check_drain_plan(&default_drain_plan()), Ok(()));
    }

    #[test]
    fn order_rules_name_the_entry() {
        let types = [entry(PodType::DaemonSet, 1, None), entry(PodType::Default, 1, None)];
        assert!(matches!(check_drain_plan(&types), Err(SpecError::TypeOrder { index: 1, .. })));
        let prio = [entry(PodType::Default, 5, None), entry(PodType::Default, 1, None)];
        assert_eq!(check_drain_plan(&prio), Err(SpecError::PriorityOrder { index: 1, found: 1, previous: 5 }));
        let sel = [entry(PodType::Default, 5, None), entry(PodType::Default, 5, Some("db"))];
        assert_eq!(check_drain_plan(&sel), Err(SpecError::SelectorOrder { index: 1 }));
        let dup = [entry(PodType::Default, 5, Some("db")), entry(PodType::Default, 5, Some("db"))];
        assert_eq!(check_drain_plan(&dup), Err(SpecError::Duplicate { index: 1, first: 0 }));
        let ok =
            [entry(PodType::Default, 5, Some("db")), entry(PodType::Default, 5, None), entry(PodType::Static, 1, None)];
        assert_eq!(check_drain_plan(&ok), Ok(()));
        assert!(check_drain_plan(&prio).unwrap_err().to_string().starts_with("spec.drainPlan[1]"));
    }

    #[test]
    fn stage_cannot_go_back_and_plan_cannot_change() {
        let mut spec =
            NodeMaintenanceSpec { stage: Stage::Cordon, drain_plan: default_drain_plan(), ..Default::default() };
        let mut status = NodeMaintenanceStatus::default();
        status.stage_statuses.push(StageStatus { name: Stage::Drain, start_timestamp: "2026-01-01T00:00:00Z".into() });
        assert!(matches!(check_against_status(&spec, &status), Err(SpecError::StageBackwards { .. })));
        spec.stage = Stage::Complete;
        assert_eq!(check_against_status(&spec, &status), Ok(()));
        status.drain_status.reached_drain_targets = default_drain_plan()[..2].to_vec();
        assert_eq!(check_against_status(&spec, &status), Ok(()));
        spec.drain_plan[1].pod_priority = 7;
        assert_eq!(check_against_status(&spec, &status), Err(SpecError::DrainPlanChanged));
    }
}
