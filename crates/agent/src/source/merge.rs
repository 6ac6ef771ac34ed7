//! Merges the latest SET from each source into the pods the node should run.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;

use super::static_pod::CONFIG_SEEN;
use super::{SourceKind, SourceUpdate};
use gantry_vocab::spec;

#[derive(Debug, Default)]
pub struct Merger {
    sources: BTreeMap<SourceKind, Vec<Pod>>,
    /// When each pod UID was first seen; kept across updates as upstream does.
    seen: HashMap<String, String>,
}

/// The merged desired state.
#[derive(Debug, Default, Clone)]
pub struct Desired {
    pub pods: BTreeMap<String, Pod>,
    /// One message per pod that was dropped because another source already defines it.
    pub rejected: Vec<String>,
}

impl Merger {
    /// Records `update` and returns the merged set. `now` stamps newly seen pods.
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
                let mut pod = pod.clone();
                let uid = spec::uid(&pod).to_string();
                let seen = self.seen.entry(uid.clone()).or_insert_with(|| now.to_string()).clone();
                pod.metadata.annotations.get_or_insert_with(Default::default).insert(CONFIG_SEEN.to_string(), seen);
                desired.pods.insert(uid, pod);
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
        m.apply(SourceUpdate { source: SourceKind::File, pods: vec![pod("a", "1"), pod("b", "2")] }, "t0");
        let d = m.apply(SourceUpdate { source: SourceKind::Http, pods: vec![pod("b", "3"), pod("c", "4")] }, "t1");
        assert_eq!(d.pods.keys().collect::<Vec<_>>(), ["1", "2", "4"]);
        assert_eq!(d.rejected.len(), 1);
        assert!(d.rejected[0].contains("default/b"), "{:?}", d.rejected);
        assert!(m.all_reported(&[SourceKind::File, SourceKind::Http]));
    }

    #[test]
    fn seen_time_is_kept_while_the_pod_stays() {
        let mut m = Merger::default();
        m.apply(SourceUpdate { source: SourceKind::File, pods: vec![pod("a", "1")] }, "t0");
        let d = m.apply(SourceUpdate { source: SourceKind::File, pods: vec![pod("a", "1"), pod("b", "2")] }, "t1");
        let seen = |d: &Desired, uid: &str| d.pods[uid].metadata.annotations.as_ref().unwrap()[CONFIG_SEEN].clone();
        assert_eq!(seen(&d, "1"), "t0");
        assert_eq!(seen(&d, "2"), "t1");
        m.apply(SourceUpdate { source: SourceKind::File, pods: vec![] }, "t2");
        let d = m.apply(SourceUpdate { source: SourceKind::File, pods: vec![pod("a", "1")] }, "t3");
        assert_eq!(seen(&d, "1"), "t3", "a pod that went away and came back is new");
    }

    #[test]
    fn not_all_reported_until_each_source_spoke() {
        let mut m = Merger::default();
        m.apply(SourceUpdate { source: SourceKind::File, pods: vec![] }, "t0");
        assert!(!m.all_reported(&[SourceKind::File, SourceKind::Http]));
    }
}
