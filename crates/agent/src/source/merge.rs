//! Merges the latest SET from each source into the pods the node should run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::static_pod::CONFIG_SEEN;
use super::{SourceKind, SourceUpdate};
use gantry_vocab::spec;

#[derive(Debug, Default)]
pub struct Merger {
    sources: BTreeMap<SourceKind, Vec<Arc<Pod>>>,
    /// Per pod UID, kept while the pod stays desired: when it was first seen (as upstream), and
    /// the stamped copy of the source's pod, reused while the source sends the same pod.
    seen: HashMap<String, Seen>,
}

#[derive(Debug)]
struct Seen {
    at: String,
    /// The source's pod, and the copy stamped with `at`.
    from: Arc<Pod>,
    stamped: Arc<Pod>,
}

/// The merged desired state.
#[derive(Debug, Default, Clone)]
pub struct Desired {
    pub pods: BTreeMap<String, Arc<Pod>>,
    /// One message per pod that was dropped because another source already defines it.
    pub rejected: Vec<String>,
}

impl Merger {
    /// Records `update` and returns the merged set. `now` stamps newly seen pods. A pod the
    /// source sent before (the same `Arc`) is not copied again: a source that resends its
    /// whole SET on every event would otherwise copy every pod per event.
    pub fn apply(&mut self, update: SourceUpdate, now: &str) -> Desired {
        self.sources.insert(update.source, update.pods);
        let mut desired = Desired::default();
        let mut names = HashSet::new();
        for (source, pods) in &self.sources {
            for pod in pods {
                let full_name = spec::full_name(pod);
                if !names.insert(full_name.clone()) {
                    desired.rejected.push(format!(
                        "pod {full_name} from source {} is already defined by another source; ignoring this copy",
                        source.as_str()
                    ));
                    continue;
                }
                let uid = spec::uid(pod).to_string();
                let stamped = match self.seen.get_mut(&uid) {
                    Some(seen) if Arc::ptr_eq(&seen.from, pod) => seen.stamped.clone(),
                    Some(seen) => {
                        seen.from = pod.clone();
                        seen.stamped = stamp(pod, &seen.at);
                        seen.stamped.clone()
                    }
                    None => {
                        let stamped = stamp(pod, now);
                        let seen = Seen { at: now.to_string(), from: pod.clone(), stamped: stamped.clone() };
                        self.seen.insert(uid.clone(), seen);
                        stamped
                    }
                };
                desired.pods.insert(uid, stamped);
            }
        }
        self.seen.retain(|uid, _| desired.pods.contains_key(uid));
        desired
    }

    /// True once every configured source has reported at least once, so pods no source
    /// wants can safely be stopped.
    pub fn all_reported(&self, configured: &[SourceKind]) -> bool {
        configured.iter().all(|s| self.sources.contains_key(s))
    }
}

/// A copy of `pod` annotated with when it was first seen. A source that stamps its own pods
/// (the API source, which keeps each pod's first-seen time across its updates) is taken at its
/// word, and its pod is shared, not copied: a copy per pod was the largest thing the agent
/// kept (about 10 KB a pod with three volumes).
fn stamp(pod: &Arc<Pod>, seen: &str) -> Arc<Pod> {
    if pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CONFIG_SEEN)) {
        return pod.clone();
    }
    let mut pod = Pod::clone(pod);
    pod.metadata.annotations.get_or_insert_with(Default::default).insert(CONFIG_SEEN.to_string(), seen.to_string());
    Arc::new(pod)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(name: &str, uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn sources_are_merged_and_cross_source_duplicates_rejected() {
        let mut m = Merger::default();
        m.apply(SourceUpdate::owned(SourceKind::File, vec![pod("a", "1"), pod("b", "2")]), "t0");
        let d = m.apply(SourceUpdate::owned(SourceKind::Http, vec![pod("b", "3"), pod("c", "4")]), "t1");
        assert_eq!(d.pods.keys().collect::<Vec<_>>(), ["1", "2", "4"]);
        assert_eq!(d.rejected.len(), 1);
        assert!(d.rejected[0].contains("default/b"), "{:?}", d.rejected);
        assert!(m.all_reported(&[SourceKind::File, SourceKind::Http]));
    }

    #[test]
    fn seen_time_is_kept_while_the_pod_stays() {
        let mut m = Merger::default();
        m.apply(SourceUpdate::owned(SourceKind::File, vec![pod("a", "1")]), "t0");
        let d = m.apply(SourceUpdate::owned(SourceKind::File, vec![pod("a", "1"), pod("b", "2")]), "t1");
        let seen = |d: &Desired, uid: &str| d.pods[uid].metadata.annotations.as_ref().unwrap()[CONFIG_SEEN].clone();
        assert_eq!(seen(&d, "1"), "t0");
        assert_eq!(seen(&d, "2"), "t1");
        m.apply(SourceUpdate::owned(SourceKind::File, vec![]), "t2");
        let d = m.apply(SourceUpdate::owned(SourceKind::File, vec![pod("a", "1")]), "t3");
        assert_eq!(seen(&d, "1"), "t3", "a pod that went away and came back is new");
    }

    #[test]
    fn a_pod_its_source_stamped_is_passed_on_as_it_is() {
        let mut m = Merger::default();
        let mut stamped = pod("a", "1");
        stamped.metadata.annotations = Some([(CONFIG_SEEN.to_string(), "t-source".to_string())].into());
        let stamped = Arc::new(stamped);
        let d = m.apply(SourceUpdate { source: SourceKind::Api, pods: vec![stamped.clone()] }, "t0");
        assert!(Arc::ptr_eq(&d.pods["1"], &stamped), "shared, not copied");
        assert_eq!(d.pods["1"].metadata.annotations.as_ref().unwrap()[CONFIG_SEEN], "t-source");
    }

    #[test]
    fn a_pod_resent_unchanged_is_not_copied_and_a_changed_one_keeps_its_seen_time() {
        let mut m = Merger::default();
        let a = Arc::new(pod("a", "1"));
        let d0 = m.apply(SourceUpdate { source: SourceKind::Api, pods: vec![a.clone()] }, "t0");
        let d1 = m.apply(SourceUpdate { source: SourceKind::Api, pods: vec![a.clone()] }, "t1");
        assert!(Arc::ptr_eq(&d0.pods["1"], &d1.pods["1"]), "the same pod is shared, not copied");
        let mut changed = pod("a", "1");
        changed.metadata.labels = Some([("k".to_string(), "v".to_string())].into());
        let d2 = m.apply(SourceUpdate { source: SourceKind::Api, pods: vec![Arc::new(changed)] }, "t2");
        assert_eq!(d2.pods["1"].metadata.labels.as_ref().unwrap()["k"], "v");
        assert_eq!(d2.pods["1"].metadata.annotations.as_ref().unwrap()[CONFIG_SEEN], "t0");
    }

    #[test]
    fn not_all_reported_until_each_source_spoke() {
        let mut m = Merger::default();
        m.apply(SourceUpdate::owned(SourceKind::File, vec![]), "t0");
        assert!(!m.all_reported(&[SourceKind::File, SourceKind::Http]));
    }
}
