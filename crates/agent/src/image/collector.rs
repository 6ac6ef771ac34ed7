//! Image garbage collection against CRI: a pass shortly after startup, then every 5 minutes,
//! as upstream. What to remove is decided by [`super::gc`]; this module gathers the inputs
//! (images, containers and sandboxes the runtime still has, the sandbox image, image
//! filesystem usage), removes the chosen images and reports failures as node events.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use gantry_cri::{Cri, CriError, api};
use tokio::sync::{mpsc, oneshot};

use super::gc::{FsUsage, ImageInfo, ImageRecords, Policy};
use crate::clock;
use crate::events::Recorder as EventRecorder;
use crate::events::{EventType, NodeEvent};
use gantry_config::ImageSettings;
use gantry_pod::Nanos;

/// Upstream `ImageGCPeriod`.
pub const PERIOD: Duration = Duration::from_secs(300);
/// Lets the pod workers start what is already assigned before the first pass, so the images
/// of pods about to (re)start count as in use.
pub const FIRST_PASS_DELAY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error("{0}")]
    Cri(#[from] CriError),
    #[error("cannot find the image filesystem: {0}")]
    ImageFs(String),
    #[error("{0}")]
    Shortfall(String),
}

pub struct ImageCollector {
    cri: Cri,
    settings: ImageSettings,
    events: Option<EventRecorder>,
    node: String,
    records: ImageRecords,
    requests: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    requests_tx: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

/// Asks the image collector to remove every unused image now.
#[derive(Clone)]
pub struct ImageReclaimer(mpsc::UnboundedSender<oneshot::Sender<()>>);

impl ImageReclaimer {
    /// Returns once the collector removed what it could (at once if it does not run).
    pub async fn delete_unused(&self) {
        let (done, wait) = oneshot::channel();
        if self.0.send(done).is_ok() {
            let _ = wait.await;
        }
    }
}

impl ImageCollector {
    pub fn new(cri: Cri, settings: ImageSettings, events: Option<EventRecorder>, node: &str) -> Self {
        let (requests_tx, requests) = mpsc::unbounded_channel();
        ImageCollector {
            cri,
            settings,
            events,
            node: node.to_string(),
            records: ImageRecords::default(),
            requests,
            requests_tx,
        }
    }

    /// Runs forever. Images present at startup count as detected long ago, as upstream.
    pub async fn run(mut self) {
        match self.inputs().await {
            Ok((images, in_use, _)) => self.records.observe(&images, &in_use, clock::now(), true),
            Err(e) => tracing::warn!(node = %self.node, error = %e, "image garbage collection: cannot list images"),
        }
        let mut failed_before = false;
        let mut next = tokio::time::Instant::now() + FIRST_PASS_DELAY;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                // The eviction manager's requests are answered between passes, at once.
                Some(done) = self.requests.recv() => {
                    self.delete_unused().await;
                    let _ = done.send(());
                    continue;
                }
            }
            match self.pass().await {
                Ok(()) => failed_before = false,
                Err(e) => {
                    tracing::error!(node = %self.node, error = %e, "image garbage collection failed");
                    // Upstream only raises the event when the previous pass failed as well.
                    if failed_before {
                        self.event("ImageGCFailed", e.to_string());
                    }
                    failed_before = true;
                }
            }
            next = tokio::time::Instant::now() + PERIOD;
        }
    }

    /// Where the eviction manager asks for every unused image to go (upstream's
    /// `DeleteUnusedImages`); the answer comes once the pass is over.
    pub fn reclaimer(&self) -> ImageReclaimer {
        ImageReclaimer(self.requests_tx.clone())
    }

    /// Removes every image the policy lets go, whatever the disk usage (ages, pins, use and
    /// the sandbox image still protect images).
    async fn delete_unused(&mut self) {
        let everything = Policy { high_threshold_percent: 0, low_threshold_percent: 0, ..self.policy() };
        if let Err(e) = self.remove_planned(&everything).await {
            tracing::info!(node = %self.node, error = %e, "Eviction manager: unexpected error when attempting to reduce resource pressure");
        }
    }

    /// One pass: refresh the records, remove what the policy chooses.
    pub async fn pass(&mut self) -> Result<(), GcError> {
        let plan = self.remove_planned(&self.policy()).await?;
        if let Some(message) = plan.shortfall_message() {
            self.event("FreeDiskSpaceFailed", message.clone());
            return Err(GcError::Shortfall(message));
        }
        Ok(())
    }

    /// Refreshes the records and removes what `policy` chooses.
    async fn remove_planned(&mut self, policy: &Policy) -> Result<super::gc::Plan, GcError> {
        let (images, in_use, sandbox_image) = self.inputs().await?;
        // The agent's clock: image ages follow a test's paused tokio clock.
        let now = clock::now();
        self.records.observe(&images, &in_use, now, false);
        let fs = self.image_fs_usage().await?;
        let plan = self.records.plan(&images, &in_use, &sandbox_image, fs, policy, now);
        if plan.bytes_to_free > 0 {
            tracing::info!(
                node = %self.node, usage_percent = fs.usage_percent(),
                high_threshold_percent = self.settings.gc_high_threshold_percent,
                bytes_to_free = plan.bytes_to_free, "disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
            );
        }
        for id in &plan.remove {
            tracing::info!(node = %self.node, image = %id, "removing image to free bytes");
            let spec = api::ImageSpec { image: id.clone(), ..Default::default() };
            match self.cri.images.remove_image(api::RemoveImageRequest { image: Some(spec) }).await {
                Ok(_) => self.records.forget(id),
                Err(e) if e.is_not_found() => self.records.forget(id),
                Err(e) => tracing::warn!(node = %self.node, image = %id, error = %e, "failed to remove image"),
            }
        }
        Ok(plan)
    }

    fn policy(&self) -> Policy {
        Policy {
            high_threshold_percent: self.settings.gc_high_threshold_percent,
            low_threshold_percent: self.settings.gc_low_threshold_percent,
            min_age: self.settings.minimum_gc_age.as_nanos() as Nanos,
            max_age: self.settings.maximum_gc_age.as_nanos() as Nanos,
        }
    }

    /// The images, the image references in use by any container the runtime still has
    /// (running or exited), and the sandbox image.
    async fn inputs(&self) -> Result<(Vec<ImageInfo>, HashSet<String>, String), GcError> {
        let listed = self.cri.images.list_images(api::ListImagesRequest::default()).await?;
        let images = listed.images.into_iter().map(image_info).collect();
        let containers = self.cri.runtime.list_containers(api::ListContainersRequest::default()).await?;
        let mut in_use = HashSet::new();
        for c in containers.containers {
            in_use.extend(c.image.map(|i| i.image).filter(|i| !i.is_empty()));
            if !c.image_ref.is_empty() {
                in_use.insert(c.image_ref);
            }
        }
        let sandbox_image = match &self.settings.pod_infra_container_image {
            Some(image) => image.clone(),
            None => self.runtime_sandbox_image().await,
        };
        Ok((images, in_use, sandbox_image))
    }

    /// containerd reports its sandbox image as `sandboxImage` in the verbose `Status` info.
    async fn runtime_sandbox_image(&self) -> String {
        match self.cri.runtime.status(api::StatusRequest { verbose: true }).await {
            Ok(status) => sandbox_image_from_info(&status.info),
            Err(e) => {
                tracing::warn!(node = %self.node, error = %e, "cannot ask the runtime for its sandbox image");
                String::new()
            }
        }
    }

    /// Capacity and free space of the filesystem holding the runtime's images.
    async fn image_fs_usage(&self) -> Result<FsUsage, GcError> {
        let info = self.cri.images.image_fs_info(api::ImageFsInfoRequest::default()).await?;
        let mountpoint = info
            .image_filesystems
            .iter()
            .find_map(|fs| fs.fs_id.as_ref().map(|id| id.mountpoint.clone()))
            .ok_or_else(|| GcError::ImageFs("ImageFsInfo reported no image filesystem".into()))?;
        fs_usage(Path::new(&mountpoint)).map_err(|e| GcError::ImageFs(format!("statfs {mountpoint}: {e}")))
    }

    fn event(&self, reason: &str, message: String) {
        let ev = NodeEvent { type_: EventType::Warning, reason: reason.to_string(), message };
        match &self.events {
            Some(recorder) => recorder.record_node(&ev),
            None => tracing::warn!(node = %self.node, reason, "{}", ev.message),
        }
    }
}

fn image_info(image: api::Image) -> ImageInfo {
    let mut names = image.repo_tags;
    names.extend(image.repo_digests);
    ImageInfo { id: image.id, names, size: image.size, pinned: image.pinned }
}

/// Finds `sandboxImage` in the verbose info (containerd nests it in the `config` JSON).
pub fn sandbox_image_from_info(info: &std::collections::HashMap<String, String>) -> String {
    info.values()
        .filter_map(|v| serde_json::from_str::<serde_json::Value>(v).ok())
        .find_map(|v| find_key(&v, "sandboxImage"))
        .unwrap_or_default()
}

fn find_key(v: &serde_json::Value, key: &str) -> Option<String> {
    match v {
        serde_json::Value::Object(map) => map
            .get(key)
            .and_then(|s| s.as_str().map(str::to_string))
            .or_else(|| map.values().find_map(|child| find_key(child, key))),
        _ => None,
    }
}

fn fs_usage(path: &Path) -> nix::Result<FsUsage> {
    let st = nix::sys::statvfs::statvfs(path)?;
    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    let (frsize, blocks, available) = (st.fragment_size() as u64, st.blocks() as u64, st.blocks_available() as u64);
    Ok(FsUsage { capacity: blocks.saturating_mul(frsize), available: available.saturating_mul(frsize) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_image_is_read_from_containerds_config() {
        let info =
            [("config".to_string(), r#"{"containerd":{},"sandboxImage":"registry.k8s.io/pause:3.9"}"#.to_string())]
                .into_iter()
                .collect();
        assert_eq!(sandbox_image_from_info(&info), "registry.k8s.io/pause:3.9");
        assert_eq!(sandbox_image_from_info(&Default::default()), "");
    }
}
