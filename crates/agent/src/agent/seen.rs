//! What each pod's worker last saw of its pod in the runtime, so that the relist wakes a
//! worker only for a change it has not seen.
//!
//! The relist runs every second. During a start, a worker creates the sandbox and starts the
//! containers itself, and reports what it saw; without this record the relist would wake it
//! once or twice more for its own changes, each time listing the pod again and computing the
//! same status. A fingerprint is recorded by whoever looked last (the worker or the relist),
//! and the relist wakes a worker when what it lists differs from it: a change that neither
//! has seen is never hidden.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use gantry_pod::ObservedPod;

#[derive(Default)]
pub struct Seen(Mutex<HashMap<String, u64>>);

impl Seen {
    /// A worker has seen (and reported) `observed`.
    pub fn note(&self, uid: &str, observed: &ObservedPod) {
        let fp = fingerprint(observed);
        let mut seen = self.0.lock().unwrap();
        match seen.get_mut(uid) {
            Some(last) => *last = fp,
            None => drop(seen.insert(uid.to_string(), fp)),
        }
    }

    /// The relist lists `observed`: whether it differs from what was last seen of the pod.
    pub fn changed(&self, uid: &str, observed: &ObservedPod) -> bool {
        let fp = fingerprint(observed);
        self.0.lock().unwrap().insert(uid.to_string(), fp) != Some(fp)
    }

    /// Forgets pods that are no longer in the runtime.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0.lock().unwrap().retain(|uid, _| keep(uid));
    }
}

/// The pod's sandboxes and containers, with their readiness and states.
fn fingerprint(observed: &ObservedPod) -> u64 {
    let mut items: Vec<(&str, u8)> = observed
        .sandboxes
        .iter()
        .map(|s| (s.id.as_str(), u8::from(s.ready)))
        .chain(observed.containers.iter().map(|c| (c.id.as_str(), c.state as u8)))
        .collect();
    items.sort();
    let mut hasher = DefaultHasher::new();
    items.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_pod::SandboxInfo;

    /// A pod with one sandbox, ready or not yet.
    fn pod(ready: bool) -> ObservedPod {
        let sandbox =
            SandboxInfo { id: "s1".into(), attempt: 0, ready, created_at: 1, ip: None, additional_ips: Vec::new() };
        ObservedPod { sandboxes: vec![sandbox], containers: Vec::new() }
    }

    #[test]
    fn what_the_worker_saw_wakes_nobody() {
        let seen = Seen::default();
        seen.note("u", &pod(true));
        assert!(!seen.changed("u", &pod(true)));
    }

    #[test]
    fn a_change_the_worker_has_not_seen_wakes_it_once() {
        let seen = Seen::default();
        seen.note("u", &pod(false));
        assert!(seen.changed("u", &pod(true)), "the sandbox became ready after the worker looked");
        assert!(!seen.changed("u", &pod(true)), "the next relist has nothing new");
        assert!(seen.changed("v", &pod(true)), "a pod never seen");
    }

    #[test]
    fn a_forgotten_pod_is_new_again() {
        let seen = Seen::default();
        seen.note("u", &pod(true));
        seen.retain(|uid| uid != "u");
        assert!(seen.changed("u", &pod(true)));
    }
}
