//! The pods' volume usage, measured in the background every `volumeStatsAggPeriod` (upstream's
//! fsResourceAnalyzer and its per-pod volume stat calculators) rather than on every scrape:
//! walking a large emptyDir or asking a CSI driver is too slow for each `/stats/summary`,
//! `/metrics` or eviction pass. Every reader gets the last measure, with the time it was
//! taken; a pod not measured yet has no volume figures, and with the period off there are none.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::host;
use super::summary::spec_volumes;
use super::types::{FsStats, PvcReference, VolumeStats};
use crate::ServerState;
use gantry_vocab::{paths, spec};

/// The last measure of each pod's volumes, by pod UID.
#[derive(Default)]
pub struct VolumeStatsCache {
    by_pod: Mutex<HashMap<String, Vec<VolumeStats>>>,
}

impl VolumeStatsCache {
    /// The pod's volumes as last measured (empty before the first measure).
    pub fn get(&self, uid: &str) -> Vec<VolumeStats> {
        self.lock().get(uid).cloned().unwrap_or_default()
    }

    /// Keeps the new measures; pods no longer listed are forgotten.
    fn replace(&self, measured: HashMap<String, Vec<VolumeStats>>) {
        *self.lock() = measured;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<VolumeStats>>> {
        self.by_pod.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Measures the volumes of every pod the node runs, every `period` (the first pass at once).
pub async fn run(state: ServerState, period: Duration) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        measure_all(&state).await;
    }
}

/// One pass over the node's pods.
pub async fn measure_all(state: &ServerState) {
    let mut measured = HashMap::new();
    for pod in state.pods().into_iter().map(|p| p.pod) {
        let uid = spec::uid(&pod).to_string();
        let by_plugin = state.plugin_volumes().usage(&uid).await;
        let time = Timestamp::now().to_string();
        let (root, spec_pod, at) = (state.root_dir().to_path_buf(), pod.clone(), time.clone());
        // Walking the node's volume directories is blocking I/O.
        let local = tokio::task::spawn_blocking(move || local_volumes(&root, &spec_pod, &at))
            .await
            .expect("measuring volumes does not panic");
        measured.insert(uid, volumes(&pod, local, by_plugin, &time));
    }
    state.stats_cache().volumes.replace(measured);
}

/// Every volume the node keeps for the pod (emptyDir, configMap, secret, downward API,
/// projected): bytes and inodes used under it (as upstream's `MetricsDu`), on its filesystem.
fn local_volumes(root_dir: &Path, pod: &Pod, time: &str) -> Vec<VolumeStats> {
    let local = spec_volumes(pod).iter().filter_map(|v| {
        let path = paths::volume_dir(root_dir, spec::uid(pod), paths::volume_plugin(v)?, &v.name);
        let base = host::filesystem(&path, time)?;
        let (used, inodes) = host::disk_usage(&path);
        Some(VolumeStats {
            fs: FsStats { used_bytes: Some(used), inodes_used: Some(inodes), ..base },
            name: v.name.clone(),
            pvc_ref: None,
        })
    });
    local.collect()
}

/// The local volumes and those a plugin `measured` (by pod volume name, at `time`), with the
/// claim behind each, by name.
fn volumes(pod: &Pod, local: Vec<VolumeStats>, measured: Vec<(String, FsStats)>, time: &str) -> Vec<VolumeStats> {
    let by_plugin = measured.into_iter().map(|(name, fs)| {
        let spec_volume = spec_volumes(pod).iter().find(|v| v.name == name);
        let pvc_ref = spec_volume
            .and_then(|v| spec::claim_name(pod, v))
            .map(|claim| PvcReference { name: claim, namespace: spec::namespace(pod).into() });
        VolumeStats { fs: FsStats { time: time.into(), ..fs }, name, pvc_ref }
    });
    let mut out: Vec<VolumeStats> = local.into_iter().chain(by_plugin).collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_volume_names_its_claim_and_all_are_sorted() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "claim-1"}},
                {"name": "scratch", "emptyDir": {}},
            ]},
        }))
        .unwrap();
        let local = vec![VolumeStats { name: "scratch".into(), ..Default::default() }];
        let measured = vec![("data".to_string(), FsStats { used_bytes: Some(7), ..Default::default() })];
        let out = volumes(&pod, local, measured, "t1");
        assert_eq!(out.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["data", "scratch"]);
        assert_eq!(out[0].pvc_ref, Some(PvcReference { name: "claim-1".into(), namespace: "ns".into() }));
        assert_eq!((out[0].fs.used_bytes, out[0].fs.time.as_str()), (Some(7), "t1"));
        assert_eq!(out[1].pvc_ref, None);
    }

    #[test]
    fn the_cache_keeps_the_last_pass_only() {
        let cache = VolumeStatsCache::default();
        assert!(cache.get("u1").is_empty(), "nothing before the first measure");
        let one = vec![VolumeStats { name: "v".into(), ..Default::default() }];
        cache.replace(HashMap::from([("u1".to_string(), one.clone())]));
        assert_eq!(cache.get("u1"), one);
        cache.replace(HashMap::from([("u2".to_string(), one)]));
        assert!(cache.get("u1").is_empty(), "a pod gone is forgotten");
    }
}
