//! Garbage collection of dead containers and sandboxes.
//!
//! For a pod that is still wanted, the newest instance of each container is kept (its exit
//! code and log feed `lastState` and `kubectl logs --previous`), older dead instances go, and
//! so do dead sandboxes that hold nothing worth keeping. A pod that is no longer wanted loses
//! everything once nothing in it runs.

use std::collections::HashSet;

use super::{ContainerState, ObservedPod};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Removal {
    Container(String),
    Sandbox(String),
}

/// What to remove from one pod's runtime objects.
pub fn collect(observed: &ObservedPod, wanted: bool) -> Vec<Removal> {
    if !wanted {
        return collect_unwanted(observed);
    }
    let keep: HashSet<&str> = newest_per_name(observed);
    let mut removals: Vec<Removal> = observed
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Exited && !keep.contains(c.id.as_str()))
        .map(|c| Removal::Container(c.id.clone()))
        .collect();
    let current = observed.current_sandbox().map(|s| s.id.as_str());
    for s in &observed.sandboxes {
        let holds_kept = observed.containers.iter().any(|c| c.sandbox_id == s.id && keep.contains(c.id.as_str()));
        if !s.ready && Some(s.id.as_str()) != current && !holds_kept {
            removals.push(Removal::Sandbox(s.id.clone()));
        }
    }
    removals
}

fn collect_unwanted(observed: &ObservedPod) -> Vec<Removal> {
    if observed.running().next().is_some() || observed.sandboxes.iter().any(|s| s.ready) {
        return Vec::new(); // still being stopped; the terminating worker owns it
    }
    let containers = observed.containers.iter().map(|c| Removal::Container(c.id.clone()));
    let sandboxes = observed.sandboxes.iter().map(|s| Removal::Sandbox(s.id.clone()));
    containers.chain(sandboxes).collect()
}

fn newest_per_name(observed: &ObservedPod) -> HashSet<&str> {
    observed.containers.iter().filter_map(|c| observed.latest(&c.name).map(|l| l.id.as_str())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ContainerInfo, SandboxInfo};

    fn sandbox(id: &str, attempt: u32, ready: bool) -> SandboxInfo {
        SandboxInfo { id: id.into(), attempt, ready, created_at: attempt as i64, ip: None, additional_ips: vec![] }
    }

    fn container(id: &str, name: &str, sandbox: &str, attempt: u32, state: ContainerState) -> ContainerInfo {
        ContainerInfo {
            sandbox_id: sandbox.into(),
            attempt,
            created_at: attempt as i64,
            ..ContainerInfo::fixture(id, name, state)
        }
    }

    #[test]
    fn keeps_newest_dead_instance_and_removes_older_ones() {
        let obs = ObservedPod {
            sandboxes: vec![sandbox("s", 0, true)],
            containers: vec![
                container("a0", "a", "s", 0, ContainerState::Exited),
                container("a1", "a", "s", 1, ContainerState::Exited),
                container("a2", "a", "s", 2, ContainerState::Running),
                container("b0", "b", "s", 0, ContainerState::Exited),
            ],
        };
        let removals = collect(&obs, true);
        assert_eq!(removals, vec![Removal::Container("a0".into()), Removal::Container("a1".into())]);
    }

    #[test]
    fn removes_old_dead_sandboxes_unless_they_hold_the_newest_instance() {
        let obs = ObservedPod {
            sandboxes: vec![sandbox("old", 0, false), sandbox("older", 1, false), sandbox("cur", 2, true)],
            containers: vec![
                container("a0", "a", "old", 0, ContainerState::Exited),
                container("b0", "b", "older", 0, ContainerState::Exited),
                container("b1", "b", "cur", 1, ContainerState::Running),
            ],
        };
        let removals = collect(&obs, true);
        assert!(removals.contains(&Removal::Sandbox("older".into())));
        assert!(removals.contains(&Removal::Container("b0".into())));
        assert!(!removals.contains(&Removal::Sandbox("old".into())), "holds a's only instance");
        assert!(!removals.contains(&Removal::Sandbox("cur".into())));
    }

    #[test]
    fn unwanted_pod_is_removed_only_once_stopped() {
        let mut obs = ObservedPod {
            sandboxes: vec![sandbox("s", 0, true)],
            containers: vec![container("a0", "a", "s", 0, ContainerState::Running)],
        };
        assert!(collect(&obs, false).is_empty());
        obs.sandboxes[0].ready = false;
        obs.containers[0].state = ContainerState::Exited;
        assert_eq!(collect(&obs, false), vec![Removal::Container("a0".into()), Removal::Sandbox("s".into())]);
    }
}
