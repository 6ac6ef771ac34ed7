//! The latest status of every pod the agent runs, and the standalone status file.
//!
//! Without an API server the status has to be visible somewhere: the store writes a v1
//! `PodList` to `<root-dir>/pods.json` (atomically, after every change, at most once a
//! second; a failed write is retried with backoff), which `gantry pods`
//! prints as a table and any JSON tool can read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::watch;

use gantry_vocab::spec;

pub const STATUS_FILE: &str = "pods.json";

pub struct StatusStore {
    /// Shared with readers: the status sync and the status file read all pods on every change.
    pods: Mutex<BTreeMap<String, Arc<PodRecord>>>,
    /// Bumped on every change; each consumer (status file, API status sync) subscribes.
    version: watch::Sender<u64>,
    /// The latest version the API server has in full (cluster mode).
    reported: watch::Sender<u64>,
}

impl Default for StatusStore {
    fn default() -> Self {
        StatusStore { pods: Mutex::default(), version: watch::Sender::new(0), reported: watch::Sender::new(0) }
    }
}

/// A pod as its worker runs it, with the status the worker last reported. The pod is the
/// worker's own `Arc`, not a copy: the store adds only the status to each pod's memory.
#[derive(Debug)]
pub struct PodRecord {
    /// Its `status` is whatever the pod's source had; [`status`](Self::status) is the node's.
    pub pod: Arc<Pod>,
    /// Shared, so that what remembers a sent status does not keep the pod alive with it.
    pub status: Arc<PodStatus>,
}

impl PodRecord {
    /// The pod with the node's status, as the API shows it.
    pub fn to_pod(&self) -> Pod {
        Pod { status: Some(PodStatus::clone(&self.status)), ..Pod::clone(&self.pod) }
    }

    pub fn phase(&self) -> Option<&str> {
        self.status.phase.as_deref()
    }
}

/// A record serialized as a v1 Pod, without building one.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PodView<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: &'a ObjectMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<&'a PodSpec>,
    status: &'a PodStatus,
}

impl<'a> From<&'a PodRecord> for PodView<'a> {
    fn from(record: &'a PodRecord) -> Self {
        PodView {
            api_version: "v1",
            kind: "Pod",
            metadata: &record.pod.metadata,
            spec: record.pod.spec.as_ref(),
            status: &record.status,
        }
    }
}

/// Puts `pod` in place of the recorded copy of the same pod with the same spec, keeping its
/// status.
fn keep_newer_copy(pods: &mut BTreeMap<String, Arc<PodRecord>>, pod: &Arc<Pod>) {
    let uid = spec::uid(pod);
    let Some(r) = pods.get(uid).filter(|r| !Arc::ptr_eq(&r.pod, pod) && r.pod.spec == pod.spec) else { return };
    let record = PodRecord { pod: pod.clone(), status: r.status.clone() };
    pods.insert(uid.to_string(), Arc::new(record));
}

impl StatusStore {
    /// Records `status` for `pod`; returns whether anything changed.
    pub fn set(&self, pod: &Arc<Pod>, status: PodStatus) -> bool {
        let uid = spec::uid(pod).to_string();
        let mut pods = self.pods.lock().unwrap();
        if pods.get(&uid).is_some_and(|r| *r.status == status && r.pod.spec == pod.spec) {
            // Nothing to report, but the worker may hold a newer copy of the same pod (the
            // source's, once the API object's status moved): keep that one, so that the older
            // copy is freed rather than kept here for the pod's life.
            keep_newer_copy(&mut pods, pod);
            return false;
        }
        pods.insert(uid, Arc::new(PodRecord { pod: pod.clone(), status: Arc::new(status) }));
        drop(pods);
        self.version.send_modify(|v| *v += 1);
        true
    }

    /// Keeps `pod` (a newer copy of a recorded pod with the same spec) in place of the recorded
    /// copy, which is freed rather than kept here until the next status change.
    pub fn renew(&self, pod: &Arc<Pod>) {
        keep_newer_copy(&mut self.pods.lock().unwrap(), pod);
    }

    pub fn remove(&self, uid: &str) {
        if self.pods.lock().unwrap().remove(uid).is_some() {
            self.version.send_modify(|v| *v += 1);
        }
    }

    /// The pod with its status, copied (a whole pod spec: readers that need only the status
    /// take [`status`](Self::status)).
    pub fn get(&self, uid: &str) -> Option<Pod> {
        self.pods.lock().unwrap().get(uid).map(|r| r.to_pod())
    }

    /// The pod's status, shared.
    pub fn status(&self, uid: &str) -> Option<Arc<PodStatus>> {
        self.pods.lock().unwrap().get(uid).map(|r| r.status.clone())
    }

    /// Every pod with its status, shared, not copied.
    pub fn all(&self) -> Vec<Arc<PodRecord>> {
        self.pods.lock().unwrap().values().cloned().collect()
    }

    /// The current version (see [`subscribe`](Self::subscribe)).
    pub fn version(&self) -> u64 {
        *self.version.borrow()
    }

    /// The API status sync reported every status of `version`.
    pub fn mark_reported(&self, version: u64) {
        self.reported.send_if_modified(|v| {
            let newer = version > *v;
            if newer {
                *v = version;
            }
            newer
        });
    }

    /// Returns once the API server has every status of `version` (or a later one).
    pub async fn reported(&self, version: u64) {
        let _ = self.reported.subscribe().wait_for(|v| *v >= version).await;
    }

    /// A receiver that sees every change from now on.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Keeps `<root-dir>/pods.json` up to date. Runs until the process ends; the node writes
    /// the file once more when it stops ([`StatusStore::write_file`]).
    ///
    /// A change after a quiet spell is written at once; the changes that follow it within
    /// [`WRITE_SPACING`] are written together.
    ///
    /// A failed write (a full disk, say) is retried with backoff, not only at the next change,
    /// so the file catches up once the disk has room again; each attempt is logged, so the log
    /// gets the failure once and then at the backoff's pace.
    pub async fn write_file_forever(&self, root_dir: PathBuf) {
        let path = root_dir.join(STATUS_FILE);
        let mut changes = self.subscribe();
        let mut retry: Option<Duration> = None;
        loop {
            changes.borrow_and_update();
            let written_at = tokio::time::Instant::now();
            match write_pod_list(&path, &self.all()).await {
                Ok(()) if retry.take().is_some() => {
                    tracing::info!(file = %path.display(), "pod status file written again");
                }
                Ok(()) => {}
                Err(e) => {
                    let delay = retry.map_or(FIRST_RETRY, |d| (d * 2).min(MAX_RETRY));
                    tracing::warn!(file = %path.display(), error = %e, retry_in = ?delay, "cannot write pod status file");
                    retry = Some(delay);
                }
            }
            match retry {
                // The retry writes whatever changed meanwhile.
                Some(delay) => tokio::time::sleep(delay).await,
                None if changes.changed().await.is_err() => return,
                None => tokio::time::sleep_until(written_at + WRITE_SPACING).await,
            }
        }
    }

    /// Writes `<root-dir>/pods.json` now: the last changes, when the node stops.
    pub async fn write_file(&self, root_dir: &Path) -> std::io::Result<()> {
        write_pod_list(&root_dir.join(STATUS_FILE), &self.all()).await
    }
}

/// The least time from one status file write to the next. Every pod start changes its status
/// about three times, and each write serializes every pod: written on each change, 110 pods
/// starting together wrote the file some 330 times (14% of the agent's CPU time during the
/// start); every 250 ms, some 50 times in a 12 s start, still 11%. A second keeps `gantry
/// pods` as current as a person reads it.
const WRITE_SPACING: Duration = Duration::from_secs(1);

/// How soon a failed status file write is tried again, doubling up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(8);

/// A v1 `PodList` of borrowed pods, serialized straight to bytes (not through a JSON value).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PodList<'a> {
    api_version: &'static str,
    kind: &'static str,
    items: Vec<PodView<'a>>,
}

async fn write_pod_list(path: &Path, pods: &[Arc<PodRecord>]) -> std::io::Result<()> {
    let list =
        PodList { api_version: "v1", kind: "PodList", items: pods.iter().map(|r| PodView::from(&**r)).collect() };
    let tmp = path.with_extension("json.tmp");
    // Compact: a third of the bytes to format and write; `gantry pods -o json` indents it.
    tokio::fs::write(&tmp, serde_json::to_vec(&list)?).await?;
    tokio::fs::rename(&tmp, path).await
}

/// Why a status file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: {source}", path.display())]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("{}: not a pod list: {source}", path.display())]
    NotAPodList { path: std::path::PathBuf, source: serde_json::Error },
}

/// Reads a status file written by [`StatusStore::write_file_forever`].
pub fn read_pod_list(path: &Path) -> Result<Vec<Pod>, ReadError> {
    let data = std::fs::read(path).map_err(|source| ReadError::Io { path: path.to_path_buf(), source })?;
    let list: k8s_openapi::List<Pod> =
        serde_json::from_slice(&data).map_err(|source| ReadError::NotAPodList { path: path.to_path_buf(), source })?;
    Ok(list.items)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn pod_from_source() -> Arc<Pod> {
        let pod = serde_json::json!({
            "metadata": { "name": "web", "namespace": "default", "uid": "u1", "labels": { "app": "web" } },
            "spec": { "containers": [{ "name": "app", "image": "busybox" }] },
            "status": { "phase": "Pending", "message": "as the API server had it" }
        });
        Arc::new(serde_json::from_value(pod).unwrap())
    }

    /// The store holds the worker's pod, not a copy, and shows it with the node's status.
    #[tokio::test]
    async fn records_share_the_pod_and_are_written_as_pods_with_the_nodes_status() {
        let store = StatusStore::default();
        let pod = pod_from_source();
        let running = PodStatus { phase: Some("Running".into()), ..Default::default() };
        assert!(store.set(&pod, running.clone()));
        assert!(!store.set(&pod, running.clone()), "nothing changed");
        let record = store.all().pop().unwrap();
        assert!(Arc::ptr_eq(&record.pod, &pod), "shared, not copied");
        assert_eq!(store.get("u1").unwrap().status, Some(running.clone()));
        assert!(Arc::ptr_eq(&store.status("u1").unwrap(), &record.status), "the status, shared");
        assert!(store.status("missing").is_none());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATUS_FILE);
        write_pod_list(&path, &store.all()).await.unwrap();
        let written = read_pod_list(&path).unwrap();
        assert_eq!(written, [record.to_pod()]);
        let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(raw["items"][0], serde_json::to_value(record.to_pod()).unwrap(), "the same JSON as the Pod");
        assert_eq!(raw["items"][0]["status"]["phase"], "Running");
    }

    /// A newer copy of the same pod (the API object's status moved) replaces the recorded one
    /// without counting as a change, so the older copy is freed, not kept for the pod's life.
    #[test]
    fn a_newer_copy_of_an_unchanged_pod_replaces_the_older_one() {
        let store = StatusStore::default();
        let older = pod_from_source();
        let running = PodStatus { phase: Some("Running".into()), ..Default::default() };
        assert!(store.set(&older, running.clone()));
        let sent = store.all().pop().unwrap().status.clone();
        let version = store.version();
        let mut copy = Pod::clone(&older);
        copy.status = Some(running.clone());
        let newer = Arc::new(copy);
        assert!(!store.set(&newer, running), "nothing to report");
        assert_eq!(store.version(), version);
        let record = store.all().pop().unwrap();
        assert!(Arc::ptr_eq(&record.pod, &newer));
        assert!(Arc::ptr_eq(&record.status, &sent), "the status is still the one a sync may hold");
        drop(record);
        assert_eq!(Arc::strong_count(&older), 1, "the store no longer holds the older copy");
    }

    /// A pod named `name` (also its UID) with the status `phase`.
    fn pod_in(store: &StatusStore, name: &str, phase: &str) {
        let pod = serde_json::json!({ "metadata": { "name": name, "namespace": "default", "uid": name } });
        let status = PodStatus { phase: Some(phase.into()), ..Default::default() };
        store.set(&Arc::new(serde_json::from_value(pod).unwrap()), status);
    }

    fn written(path: &Path) -> Vec<String> {
        read_pod_list(path).unwrap_or_default().into_iter().filter_map(|p| p.metadata.name).collect()
    }

    /// A change after a quiet spell is written at once; a burst of changes is written together,
    /// at most every `WRITE_SPACING`, and its last change is written within that time.
    #[tokio::test(start_paused = true)]
    async fn the_status_file_gathers_a_burst_of_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATUS_FILE);
        let store = Arc::new(StatusStore::default());
        let writer = tokio::spawn({
            let (store, root) = (store.clone(), dir.path().to_path_buf());
            async move { store.write_file_forever(root).await }
        });
        tokio::time::sleep(WRITE_SPACING * 2).await;
        pod_in(&store, "first", "Pending");
        // The writer's blocking file calls hold the paused clock: "at once" is within the
        // first 1 ms poll.
        let start = tokio::time::Instant::now();
        while written(&path) != ["first"] {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(start.elapsed() <= Duration::from_millis(1), "written after {:?}", start.elapsed());

        // 40 pods over 1.6 spacings.
        let mut contents = std::collections::BTreeSet::new();
        for i in 0..40 {
            pod_in(&store, &format!("p{i:02}"), "Running");
            tokio::time::sleep(WRITE_SPACING / 25).await;
            contents.insert(written(&path).len());
        }
        assert!(contents.len() <= 3, "written every {WRITE_SPACING:?}, not on each change: {contents:?}");
        let last = tokio::time::Instant::now();
        while written(&path).len() != 41 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(last.elapsed() <= WRITE_SPACING, "the burst's end waited {:?}", last.elapsed());
        writer.abort();
    }

    #[tokio::test]
    async fn a_failed_status_file_write_is_retried_without_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("not-yet");
        let store = Arc::new(StatusStore::default());
        let writer = tokio::spawn({
            let (store, root) = (store.clone(), root.clone());
            async move { store.write_file_forever(root).await }
        });
        // The first write fails (no directory); the disk "gets room" a moment later.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!root.join(STATUS_FILE).exists());
        std::fs::create_dir(&root).unwrap();
        let deadline = std::time::Instant::now() + FIRST_RETRY * 5;
        while !root.join(STATUS_FILE).exists() {
            assert!(std::time::Instant::now() < deadline, "the status file was never written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(read_pod_list(&root.join(STATUS_FILE)).unwrap().is_empty());
        writer.abort();
    }
}
