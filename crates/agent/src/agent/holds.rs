//! The agent's bookkeeping of static pods held by node maintenances (pure): which pods leave
//! the desired set, and which static pods keep a mirror pod. A held pod keeps its mirror
//! until its worker has stopped it, since the mirror going away is what tells the
//! maintenance controller that the pod is gone.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use gantry_vocab::keys::is_api_pod;

#[derive(Debug, Default)]
pub struct Holds {
    /// Held static pod UID → the maintenance holding it.
    held: BTreeMap<String, String>,
    /// Held pods whose worker is still stopping them.
    stopping: HashSet<String>,
}

/// What changed with an update, for the logs.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    /// (UID, maintenance) newly held.
    pub held: Vec<(String, String)>,
    /// (UID, maintenance) released.
    pub released: Vec<(String, String)>,
}

impl Holds {
    /// Takes the latest decision; `has_worker` says which pods are running now (they keep
    /// their mirror until their worker is done).
    pub fn update(&mut self, held: BTreeMap<String, String>, has_worker: impl Fn(&str) -> bool) -> Changes {
        let mut changes = Changes::default();
        for (uid, m) in held.iter().filter(|(uid, _)| !self.held.contains_key(*uid)) {
            changes.held.push((uid.clone(), m.clone()));
            if has_worker(uid) {
                self.stopping.insert(uid.clone());
            }
        }
        for (uid, m) in self.held.iter().filter(|(uid, _)| !held.contains_key(*uid)) {
            changes.released.push((uid.clone(), m.clone()));
        }
        self.stopping.retain(|uid| held.contains_key(uid));
        self.held = held;
        changes
    }

    /// The pod's worker is done; true if that changes which mirrors are wanted.
    pub fn worker_done(&mut self, uid: &str) -> bool {
        self.stopping.remove(uid)
    }

    /// What the node runs: everything the sources want except held static pods.
    pub fn desired(&self, merged: &BTreeMap<String, Arc<Pod>>) -> BTreeMap<String, Arc<Pod>> {
        merged.iter().filter(|(uid, _)| !self.held.contains_key(*uid)).map(|(u, p)| (u.clone(), p.clone())).collect()
    }

    /// The static pods that should have a mirror pod.
    pub fn mirrored(&self, merged: &BTreeMap<String, Arc<Pod>>) -> Vec<Pod> {
        merged
            .iter()
            .filter(|(uid, p)| !is_api_pod(p) && (!self.held.contains_key(*uid) || self.stopping.contains(*uid)))
            .map(|(_, p)| Pod::clone(p))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_vocab::keys::CONFIG_SOURCE;

    fn pod(uid: &str, source: &str) -> (String, Arc<Pod>) {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.annotations = Some([(CONFIG_SOURCE.to_string(), source.to_string())].into());
        (uid.to_string(), Arc::new(p))
    }

    fn uids<P: std::borrow::Borrow<Pod>>(pods: impl IntoIterator<Item = P>) -> Vec<String> {
        pods.into_iter().map(|p| p.borrow().metadata.uid.clone().unwrap()).collect()
    }

    fn hold(uid: &str) -> BTreeMap<String, String> {
        [(uid.to_string(), "m".to_string())].into()
    }

    #[test]
    fn a_running_held_pod_leaves_the_desired_set_but_keeps_its_mirror_until_stopped() {
        let merged: BTreeMap<String, Arc<Pod>> = [pod("s1", "file"), pod("s2", "file"), pod("a1", "api")].into();
        let mut holds = Holds::default();
        let changes = holds.update(hold("s1"), |_| true);
        assert_eq!(changes.held, [("s1".to_string(), "m".to_string())]);
        assert_eq!(uids(holds.desired(&merged).into_values()), ["a1", "s2"]);
        assert_eq!(uids(holds.mirrored(&merged)), ["s1", "s2"], "mirror stays while stopping");
        assert!(holds.worker_done("s1"));
        assert_eq!(uids(holds.mirrored(&merged)), ["s2"], "mirror goes once stopped");
        assert!(!holds.worker_done("s2"), "other pods' workers do not change mirrors");
    }

    #[test]
    fn a_pod_held_before_it_runs_never_gets_a_mirror_and_release_brings_both_back() {
        let merged: BTreeMap<String, Arc<Pod>> = [pod("s1", "file")].into();
        let mut holds = Holds::default();
        holds.update(hold("s1"), |_| false);
        assert!(holds.desired(&merged).is_empty());
        assert!(holds.mirrored(&merged).is_empty());
        let changes = holds.update(BTreeMap::new(), |_| false);
        assert_eq!(changes.released, [("s1".to_string(), "m".to_string())]);
        assert_eq!(uids(holds.desired(&merged).into_values()), ["s1"]);
        assert_eq!(uids(holds.mirrored(&merged)), ["s1"]);
    }

    #[test]
    fn an_unchanged_decision_reports_nothing() {
        let mut holds = Holds::default();
        holds.update(hold("s1"), |_| true);
        assert_eq!(holds.update(hold("s1"), |_| true), Changes::default());
    }
}
